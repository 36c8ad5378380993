"""``simlab calibrate``: latency profiles and acceptance predictors from traces and datasheets.

``simlab calibrate TRACE --out P`` is short for ``simlab calibrate fit TRACE --out P``: a group
whose first argument is not one of its commands runs ``fit``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup

from simlab.cli.app import app
from simlab.cli.output import Force, console, print_json
from simlab.cli.simulate import trace_label
from simlab.common.atomic import check_output
from simlab.common.errors import SimlabError

DEFAULT_COMMAND = "fit"
REPORT_CONTEXT = 512  # context length of the roofline summary table
REPORT_KS = (1, 2, 4, 8, 16, 32)
REPORT_TREE_NODES = (4, 16, 64)  # tree sizes of the summary: a tree of n nodes is verified over k = n + 1 tokens


class _DefaultToFit(TyperGroup):
    """A group that treats an unknown first argument (a trace path) as ``fit``'s argument."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = [DEFAULT_COMMAND, *args]
        return super().parse_args(ctx, args)


calibrate_app = typer.Typer(
    cls=_DefaultToFit,
    no_args_is_help=True,
    help="Fit latency profiles and acceptance predictors: `simlab calibrate TRACE --out calibrate/NAME.json`.",
)
app.add_typer(calibrate_app, name="calibrate")


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


@calibrate_app.command("fit")
def fit(
    trace: Annotated[Path, typer.Argument(help="Trace directory whose latency samples to fit.")],
    out: Annotated[Path, typer.Option("--out", help="Profile to write, e.g. calibrate/NAME.json.")],
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Also draw the fit (.png, .svg or .pdf).")] = None,
    form: Annotated[str, typer.Option("--form", help="auto (smallest BIC), affine, hinge or per-x.")] = "auto",
    name: Annotated[Optional[str], typer.Option("--name", help="Profile name.", show_default="the --out file's stem")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    force: Force = False,
    strict: Annotated[bool, typer.Option("--strict", help="Refuse to write a fit whose samples leave a slope unmeasured (one size, one context) or hold one sample per point.")] = False,
) -> None:
    """Fit T_d(ctx) and T_v(k, ctx) to a trace's latency samples by least squares.

    Each series (draft step, early-exit step, target forward; with the probe's tree axis the
    target's tree verification and the draft's tree expansion; with its exit-head axis the exit
    head over k rows that DEL's shadow tokens run; solo and co-running; per batch
    size where the trace was probed with a batch axis) gets the form with the smallest BIC:
    affine in k, piecewise-linear in k (hinge) or one intercept per measured k (per-x), each
    with a context term. Prints R², the worst point and the median error on samples left out
    of the fit (one repeat at a time), and says which series rest on too few samples (one size,
    one context, one sample per point).
    """
    from rich.table import Table

    from simlab.latency.fitted import SIZE_NAMES, fit_latency, held_out, thin_fits
    from simlab.latency.model import save_profile
    from simlab.trace.io import read_trace

    check_output(out, force=force)
    if plot:
        check_output(plot, "--plot", force=force)
    tr = read_trace(trace)
    note = ""
    load = tr.manifest.extra.get("probe_other_cpu")  # the recorder's measure of a busy machine
    busy = f"; other processes took {load:.0%} of the CPU while it was probed" if load is not None else ""
    model = fit_latency(tr.latency, name=name or out.stem, hardware=tr.manifest.hardware, form=form,
                        source=f"least-squares fit of {tr.path} latency samples (simlab calibrate){busy}",
                        draft_layer=tr.manifest.draft_layer)
    thin = thin_fits(model)
    if strict and thin:
        raise SimlabError(f"--strict: {len(thin)} series of {tr.path} rest on too few samples, the first: {thin[0]}")
    try:
        model.held_out = held_out(tr.latency, form=form, draft_layer=tr.manifest.draft_layer).to_dict()
    except SimlabError as exc:  # too few repeats: the fit still stands
        note = f"no held-out check: {exc}"
    path = save_profile(model, out)
    if plot:
        from simlab.latency.plot import plot_fit

        plot_fit(model, tr.latency, plot)
    if json_out:
        print_json({"profile": str(path), **model.to_profile(), "too_few_samples": thin})
        return
    console.print(f"trace: {trace_label(tr)}")
    table = Table(title=f"latency fit {model.name}", header_style="bold")
    for col in ("series", "form", "samples", "R² (medians)", "median |err|", "worst point", "measured ms", "fit ms",
                "err"):
        table.add_column(col)
    fits = [(1, model), *sorted(model.batches.items())]  # batch sizes of the probe's batch axis
    for b, series, corun, s in ((b, sr, c, s) for b, m in fits for (sr, c), s in sorted(m.surfaces.items())):
        q, w = s.quality, s.quality["worst_point"]
        size = "" if series == "draft" else f"{SIZE_NAMES[series]}={w['x']} "
        batch = f" x{b} sequences" if b > 1 else ""
        table.add_row(f"{series}{' (co-run)' if corun else ''}{batch}", s.form, str(q["samples"]),
                      "-" if q["r2"] != q["r2"] else f"{q['r2']:.3f}", f"{100 * q['median_abs_rel_err']:.1f}%",
                      f"{size}ctx={w['context_len']}", f"{1e3 * w['measured_s']:.1f}", f"{1e3 * w['fitted_s']:.1f}",
                      _pct(w["rel_err"]))
    console.print(table)
    h = model.held_out
    if h:
        console.print(f"held-out samples ({h['folds']} folds, one repeat left out at a time): median |error| "
                      f"{100 * h['fitted_median']:.1f}% (90th percentile {100 * h['fitted_p90']:.1f}%); "
                      f"the median table: {100 * h['table_median']:.1f}%")
    else:
        console.print(f"[yellow]note:[/] {note}")
    for line in thin:
        console.print(f"[yellow]too few samples:[/] {line}", highlight=False)
    console.print(f"wrote {path}" + (f" and {plot}" if plot else ""))


@calibrate_app.command("roofline")
def roofline(
    target_config: Annotated[Optional[str], typer.Option("--target-config", help="Target model: a name (see --list) or a JSON file (simlab shape or Hugging Face config.json).")] = None,
    draft_config: Annotated[Optional[str], typer.Option("--draft-config", help="Draft model, as --target-config; leave out for self-speculative drafting.")] = None,
    draft_layer: Annotated[Optional[int], typer.Option("--draft-layer", help="Self-speculative: the exit layer that drafts (without --draft-config).")] = None,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU name (see --list).")] = "a100-80g",
    out: Annotated[Optional[Path], typer.Option("--out", help="Profile to write, e.g. calibrate/roofline/NAME.json.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Weight and KV-cache dtype: bfloat16, float16, float32 or int8.")] = "bfloat16",
    framework: Annotated[str, typer.Option("--framework", help="Fixed per-layer/per-forward overhead fitted to published figures of this framework, or 'ideal' for none.")] = "hf-eager",
    name: Annotated[Optional[str], typer.Option("--name", help="Profile name.", show_default="the --out file's stem")] = None,
    check: Annotated[bool, typer.Option("--check", help="Compare the model with the published latencies in calibrate/roofline/published.csv.")] = False,
    list_known: Annotated[bool, typer.Option("--list", help="List the known GPUs and model shapes.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    force: Force = False,
) -> None:
    """Predict T_d and T_v(k, ctx) for hardware you do not have, from model shapes and a GPU's
    memory bandwidth and matmul rate (a roofline), plus a framework overhead per layer and
    per forward fitted to published figures."""
    from rich.table import Table

    from simlab.latency import roofline as rf
    from simlab.latency.model import save_profile
    from simlab.trace.schema import NO_LAYER

    if list_known:
        return _list_known(rf, json_out)
    if check:
        return _check(rf, framework, json_out)
    if not (target_config and out):
        raise SimlabError("calibrate roofline needs --target-config and --out (or --check, or --list)")
    check_output(out, force=force)
    model = rf.RooflineLatency(
        name=name or out.stem,
        target=rf.model_shape(target_config),
        draft=rf.model_shape(draft_config) if draft_config else None,
        gpu=rf.gpu_spec(gpu),
        dtype=dtype,
        overhead=rf.fit_overhead(framework),
        draft_layer=NO_LAYER if draft_layer is None else draft_layer,
    )
    path = save_profile(model, out)
    rows = [{"k": k, "target_ms": 1e3 * model.target_forward(k, REPORT_CONTEXT)} for k in REPORT_KS]
    trees = [{"nodes": n, "target_ms": 1e3 * model.target_tree(n + 1, REPORT_CONTEXT)} for n in REPORT_TREE_NODES]
    draft_ms = 1e3 * model.draft_step(REPORT_CONTEXT) if model.draft or model.draft_layer != NO_LAYER else None
    if json_out:
        print_json({"profile": str(path), "context_len": REPORT_CONTEXT, "draft_step_ms": draft_ms,
                    "target_forward_ms": rows, "target_tree_ms": trees, **model.to_profile()})
        return
    o = model.overhead
    console.print(f"{model.name}: {model.target.name}" + (f" drafted by {model.draft.name}" if model.draft else "")
                  + f" on {model.hardware}, {dtype}; overhead ({o.framework}) {1e3 * o.per_layer_s:.3f} ms/layer "
                  f"+ {1e3 * o.per_forward_s:.2f} ms/forward")
    for m in (model.draft, model.target):
        if m and model.gpus_needed(m) > 1:
            console.print(f"[yellow]note:[/] {m.name} needs {model.gpus_needed(m)} GPUs' memory; modelled as layers "
                          "split over GPUs that run one after another (device_map='auto')")
    table = Table(title=f"predicted at context {REPORT_CONTEXT}", header_style="bold")
    table.add_column("forward")
    table.add_column("ms", justify="right")
    if draft_ms is not None:
        table.add_row("draft step", f"{draft_ms:.2f}")
    for r in rows:
        table.add_row(f"target, k={r['k']}", f"{r['target_ms']:.2f}")
    for r in trees:
        table.add_row(f"target, tree of {r['nodes']} nodes", f"{r['target_ms']:.2f}")
    console.print(table)
    console.print(f"wrote {path}")


def _list_known(rf, json_out: bool) -> None:
    from rich.table import Table

    gpus, models = rf.known_gpus(), rf.known_models()
    if json_out:
        print_json({"gpus": [g.__dict__ for g in gpus.values()], "models": [m.__dict__ for m in models.values()]})
        return
    t = Table(title="GPUs (calibrate/roofline/gpus.json)", header_style="bold")
    for col in ("name", "label", "memory GB", "bandwidth GB/s", "matmul TFLOPS"):
        t.add_column(col)
    for g in gpus.values():
        t.add_row(g.name, g.label, f"{g.memory_gb:g}", f"{g.memory_bandwidth_gb_s:g}", f"{g.matmul_tflops:g}")
    console.print(t)
    t = Table(title="model shapes (calibrate/roofline/models.json)", header_style="bold")
    for col in ("name", "layers", "hidden", "ffn", "vocab", "heads/kv", "params (B)"):
        t.add_column(col)
    for m in models.values():
        t.add_row(m.name, str(m.layers), str(m.hidden), str(m.ffn), str(m.vocab), f"{m.heads}/{m.kv}",
                  f"{m.total_params / 1e9:.2f}")
    console.print(t)


def _check(rf, framework: str, json_out: bool) -> None:
    from rich.table import Table

    df = rf.check_published(framework)
    overhead = rf.fit_overhead(framework)
    if json_out:
        print_json({"overhead": overhead.__dict__, "rows": df.to_dict(orient="records")})
        return
    console.print(f"overhead ({framework}): {1e3 * overhead.per_layer_s:.3f} ms/layer + "
                  f"{1e3 * overhead.per_forward_s:.2f} ms/forward; {overhead.source}")
    t = Table(title="roofline vs published per-token latencies", header_style="bold")
    for col in ("source", "model", "gpu", "role", "published ms", "roofline ms", "err", "+overhead ms", "err"):
        t.add_column(col)
    for r in df.itertuples(index=False):
        t.add_row(r.source, r.model, r.gpu, r.role, f"{1e3 * r.seconds:.2f}", f"{1e3 * r.ideal_s:.2f}",
                  _pct(r.ideal_rel_err), f"{1e3 * r.predicted_s:.2f}", _pct(r.rel_err))
    console.print(t)


@calibrate_app.command("predictor")
def predictor(
    trace: Annotated[Path, typer.Argument(help="Trace directory to train on.")],
    out: Annotated[Path, typer.Option("--out", help="Predictor JSON to write.")],
    kind: Annotated[str, typer.Option("--kind", help="logistic or mlp.")] = "logistic",
    gamma: Annotated[int, typer.Option("--gamma", help="γ of the vanilla-SD replay that produces the examples.")] = 8,
    test_fraction: Annotated[float, typer.Option("--test-fraction", help="Share of prompts held out for scoring.")] = 0.3,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the prompt split (and of stochastic replay).")] = 0,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    force: Force = False,
) -> None:
    """Train an acceptance predictor (confidence, entropy, draft position, recent acceptance)
    on one split of the prompts; report AUC and calibration on the other. The JSON loads
    without scikit-learn: `simlab simulate --policy ags --predictor PATH`."""
    from rich.table import Table

    from simlab.predictor.model import save_predictor
    from simlab.predictor.train import train
    from simlab.trace.io import read_trace

    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise SimlabError("training a predictor needs scikit-learn: pip install 'simlab[calibrate]'") from None
    if gamma < 1:
        raise SimlabError(f"--gamma must be >= 1, got {gamma}")
    check_output(out, force=force)
    tr = read_trace(trace)
    model = train(tr, kind=kind, gamma=gamma, test_fraction=test_fraction, seed=seed)
    path = save_predictor(model, out)
    r = model.report
    if json_out:
        print_json({"predictor": str(path), **model.to_dict()})
        return
    console.print(f"trace: {trace_label(tr)}")
    console.print(f"examples from {r['replay']}: {r['train_examples']} "
                  f"train ({len(r['train_prompts'])} prompts), {r['test_examples']} test ({len(r['test_prompts'])} "
                  f"prompts, acceptance {r['test_accept_rate']:.3f})")
    t = Table(title="held-out prompts", header_style="bold")
    for col in ("predictor", "AUC", "ECE", "Brier", "log loss"):
        t.add_column(col)
    for label, s in ((model.name, r["test"]), ("draft confidence (untrained)", r["test_confidence_baseline"])):
        t.add_row(label, f"{s['auc']:.3f}", f"{s['ece']:.3f}", f"{s['brier']:.3f}", f"{s['log_loss']:.3f}")
    console.print(t)
    t = Table(title=f"reliability of {model.name} (held-out)", header_style="bold")
    for col in ("predicted", "tokens", "mean predicted", "accepted"):
        t.add_column(col)
    for b in r["test"]["reliability"]:
        t.add_row(f"{b['low']:.1f}-{b['high']:.1f}", str(b["count"]), f"{b['mean_predicted']:.3f}",
                  f"{b['accepted_rate']:.3f}")
    console.print(t)
    console.print(f"wrote {path}")
