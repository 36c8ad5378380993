"""REST's retrieval, compiled: :meth:`simlab.policies.rest.Rest.propose` over the datastore's arrays.

Why. The policy retrieves with numpy calls over the suffix array (a binary search of Python
tuples, a ``np.unique`` per drafted token): about a thousand simulated tokens a CPU-second, where
``simlab bench`` asks half a million. A retrieval reads the datastore (fixed for the run), the
context's last ``max_suffix`` tokens, the round's cap and whether each sequence answered the
prompt (a function of the prompt), nothing else, so :func:`rounds` walks a prompt's rounds as
:func:`simlab.policies.rounds.decode` does and retrieves at each round's start, in one compiled
loop (nothing is kept from one simulation to the next).

The same result by fewer steps: the policy tries each suffix length from ``max_suffix`` down and
stops at the first with an occurrence that counts (not in a sequence that answered the prompt, its
continuation not at a separator). Lengths that occur nowhere find nothing, and the longest that
occurs at all is found by bisection, below the last round's longest plus the tokens committed since;
the lengths with a counted occurrence are the shortest up to some length (a counted occurrence one
token on is one of the suffix a token shorter), so that length is bisected too, where the policy
walks down (on the bench's trace a round walked 7.6 lengths on average). Each search is the same pair of
binary searches (Python's tuple order: a window cut short by the array's end sorts first); the
counted occurrences in suffix-array order, the first ``max_matches`` of them; then at each depth the
continuation token most of them share (the smallest on a tie: ``np.unique`` sorts, ``np.argmax``
takes the first), keeping the occurrences that follow it.

Bit for bit the round protocol running :class:`~simlab.policies.rest.Rest`
(``tests/test_lookup_compiled.py``).
"""

from __future__ import annotations

from numba import njit

from simlab.common.datastore import SEPARATOR
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
def _first(store, order, context, start, m):
    """Where in ``order`` the first suffix >= ``context[start:start + m]`` is."""
    lo, hi = 0, len(order)
    while lo < hi:
        mid = (lo + hi) // 2
        if _compare(store, order[mid], context, start, m) < 0:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _longest(store, order, context, n, shortest, longest):
    """The longest suffix of ``context[:n]`` of ``shortest..longest`` tokens that occurs in the
    datastore at all (``shortest - 1``: none). A suffix of one that occurs occurs too, so the
    lengths that occur are found by bisection, not one by one."""
    yes, no = shortest - 1, longest + 1
    while no - yes > 1:
        mid = (yes + no) // 2
        lo = _first(store, order, context, n - mid, mid)
        if lo < len(order) and _compare(store, order[lo], context, n - mid, mid) == 0:
            yes = mid
        else:
            no = mid
    return yes


@njit(cache=True)
def _occurrences(store, order, context, start, m):
    """The range of ``order`` whose suffixes start with ``context[start:start + m]``
    (:meth:`~simlab.common.datastore.Datastore.occurrences`)."""
    lo = _first(store, order, context, start, m)
    first, hi = lo, len(order)
    while lo < hi:  # the first suffix that does not start with pattern
        mid = (lo + hi) // 2
        if _compare(store, order[mid], context, start, m) <= 0:
            lo = mid + 1
        else:
            hi = mid
    return first, lo


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
def retrieve(store, owner, order, own, context, n, cap, num_tokens, min_suffix, longest, max_matches, at, values,
             draft):
    """REST's proposal after ``context[:n]`` into ``draft``; returns its length and the longest
    suffix of at most ``longest`` tokens that occurs (:func:`_longest`). ``own``: per sequence,
    whether it answered this prompt; ``at``, ``values``: room for ``max_matches``."""
    # the policy searches from min(max_suffix, n) down; the longer suffixes occur nowhere
    top = _longest(store, order, context, n, min_suffix, longest)
    # and stops at the first length with an occurrence that counts: the lengths that have one are
    # min_suffix up to some length (a counted occurrence, one token on, is one of the suffix one token
    # shorter, in the same sequence, with the same continuation), so that length is found by bisection
    yes, no = min_suffix - 1, top + 1
    while no - yes > 1:
        mid = (yes + no) // 2
        lo, hi = _occurrences(store, order, context, n - mid, mid)
        if _counted(store, owner, order, own, lo, hi, mid) < hi:
            yes = mid
        else:
            no = mid
    if yes < min_suffix:
        return 0, top
    lo, hi = _occurrences(store, order, context, n - yes, yes)
    found, j = 0, _counted(store, owner, order, own, lo, hi, yes)
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
    return k, top


@njit(cache=True)
def rounds(tokens, prompt_len, end, budget, num_tokens, min_suffix, max_suffix, max_matches, store, owner, order, own,
           at, values, draft, out):
    """One prompt's rounds into ``out`` (committed position, tokens proposed, accepted); returns how many."""
    committed, r = 1, 0
    seen = top = 0  # the last retrieval's context length, and the longest suffix it found occurring
    while committed < end:
        cap = min(num_tokens, budget - committed - 1)
        k = acc = 0
        if cap > 0:
            n = prompt_len + committed
            # a suffix that occurs begins with a suffix of the last context, which occurs too: it is at
            # most that one's longest plus the tokens since (where that longest is max_suffix, the bound
            # is past max_suffix: no bound)
            longest = min(max_suffix, n, top + n - seen)
            k, top = retrieve(store, owner, order, own, tokens, n, cap, num_tokens, min_suffix, longest, max_matches,
                              at, values, draft)
            seen = n
            acc = accepted(draft, tokens, n, k, end - committed - 1)
        out[r, 0], out[r, 1], out[r, 2] = committed, k, acc
        r += 1
        committed += acc + 1
    return r
