"""Order-preserving matching of two op-name sequences (host ET ops vs Kineto ops of a thread).

Two traces of the same program list the same ops in the same order, with gaps where one of
them saw something the other did not (a profiler window that starts mid-iteration, ops on a
worker thread, a few record functions one of them omits). The matcher is patience-diff
style, so that it scales to long traces: strip the common prefix and suffix, anchor on
k-grams that occur exactly once in both ranges (k = 1, 2, 4, ... 32), keep the longest chain
of anchors that is increasing in both sequences, and recurse between anchors. Ranges small
enough (``_SMALL`` cells) are finished with ``difflib.SequenceMatcher``. A second pass aligns
what is left over on both sides, which recovers the other half when one trace is a rotation
of the other (window starting at the backward pass vs trace starting at the forward pass).
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from difflib import SequenceMatcher

_SMALL = 2_000_000        # n*m below which difflib finishes a range
_KS = (1, 2, 4, 8, 16, 32)


def align(a: Sequence[Hashable], b: Sequence[Hashable], *,
          second_pass: bool = True) -> list[tuple[int, int]]:
    """Pairs (i, j) with a[i] == b[j]; each index used at most once, sorted by i."""
    table: dict[Hashable, int] = {}
    ia = [table.setdefault(x, len(table)) for x in a]
    ib = [table.setdefault(x, len(table)) for x in b]
    out: list[tuple[int, int]] = []
    _match(ia, ib, 0, len(ia), 0, len(ib), out)
    if second_pass and out:
        used_a = {i for i, _ in out}
        used_b = {j for _, j in out}
        ra = [i for i in range(len(ia)) if i not in used_a]
        rb = [j for j in range(len(ib)) if j not in used_b]
        if ra and rb:
            extra: list[tuple[int, int]] = []
            _match([ia[i] for i in ra], [ib[j] for j in rb], 0, len(ra), 0, len(rb), extra)
            out.extend((ra[i], rb[j]) for i, j in extra)
    out.sort()
    return out


def _match(a: list[int], b: list[int], alo: int, ahi: int, blo: int, bhi: int,
           out: list[tuple[int, int]]) -> None:
    stack = [(alo, ahi, blo, bhi)]
    while stack:
        alo, ahi, blo, bhi = stack.pop()
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            out.append((alo, blo))
            alo += 1
            blo += 1
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi -= 1
            bhi -= 1
            out.append((ahi, bhi))
        if alo >= ahi or blo >= bhi:
            continue
        if (ahi - alo) * (bhi - blo) <= _SMALL:
            _difflib(a, b, alo, ahi, blo, bhi, out)
            continue
        anchors = _anchors(a, b, alo, ahi, blo, bhi)
        if not anchors:
            _difflib(a, b, alo, ahi, blo, bhi, out, autojunk=True)
            continue
        pi, pj = alo, blo
        for i, j in anchors:
            out.append((i, j))
            stack.append((pi, i, pj, j))
            pi, pj = i + 1, j + 1
        stack.append((pi, ahi, pj, bhi))


def _difflib(a, b, alo, ahi, blo, bhi, out, autojunk: bool = False) -> None:
    sm = SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=autojunk)
    for i, j, size in sm.get_matching_blocks():
        out.extend((alo + i + k, blo + j + k) for k in range(size))


def _anchors(a, b, alo, ahi, blo, bhi) -> list[tuple[int, int]]:
    """Positions of k-grams unique in both ranges, longest chain increasing in both."""
    for k in _KS:
        if ahi - alo < k or bhi - blo < k:
            break
        pa = _unique_grams(a, alo, ahi, k)
        pb = _unique_grams(b, blo, bhi, k)
        pairs = sorted((i, pb[g]) for g, i in pa.items() if g in pb)
        if len(pairs) >= 2 or (pairs and k == _KS[-1]):
            return _longest_chain(pairs)
    return []


def _unique_grams(s: list[int], lo: int, hi: int, k: int) -> dict:
    seen: dict = {}
    dup = set()
    for i in range(lo, hi - k + 1):
        g = s[i] if k == 1 else tuple(s[i:i + k])
        if g in seen:
            dup.add(g)
        else:
            seen[g] = i
    for g in dup:
        del seen[g]
    return seen


def _longest_chain(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest subsequence of ``pairs`` (sorted by i, i distinct) strictly increasing in j."""
    tails: list[int] = []        # smallest j ending a chain of each length
    tail_idx: list[int] = []
    prev = [-1] * len(pairs)
    for n, (_, j) in enumerate(pairs):
        k = bisect.bisect_left(tails, j)
        if k == len(tails):
            tails.append(j)
            tail_idx.append(n)
        else:
            tails[k] = j
            tail_idx[k] = n
        prev[n] = tail_idx[k - 1] if k else -1
    chain = []
    n = tail_idx[-1] if tail_idx else -1
    while n >= 0:
        chain.append(pairs[n])
        n = prev[n]
    chain.reverse()
    return chain
