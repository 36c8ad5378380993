"""Model time of the simulator, and the two compute streams it runs on.

Time: one SimPy environment; ``env.now`` is seconds of wall-clock time on the recording (or
profiled) hardware. Prompts are decoded one after another at batch size 1, as in the papers.
A forward is a timeout whose length the latency model gives; nothing else takes time (policy
decisions and sampling are free, as they are negligible next to a forward).

Streams: the draft model and the target model each compute on their own :class:`Device`.
A device refuses to start work while it is busy (the invariant "no device does two things at
once" is checked on every forward, not assumed). The topology decides what concurrent work
costs; by default it is the one the trace was recorded in (``Manifest.recorded_topology``),
and ``--topology`` overrides it:

- ``two-devices`` (SPIDE's and PEARL's setups; synthetic traces): the models sit on separate
  accelerators, so a forward takes its solo time whether or not the other model is busy.
- ``one-device``: both models share one accelerator. While both compute at the same time (a
  parallel round), each forward takes its *co-running* time, measured on the recording
  hardware with the other model running (``corun`` latency samples); serial rounds never
  overlap and use solo times. Without co-running measurements the solo times stand in, which
  is optimistic, and the run is flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simlab.trace.schema import Topology


@dataclass(frozen=True, slots=True)
class Slice:
    """One forward on one device, for timelines."""

    device: str
    name: str
    start: float
    end: float
    args: dict


class DeviceBusyError(RuntimeError):
    """Work was booked on a device that was still computing: an executor bug."""


@dataclass(slots=True)
class Device:
    """One model's compute stream: its busy time, and its forwards when a timeline is asked for."""

    name: str
    record: bool = False
    busy_s: float = 0.0
    free_at: float = 0.0
    slices: list[Slice] = field(default_factory=list)

    def book(self, start: float, seconds: float, what: str, position: int, tokens: int,
             accepted: int | None = None, fed: int = 1) -> float:
        """Occupy the device for ``seconds`` from ``start``; return the end time. ``fed``: the
        tokens a draft run's first forward fed (:mod:`simlab.sim.draft_cache`), shown when more
        than one."""
        if start < self.free_at - 1e-12:
            raise DeviceBusyError(f"{self.name} asked to {what} at t={start:.6f} while busy until {self.free_at:.6f}")
        end = start + seconds
        self.free_at = end
        self.busy_s += seconds
        if self.record:
            args = {"position": position, "tokens": tokens}
            if accepted is not None:
                args["accepted"] = accepted
            if fed > 1:
                args["fed"] = fed
            self.slices.append(Slice(self.name, f"{what} x{tokens}", start, end, args))
        return end


__all__ = ["Device", "DeviceBusyError", "Slice", "Topology"]
