"""What a policy is shown about a token the draft just produced.

Defined apart from both the trace (which produces signals when replaying) and the policies
(which read them) so that neither imports the other. A signal carries only what a real
decoder knows at that moment: never whether the token will be accepted.
"""

from __future__ import annotations

import math
from typing import NamedTuple


class TokenSignal(NamedTuple):
    """One drafted token as a policy sees it.

    ``index`` is the token's 1-based place in the current draft run; ``confidence`` the draft's
    top-1 probability (SPIDE eq. 2); ``entropy`` the draft entropy in nats (SVIP, AdaEDL);
    ``score`` a trained predictor's P(accept) when one was recorded, else NaN.
    """

    index: int
    confidence: float
    entropy: float
    score: float = math.nan
