"""Where the simulated time goes: per-rank breakdown and the critical path."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from echo_et.sim.program import CAT_COMPUTE, CAT_COPY, CAT_NAMES, CAT_SYNC, COMM_CATS

_COMPUTE_CATS = (CAT_COMPUTE, CAT_COPY)


def _row_union(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Union length of each row's intervals [lo, hi) (2-D arrays, one row per rank)."""
    if lo.shape[1] == 0:
        return np.zeros(lo.shape[0], dtype=np.int64)
    order = np.argsort(lo, axis=1, kind="stable")
    lo = np.take_along_axis(lo, order, axis=1)
    hi = np.take_along_axis(hi, order, axis=1)
    run = np.maximum.accumulate(hi, axis=1)
    prev = np.concatenate((lo[:, :1], run[:, :-1]), axis=1)
    add = np.clip(hi - np.maximum(lo, prev), 0, None)
    add[:, 0] = np.clip(hi[:, 0] - lo[:, 0], 0, None)
    return add.sum(axis=1)


def rank_breakdowns(states: list) -> dict[int, dict[str, int]]:
    """Step time and its breakdown (see :class:`RankResult`) for every simulated rank,
    vectorized over the ranks that run the same program."""
    out: dict[int, dict[str, int]] = {}
    by_prog: dict[int, list] = {}
    for st in states:
        by_prog.setdefault(id(st.prog), []).append(st)
    for group in by_prog.values():
        prog = group[0].prog
        if prog.n_items == 0:
            for st in group:
                out[st.cls] = dict(step_time_ns=0, compute_ns=0, comm_ns=0, exposed_comm_ns=0, idle_ns=0,
                                   sync_wait_ns=0, host_wait_ns=0)
            continue
        cats = np.asarray(prog.cat, dtype=np.int64)
        comp = np.flatnonzero(np.isin(cats, _COMPUTE_CATS))
        comm = np.flatnonzero(np.isin(cats, tuple(COMM_CATS)))
        busy = np.union1d(comp, comm)
        sync = np.flatnonzero(cats == CAT_SYNC)
        rdv = np.array(sorted(prog.rendezvous), dtype=np.int64)
        for lo_k in range(0, len(group), 512):  # bounded memory on huge jobs
            chunk = group[lo_k:lo_k + 512]
            start = np.array([st.start for st in chunk], dtype=np.int64)
            end = np.array([st.end for st in chunk], dtype=np.int64)
            origin = np.array([st.origin for st in chunk], dtype=np.int64)
            step = end.max(axis=1) - origin
            compute_ns = _row_union(start[:, comp], end[:, comp])
            comm_ns = _row_union(start[:, comm], end[:, comm])
            busy_ns = _row_union(start[:, busy], end[:, busy])
            if rdv.size:
                arr = np.array([[st.arrive[i] for i in rdv.tolist()] for st in chunk], dtype=np.int64)
                wait = _row_union(arr, start[:, rdv])
            else:
                wait = np.zeros(len(chunk), dtype=np.int64)
            if sync.size:
                dur = np.array([[st.dur[i] for i in sync.tolist()] for st in chunk], dtype=np.int64)
                host_wait = np.clip(end[:, sync] - start[:, sync] - dur, 0, None).sum(axis=1)
            else:
                host_wait = np.zeros(len(chunk), dtype=np.int64)
            for k, st in enumerate(chunk):
                out[st.cls] = dict(
                    step_time_ns=int(step[k]),
                    compute_ns=int(compute_ns[k]),
                    comm_ns=int(comm_ns[k]),
                    exposed_comm_ns=int(busy_ns[k] - compute_ns[k]),
                    idle_ns=int(max(0, step[k] - busy_ns[k])),
                    sync_wait_ns=int(wait[k]),
                    host_wait_ns=int(host_wait[k]),
                )
    return out


def _label(st, item: int) -> tuple[str, str]:
    node = st.node(item)
    cat = CAT_NAMES.get(st.prog.cat[item], "other")
    if node is None:
        return cat, "(host gap)"
    return cat, node.name or f"node {node.id}"


def critical_path(states: list, part, top: int, nodes: Counter | None = None) -> dict[str, Any]:
    """Walk back from the item that ends last on the slowest rank, always through the
    predecessor that decided each start (for a collective: the member that arrived last),
    and add up what lies on the way. Measured gaps kept before items (launch latency, idle
    host time between operators) count as "gap". ``nodes``, when given, counts how often each
    node (graph id, index in the graph) lies on the path with a non-zero time."""
    live = [s for s in states if s.prog.n_items]
    if not live:
        return {"length_ns": 0, "rank": -1, "start_rank": -1, "start_offset_ns": 0, "by_category": {}, "top": [],
                "ranks": []}
    st = max(live, key=lambda s: (max(s.end) - s.origin, -s.rank))
    slowest = st
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
                if nodes is not None and st.dur[item] > 0 and prog.node_of[item] >= 0:
                    nodes[(prog.graph_id, prog.node_of[item])] += 1
                item = ep[0]
                continue
            _add(contrib, by_cat, cat, name, e - s)
            if nodes is not None and e > s and prog.node_of[item] >= 0:
                nodes[(prog.graph_id, prog.node_of[item])] += 1
        # find what decided this item's start (or, for a rendezvous, its last arrival)
        if item in st.met:
            last = max(st.met[item], key=lambda p: p[2])
            st, item = last[0], last[1]
            prog = st.prog
            t = st.arrive[item]
        else:
            t = st.start[item]
        p = prog.prev[item]
        nxt = None
        g = prog.pgap[item]
        if (st.end[p] if p >= 0 else st.origin) + g == t:
            nxt = (p, True) if p >= 0 else None
        else:
            for ref, g2 in prog.spreds[item]:
                q = ref >> 1
                if (st.start[q] if ref & 1 else st.end[q]) + g2 == t:
                    nxt, g = (q, not (ref & 1)), g2
                    break
        gaps += g
        if nxt is None:
            break  # reached the rank's origin
        item, at_end = nxt
    if gaps:
        by_cat["gap"] = by_cat.get("gap", 0) + gaps
    ranked = sorted(contrib.items(), key=lambda kv: (-kv[1][0], kv[0]))[:top]
    return {
        "length_ns": int(length),
        "rank": slowest.rank,
        # The path may begin on a rank that started later (or earlier) than the slowest
        # rank: by_category sums to length_ns - start_offset_ns.
        "start_rank": st.rank,
        "start_offset_ns": int(st.origin - slowest.origin),
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
