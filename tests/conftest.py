"""Hypothesis runs derandomised: every run draws the same examples, so a pass is reproducible
and a mutant killed by a property test is not killed by luck (the mutation campaign and its CI
sample rely on it). ``HYPOTHESIS_PROFILE=explore`` draws fresh random examples instead, to hunt
for new counterexamples locally."""

import os

from hypothesis import settings

settings.register_profile("derandomized", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "derandomized"))
