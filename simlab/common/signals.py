"""What a policy is shown about a token the draft just produced.

Defined apart from both the trace (which produces signals when replaying) and the policies
(which read them) so that neither imports the other. A signal carries only what a real
decoder knows at that moment: never whether the token will be accepted.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping, NamedTuple, Sequence

if TYPE_CHECKING:  # numpy is imported where a table is built: the policies import this module
    import numpy as np


class TokenSignal(NamedTuple):
    """One drafted token as a policy sees it.

    ``index`` is the token's 1-based place in the current draft run; ``confidence`` the draft's
    top-1 probability (SPIDE eq. 2); ``entropy`` the draft entropy in nats (SVIP, AdaEDL);
    ``score`` a trained predictor's P(accept) when one was recorded, else NaN; ``end`` whether
    the token is an end token (policies with ``stops_at_draft_end`` stop drafting after it).
    """

    index: int
    confidence: float
    entropy: float
    score: float = math.nan
    end: bool = False


class ShadowTokens(NamedTuple):
    """Every exit layer's greedy token at the positions a target forward has just settled.

    After the prefill and after each verification, the target's hidden states at every layer are
    at hand; DEL (§4.2) sends them through the LM head to get, per exit layer ℓ, the token that
    layer would have drafted (a *shadow token*), and whether it equals the target's token at
    position ``start + i``, with its top-1 probability. Only positions whose prefix the target
    has confirmed are included (the accepted drafts and the target's own token), so nothing here
    is a future acceptance bit.

    ``table`` holds them as the sums a policy takes over the positions (DEL's eqs. 2-3): row i is
    position ``start + i``, its columns 1, then per exit layer in the order of ``layers``
    (ascending) 1.0 or 0.0 for a match, then the confidence of a matching token (else 0.0), then
    that of a mismatching one (else 0.0). A round's sums over every layer are then a few numpy
    additions of rows of a slice of one table per prompt (:meth:`read` builds it), not a Python
    loop over layers and positions; the zeros leave sums as they were, to the last bit.
    """

    start: int
    layers: tuple[int, ...]
    table: np.ndarray

    @classmethod
    def read(cls, start: int, matches: Mapping[int, Sequence[bool]],
             confidence: Mapping[int, Sequence[float]]) -> ShadowTokens:
        """The shadow tokens of positions ``start``.. from each layer's matches and confidences."""
        import numpy as np  # here, not at the top: `simlab CMD --help` builds every policy's flags

        layers = tuple(sorted(matches))
        match = np.array([matches[layer] for layer in layers], dtype=bool).T
        conf = np.array([confidence[layer] for layer in layers], dtype=float).T
        columns = [np.ones((len(match), 1)), match, np.where(match, conf, 0.0), np.where(match, 0.0, conf)]
        return cls(start, layers, np.ascontiguousarray(np.hstack(columns)))  # a row's columns side by side


def shadow_layers(exit_layers: Sequence[int] | None, n_layers: int) -> list[int]:
    """The layers whose shadow tokens a self-speculative decoder computes, one exit head (final
    norm and LM head) each: the exit layers its policies may draft with (a trace's recorded
    ones), or, where none are named, every layer short of the last (1..L-1; layer L's token is
    the target's own). The one rule for the live decoder, which runs these heads, and the
    simulator, which prices them (tests/test_del_pricing.py holds both to it)."""
    return list(exit_layers) if exit_layers else list(range(1, n_layers))
