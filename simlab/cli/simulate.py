"""``simlab simulate``: replay a trace under a policy and print the metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from simlab.cli import policy_options as opt
from simlab.cli.app import app
from simlab.cli.output import (
    Force,
    Strict,
    check_strict,
    console,
    frame_output,
    meanings,
    metrics_table,
    print_extrapolated,
    print_json,
)
from simlab.common.atomic import check_output
from simlab.common.errors import SimlabError
from simlab.common.locations import default_trace
from simlab.common.metrics import SUMMARY_KEYS
from simlab.common.table_file import write_frame
from simlab.sim.devices import Topology

TopologyOption = Annotated[Optional[Topology], typer.Option(
    "--topology", help="Where the two models run.", show_default="the topology the trace was recorded in, from its manifest")]


def load_inputs(trace: Optional[Path], latency: Optional[Path]):
    """The trace (default: the shipped one) and the latency model (default: the trace's)."""
    from simlab.latency.model import load_profile
    from simlab.trace.io import read_trace

    tr = read_trace(trace or default_trace())
    lat = load_profile(latency) if latency else None
    return tr, lat


def vllm_draft(manifest) -> str | None:
    """What vLLM is given as the draft model of a trace: an installed catalog model's directory, else
    its name; None where the draft is the target's own first layers (a self-speculative trace),
    which vLLM's draft_model speculation cannot run."""
    from simlab.models.cache import installed_path
    from simlab.trace.schema import NO_LAYER

    if manifest.draft_layer != NO_LAYER:
        return None
    return str(installed_path(manifest.draft_model) or manifest.draft_model)


def topology_label(topology: Topology, given: Optional[Topology]) -> str:
    """The simulated topology and where it came from, for table titles."""
    return f"{topology.value} ({'--topology' if given is not None else 'as recorded'})"


def trace_label(tr) -> str:
    m = tr.manifest
    kind = "SYNTHETIC" if m.kind == "synthetic" else m.kind
    return f"{tr.path} [{kind}] {m.draft_model} -> {m.target_model}, {m.dataset}, {m.hardware}"


@app.command()
@opt.with_policy_flags
def simulate(
    params: dict[str, Any],
    policy: opt.Policy = "sd",
    trace: Annotated[Optional[Path], typer.Option("--trace", help="Trace directory.", show_default="the shipped trace")] = None,
    latency: Annotated[Optional[Path], typer.Option("--latency", help="Latency profile JSON.", show_default="the trace's own samples")] = None,
    predictor: Annotated[Optional[Path], typer.Option("--predictor", help="Acceptance predictor JSON (simlab calibrate predictor) for the policies that use one.", show_default="the draft's confidence")] = None,
    topology: TopologyOption = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed for stochastic replay (temperature > 0 traces).")] = 0,
    spread_trace: Annotated[Optional[list[Path]], typer.Option("--spread-trace", help="Temperature > 0: another trace of the same prompts recorded with another record --seed (repeatable); the interval then covers the sampled continuation.")] = None,
    spread_seeds: Annotated[int, typer.Option("--spread-seeds", help="Temperature > 0: replay seeds per trace for the interval one run may land in (0: none).")] = 20,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write per-prompt results (.csv or .parquet).")] = None,
    timeline: Annotated[Optional[Path], typer.Option("--timeline", help="Write one prompt's per-device timeline (Chrome trace JSON).")] = None,
    timeline_prompt: Annotated[Optional[int], typer.Option("--timeline-prompt", help="prompt_id for --timeline.", show_default="the first prompt")] = None,
    force: Force = False,
    strict: Strict = False,
) -> None:
    """Replay a trace in the SimPy simulator under a drafting policy.

    Prints the speedup over the target alone, the target calls against plain SD at its best γ
    (SPIDE's cost), accepted drafts and tokens per target call, calls, acceptance and decode
    times, with what each figure is under the table.
    """
    from simlab.policies.vllm import config_of
    from simlab.predictor.model import load_predictor
    from simlab.sim.run import Simulator
    from simlab.sim.timeline import write_chrome_trace

    if out is not None:
        frame_output(out, force)
    if timeline is not None:
        check_output(timeline, "--timeline", force=force)
    tr, lat = load_inputs(trace, latency)
    pred = load_predictor(predictor) if predictor else None
    sim = Simulator(tr, lat, seed=seed, topology=topology, predictor=pred)
    prompt_ids = tr.columns("prompts")["prompt_id"]
    if timeline is not None and timeline_prompt is None:
        timeline_prompt = int(prompt_ids.min())
    if timeline_prompt is not None and timeline_prompt not in set(prompt_ids.tolist()):
        raise SimlabError(f"--timeline-prompt {timeline_prompt} is not a prompt_id of the trace")
    res = sim.run(policy, params, timeline_prompt=timeline_prompt)
    check_strict(res.summary.extra, strict, f"{policy} on {tr.path}")
    if out:
        write_frame(res.per_prompt, out)
    if timeline:
        write_chrome_trace(res.timeline, timeline, title=f"{policy} on prompt {timeline_prompt}, {sim.topology.value}")
    summary = res.summary.to_dict()
    spread = None
    if not tr.manifest.greedy and spread_seeds > 0:
        from simlab.sim.spread import sampling_spread
        from simlab.trace.io import read_trace

        spread = sampling_spread([tr, *(read_trace(p) for p in spread_trace or [])], policy, params,
                                 seeds=spread_seeds, seed=seed, latency=lat, topology=sim.topology)
    elif spread_trace:
        raise SimlabError("--spread-trace needs a trace recorded at temperature > 0")
    draft = vllm_draft(tr.manifest)
    vllm_config = config_of(policy, res.params, draft) if draft else None
    if json_out:
        print_json({
            "policy": policy,
            "params": res.params,
            "trace": str(tr.path),
            "trace_kind": tr.manifest.kind,
            "latency": sim.latency.name,
            "predictor": pred.name if pred else None,
            "topology": sim.topology.value,
            "topology_from": "--topology" if topology is not None else "trace manifest",
            "seed": seed,
            **summary,
            **({"spread": {"method": spread.describe(), **spread.to_dict()}} if spread is not None else {}),
            **({"speculative_config": vllm_config} if vllm_config else {}),
        })
        return
    ref = summary.get("reference_gamma")
    caption = f"plain SD's best γ on this trace: {ref}" if ref else None
    params_text = ", ".join(f"{k}={v}" for k, v in res.params.items() if k != "policy")
    console.print(f"trace: {trace_label(tr)}")
    console.print(f"latency: {sim.latency.name}; topology: {topology_label(sim.topology, topology)}")
    title = f"{policy} ({params_text})" if params_text else policy
    console.print(metrics_table(f"{title} — {topology_label(sim.topology, topology)}",
                                {k: summary[k] for k in SUMMARY_KEYS}, caption))
    console.print("what the figures are:")
    console.print(meanings(SUMMARY_KEYS), highlight=False)
    print_extrapolated(summary)
    if summary.get("corun_latency", "measured") != "measured" and res.summary.parallel_rounds:
        console.print("[yellow]note:[/] one-device topology without co-running latency samples: parallel rounds "
                      "use solo latencies (optimistic)")
    if spread is not None:
        console.print(f"one run at temperature {tr.manifest.temperature}: {spread.describe()}")
        for key, iv in spread.intervals.items():
            console.print(f"  {key}: {iv.mean:.3f} [{iv.low:.3f}, {iv.high:.3f}]")
    if vllm_config:
        console.print(f"vLLM, one request at a time: --speculative-config '{json.dumps(vllm_config)}'", soft_wrap=True)
    if res.summary.rollout_overruns:
        console.print(f"[yellow]note:[/] drafts ran past the recorded rollouts {res.summary.rollout_overruns} times "
                      "(their signals repeat the last rollout step)")
