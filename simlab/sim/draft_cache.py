"""What each draft model's KV cache holds between rounds, and so what a round's first draft
forward feeds.

The live decoder (:mod:`simlab.live.executor`) feeds a draft model, at its first forward of a
round, every token its KV cache lacks, and crops the cache to the committed prefix after each
verification. That first forward therefore feeds one token (the last committed one) after a
round that rejected a draft, but:

- two after a serial round that accepted every draft: its last draft was sampled from the
  draft's last forward and never fed, and the target's bonus token follows it (the same after
  a tree round whose deepest accepted node is a leaf, which the draft never expanded);
- one more for every round before it that drafted nothing (a plain target step);
- the whole context for an exit layer's first draft in a prompt: each exit layer drafts with
  a cache of its own, which starts empty (the session's draft was prefilled with the prompt).

The simulator and the serving engine keep the same account (:class:`DraftCache`) and price
that first forward as a draft forward over all the tokens it feeds
(:meth:`~simlab.latency.grid.LatencyGrid.catch_up_seconds` on top of the one-token step).
Without it a round after a fully accepted one was priced at a one-token step while the live
draft fed two (about 2x the step for SmolLM2's 24-layer draft on a CPU, 1.13x for the Qwen
0.5B draft).
"""

from __future__ import annotations

from simlab.trace.schema import NO_LAYER


class DraftCache:
    """Tokens (prompt included) held by the KV cache of each draft: ``NO_LAYER`` is the
    session's draft, an exit layer its own early-exit draft."""

    __slots__ = ("held", "most")

    def __init__(self, prompt_len: int):
        self.held = {NO_LAYER: prompt_len}  # the session's draft was prefilled with the prompt
        # no cache holds more tokens than this (a bound, loose after a crop of one layer): a crop
        # to ``most`` tokens or more changes nothing, and the simulator skips it, a call saved
        # after most rounds (those that leave no draft past the accepted prefix)
        self.most = prompt_len

    def draft(self, layer: int, known: int, steps: int) -> int:
        """``steps`` >= 1 draft forwards of ``layer``'s draft after ``known`` tokens (prompt,
        committed tokens and drafts pending): the first feeds what the cache lacks, each later
        one the token drafted before it, and the last token drafted is not fed. Returns the
        tokens the first forward feeds."""
        feed = known - self.held.get(layer, 0)
        held = self.held[layer] = known + steps - 1
        if held > self.most:
            self.most = held
        return feed

    def crop(self, length: int, layer: int | None = None) -> None:
        """Keep at most ``length`` tokens in ``layer``'s cache (None: every cache), as the live
        decoder crops to the committed prefix less its last token after a verification."""
        held = self.held
        if layer is not None:
            if held[layer] > length:
                held[layer] = length
            return
        for key, value in held.items():
            if value > length:
                held[key] = length
        if self.most > length:
            self.most = length


__all__ = ["DraftCache"]
