"""How torch's OpenMP threads wait, set the same way by every command that times forwards.

Torch's CPU kernels run on OpenMP threads, which between parallel regions either spin (GNU
OpenMP's default, for a while) or sleep. Spinning threads turn a CPU shared with any other busy
process into a several-fold slowdown: on this project's 2-core CPU, SmolLM2-135M's forward of
2 sequences x 1 token took 165-306 ms spinning against 103-125 ms waiting passively while one
other decode ran. So simlab waits passively, and every command must do so alike, because on an
idle machine sleeping costs time: the same forward took 108-111 ms passively against 89-90 ms
spinning, 4 sequences 106 against 82-86 ms, one sequence 59-63 against 56 ms (medians of 5,
interleaved runs). A latency probe (``record``, ``live``'s re-probe) and the decode it prices
(``live``, ``serve --live``) that wait differently time two different programs: ``serve
--live`` once ran spinning against a passive probe and measured batched steps 20-30% faster
than predicted.
"""

from __future__ import annotations

import os


def wait_passively() -> None:
    """Make OpenMP threads sleep while they wait; call before torch is first imported (OpenMP
    reads the variable once, when it starts). A value the user set is kept."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
