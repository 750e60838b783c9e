"""An ASTRA-sim export that says what it promises: the network fitted to a communication
model (or to the job's own measured collectives), and echo-et's replay of exactly what was
exported (``expected_step_ns``).

The converter (:mod:`echo_et.converters.astra_sim`) only writes what it is given; this module
decides the network values and runs the simulator, which converters may not import:

* :func:`fit_network` chooses a bandwidth and a link latency per network dimension so that
  ASTRA-sim's time for each collective and send of the job (its analytical cost,
  :mod:`echo_et.converters.astra_sim.costs`) is as close as possible, in relative terms, to
  the target: the CC model's estimate (``--profile``/``--preset``) or the collective's own
  time in echo-et's replay of the trace (``--measured-network``). The report lists every
  distinct (collective, bytes, group size) with both times and the residual error.
* :func:`export_with_report` plans the export, replays the job and the export in echo-et's
  simulator and writes the folder. ``expected_step_ns`` is the export's step (each rank's
  end minus its start offset, the slowest rank) with the communication times the network
  is meant to reproduce: the model's, or else the measured ones.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from echo_et.converters.astra_sim import ExportOptions, ExportPlan
from echo_et.converters.astra_sim.configs import DEFAULT_GPUS_PER_NODE, DEFAULT_SPLITS, Network
from echo_et.converters.astra_sim.costs import (
    GIB_PER_GB,
    HOPS,
    Dim,
    all_to_all_p2p_ns,
    all_to_all_p2p_shaped_ns,
    collective_ns,
    peer_dims,
    send_ns,
    shaped_ns,
)
from echo_et.converters.astra_sim.mapping import CHAKRA_ALL_TO_ALL, chakra_type_of, comm_size_of
from echo_et.errors import EchoError
from echo_et.ir.job import Job
from echo_et.ir.schema import collective_name, pb
from echo_et.sim import CommCall, Predictor, SimOptions, Simulator

MIN_NPUS = 2
BW_RANGE = (1e-4, 1e5)       # GB/s searched
LAT_RANGE = (0.0, 1e8)        # ns searched
PRIOR_WEIGHT = 1e-6           # pull of the default network in the fit (log units)
SPLIT_CHOICES = (4, 2, 1)     # preferred-dataset-splits a fit may choose
SEND = -1                     # Sample.comm_type of a send
A2A_P2P = -2                  # Sample.comm_type of an all-to-all written as per-peer send/recv


# -- what the communication takes ---------------------------------------------------------------
class _Recorder(Simulator):
    """Replay that remembers each collective's and send/recv's own time per rank."""

    def __init__(self, job: Job, options: SimOptions | None = None):
        super().__init__(job, options)
        self.own: dict[Hashable, dict[int, int]] = {}
        self.start: dict[Hashable, int] = {}
        self.calls: dict[Hashable, tuple[int, int, int, tuple[int, ...], int, int]] = {}

    def _keep(self, key: Hashable, call: CommCall, t: int | list[int]) -> None:
        times = t if isinstance(t, list | tuple) else [t] * len(call.ranks)
        self.own[key] = {r: int(x) for r, x in zip(call.ranks, times, strict=True)}
        self.start[key] = call.last_arrival_ns
        self.calls[key] = (call.coll_type, call.in_bytes, call.out_bytes, tuple(call.group.ranks),
                           call.src, call.dst)

    def collective(self, call: CommCall):
        t = super().collective(call)
        self._keep(("c", call.group.id, call.seq), call, t)
        return t

    def p2p(self, call: CommCall):
        t = super().p2p(call)
        self._keep(("p", call.group.id, call.src, call.dst, call.seq), call, t)
        return t


class _ExportReplay(Simulator):
    """Replay of the export's view with given own times for its communication."""

    def __init__(self, job: Job, options: SimOptions, own: dict[Hashable, dict[int, int]]):
        super().__init__(job, options)
        self.own = own

    def _lookup(self, key: Hashable, call: CommCall, fallback):
        rec = self.own.get(key)
        if rec is None:
            return fallback(call)
        top = max(rec.values(), default=0)
        return [rec.get(r, top) for r in call.ranks]

    def collective(self, call: CommCall):
        return self._lookup(("c", call.group.id, call.seq), call, super().collective)

    def p2p(self, call: CommCall):
        return self._lookup(("p", call.group.id, call.src, call.dst, call.seq), call, super().p2p)


def _view_options() -> SimOptions:
    # ASTRA-sim sends never wait for their receive; its nodes start exactly when ready.
    return SimOptions(p2p_eager_bytes=1 << 62, check=False, critical_top=0)


# -- fitting the network ------------------------------------------------------------------------
@dataclass
class Sample:
    """One distinct communication of the job and the time ASTRA-sim should give it."""

    what: str                  # "all_reduce", ..., "send"
    comm_type: int             # Chakra type; SEND, or A2A_P2P (an all-to-all as per-peer send/recv)
    size: int                  # comm_size as exported
    members: tuple[int, ...]   # collective: group ranks; send: (src, dst)
    target_ns: float
    count: int = 1
    shape: tuple = ()          # costs.collective_shape, ("send", dim) or ("a2a-p2p", costs.peer_dims)


@dataclass
class NetworkFit:
    source: str                             # "model:<name>" or "measured"
    network: Network
    samples: list[Sample] = field(default_factory=list)
    fixed: tuple[str, ...] = ()
    splits: int = DEFAULT_SPLITS             # preferred-dataset-splits the times assume
    loss: float = 0.0                        # mean squared log ratio, weighted by count

    def predict(self, s: Sample, dims: list[Dim] | None = None) -> float:
        dims = dims or _dims(self.network)
        if s.shape and s.shape[0] == "send":
            d = dims[s.shape[1]]
            return HOPS.get(d.topology, 1) * d.latency + s.size / (d.bandwidth * GIB_PER_GB)
        if s.shape and s.shape[0] == "a2a-p2p":
            return all_to_all_p2p_shaped_ns(s.size, len(s.members), s.shape[1], dims)
        if s.comm_type == A2A_P2P:
            return all_to_all_p2p_ns(s.size, list(s.members), dims)
        if s.comm_type < 0:
            return send_ns(s.size, s.members[0], s.members[1], dims)
        if s.shape:
            return shaped_ns(s.comm_type, s.size, s.shape, dims, self.splits)
        return collective_ns(s.comm_type, s.size, list(s.members), dims, self.splits)

    def residuals(self) -> list[dict[str, Any]]:
        """Per distinct (collective, bytes, group size): target, ASTRA-sim's time, error %."""
        dims = _dims(self.network)
        rows: dict[tuple, dict[str, Any]] = {}
        for s in _by_shape(self.samples, dims):
            p = self.predict(s, dims)
            key = (s.what, s.size, len(s.members))
            row = rows.setdefault(key, {"collective": s.what, "bytes": s.size, "group_size": len(s.members),
                                        "count": 0, "target_ns": 0.0, "astra_sim_ns": 0.0})
            row["count"] += s.count
            row["target_ns"] += s.target_ns * s.count
            row["astra_sim_ns"] += p * s.count
        out = []
        for key in sorted(rows):
            row = rows[key]
            t, a = row["target_ns"] / row["count"], row["astra_sim_ns"] / row["count"]
            row["target_ns"], row["astra_sim_ns"] = round(t), round(a)
            row["error_pct"] = round(100.0 * (a - t) / t, 2) if t > 0 else None
            out.append(row)
        return out

    def to_json(self) -> dict[str, Any]:
        res = self.residuals()
        errs = [abs(r["error_pct"]) for r in res if r["error_pct"] is not None]
        return {"source": self.source, "fixed": list(self.fixed), "preferred_dataset_splits": self.splits,
                "bandwidth_gbps": [round(b, 4) for b in self.network.bandwidth],
                "latency_ns": [round(x, 2) for x in self.network.latency],
                "residuals": res,
                "max_abs_error_pct": round(max(errs), 2) if errs else None}


def _dims(net: Network) -> list[Dim]:
    return [Dim(t, n, b, x) for t, n, b, x in zip(net.topology, net.npus_count, net.bandwidth, net.latency,
                                                  strict=True)]


def _gpn(net: Network) -> int:
    return net.npus_count[0] if len(net.npus_count) > 1 else 0


def _sample_type(ctype: int, all_to_all: str) -> int:
    return A2A_P2P if ctype == CHAKRA_ALL_TO_ALL and all_to_all == "p2p" else ctype


def _merged_collectives(job: Job, plan: ExportPlan) -> dict[tuple[int, int], list[int]]:
    """(group id, seq) of each exported collective that other collectives of its group were
    merged into (they ran concurrently) -> the seqs merged into it."""
    heads = {gid: [pn for pn in gp.nodes if pn.merged] if gp.any_merged else [] for gid, gp in plan.plans.items()}
    if not any(heads.values()):
        return {}
    out: dict[tuple[int, int], list[int]] = {}
    for r in job.ranks():
        b = job.binding(r)
        for pn in heads[b.graph]:
            out[(b.groups[pn.node.collective.group], pn.node.collective.seq)] = [m.collective.seq for m in pn.merged]
    return out


def _merge_recorded(rec: _Recorder, merges: dict[tuple[int, int], list[int]]) -> None:
    """The replay's own times of merged collectives as one: each member's time from the
    last arrival at any of them to its end of the last of them (summed bytes)."""
    for (g, seq), rest in merges.items():
        keys = [("c", g, s) for s in (seq, *rest)]
        if any(k not in rec.own for k in keys):
            continue
        start = max(rec.start[k] for k in keys)
        rec.own[keys[0]] = {r: max(rec.start[k] + rec.own[k].get(r, 0) for k in keys) - start
                            for r in rec.own[keys[0]]}
        ctype, _, _, members, src, dst = rec.calls[keys[0]]
        rec.calls[keys[0]] = (ctype, sum(rec.calls[k][1] for k in keys), sum(rec.calls[k][2] for k in keys),
                              members, src, dst)
        rec.start[keys[0]] = start
        for k in keys[1:]:
            del rec.own[k], rec.calls[k], rec.start[k]


def _model_samples(job: Job, model: Any, net: Network, splits: int, all_to_all: str = "p2p",
                   merges: dict[tuple[int, int], list[int]] | None = None) -> list[Sample]:
    """Every distinct collective and send of the job priced by the CC model (collectives
    merged into one at their summed bytes)."""
    merges = merges or {}
    merged_away = {(g, s) for (g, _), rest in merges.items() for s in rest}
    seen: dict[tuple, Sample] = {}
    gpn = net.npus_count[0] if len(net.npus_count) > 1 else max(net.npus, 1)
    comm_of: dict[str, list[pb.Node]] = {}
    for r in job.ranks():
        b = job.binding(r)
        if b.graph not in comm_of:
            # streamed: only the communication nodes are held, the graph is not expanded
            comm_of[b.graph] = list(job.graph(b.graph).iter_nodes((pb.KIND_COLLECTIVE, pb.KIND_SEND)))
        for n in comm_of[b.graph]:
            if n.kind == pb.KIND_COLLECTIVE:
                c = n.collective
                ctype = chakra_type_of(c.type)
                group = job.resolve_group(r, c.group)
                if ctype is None or len(group.ranks) <= 1:
                    continue
                if (group.id, c.seq) in merged_away:
                    continue
                in_b, out_b = int(c.in_bytes), int(c.out_bytes)
                if (group.id, c.seq) in merges:
                    gb = job.binding(r)
                    key_of = {s.collective.seq: s for s in comm_of[gb.graph] if s.kind == pb.KIND_COLLECTIVE
                              and s.collective.group == c.group}
                    for s_ in merges[(group.id, c.seq)]:
                        in_b += key_of[s_].collective.in_bytes
                        out_b += key_of[s_].collective.out_bytes
                size, _ = comm_size_of(c.type, in_b, out_b, len(group.ranks), splits)
                key = ("c", c.type, in_b, out_b, group.id)
                if key in seen:
                    continue
                est = model.estimate(collective_name(c.type), in_b, list(group.ranks),
                                     dtype=c.dtype or "float32", gpus_per_node=gpn)
                seen[key] = Sample(collective_name(c.type), _sample_type(ctype, all_to_all), size, tuple(group.ranks),
                                   float(est.time_ns), len(group.ranks))
            elif n.kind == pb.KIND_SEND:
                group = job.resolve_group(r, n.p2p.group)
                dst = group.ranks[n.p2p.peer]
                key = ("p", n.p2p.bytes, r, dst)
                if key in seen or dst == r:
                    continue
                est = model.p2p(int(n.p2p.bytes), r, dst, gpus_per_node=gpn)
                seen[key] = Sample("send", SEND, max(1, int(n.p2p.bytes)), (r, dst), float(est.time_ns))
    return _merge_samples(seen.values())


def _measured_samples(job: Job, rec: _Recorder, splits: int, all_to_all: str = "p2p") -> list[Sample]:
    """Every collective and send of the replay with its own time (the slowest member's)."""
    placeholders = _placeholder_keys(job)
    seen: list[Sample] = []
    for key, (ctype_ir, in_b, out_b, ranks, src, dst) in rec.calls.items():
        t = max(rec.own[key].values(), default=0)
        if t <= 0 or (key[0], key[1]) in placeholders:
            continue
        if key[0] == "c":
            ctype = chakra_type_of(ctype_ir)
            if ctype is None or len(ranks) <= 1:
                continue
            size, _ = comm_size_of(ctype_ir, in_b, out_b, len(ranks), splits)
            seen.append(Sample(collective_name(ctype_ir), _sample_type(ctype, all_to_all), size, ranks, float(t)))
        elif src != dst:
            seen.append(Sample("send", SEND, max(1, in_b), (src, dst), float(t)))
    return _merge_samples(seen)


def _placeholder_keys(job: Job) -> set[tuple[str, int]]:
    """(kind, group id) of communication traced without a measured time."""
    out: set[tuple[str, int]] = set()
    keys_of: dict[str, set[tuple[str, str]]] = {}
    for r in job.ranks():
        b = job.binding(r)
        keys = keys_of.get(b.graph)
        if keys is None:
            # The stored nodes suffice: a repeat block's copy has its body node's kind, group
            # and attributes.
            keys = keys_of[b.graph] = {
                ("c" if n.kind == pb.KIND_COLLECTIVE else "p",
                 n.collective.group if n.kind == pb.KIND_COLLECTIVE else n.p2p.group)
                for n in job.graph(b.graph).stored_nodes
                if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)
                and n.attrs.get("timing") == "placeholder"}
        out.update((kind, b.groups[key]) for kind, key in keys)
    return out


def _merge_samples(samples) -> list[Sample]:
    """Samples that ASTRA-sim prices alike (same type, size, members) become one, with the
    mean target."""
    acc: dict[tuple, list] = {}
    for s in samples:
        key = (s.what, s.comm_type, s.size, s.members)
        a = acc.setdefault(key, [0.0, 0])
        a[0] += s.target_ns * s.count
        a[1] += s.count
    return [Sample(k[0], k[1], k[2], k[3], v[0] / v[1], v[1]) for k, v in sorted(acc.items())]


def fit_network(samples: list[Sample], base: Network, source: str, *, fixed_bw: dict[int, float] | None = None,
                fixed_lat: dict[int, float] | None = None, splits: int = DEFAULT_SPLITS) -> NetworkFit:
    """Bandwidth and latency per dimension minimising the mean squared log ratio between
    ASTRA-sim's time and the target over ``samples`` (weighted by count), for a system file
    with ``splits`` preferred-dataset-splits; values in ``fixed_bw``/``fixed_lat``
    (dimension -> value) are kept."""
    fixed_bw, fixed_lat = dict(fixed_bw or {}), dict(fixed_lat or {})
    samples = [s for s in samples if s.target_ns > 0]
    if not samples:
        raise EchoError(f"no communication with a known time to fit the network to ({source})")
    ndim = len(base.npus_count)
    used = set()
    probe = _dims(base)
    for s in samples:
        used |= _dims_used(s, probe)
    bw = list(base.bandwidth)
    lat = list(base.latency)
    params: list[tuple[str, int]] = []
    for d in range(ndim):
        if d in used and d not in fixed_bw:
            params.append(("bw", d))
        if d in used and d not in fixed_lat:
            params.append(("lat", d))
    for d, v in fixed_bw.items():
        bw[d] = v
    for d, v in fixed_lat.items():
        lat[d] = v
    report = samples
    samples = _by_shape(samples, _dims(base))
    weights = np.array([s.count for s in samples], dtype=float)
    targets = np.log(np.array([s.target_ns for s in samples], dtype=float))
    prior_bw = [math.log(b) for b in base.bandwidth]
    prior_lat = [math.log1p(x) for x in base.latency]

    def loss(bw_: list[float], lat_: list[float]) -> float:
        net = replace(base, bandwidth=bw_, latency=lat_)
        dims = _dims(net)
        fit = NetworkFit(source, net, splits=splits)
        pred = np.array([max(fit.predict(s, dims), 1e-3) for s in samples])
        err = float(np.sum(weights * (np.log(pred) - targets) ** 2) / np.sum(weights))
        # A weak pull towards the default network: among values the samples cannot tell
        # apart (a bandwidth no size depends on), keep the usual one.
        pull = sum((math.log(b) - p) ** 2 for b, p in zip(bw_, prior_bw, strict=True))
        pull += sum((math.log1p(x) - p) ** 2 for x, p in zip(lat_, prior_lat, strict=True))
        return err + PRIOR_WEIGHT * pull

    def to_u(kind: str, v: float) -> float:
        return math.log(v) if kind == "bw" else math.log1p(v)

    def from_u(kind: str, u: float) -> float:
        return math.exp(u) if kind == "bw" else math.expm1(u)

    bounds = {"bw": (math.log(BW_RANGE[0]), math.log(BW_RANGE[1])),
              "lat": (math.log1p(LAT_RANGE[0]), math.log1p(LAT_RANGE[1]))}
    best = loss(bw, lat)
    for _round in range(12):
        before = best
        for kind, d in params:
            vec = bw if kind == "bw" else lat

            def f(u: float, vec=vec, kind=kind, d=d) -> float:
                old = vec[d]
                vec[d] = from_u(kind, u)
                try:
                    return loss(bw, lat)
                finally:
                    vec[d] = old

            lo, hi = bounds[kind]
            u = _golden(f, lo, hi, to_u(kind, vec[d]))
            val = f(u)
            if val < best:
                vec[d] = from_u(kind, u)
                best = val
        if before - best < 1e-9:
            break
    # Rounded as written to network.yml and reported.
    net = replace(base, bandwidth=[round(float(b), 4) for b in bw], latency=[round(float(x), 2) for x in lat])
    fixed = tuple([f"bandwidth[{d}]" for d in sorted(fixed_bw)] + [f"latency[{d}]" for d in sorted(fixed_lat)])
    out = NetworkFit(source, net, report, fixed, splits)
    out.loss = loss(list(net.bandwidth), list(net.latency))
    return out


def _by_shape(samples: list[Sample], dims: list[Dim]) -> list[Sample]:
    """Samples ASTRA-sim prices alike (type, size and what of the placement matters) become
    one, with the count-weighted mean target: the fit evaluates each once."""
    from echo_et.converters.astra_sim.costs import collective_shape, hop_dim

    acc: dict[tuple, list] = {}
    for s in samples:
        if s.comm_type == A2A_P2P:
            shape: tuple = ("a2a-p2p", peer_dims(list(s.members), dims))
        elif s.comm_type < 0:
            shape = ("send", hop_dim(s.members[0], s.members[1], dims))
        else:
            shape = collective_shape(list(s.members), dims)
        key = (s.what, s.comm_type, s.size, shape)
        a = acc.setdefault(key, [0.0, 0, s.members])
        a[0] += s.target_ns * s.count
        a[1] += s.count
    return [Sample(k[0], k[1], k[2], v[2], v[0] / v[1], v[1], k[3]) for k, v in sorted(acc.items(), key=str)]


def _dims_used(s: Sample, dims: list[Dim]) -> set[int]:
    from echo_et.converters.astra_sim.costs import hop_dim

    total = math.prod(d.npus for d in dims)
    m = list(s.members)
    if s.comm_type >= 0 and len(m) == total and len(dims) > 1:
        return set(range(len(dims)))
    if s.comm_type == A2A_P2P:
        return {d for counts in peer_dims(m, dims) for d, c in enumerate(counts) if c}
    if s.comm_type < 0:
        return {hop_dim(m[0], m[1], dims)}
    return {hop_dim(m[k], m[(k + 1) % len(m)], dims) for k in range(len(m))}


def _golden(f, lo: float, hi: float, start: float) -> float:
    """Minimise ``f`` on [lo, hi]: a coarse scan (the loss is not unimodal everywhere when a
    latency and a bandwidth trade off), then golden-section search around the best point."""
    grid = np.linspace(lo, hi, 41)
    vals = [f(float(u)) for u in grid]
    k = int(np.argmin(vals))
    if f(start) <= vals[k]:
        center = start
        step = (hi - lo) / 40
    else:
        center = float(grid[k])
        step = (hi - lo) / 40
    a, b = max(lo, center - step), min(hi, center + step)
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(40):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


# -- the export with its report ------------------------------------------------------------------
def export_with_report(job: Job, dest, options: ExportOptions | None = None, *, comm_model: Any = None,
                       measured_network: bool = False, expected: bool = True,
                       fit_splits: bool = False) -> dict[str, Any]:
    """Fit the network if asked (``comm_model`` or ``measured_network``), write the export,
    and replay it: the export's result plus ``network_fit``, ``replay_step_ns`` (echo-et's
    replay of the job), ``expected_step_ns`` and ``expected_comm`` ("model" or "measured").
    With ``fit_splits`` the fit also chooses preferred-dataset-splits (1, 2 or 4): fewer
    chunks mean fewer latencies per collective, which matches NCCL's ring better at small
    sizes; on a tie the options' value stays."""
    opts = options or ExportOptions()
    if comm_model is not None and measured_network:
        raise EchoError("fit the network to a communication model or to the measured collectives, not both")
    plan = ExportPlan(job, opts)      # refuses a job that fails the IR check, before anything runs
    base = plan.network
    rec: _Recorder | None = None
    replay_ns = None
    why_not = None
    if expected or measured_network:
        rec = _Recorder(job, SimOptions(critical_top=0))
        try:
            replay_ns = rec.run().step_time_ns
        except EchoError as e:
            if measured_network:
                raise EchoError(f"cannot fit the network to the measured collectives: echo-et cannot "
                                f"replay the job ({e})") from None
            rec, why_not = None, str(e)
    merges = _merged_collectives(job, plan)
    if rec is not None and merges:
        _merge_recorded(rec, merges)
    fit = None
    if comm_model is not None or measured_network:
        if comm_model is not None:
            samples = _model_samples(job, comm_model, base, opts.splits, opts.all_to_all, merges)
            source = f"model:{getattr(comm_model, 'name', 'model')}"
        else:
            assert rec is not None
            samples = _measured_samples(job, rec, opts.splits, opts.all_to_all)
            source = "measured"
        fixed_bw, fixed_lat = _fixed(opts, job, len(base.npus_count))
        fit = fit_network(samples, base, source, fixed_bw=fixed_bw, fixed_lat=fixed_lat, splits=opts.splits)
        for splits in (SPLIT_CHOICES if fit_splits else ()):
            if splits == fit.splits:
                continue
            other = fit_network(samples, base, source, fixed_bw=fixed_bw, fixed_lat=fixed_lat, splits=splits)
            if other.loss < 0.98 * fit.loss:
                fit = other
        plan = plan.with_network(replace(_with_network(opts, fit.network), splits=fit.splits))
    result = plan.write(dest)
    result["network_fit"] = fit.to_json() if fit is not None else None
    result["expected_step_ns"] = None
    result["replay_step_ns"] = replay_ns
    if why_not is not None:
        result["expected_error"] = f"echo-et cannot replay the job: {why_not}"
    elif expected:
        assert rec is not None
        view = plan.view()
        if comm_model is not None:
            sim = Predictor(view, _view_options(), comm_model=comm_model)
            sim.gpus_per_node = _gpn(plan.network) or sim.gpus_per_node
            res = sim.run()
            result["expected_comm"] = "model"
        else:
            res = _ExportReplay(view, _view_options(), rec.own).run()
            result["expected_comm"] = "measured"
        result["expected_step_ns"] = res.step_time_ns
        result["expected_rank_step_ns"] = {str(r): v.step_time_ns for r, v in sorted(res.ranks.items())}
    return result


def _fixed(opts: ExportOptions, job: Job, ndim: int) -> tuple[dict[int, float], dict[int, float]]:
    """Network values the user gave explicitly: kept by the fit."""
    bw: dict[int, float] = {}
    lat: dict[int, float] = {}
    if ndim == 1:
        gpn = opts.gpus_per_node or job.manifest.hardware.gpus_per_node or DEFAULT_GPUS_PER_NODE
        given = opts.intra_bw if max(MIN_NPUS, job.world_size) <= gpn else opts.inter_bw
        if given is not None:
            bw[0] = float(given)
    else:
        if opts.intra_bw is not None:
            bw[0] = float(opts.intra_bw)
        if opts.inter_bw is not None:
            bw[1] = float(opts.inter_bw)
    if opts.latency is not None:
        for d in range(ndim):
            lat[d] = float(opts.latency)
    return bw, lat


def _with_network(opts: ExportOptions, net: Network) -> ExportOptions:
    """Options that make the converter write exactly ``net``."""
    if len(net.npus_count) == 1:
        # One dimension takes the intra- or the inter-node values: give both.
        return replace(opts, intra_bw=net.bandwidth[0], inter_bw=net.bandwidth[0],
                       intra_latency=net.latency[0], inter_latency=net.latency[0])
    return replace(opts, intra_bw=net.bandwidth[0], inter_bw=net.bandwidth[1],
                   intra_latency=net.latency[0], inter_latency=net.latency[1])


# -- running the real simulator -------------------------------------------------------------------
_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")


def run_astra_sim(folder, binary, *, timeout_s: float = 3600) -> dict[str, Any]:
    """Run an export's ``run.sh`` with the ASTRA-sim ``binary``; every rank's finish time
    (cycles = ns), its step (finish minus its start offset from ``start_offsets.json``), the
    job's step (the slowest rank's) and the wall time of the run. Raises EchoError when the
    binary fails or a rank never finishes."""
    folder = Path(folder).resolve()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(["sh", str(folder / "run.sh")], cwd=folder, capture_output=True, text=True,
                              timeout=timeout_s, env={**os.environ, "ASTRA_SIM_BIN": str(binary)})
    except subprocess.TimeoutExpired:
        raise EchoError(f"ASTRA-sim ({binary}) did not finish {folder} within {timeout_s:.0f} s") from None
    wall = time.perf_counter() - t0
    out = (folder / "log" / "stdout.txt").read_text(errors="replace") if (folder / "log" / "stdout.txt").is_file() \
        else proc.stdout
    finished = {int(a): int(b) for a, b in _FINISHED.findall(out)}
    if proc.returncode != 0:
        tail = (proc.stderr or out).strip().splitlines()[-1:] or ["(no output)"]
        raise EchoError(f"ASTRA-sim ({binary}) failed on {folder}: {tail[0]}")
    offsets_path = folder / "start_offsets.json"
    offsets = json.loads(offsets_path.read_text())["start_offset_us"] if offsets_path.is_file() else []
    steps = {r: c - 1000 * (offsets[r] if r < len(offsets) else 0) for r, c in finished.items()}
    return {"finished_cycles": finished, "rank_step_ns": steps, "step_ns": max(steps.values(), default=0),
            "wall_s": round(wall, 3), "stats_lines": "Wall time" in out,
            "statistics_failed": "Only GPU and COMM types are supported" in out}


__all__ = ["NetworkFit", "Sample", "export_with_report", "fit_network", "run_astra_sim"]
