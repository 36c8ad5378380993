"""Loading the draft/target pair of a live run and the executor that decodes with them."""

from __future__ import annotations

from simlab.live.executor import LiveExecutor
from simlab.live.setup import LiveSetup
from simlab.trace.io import Trace


def load_pair(setup: LiveSetup, trace: Trace | None) -> tuple[LiveExecutor, list[int]]:
    """The executor over the run's models, and the target's end tokens.

    A self-speculative run (``--draft-layer``) drafts with the target's first layers; the exit
    layers its policies may draft with are the comparison trace's, or every layer without one.
    """
    from simlab.common.signals import shadow_layers
    from simlab.models.early_exit import early_exit_draft
    from simlab.models.load import eos_token_ids, load_model

    cfg = setup.cfg
    target = load_model(setup.target_ref, setup.target_device, setup.dtype)
    exit_layers = None
    if setup.draft_ref is not None:
        draft = load_model(setup.draft_ref, setup.draft_device, setup.dtype)
    else:
        draft = early_exit_draft(target, cfg.draft_layer)
        recorded = list(trace.manifest.exit_layers) if trace is not None else []
        exit_layers = shadow_layers(recorded, target.config.num_hidden_layers)
    eos = eos_token_ids(target, setup.tokenizer)
    return LiveExecutor(draft, target, eos, cfg.temperature, cfg.seed, exit_layers=exit_layers), eos
