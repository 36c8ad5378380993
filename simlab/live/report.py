"""Running a live session and reporting it: progress, files written as prompts finish, a clean
stop on Ctrl-C (finished prompts are kept and reported), measured vs predicted tables."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
from rich.table import Table

from simlab.common.atomic import replace_file
from simlab.common.locations import portable_path
from simlab.common.metrics import PositionStats, Summary, total
from simlab.common.table_file import write_frame
from simlab.live.decoding import DISTURBED, PromptOutcome
from simlab.live.prediction import DRIFTED, Comparison, describe_gap
from simlab.live.session import EXTRA_PROBES, LiveSession
from simlab.sim.devices import Slice
from simlab.sim.timeline import write_chrome_trace

EXPLAIN = 0.10  # a prompt whose speedup error exceeds this is explained by its forwards in the printout


def _forward_slices(run) -> list[Slice]:
    return [Slice(f.device, f"{f.what} x{f.tokens}", f.start, f.end, {"position": f.position, "tokens": f.tokens})
            for f in run.forwards if f.what != "prefill"]


class LiveReport:
    def __init__(self, session: LiveSession, out: Path | None = None, log_dir: Path | None = None,
                 against_hf: bool = False, say: Callable[[str], None] = print):
        self.session, self.out, self.log_dir, self.against_hf, self.say = session, out, log_dir, against_hf, say
        self.outcomes: list[PromptOutcome] = []
        self.hf_rows: list[dict[str, Any]] = []
        self.comparison: Comparison | None = None
        self.interrupted = False
        self.unprobed: list[int] = []  # sizes the prediction verifies that --probe did not time
        self.probe_samples: list[pd.DataFrame] = []  # each probe's samples, with its CPU share of others
        self.probe_seconds: list[float] = []  # what each probe took, wall-clock: the protocol's cost

    # -- running ----------------------------------------------------------------------------

    def run(self) -> None:
        s = self.session
        if s.cfg.compare:
            s.load_trace()
            self.say(f"comparison trace: {s.trace.path} ({len(s.trace.prompts)} of its prompts)")
        self.say(f"loading {s.setup.draft_name()} and {s.cfg.target} on {s.setup.target_device} ({s.setup.dtype})")
        s.load_models()
        if s.setup.probe_plan is not None:
            self._probe()
        started = time.perf_counter()
        try:
            for i, outcome in enumerate(s.decode(), 1):
                self.outcomes.append(outcome)
                drift = s.decoded(outcome) if s.trace is not None else None
                if self.against_hf:
                    self._hf(outcome)
                self._write(outcome)
                c = outcome.policy.counts
                self.say(f"[{i}/{len(s.prompts)}] {outcome.source}: {c.tokens} tokens, "
                         f"{c.tokens / c.wall_time_s:.2f} tok/s, speedup {c.ad_wall_time_s / c.wall_time_s:.3f}x, "
                         f"{c.target_calls} target calls{', NOT lossless' if outcome.lossless is False else ''} "
                         f"({time.perf_counter() - started:.0f}s elapsed)")
                limit = s.cfg.reprobe_drift
                if limit is not None and drift is not None and abs(drift) > limit and i < len(s.prompts):
                    self._reprobe(outcome, drift)
        except KeyboardInterrupt:
            self.interrupted = True
            self.say(f"interrupted: keeping the {len(self.outcomes)} finished prompts")
        if s.trace is not None and self.outcomes:
            self.comparison = s.compare(self.outcomes)
            self._write_table()
            self._write_sim_timelines()

    def _probe(self) -> None:
        """``--probe``: time the run's forwards again here, keep the samples beside ``--out``
        (``OUT.latency.csv``), and state the prediction made from them before the first decode."""
        s = self.session
        ks = s.probe_plan().ks
        self.say(f"timing the run's forwards again in this process ({s.cfg.probe}"
                 + (f": k = {','.join(map(str, ks))}, what the prediction verifies" if s.setup.probe_auto else "")
                 + ")...")
        self._timed(s.probe_here)
        sim = s.prediction.simulated()
        ours = sim.per_prompt[sim.per_prompt["prompt_id"].isin([s.prediction.prompt_id(p.source) for p in s.prompts])]
        self.say(f"predicted from them, before decoding: speedup {ours['ad_wall_time_s'].sum() / ours['wall_time_s'].sum():.3f}x, "
                 f"{ours['tokens'].sum() / ours['wall_time_s'].sum():.2f} tok/s over {len(ours)} prompts")
        self.unprobed = [k for k in s.prediction.verified_sizes() if k not in s.probe_plan().ks]
        if self.unprobed:
            self.say(f"the prediction verifies k = {','.join(map(str, self.unprobed))}, which the probe did not time: "
                     "priced from the trace's own samples and interpolation "
                     + (f"({EXTRA_PROBES} further probes did not settle the sizes)" if s.setup.probe_auto
                        else "(--probe 'k=auto' times them all)"))

    def _timed(self, probe: Callable[[], tuple[pd.DataFrame, float | None]]) -> None:
        """Run ``probe`` (the session's probe or re-probe); say how many forwards it timed and how
        long it took, and keep its samples in ``OUT.latency.csv`` (``probe``: 1 for ``--probe``'s,
        then each re-probe's number)."""
        started = time.perf_counter()
        samples, other = probe()
        seconds = time.perf_counter() - started
        self.probe_seconds.append(seconds)
        self.say(f"re-probed {len(samples)} forwards in {seconds:.0f} s; other processes took "
                 f"{'?' if other is None else f'{other:.0%}'} of the CPU meanwhile")
        self.probe_samples.append(samples.assign(other_cpu=other, probe=self.session.probes))
        if self.out is not None:
            pd.concat(self.probe_samples).to_csv(self.out.with_suffix(".latency.csv"), index=False)

    def _reprobe(self, outcome: PromptOutcome, drift: float) -> None:
        """``--reprobe-drift``: the machine has moved since the last probe; time the forwards again."""
        s = self.session
        self.say(f"{outcome.source}'s autoregressive baselines ran {drift:+.1%} against their price: timing the "
                 f"run's forwards again (probe {s.probes + 1}) to price the prompts that follow")
        self._timed(s.reprobe)

    def _hf(self, outcome: PromptOutcome) -> None:
        from simlab.live.hf import assisted_generate, lookup_generate

        s = self.session
        ex = s.executor
        if s.cfg.policy == "pld":  # Hugging Face's prompt lookup with the policy's settings
            pld = s.make_policy("pld", s.cfg.params)
            gamma = pld.num_tokens
            hf = lookup_generate(ex.target_model, s.ids[outcome.prompt_id], s.cfg.max_new_tokens, pld.num_tokens,
                                 pld.ngram_max, s.eos)
        else:
            gamma = s.cfg.params.get("gamma") or 5
            hf = assisted_generate(ex.target_model, ex.draft_model, s.ids[outcome.prompt_id], s.cfg.max_new_tokens,
                                   int(gamma), s.eos)
        run = outcome.policy
        prefill = sum(f.end - f.start for f in run.forwards if f.what == "prefill")
        ours = prefill + run.counts.wall_time_s
        self.hf_rows.append({
            "prompt_id": outcome.prompt_id, "hf_gamma": int(gamma), "hf_tokens": len(hf.tokens),
            "hf_seconds": hf.seconds, "hf_tokens_per_s": len(hf.tokens) / hf.seconds, "hf_target_calls": hf.target_calls,
            "simlab_seconds": ours, "simlab_tokens_per_s": len(run.tokens) / ours,
            "simlab_target_calls": run.counts.target_calls, "same_tokens": hf.tokens == run.tokens,
        })

    def _write(self, outcome: PromptOutcome) -> None:
        if self.out is not None:
            self._write_table()
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            run = outcome.policy
            write_chrome_trace(_forward_slices(run), self.log_dir / f"live-{outcome.prompt_id}.json",
                               title=f"live {self.session.cfg.policy}, prompt {outcome.prompt_id}")
            rounds = json.dumps(run.rounds)
            replace_file(self.log_dir / f"rounds-{outcome.prompt_id}.json", lambda tmp: tmp.write_text(rounds))

    def _write_sim_timelines(self) -> None:
        if self.log_dir is None or self.comparison is None:
            return
        s = self.session
        for outcome in self.outcomes:
            write_chrome_trace(s.prediction_for(outcome).timeline(outcome.source),
                               self.log_dir / f"sim-{outcome.prompt_id}.json",
                               title=f"simulated {s.cfg.policy}, prompt {outcome.prompt_id}, {s.topology.value}")

    def table(self) -> pd.DataFrame:
        if self.comparison is not None:
            df = self.comparison.table
        else:
            df = self.session.compare(self.outcomes).table if self.outcomes else pd.DataFrame()
        if self.hf_rows:
            df = df.merge(pd.DataFrame(self.hf_rows), on="prompt_id", how="left")
        return df

    def _write_table(self) -> None:
        if self.out is not None and self.outcomes:
            write_frame(self.table(), self.out)

    # -- summarising ------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        s = self.session
        df = self.table()
        out: dict[str, Any] = {"policy": s.cfg.policy, "params": s.cfg.params, "draft": s.setup.draft_name(),
                               "target": s.cfg.target, "hardware": s.setup.hardware, "prompts": len(self.outcomes),
                               "interrupted": self.interrupted}
        if s.cfg.probe:
            out.update(probe=s.cfg.probe, probe_ks=list(s.probe_plan().ks), unprobed_ks=self.unprobed,
                       reprobe_drift=s.cfg.reprobe_drift, reprobes=s.probes - 1,
                       probe_seconds=[round(x, 1) for x in self.probe_seconds])
        if df.empty:
            return out
        wall, ad = df["measured_wall_time_s"].sum(), df["measured_ad_wall_time_s"].sum()
        tokens = df["measured_tokens"].sum()
        out.update(measured_tokens=int(tokens), measured_tokens_per_s=tokens / wall, measured_speedup=ad / wall,
                   measured_target_calls=int(df["measured_target_calls"].sum()),
                   median_ad_spread=float(df["measured_ad_spread"].median()), repeats=s.cfg.repeats,
                   median_speedup_spread=float(df["measured_speedup_spread"].median()),
                   disturbed=int(df["disturbed"].sum()), disturbed_threshold=DISTURBED)
        if s.cfg.temperature == 0:
            out["lossless"] = int(df["lossless"].sum())
        else:  # two samples agree only by chance: no token-by-token verdict
            out["lossless"] = "in distribution (speculative sampling; checked exactly in tests/test_live_sampling.py)"
        if "predicted_wall_time_s" in df:
            pw, pad = df["predicted_wall_time_s"].sum(), df["predicted_ad_wall_time_s"].sum()
            ptok = df["predicted_tokens"].sum()
            out.update(trace=portable_path(self.comparison.trace_path), topology=s.topology.value,
                       predicted_tokens_per_s=ptok / pw,
                       predicted_speedup=pad / pw, predicted_target_calls=int(df["predicted_target_calls"].sum()),
                       median_abs_error_speedup=float(df["error_speedup"].abs().median()),
                       median_abs_error_tokens_per_s=float(df["error_tokens_per_s"].abs().median()),
                       median_ad_drift=float(df["ad_drift"].median()), drifted=int(df["drifted"].sum()),
                       drifted_threshold=DRIFTED)
            if s.cfg.temperature == 0:  # at T > 0 the trace's continuation is another sample
                out.update(target_calls_equal=int((df["measured_target_calls"] == df["predicted_target_calls"]).sum()),
                           tokens_equal=int((df["measured_tokens"] == df["predicted_tokens"]).sum()))
            out["error_speedup"] = out["predicted_speedup"] / out["measured_speedup"] - 1
        if self.comparison is not None and self.comparison.forwards:
            out["forwards"] = self._forwards()
        if "measured_shadow_s" in df:
            shadow = float(df["measured_shadow_s"].sum())
            out.update(measured_shadow_s=shadow, measured_shadow_share=shadow / wall)
        if "predicted_shadow_s" in df:
            out.update(predicted_shadow_s=float(df["predicted_shadow_s"].sum()),
                       shadows_priced=s.prediction.simulator.latency.prices_shadows)
        out.update(self._drafts())
        spread = s.prediction.spread() if "predicted_speedup" in out else None
        if spread is not None:
            measured = {"speedup": out["measured_speedup"], "tokens_per_s": out["measured_tokens_per_s"],
                        "mean_acceptance_length": out["measured_mean_acceptance_length"],
                        "tokens_per_target_call": tokens / out["measured_target_calls"],
                        "target_calls": out["measured_target_calls"], "tokens": out["measured_tokens"]}
            out["spread"] = {"method": spread.describe(), **spread.to_dict()}
            for key, value in measured.items():
                out["spread"][key].update(measured=value, inside=spread.intervals[key].holds(value))
        if self.hf_rows:
            hf = pd.DataFrame(self.hf_rows)
            out.update(hf_gamma=int(hf["hf_gamma"].iloc[0]),
                       hf_tokens_per_s=hf["hf_tokens"].sum() / hf["hf_seconds"].sum(),
                       hf_target_calls=int(hf["hf_target_calls"].sum()),
                       simlab_tokens_per_s_incl_prefill=sum(len(o.policy.tokens) for o in self.outcomes)
                       / hf["simlab_seconds"].sum(),
                       simlab_vs_hf=(hf["hf_seconds"].sum() / hf["simlab_seconds"].sum()))
        return out

    def _forwards(self) -> dict[str, dict[str, float]]:
        """Measured and priced device seconds per kind of forward, summed over the predicted prompts."""
        totals: dict[str, list[float]] = {}
        for times in self.comparison.forwards.values():
            for kind, (measured, priced) in times.items():
                pair = totals.setdefault(kind, [0.0, 0.0])
                pair[0] += measured
                pair[1] += priced
        return {kind: {"measured_s": m, "predicted_s": p} for kind, (m, p) in totals.items()}

    def _drafts(self) -> dict[str, Any]:
        """vLLM's counters over the finished prompts: measured, and predicted where simulated."""
        runs = [o.policy for o in self.outcomes]
        positions = PositionStats()
        for run in runs:
            positions += run.positions
        m = Summary.from_counts(total(r.counts for r in runs), positions=positions)
        out = {"measured_num_drafts": m.num_drafts, "measured_mean_acceptance_length": m.mean_acceptance_length,
               "measured_acceptance_per_position": m.acceptance_per_position}
        simulated = self.comparison.simulated if self.comparison is not None else None
        if simulated is not None:
            pid_of = dict(zip(self.session.trace.prompts["source"], self.session.trace.prompts["prompt_id"]))
            pids = {pid_of[o.source] for o in self.outcomes if o.source in pid_of}
            rows = simulated.per_prompt[simulated.per_prompt["prompt_id"].isin(pids)]
            drafts = int(rows["num_drafts"].sum())
            out.update(predicted_num_drafts=drafts,
                       predicted_mean_acceptance_length=1 + rows["accepted"].sum() / drafts if drafts else math.nan)
        return out

    def print(self, console) -> None:
        summ = self.summary()
        df = self.table()
        if df.empty:
            console.print("no prompt finished")
            return
        t = Table(title=f"live {summ['policy']} {summ['params']} — {summ['draft']} -> {summ['target']} on {summ['hardware']}",
                  caption_justify="left", caption=(
                      "meas: measured; pred: simulated; speedup: over the same code decoding with the target alone; err: "
                      "predicted / measured speedup - 1; calls: target forward passes; MAT: accepted draft tokens per target "
                      "call; lossless: the tokens equal the target's own greedy output; spread: (max - min) / median speedup "
                      "over --repeats; AD drift: the target-alone decode's time against its probed price; others: the most "
                      "CPU other processes took; disturbed: others above 10%; drifted: AD drift beyond 10%"))
        cols = [("prompt", "prompt_id", "{}"), ("tokens", "measured_tokens", "{}"),
                ("tok/s meas", "measured_tokens_per_s", "{:.2f}"), ("tok/s pred", "predicted_tokens_per_s", "{:.2f}"),
                ("speedup meas", "measured_speedup", "{:.3f}"), ("speedup pred", "predicted_speedup", "{:.3f}"),
                ("err", "error_speedup", "{:+.1%}"), ("calls meas", "measured_target_calls", "{}"),
                ("calls pred", "predicted_target_calls", "{}"), ("MAT meas", "measured_mat", "{:.2f}"),
                ("MAT pred", "predicted_mat", "{:.2f}"), ("lossless", "lossless", "{}"),
                ("spread", "measured_speedup_spread", "{:.1%}"), ("AD drift", "ad_drift", "{:+.1%}"),
                ("others", "other_cpu_max", "{:.0%}"), ("disturbed", "disturbed", "{}"), ("drifted", "drifted", "{}")]
        cols = [c for c in cols if c[1] in df]
        for name, _, _ in cols:
            t.add_column(name, justify="right")
        for _, row in df.iterrows():
            t.add_row(*[_fmt(spec, row[key]) for _, key, spec in cols])
        console.print(t)
        lines = [f"overall: {summ['measured_tokens']} tokens, measured {summ['measured_tokens_per_s']:.2f} tok/s, "
                 f"speedup {summ['measured_speedup']:.3f}x; "
                 + (f"lossless on {summ['lossless']}/{summ['prompts']} prompts; " if isinstance(summ["lossless"], int)
                    else f"lossless {summ['lossless']}; ")
                 +
                 f"the autoregressive baselines before and after the policy differed by {summ['median_ad_spread']:.1%} "
                 "(median over prompts)",
                 f"protocol: {summ['repeats']} repeat(s) per prompt (speedup spread over repeats, median "
                 f"{summ['median_speedup_spread']:.1%}); {summ['disturbed']}/{summ['prompts']} prompts disturbed "
                 f"(others took > {summ['disturbed_threshold']:.0%} of the CPU during a decode)"]
        if "predicted_speedup" in summ:
            lines.append(f"predicted: {summ['predicted_tokens_per_s']:.2f} tok/s, speedup "
                         f"{summ['predicted_speedup']:.3f}x ({summ['error_speedup']:+.1%}); median |error| per prompt: "
                         f"speedup {summ['median_abs_error_speedup']:.1%}, tok/s {summ['median_abs_error_tokens_per_s']:.1%}")
            drift = summ["median_ad_drift"]
            lines.append(f"autoregressive decoding ran {drift:+.1%} against the trace's probed latencies (median); "
                         f"{summ['drifted']}/{summ['prompts']} prompts drifted (baselines more than "
                         f"{summ['drifted_threshold']:.0%} off their price: the machine, not the policy)"
                         + (" — the machine has drifted since the probe: consider --reprobe" if abs(drift) > DRIFTED
                            else ""))
            if "forwards" in summ:
                lines.append("forwards, measured against priced (all prompts): " + "; ".join(
                    describe_gap(kind, f["measured_s"], f["predicted_s"]) for kind, f in summ["forwards"].items()))
                far = df[df["error_speedup"].abs() > EXPLAIN]
                for _, row in far.iterrows():
                    lines.append(f"  prompt {row['prompt_id']} (speedup error {row['error_speedup']:+.1%}): "
                                 f"furthest from its price: {row['forward_gap']}")
            if "target_calls_equal" in summ:
                lines.append(f"target calls equal on {summ['target_calls_equal']}/{summ['prompts']} prompts "
                             f"(measured {summ['measured_target_calls']}, predicted {summ['predicted_target_calls']}); "
                             f"trace {summ['trace']}")
            else:
                lines.append(f"trace {summ['trace']}")
        if "spread" in summ:
            sp = summ["spread"]
            lines.append(f"at temperature {self.session.cfg.temperature}, one run's prediction ({sp['method']}):")
            for key in ("mean_acceptance_length", "target_calls", "tokens_per_target_call", "speedup", "tokens_per_s"):
                iv = sp[key]
                lines.append(f"  {key}: {iv['mean']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}], measured "
                             f"{iv['measured']:.3f} ({'inside' if iv['inside'] else 'OUTSIDE'})")
        if "measured_shadow_s" in summ:
            priced = summ.get("shadows_priced")
            lines.append(f"shadow tokens (an exit head per exit layer after each target forward): measured "
                         f"{summ['measured_shadow_s']:.3f} s, {summ['measured_shadow_share']:.0%} of the decode"
                         + (f"; predicted {summ['predicted_shadow_s']:.3f} s" if priced else "")
                         + ("; unpriced: the trace's latency probe has no exit-head axis (--reprobe adds it)"
                            if priced is False else ""))
        lines.append(f"drafts (vLLM): {summ['measured_num_drafts']}, mean acceptance length "
                     f"{summ['measured_mean_acceptance_length']:.3f}"
                     + (f"; predicted {summ['predicted_num_drafts']}, {summ['predicted_mean_acceptance_length']:.3f}"
                        if "predicted_num_drafts" in summ else ""))
        if "hf_tokens_per_s" in summ:
            lines.append(f"HF assisted generation (γ={summ['hf_gamma']}, prefill included): "
                         f"{summ['hf_tokens_per_s']:.2f} tok/s, {summ['hf_target_calls']} target calls; simlab "
                         f"{summ['simlab_tokens_per_s_incl_prefill']:.2f} tok/s = {summ['simlab_vs_hf']:.3f}x HF")
        if self.interrupted:
            lines.append("interrupted: the figures cover the finished prompts only")
        for line in lines:
            console.print(line)


def _fmt(spec: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    try:
        return spec.format(value)
    except (ValueError, TypeError):
        return str(value)


