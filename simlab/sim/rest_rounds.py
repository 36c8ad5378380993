"""REST's retrieval, compiled: :meth:`simlab.policies.rest.Rest.propose` over the datastore's arrays.

Why. The policy retrieves with numpy calls over the suffix array (a binary search of Python
tuples, a ``np.unique`` per drafted token): about a thousand simulated tokens a CPU-second, where
``simlab bench`` asks half a million. A retrieval reads the datastore (fixed for the run), the
context's last ``max_suffix`` tokens, the round's cap and whether each sequence answered the
prompt (a function of the prompt), nothing else, so :func:`rounds` walks a prompt's rounds as
:func:`simlab.policies.rounds.decode` does and retrieves at each round's start, in one compiled
loop (nothing is kept from one simulation to the next, nor from one prompt to the next).

The same result by fewer steps. Each round finds, for every suffix length up to the longest that
occurs, the range of the suffix array whose suffixes start with the context's suffix of that
length (:func:`_ranges`), from the last round's ranges: the m-token suffix of the context is the
last context's suffix of m - d tokens then the d tokens committed since, so its occurrences are
a part of that one's range, found by binary searches within it that compare the d new tokens
only; the suffixes of the d new tokens alone are searched in the whole array. A suffix one token longer than one that occurs nowhere occurs nowhere
either, which bounds the lengths searched. The policy then tries each length from ``max_suffix``
down and stops at the first with an occurrence that counts (not in a sequence that answered the
prompt, its continuation not at a separator): the lengths with a counted occurrence are the
shortest up to some length (a counted occurrence one token on is one of the suffix a token
shorter), so that length is bisected over the ranges. A search is a binary search of Python's
tuple order (a window cut short by the array's end sorts first); the counted occurrences are
taken in suffix-array order, the first ``max_matches`` of them; then at each depth the
continuation token most of them share (the smallest on a tie: ``np.unique`` sorts, ``np.argmax``
takes the first), keeping the occurrences that follow it. The suffix array orders positions by
their next :data:`~simlab.common.datastore.KEY` tokens, so the continuation tokens come sorted,
as long as the suffix and the draft so far are shorter than that; past it they are sorted here.

Bit for bit the round protocol running :class:`~simlab.policies.rest.Rest`
(``tests/test_lookup_compiled.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simlab.common.datastore import KEY, SEPARATOR
from simlab.sim.lookup_verify import accepted


@njit(cache=True)
def _compare(store, pos, context, start, m):
    """The order of ``store[pos:pos + m]`` against ``context[start:start + m]``, as Python orders
    tuples: -1, 0 or 1."""
    for i in range(m):
        if pos + i >= len(store):
            return -1  # shorter, and equal as far as it goes
        a, b = store[pos + i], context[start + i]
        if a != b:
            return -1 if a < b else 1
    return 0


@njit(cache=True)
def _bound(store, order, context, start, m, same, lo, hi, below):
    """The first of ``order[lo:hi]`` (in order) whose suffix's order against ``context[start:start
    + m]`` is ``below`` or more: 0, the first >= it; 1, the first past those that start with it.
    Every suffix of ``order[lo:hi]`` starts with the pattern's first ``same`` tokens: compared from there."""
    while lo < hi:
        mid = (lo + hi) // 2
        if _compare(store, order[mid] + same, context, start + same, m - same) < below:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _ranges(store, order, context, n, seen, longest, ranges):
    """Bring ``ranges`` from ``context[:seen]`` to ``context[:n]``: row m, the range of ``order``
    whose suffixes start with the context's m-token suffix (:meth:`~simlab.common.datastore.Datastore.occurrences`),
    for m up to ``longest``; returns the longest m whose range is not empty (0: none). Rows
    past the one returned are stale; those up to it hold for the next call."""
    d, top = n - seen, 0
    for m in range(longest, d, -1):  # longest first: row m - d is still the last context's
        lo, hi = ranges[m - d, 0], ranges[m - d, 1]
        if lo < hi:
            lo = _bound(store, order, context, n - m, m, m - d, lo, hi, 0)
            hi = _bound(store, order, context, n - m, m, m - d, lo, hi, 1)
        ranges[m, 0], ranges[m, 1] = lo, hi
        if lo < hi and not top:
            top = m
    for m in range(1, min(d, longest) + 1):  # suffixes of the new tokens alone: the whole array
        lo = _bound(store, order, context, n - m, m, 0, 0, len(order), 0)
        hi = _bound(store, order, context, n - m, m, 0, lo, len(order), 1)
        ranges[m, 0], ranges[m, 1] = lo, hi
        if lo == hi:  # and no longer suffix occurs
            return m - 1
    return top if top else min(d, longest)


@njit(cache=True)
def _counted(store, owner, order, own, lo, hi, m):
    """The first of ``order[lo:hi]`` (occurrences of an ``m``-token suffix) that counts: not in a
    sequence that answered this prompt, its continuation not at a separator (``hi``: none)."""
    for j in range(lo, hi):
        pos = order[j]
        if not own[owner[pos]] and store[pos + m] != SEPARATOR:
            return j
    return hi


@njit(cache=True)
def retrieve(store, owner, order, own, cap, num_tokens, min_suffix, top, ranges, max_matches, at, values, draft):
    """REST's proposal into ``draft``; returns its length. ``ranges``, ``top``: the context's
    suffixes' ranges (:func:`_ranges`); ``own``: per sequence, whether it answered this prompt;
    ``at``, ``values``: room for ``max_matches``."""
    # the policy stops at the first length from the longest down with an occurrence that counts:
    # the lengths that have one are min_suffix up to some length (a counted occurrence, one token on,
    # is one of the suffix one token shorter, in the same sequence, with the same continuation), so
    # that length is found by bisection; a length past top occurs nowhere
    yes, no = min_suffix - 1, top + 1
    while no - yes > 1:
        mid = (yes + no) // 2
        if _counted(store, owner, order, own, ranges[mid, 0], ranges[mid, 1], mid) < ranges[mid, 1]:
            yes = mid
        else:
            no = mid
    if yes < min_suffix:
        return 0
    hi = ranges[yes, 1]
    found, j = 0, _counted(store, owner, order, own, ranges[yes, 0], hi, yes)
    while j < hi and found < max_matches:
        at[found] = order[j] + yes  # where the continuation starts
        found += 1
        j = _counted(store, owner, order, own, j + 1, hi, yes)
    k = 0
    for depth in range(min(num_tokens, cap)):
        m = 0
        for j in range(found):
            token = store[at[j] + depth]  # a continuation ends at its separator: never read past it
            if token != SEPARATOR:
                values[m] = token
                m += 1
        if not m:
            break
        ranked = values[:m]
        # in suffix-array order, which sorts by the first KEY tokens, the occurrences (all of the
        # suffix then the draft so far) are sorted by the token after, up to KEY; past it, sorted here
        if yes + depth >= KEY:
            ranked.sort()  # in place: values is scratch, and a sorted copy per depth is an allocation
        best, most, run = ranked[0], 0, 0
        for j in range(m):
            run = run + 1 if j and ranked[j] == ranked[j - 1] else 1
            if run > most:  # strictly more: the smallest token of the largest count
                best, most = ranked[j], run
        draft[k] = best
        k += 1
        kept = 0
        for j in range(found):
            if store[at[j] + depth] == best:
                at[kept] = at[j]
                kept += 1
        found = kept
    return k


@njit(cache=True)
def rounds(tokens, prompt_len, end, budget, num_tokens, min_suffix, max_suffix, max_matches, store, owner, order, own,
           at, values, draft, out):
    """One prompt's rounds into ``out`` (committed position, tokens proposed, accepted); returns how many."""
    ranges = np.empty((max_suffix + 1, 2), dtype=np.int64)  # per suffix length (_ranges)
    committed, r = 1, 0
    seen = top = 0  # the last retrieval's context length, and the longest suffix it found occurring
    while committed < end:
        cap = min(num_tokens, budget - committed - 1)
        k = acc = 0
        if cap > 0:
            n = prompt_len + committed
            # a suffix that occurs begins with a suffix of the last context, which occurs too: it is at
            # most that one's longest plus the tokens since
            top = _ranges(store, order, tokens, n, seen, min(max_suffix, n, top + n - seen), ranges)
            seen = n
            k = retrieve(store, owner, order, own, cap, num_tokens, min_suffix, top, ranges, max_matches, at, values,
                         draft)
            acc = accepted(draft, tokens, n, k, end - committed - 1)
        out[r, 0], out[r, 1], out[r, 2] = committed, k, acc
        r += 1
        committed += acc + 1
    return r
