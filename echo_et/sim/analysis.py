"""Where the simulated time goes: per-rank breakdown and the critical path."""

from __future__ import annotations

from typing import Any

import numpy as np

from echo_et.sim.program import CAT_COMPUTE, CAT_COPY, CAT_NAMES, CAT_SYNC, COMM_CATS

_COMPUTE_CATS = (CAT_COMPUTE, CAT_COPY)


def _union_len(lo: np.ndarray, hi: np.ndarray) -> int:
    if lo.size == 0:
        return 0
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    run_hi = np.maximum.accumulate(hi)
    # Each interval adds what lies beyond the furthest end seen before it.
    prev = np.concatenate(([lo[0]], run_hi[:-1]))
    add = np.clip(hi - np.maximum(lo, prev), 0, None)
    add[0] = hi[0] - lo[0]
    return int(add.sum())


def rank_breakdown(st) -> dict[str, int]:
    """Step time and its breakdown for one simulated rank (see :class:`RankResult`)."""
    prog = st.prog
    if prog.n_items == 0:
        return dict(step_time_ns=0, compute_ns=0, comm_ns=0, exposed_comm_ns=0, idle_ns=0,
                    sync_wait_ns=0, host_wait_ns=0)
    start = np.asarray(st.start, dtype=np.int64)
    end = np.asarray(st.end, dtype=np.int64)
    cats = np.asarray(prog.cat, dtype=np.int64)
    step = int(end.max() - st.origin)
    comp = np.isin(cats, _COMPUTE_CATS)
    comm = np.isin(cats, tuple(COMM_CATS))
    busy = comp | comm
    compute_ns = _union_len(start[comp], end[comp])
    comm_ns = _union_len(start[comm], end[comm])
    busy_ns = _union_len(start[busy], end[busy])
    if st.arrive:
        items = np.fromiter(st.arrive.keys(), dtype=np.int64)
        arr = np.fromiter(st.arrive.values(), dtype=np.int64)
        sync_wait = _union_len(arr, start[items])
    else:
        sync_wait = 0
    sync_items = np.flatnonzero(cats == CAT_SYNC)
    if sync_items.size:
        dur = np.asarray(st.dur, dtype=np.int64)[sync_items]
        host_wait = int(np.clip(end[sync_items] - start[sync_items] - dur, 0, None).sum())
    else:
        host_wait = 0
    return dict(
        step_time_ns=step,
        compute_ns=compute_ns,
        comm_ns=comm_ns,
        exposed_comm_ns=busy_ns - compute_ns,
        idle_ns=max(0, step - busy_ns),
        sync_wait_ns=sync_wait,
        host_wait_ns=host_wait,
    )


def _label(st, item: int) -> tuple[str, str]:
    node = st.node(item)
    cat = CAT_NAMES.get(st.prog.cat[item], "other")
    if node is None:
        return cat, "(host gap)"
    return cat, node.name or f"node {node.id}"


def critical_path(states: list, part, top: int) -> dict[str, Any]:
    """Walk back from the item that ends last on the slowest rank, always through the
    predecessor that decided each start (for a collective: the member that arrived last),
    and add up what lies on the way. Gates (launch latency, measured gaps) count as "gap"."""
    live = [s for s in states if s.prog.n_items]
    if not live:
        return {"length_ns": 0, "rank": -1, "by_category": {}, "top": [], "ranks": []}
    st = max(live, key=lambda s: (max(s.end) - s.origin, -s.rank))
    item = max(range(st.prog.n_items), key=lambda i: st.end[i])
    length = st.end[item] - st.origin
    contrib: dict[tuple[str, str], list[int]] = {}
    by_cat: dict[str, int] = {}
    gaps = 0
    ranks_seen: list[int] = []
    at_end = True
    guard = sum(s.prog.n_items for s in states) * 2 + 10
    while guard > 0:
        guard -= 1
        if not ranks_seen or ranks_seen[-1] != st.rank:
            ranks_seen.append(st.rank)
        prog = st.prog
        if at_end:
            s, e = st.start[item], st.end[item]
            ep = [q for q in prog.epreds[item] if st.end[q] > s and st.end[q] + st.dur[item] == e]
            cat, name = _label(st, item)
            if ep:
                _add(contrib, by_cat, cat, name, st.dur[item])
                item = ep[0]
                continue
            _add(contrib, by_cat, cat, name, e - s)
        # find what decided this item's start (or, for a rendezvous, its last arrival)
        if item in st.met:
            last = max(st.met[item], key=lambda p: p[2])
            st, item = last[0], last[1]
            prog = st.prog
            t = st.arrive[item]
        else:
            t = st.start[item]
        g = prog.gate[item]
        t0 = t - g
        gaps += g
        p = prog.prev[item]
        nxt = None
        if p >= 0 and st.end[p] == t0:
            nxt = (p, True)
        else:
            for ref in prog.spreds[item]:
                q = ref >> 1
                v = st.start[q] if ref & 1 else st.end[q]
                if v == t0:
                    nxt = (q, not (ref & 1))
                    break
        if nxt is None:
            break  # reached the rank's origin
        item, at_end = nxt
    if gaps:
        by_cat["gap"] = by_cat.get("gap", 0) + gaps
    ranked = sorted(contrib.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return {
        "length_ns": int(length),
        "rank": max(live, key=lambda s: (max(s.end) - s.origin, -s.rank)).rank,
        "by_category": dict(sorted(by_cat.items())),
        "top": [
            {"category": c, "name": n, "ns": int(v[0]), "count": v[1],
             "share": round(v[0] / length, 4) if length else 0.0}
            for (c, n), v in ranked
        ],
        "ranks": ranks_seen,
    }


def _add(contrib, by_cat, cat: str, name: str, ns: int) -> None:
    if ns <= 0:
        return
    v = contrib.setdefault((cat, name), [0, 0])
    v[0] += ns
    v[1] += 1
    by_cat[cat] = by_cat.get(cat, 0) + ns
