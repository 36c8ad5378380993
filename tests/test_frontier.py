"""The Pareto front (max speedup, min cost) on hand-made points, and against brute force."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simlab.sweep.frontier import pareto_front, pareto_mask

NAN = math.nan

# name: (cost, speedup, optimal?) — each row says why it is or is not on the front.
POINTS = {
    "cheapest": (0.7, 1.0, True),  # nothing costs less
    "cheap": (0.8, 1.5, True),
    "cheap-but-costlier": (0.9, 1.5, False),  # same speedup as "cheap" at a higher cost
    "parity": (1.0, 2.0, True),
    "parity-twin": (1.0, 2.0, True),  # an exact duplicate: duplicates do not dominate each other
    "parity-slower": (1.0, 1.5, False),  # same cost as "parity", slower
    "fast": (1.5, 2.5, True),
    "fast-costlier": (2.0, 2.5, False),  # same speedup as "fast", costlier
    "dominated": (2.0, 2.4, False),  # slower and costlier than "fast"
    "no-cost": (NAN, 3.0, False),  # NaN never optimal ...
    "no-speed": (0.5, NAN, False),  # ... and never dominates: "cheapest" stays optimal
}


def test_pareto_rows_of_hand_made_points():
    names = list(POINTS)
    cost = [POINTS[n][0] for n in names]
    speedup = [POINTS[n][1] for n in names]
    got = {n for n, m in zip(names, pareto_mask(speedup, cost)) if m}
    assert got == {n for n in names if POINTS[n][2]}


def test_front_is_sorted_by_cost():
    table = pd.DataFrame([(n, c, s) for n, (c, s, _) in POINTS.items()], columns=["label", "cost", "speedup"])
    front = pareto_front(table)
    assert list(front["label"]) == ["cheapest", "cheap", "parity", "parity-twin", "fast"]


def test_all_equal_points_are_all_optimal():
    assert pareto_mask([2.0] * 3, [1.0] * 3).tolist() == [True, True, True]


def test_no_valid_points_means_no_front():
    assert pareto_mask([NAN, 1.0], [1.0, NAN]).tolist() == [False, False]
    assert pareto_mask([], []).tolist() == []


def brute_force(speedup, cost):
    """The definition, pair by pair: optimal unless another valid row is at least as good on
    both counts and strictly better on one."""
    out = []
    for i in range(len(speedup)):
        if not (np.isfinite(speedup[i]) and np.isfinite(cost[i])):
            out.append(False)
            continue
        out.append(not any(
            np.isfinite(speedup[j]) and np.isfinite(cost[j])
            and speedup[j] >= speedup[i] and cost[j] <= cost[i]
            and (speedup[j] > speedup[i] or cost[j] < cost[i])
            for j in range(len(speedup))
        ))
    return out


# Few distinct values, so that ties and duplicates are common.
value = st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.5, NAN])


@given(st.lists(st.tuples(value, value), max_size=30))
def test_matches_the_definition(points):
    speedup = [p[0] for p in points]
    cost = [p[1] for p in points]
    assert pareto_mask(speedup, cost).tolist() == brute_force(speedup, cost)


def test_columns_of_unequal_length_are_refused_by_name():
    with pytest.raises(ValueError, match="^speedup and cost must be 1-D and of equal length$"):
        pareto_mask([2.0, 1.5], [1.0])


def test_a_missing_figure_given_as_none_counts_as_nan():
    # simlab's --json writes NaN as null, so figures read back from it hold None where a
    # speedup or a cost is missing: such a row is never optimal and never dominates
    assert pareto_mask([2.0, None, 1.0], [1.0, 0.5, None]).tolist() == [True, False, False]
