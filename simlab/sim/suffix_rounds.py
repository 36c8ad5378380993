"""Suffix decoding's proposals, compiled: the trees of :mod:`simlab.policies.suffix` in flat arrays.

Why. The policy's trees are nested Python lists (the rule written to be read, checked position by
position against Arctic Inference's own cache, ``results/lookup/arctic_check.py``); walked by the
round protocol they simulate about two thousand tokens a CPU-second, where ``simlab bench`` asks
half a million. The replay (:mod:`simlab.sim.lookup_rounds`) needs only each round's proposal, and
a round's proposal is a function of what the trees hold at its position, which is a function of
the tokens alone, in trace order:

- :meth:`~simlab.policies.suffix_tree.SuffixTree.extend` counts a sequence's tokens one at a time (its
  last suffixes are kept between calls), so a tree that took the tokens in any cuts holds the
  same counts and the same sibling orders as one that took them token by token;
- the request's own tree takes the prompt, then the tokens committed, at each lookup; the global
  tree takes every response in full when its prompt ends (``settle``, with the whole context) and
  the current response's tokens at each lookup, prompts in trace order (one after another);
- a proposal reads the trees, the context's last ``max_tree_depth`` tokens and its cap
  (``min(num_tokens, budget - committed - 1)``, a function of the position).

So :func:`rounds` walks a prompt's rounds as :func:`simlab.policies.rounds.decode` does, bringing
both trees up to the round's position token by token and speculating there only (no position but
a round's start is looked up; nothing is kept from one simulation to the next).

The arrays. A node is a row of ``nodes`` (``COUNT``, the first and last of its children in
Arctic's sibling order, its previous and next sibling, its token, its parent, its slot in the
table or ``EMPTY``); a child is the head of its parent's order (the most frequent: most often the
one asked for) or found by an open-addressing table from (parent, token) to the child's row. The
table holds only the children a lookup cannot find as the head: every child but the head, and a
head once it has lost its place. A node made as its parent's first child takes no slot: on the
bench's trace 95% of the global tree's nodes are (a sequence's deep suffixes are new), so the
table holds a few per cent of the nodes and is sized by what it holds (:meth:`Tree.room` grows
it before a prompt that could outgrow it), not by the rows: the global tree's table with a slot
for every node was 4 MB there, filled anew each run and probed at random, and the loop took 9.5
ms a run against 3.0 ms now (one process, the two alternating; ``results/lookup/README.md``).
The root keeps no sibling order:
the policy never reads it (a match is at least one token long) and never reorders it. The node
of a suffix the tree has just counted is one of the sequence's last suffixes (``active``), so a
match of m tokens is read there where the sequence is m tokens long, and walked from the root
otherwise (the global tree, where the context's suffix reaches into the prompt). Probabilities
and scores are float32, as in the policy and in Arctic.

Bit for bit the round protocol running :class:`~simlab.policies.suffix.SuffixDecoding`
(``tests/test_lookup_compiled.py``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from simlab.sim.lookup_verify import accepted

COUNT, FIRST, LAST, PREV, NEXT, TOKEN, PARENT, SLOT = range(8)
EMPTY = -1


class Tree:
    """One suffix tree in arrays: ``nodes`` (int32 rows, those past ``meta[0]`` unused), the
    child table (``table``: key then row, slot by slot), ``meta`` (rows used, the length of
    ``active``, the table's entries) and ``active`` (the current sequence's last suffixes,
    longest first). Rows for ``tokens`` tokens, the table for the next ``ahead`` (by default all
    of them); :meth:`room` grows both before a prompt that could outgrow them."""

    def __init__(self, depth: int, tokens: int, ahead: int | None = None):
        self.depth = depth
        self.active = np.zeros(depth + 1, dtype=np.int64)
        self.meta = np.array([1, 0, 0], dtype=np.int64)
        self.nodes = np.empty((1 + depth * tokens, 8), dtype=np.int32)  # a row is written when its node is made
        self.nodes[0] = EMPTY
        self.nodes[0, COUNT] = 0
        self.table = _table(depth * (tokens if ahead is None else ahead))

    def room(self, tokens: int) -> None:
        """Make room for ``tokens`` more tokens: each counts at most ``depth`` new nodes, each of
        which may take a slot of the table."""
        used, new = int(self.meta[0]), self.depth * tokens
        if used + new > len(self.nodes):
            grown = np.empty((max(used + new, 2 * len(self.nodes)), 8), dtype=np.int32)
            grown[:used] = self.nodes[:used]
            self.nodes = grown
        entries = int(self.meta[2]) + new
        if 2 * entries > len(self.table) // 2:
            table = _table(entries)
            _rehash(self.nodes, self.table, table)
            self.table = table

    def clear(self) -> None:
        """Empty the tree (a new request's own tree)."""
        _clear(self.nodes, self.meta, self.table)

    def new_sequence(self) -> None:
        self.meta[1] = 0

    def arrays(self):
        return self.nodes, self.table, self.meta, self.active


def _table(entries: int) -> np.ndarray:
    """An empty child table for ``entries`` children, at most half full."""
    return np.full(2 << max(int(2 * entries - 1).bit_length(), 4), EMPTY, dtype=np.int64)


@njit(cache=True)
def _slot(table, key):
    """The slot of ``key`` in the table, or the empty one where it would go (linear probing)."""
    mask = np.uint64(len(table) // 2 - 1)
    h = np.uint64(key)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    i = np.int64(h & mask)
    while table[2 * i] != EMPTY and table[2 * i] != key:
        i = (i + 1) & np.int64(mask)
    return i


@njit(cache=True)
def _key(parent, token):
    return (np.int64(parent) << 32) | np.int64(token)


@njit(cache=True)
def _child(nodes, table, parent, token):
    """The row of ``parent``'s child ``token``, or EMPTY: its head, or in the table."""
    head = nodes[parent, FIRST] if parent != 0 else EMPTY
    if head != EMPTY and nodes[head, TOKEN] == token:
        return head
    if parent != 0 and head == EMPTY:  # no child
        return EMPTY
    i = _slot(table, _key(parent, token))
    return table[2 * i + 1] if table[2 * i] != EMPTY else EMPTY


@njit(cache=True)
def _rehash(nodes, old, table):
    """Fill an empty table with the children the ``old`` one holds."""
    for i in range(len(old) // 2):
        if old[2 * i] != EMPTY:
            s = _slot(table, old[2 * i])
            table[2 * s], table[2 * s + 1] = old[2 * i], old[2 * i + 1]
            nodes[old[2 * i + 1], SLOT] = s


@njit(cache=True)
def _put(nodes, table, meta, s, key, child):
    """Put ``child`` (its parent's, as ``key`` says) in the table's empty slot ``s``."""
    table[2 * s], table[2 * s + 1] = key, child
    nodes[child, SLOT] = s
    meta[2] += 1


@njit(cache=True)
def _clear(nodes, meta, table):
    """Empty the tree: its nodes' slots, then its rows."""
    for child in range(1, meta[0]):
        if nodes[child, SLOT] != EMPTY:
            table[2 * nodes[child, SLOT]] = EMPTY
    nodes[0] = EMPTY
    nodes[0, COUNT] = 0
    meta[0], meta[1], meta[2] = 1, 0, 0


@njit(cache=True)
def _promote(nodes, table, meta, parent, child):
    """Move ``child`` (its count about to rise by one) where Arctic's sibling list puts it
    (:func:`simlab.policies.suffix_tree._promote`, on linked rows)."""
    prev = nodes[child, PREV]
    if prev == EMPTY:
        return
    before = nodes[prev, COUNT]
    if before > nodes[child, COUNT] + 1:
        return
    h = prev  # the front of the group of counts equal to the one just before it
    while nodes[h, PREV] != EMPTY and nodes[nodes[h, PREV], COUNT] == before:
        h = nodes[h, PREV]
    nxt = nodes[child, NEXT]  # unlink the child
    nodes[prev, NEXT] = nxt
    if nxt != EMPTY:
        nodes[nxt, PREV] = prev
    else:
        nodes[parent, LAST] = prev
    ahead = nodes[h, PREV]  # then put it just before h
    nodes[child, PREV], nodes[child, NEXT], nodes[h, PREV] = ahead, h, child
    if ahead != EMPTY:
        nodes[ahead, NEXT] = child
    else:  # the child heads the order: the old head, found by the table from now on, joins it
        nodes[parent, FIRST] = child
        if nodes[h, SLOT] == EMPTY:
            key = _key(parent, nodes[h, TOKEN])
            _put(nodes, table, meta, _slot(table, key), key, h)


@njit(cache=True)
def extend(nodes, table, meta, active, depth, token):
    """Append ``token`` to the current sequence (:meth:`~simlab.policies.suffix_tree.SuffixTree.extend`):
    each of its last suffixes of up to ``depth`` tokens, the new one-token suffix included, is counted."""
    n = meta[1]
    if n == depth:  # the longest suffix grows past the depth: dropped
        for i in range(depth - 1):
            active[i] = active[i + 1]
        n -= 1
    active[n] = 0
    n += 1
    meta[1] = n
    nodes[0, COUNT] += 1
    for i in range(n):
        node = active[i]
        head = nodes[node, FIRST] if node != 0 else EMPTY
        if head != EMPTY and nodes[head, TOKEN] == token:  # the most frequent child, found without a search
            nodes[head, COUNT] += 1  # (it stays first: _promote leaves the head where it is)
            active[i] = head
            continue
        key, s = _key(node, token), EMPTY
        if node == 0 or head != EMPTY:  # (a node with no child yet: the new one heads its order, off the table)
            s = _slot(table, key)
            if table[2 * s] != EMPTY:
                child = table[2 * s + 1]
                if node != 0:
                    _promote(nodes, table, meta, node, child)
                nodes[child, COUNT] += 1
                active[i] = child
                continue
        child = meta[0]
        meta[0] += 1
        nodes[child, COUNT], nodes[child, TOKEN], nodes[child, PARENT], nodes[child, SLOT] = 1, token, node, EMPTY
        if s != EMPTY:
            _put(nodes, table, meta, s, key, child)
        nodes[child, FIRST] = nodes[child, LAST] = nodes[child, NEXT] = EMPTY
        if node != 0:  # a new child joins the back of the order
            last = nodes[node, LAST]
            nodes[child, PREV] = last
            if last != EMPTY:
                nodes[last, NEXT] = child
            else:
                nodes[node, FIRST] = child
            nodes[node, LAST] = child
        else:
            nodes[child, PREV] = EMPTY
        active[i] = child


@njit(cache=True)
def speculate(nodes, table, meta, active, context, n, depth, max_tokens, factor, floor, draft, best):
    """The best-scoring draft after ``context[:n]`` (:meth:`~simlab.policies.suffix_tree.SuffixTree.speculate`
    over its last ``depth`` tokens) into ``best``; returns its length and score. ``active``: the
    tree's current sequence, whose last ``meta[1]`` tokens are the context's last ones."""
    p = min(depth, n)
    held = meta[1]
    best_len, best_score = 0, np.float32(0.0)
    for m in range(1, p):
        if m <= held:
            node = active[held - m]
        else:
            node = 0
            for t in range(n - m, n):
                node = _child(nodes, table, node, context[t])
                if node == EMPTY:
                    return best_len, best_score
        cap = min(max_tokens, int(float(np.float32(m) * factor) + 1e-6))
        length, score, prob = 0, np.float32(0.0), np.float32(1.0)
        while length < cap:
            child = nodes[node, FIRST]
            if child == EMPTY:
                break
            ratio = np.float32(np.float32(nodes[child, COUNT]) / np.float32(nodes[node, COUNT]))
            prob = np.float32(prob * ratio)
            if prob < floor:
                break
            draft[length] = nodes[child, TOKEN]
            length += 1
            score = np.float32(score + prob)
            node = child
        if score >= best_score:
            best[:length] = draft[:length]
            best_len, best_score = length, score
    return best_len, best_score


@njit(cache=True)
def rounds(tokens, prompt_len, end, budget, num_tokens, depth, factor, floor, use_global, own, cache, draft, best,
           theirs, out):
    """One prompt's rounds into ``out`` (committed position, tokens proposed, accepted); returns
    how many. ``own``, ``cache``: the request's tree (empty) and the global one (the earlier
    responses', a new sequence begun), each as :meth:`Tree.arrays`; the global tree takes this
    response whole before returning, as the policy's ``settle`` does."""
    for t in range(prompt_len):
        extend(*own, depth, tokens[t])
    inserted, committed, r = 0, 1, 0  # target tokens both trees hold; tokens committed; rounds
    while committed < end:
        cap = min(num_tokens, budget - committed - 1)
        k = acc = 0
        if cap > 0:
            while inserted < committed:
                extend(*own, depth, tokens[prompt_len + inserted])
                if use_global:
                    extend(*cache, depth, tokens[prompt_len + inserted])
                inserted += 1
            n = prompt_len + committed
            k, score = speculate(*own, tokens, n, depth, cap, factor, floor, draft, best)
            if use_global:
                their_k, their_score = speculate(*cache, tokens, n, depth, cap, factor, floor, draft, theirs)
                if their_score > score:
                    k = their_k
                    best[:k] = theirs[:k]
            acc = accepted(best, tokens, n, k, end - committed - 1)
        out[r, 0], out[r, 1], out[r, 2] = committed, k, acc
        r += 1
        committed += acc + 1
    if use_global:
        while inserted < end:
            extend(*cache, depth, tokens[prompt_len + inserted])
            inserted += 1
    return r
