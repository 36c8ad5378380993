"""How torch's OpenMP threads wait, set the same way by every command that times forwards; and
numpy's BLAS threads, which the CLI does without.

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


def one_blas_thread() -> None:
    """Give numpy's OpenBLAS one thread; call before numpy is first imported (OpenBLAS starts its
    threads when it loads). It starts one per core on import, and they spin: on this project's
    2-core CPU (AMD EPYC, 8 interleaved runs each, docs/benchmarks.md), ``simlab sweep --help``
    took a median of 0.42 CPU-seconds with them and 0.31 without, ``simlab simulate`` 0.70 against
    0.67, where start-up is the cost. simlab's numpy work is small arrays and least squares, and nothing it computes moves:
    ``tools/simulate_json_diff.py`` gave 833 of 833 runs identical and ``calibrate fit`` wrote
    byte-identical profiles of every shipped trace. Torch (MKL) is not affected. A value the user
    set is kept."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
