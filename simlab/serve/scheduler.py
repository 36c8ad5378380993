"""Continuous batching: which waiting requests join the batch at the start of an engine step.

The rules (docs/serving.md):

- First come, first served: requests are admitted in arrival order, and a request that does
  not fit blocks the ones behind it (no overtaking, so no request starves).
- At most ``max_batch`` requests decode at once (running plus admitted).
- A step's token budget bounds its prefill tokens plus one token per running request (the
  least each decoder verifies). Draft tokens are not budgeted: how many a step verifies is
  what the drafting policies decide. ``check`` makes sure the longest prompt fits beside a
  full batch, so the head of the queue is always admitted eventually.
- Admitted requests are prefilled in the same step and decode from the next step on. Where
  their prefill runs is ``mixed``'s choice. Off (the default): in forwards of their own, before
  the running requests' draft and verification forwards (prefill-first, as vLLM's default
  scheduler does). On: their prompts ride in the running requests' verification forward, one
  target forward over every decoder's drafts and every admitted prompt, as llama.cpp's
  ``llama-server`` builds its batch (``update_slots`` in ``tools/server/server-context.cpp``: the
  generating slots' tokens and drafts first, then pending prompt tokens up to ``n_batch``, then one
  ``llama_decode``), so an admitted request's first token comes at the end of that forward.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simlab.common.errors import SimlabError

if TYPE_CHECKING:  # the CLI reads this module's defaults without the engine
    from simlab.serve.request import ServedRequest

DEFAULT_MAX_BATCH = 8
DEFAULT_TOKEN_BUDGET = 2048


@dataclass(frozen=True)
class Scheduler:
    max_batch: int = DEFAULT_MAX_BATCH
    token_budget: int = DEFAULT_TOKEN_BUDGET
    mixed: bool = False
    # what the token budget is called where the user sets it, for the error that says it is too
    # small (llama-cpp serve predicts llama-server, whose budget is its batch, -b)
    budget_name: str = "--token-budget"

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise SimlabError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.token_budget < 1:
            raise SimlabError(f"--token-budget must be >= 1, got {self.token_budget}")

    def check(self, longest_prompt: int) -> None:
        """The longest prompt must fit in a step beside a full batch of decoders."""
        need = longest_prompt + self.max_batch - 1
        if self.token_budget < need:
            raise SimlabError(f"{self.budget_name} {self.token_budget} is too small: the longest prompt ({longest_prompt} "
                              f"tokens) beside {self.max_batch - 1} running requests needs {need}")

    def admit(self, waiting: deque[ServedRequest], running: int) -> list[ServedRequest]:
        """Pop the requests that join this step from the head of ``waiting``."""
        admitted: list[ServedRequest] = []
        tokens = running
        room = self.max_batch - running
        while waiting and len(admitted) < room and tokens + waiting[0].prompt_len <= self.token_budget:
            r = waiting.popleft()
            tokens += r.prompt_len
            admitted.append(r)
        return admitted
