"""Hypothesis runs derandomised: every run draws the same examples, so a pass is reproducible
and a mutant killed by a property test is not killed by luck (the mutation campaign and its CI
sample rely on it). ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples instead, to hunt
for new counterexamples locally."""

import os

import pytest
from hypothesis import settings

from simlab.common.openmp import wait_passively

pytest_plugins = ["tests.live_fixtures"]  # the real-model fixtures of the live tests

# Torch's threads wait as every simlab command makes them (simlab.common.openmp): spinning, the
# two xdist workers' decodes on the 2-core box slow each other several-fold. And each worker takes
# its share of the cores (one each on 2 cores, two workers), subprocesses it starts included, where
# torch's default of one thread a core gave each of the two workers' models both cores.
wait_passively()
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1)
                                                     // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))

settings.register_profile("derandomized", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))


def pytest_addoption(parser):
    # the mutation sample runs the fast subset once per mutant (about a minute each on 2 cores):
    # a named run, `python -m pytest tests/test_mutation_sample.py --mutants`, not the default suite's
    parser.addoption("--mutants", action="store_true",
                     help="also run tests/test_mutation_sample.py's mutant runs (tens of minutes)")


LONGEST = ("test_live", "test_vllm_real", "test_live_policies")  # 7-12 minutes each on 2 cores


def pytest_collection_modifyitems(config, items):
    # the files that run real models first: .ci/run hands whole files to two workers
    # (--dist loadfile), and the longest ones started last would leave one worker idle at the end.
    # (xdist itself reorders files by their number of tests, most first, unless told not to:
    # .ci/run passes --no-loadscope-reorder, without which this order is lost)
    slow = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    # stable: each file's order is kept; the longest files before the other slow ones (on 2026-12-03
    # test_vllm_real.py, collected late, ran alone for the suite's last 6 minutes)
    items.sort(key=lambda item: (item.module.__name__ not in slow,
                                 item.module.__name__.rpartition(".")[2] not in LONGEST))
    if config.getoption("--mutants"):
        return
    skip = pytest.mark.skip(reason="a mutant run: python -m pytest tests/test_mutation_sample.py --mutants")
    for item in items:
        if item.get_closest_marker("mutants"):
            item.add_marker(skip)
