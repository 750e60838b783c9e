"""Decide a Job's parallel layout (dp, tp, pp, ep; rank order) and the role of each group.

Sources, in order of trust:

1. ``declared``: the user's ``--layout dp=2,tp=2,pp=2[,ep=E][,order=tp-dp-pp]``;
2. ``manifest``: the Job's own Layout when its product equals the world size (the ex-situ
   tracer writes it);
3. ``inferred``: read from the process groups and what runs on them:
   - groups whose traffic is send/recv only are pipeline groups (pp);
   - groups that carry all-to-all are expert groups (ep) (and may also be the dp groups, as in
     DLRM, where one world-wide group carries both the embedding all-to-all and the dense
     gradient all-reduce);
   - among groups carrying all-reduce / reduce-scatter / all-gather, a family of groups of
     consecutive ranks that issues many small collectives is tensor parallel (tp); the
     other (fewer, larger collectives: gradient buckets) is data parallel (dp);
   - a role already set on a group (ProcessGroup.role) wins over these rules.

A *family* is a set of groups of one size that partitions the ranks (each rank in exactly
one), like all tp groups of a job. The rank order (tp fastest, then dp, then pp, by default)
is the one under which every family found is exactly the set of groups that varies its axis;
when no family tells the orders apart, Megatron's order is assumed and said so.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Job
from echo_et.ir.schema import ROLE_NAMES, collective_name, pb
from echo_et.passes.mesh import AXES, DEFAULT_ORDER, Mesh, parse_order

_LAYOUT_KEYS = ("dp", "tp", "pp", "ep", "cp", "vpp", "microbatches", "zero")


@dataclass
class GroupTraffic:
    """What one rank issues on one group: collective counts by type, bytes, P2P ops."""

    collectives: Counter = field(default_factory=Counter)
    coll_bytes: int = 0
    p2p: int = 0

    @property
    def n_collectives(self) -> int:
        return sum(self.collectives.values())

    def describe(self) -> str:
        parts = [f"{collective_name(t)} x{n}" for t, n in sorted(self.collectives.items())]
        if self.p2p:
            parts.append(f"send/recv x{self.p2p}")
        return " + ".join(parts) or "no traffic"


@dataclass
class LayoutDecision:
    """A layout and how it was decided (``source`` goes to Layout.source)."""

    mesh: Mesh
    ep: int = 0
    microbatches: int = 0
    zero: int = 0
    source: str = ""
    roles: dict[int, str] = field(default_factory=dict)   # group id -> "dp"/"tp"/"pp"/"ep"/...
    reasons: list[str] = field(default_factory=list)

    @property
    def dp(self) -> int:
        return self.mesh.dp

    @property
    def tp(self) -> int:
        return self.mesh.tp

    @property
    def pp(self) -> int:
        return self.mesh.pp

    def to_layout(self) -> pb.Layout:
        return pb.Layout(dp=self.dp, tp=self.tp, pp=self.pp, ep=self.ep,
                         microbatches=self.microbatches, zero_stage=self.zero, source=self.source)

    def to_json(self) -> dict[str, Any]:
        return {
            "dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep,
            "microbatches": self.microbatches, "zero": self.zero,
            "order": "-".join(self.mesh.order), "source": self.source,
            "reasons": list(self.reasons),
            "role_counts": dict(sorted(Counter(self.roles.values()).items())),
            # Per group only for small jobs: a 100,000-rank job has ~100,000 groups.
            "group_roles": ({str(k): v for k, v in sorted(self.roles.items())}
                            if len(self.roles) <= 64 else {}),
        }


# -- parsing ------------------------------------------------------------------------------
def parse_layout(text: str) -> dict[str, Any]:
    """'dp=2,tp=2,pp=2[,ep=8][,order=tp-dp-pp]' -> dict; EchoError on anything else."""
    out: dict[str, Any] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise OptionError("layout", f"{text!r}: expected key=value pairs like dp=2,tp=2,pp=2")
        k, v = (s.strip().lower() for s in part.split("=", 1))
        if k == "order":
            out["order"] = parse_order(v)
            continue
        if k not in _LAYOUT_KEYS:
            raise OptionError("layout", f"{text!r}: unknown key {k!r} (known: {', '.join(_LAYOUT_KEYS)}, order)")
        try:
            n = int(v)
        except ValueError:
            raise OptionError("layout", f"{text!r}: {k}={v!r} is not an integer") from None
        if n < 0 or (n == 0 and k in ("dp", "tp", "pp")):
            raise OptionError("layout", f"{text!r}: {k} must be positive")
        out[k] = n
    return out


# -- traffic per group -----------------------------------------------------------------------
def graph_traffic(graph) -> dict[str, GroupTraffic]:
    """Traffic per graph-local group key."""
    out: dict[str, GroupTraffic] = defaultdict(GroupTraffic)
    # streamed, communication nodes only: a graph with repeat blocks is not expanded
    for n in graph.iter_nodes((pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)):
        if n.kind == pb.KIND_COLLECTIVE and n.HasField("collective"):
            t = out[n.collective.group]
            t.collectives[n.collective.type] += 1
            t.coll_bytes += n.collective.in_bytes
        elif n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.HasField("p2p"):
            out[n.p2p.group].p2p += 1
    return dict(out)


def group_traffic(job: Job) -> dict[int, GroupTraffic]:
    """Traffic per process group id, read from the lowest member rank bound to it (the
    checker guarantees members agree on the collective sequence)."""
    per_graph = {gid: graph_traffic(job.graph(gid)) for gid in job.graph_ids()}
    out: dict[int, GroupTraffic] = {}
    for b in sorted(job.manifest.bindings, key=lambda b: b.rank):
        traffic = per_graph.get(b.graph, {})
        for key, pgid in b.groups.items():
            if pgid in out:
                continue
            out[pgid] = traffic.get(key, GroupTraffic())
    return out


# -- inference ------------------------------------------------------------------------------
_FITS = {  # traffic kinds an axis's groups may carry
    "tp": {"reduce", "none"},
    "dp": {"reduce", "a2a", "none"},
    "pp": {"p2p", "none"},
}


def _kind(t: GroupTraffic) -> str:
    reducing = sum(t.collectives.get(c, 0) for c in
                   (pb.COLL_ALL_REDUCE, pb.COLL_REDUCE_SCATTER, pb.COLL_ALL_GATHER))
    if reducing:
        return "reduce"
    if t.collectives.get(pb.COLL_ALL_TO_ALL):
        return "a2a"
    if t.p2p and not t.n_collectives:
        return "p2p"
    return "none" if not t.n_collectives else "other"


@dataclass
class _GroupSet:
    ranks: frozenset[int]
    groups: list[pb.ProcessGroup]
    traffic: GroupTraffic
    stated: str   # role the manifest states, "" if none

    @property
    def kind(self) -> str:
        return _kind(self.traffic)


def _group_sets(job: Job, traffic: dict[int, GroupTraffic]) -> dict[frozenset[int], _GroupSet]:
    """Distinct member sets (c10d may create one set twice), traffic summed over its groups."""
    out: dict[frozenset[int], _GroupSet] = {}
    for g in job.manifest.groups:
        key = frozenset(g.ranks)
        gs = out.get(key)
        t = traffic.get(g.id, GroupTraffic())
        stated = ROLE_NAMES.get(g.role, "unknown")
        stated = stated if stated in ("dp", "tp", "pp", "ep", "world") else ""
        if gs is None:
            out[key] = _GroupSet(key, [g], GroupTraffic(Counter(t.collectives), t.coll_bytes, t.p2p), stated)
        else:
            gs.groups.append(g)
            gs.traffic.collectives.update(t.collectives)
            gs.traffic.coll_bytes += t.coll_bytes
            gs.traffic.p2p += t.p2p
            gs.stated = gs.stated or stated
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class _Candidate:
    mesh: Mesh
    score: tuple
    axis_sets: dict[str, list[_GroupSet]]


def _evaluate(mesh: Mesh, sets: dict[frozenset[int], _GroupSet]) -> _Candidate | None:
    """None when some axis's groups are missing from the job or carry traffic that does not
    fit the axis; else a score (higher is a better explanation)."""
    world = mesh.world
    axis_sets: dict[str, list[_GroupSet]] = {}
    explained: set[frozenset[int]] = set()
    for axis in ("tp", "dp", "pp"):
        n = mesh.size(axis)
        if n == 1 or n == world:
            continue
        found = []
        for ranks in mesh.groups([axis]):
            gs = sets.get(frozenset(ranks))
            if gs is None or gs.kind not in _FITS[axis] or (gs.stated and gs.stated != axis):
                return None
            found.append(gs)
            explained.add(gs.ranks)
        axis_sets[axis] = found
    whole = sets.get(frozenset(range(world)))
    if whole is not None and whole.kind != "none":
        # A world-wide group belongs to the one axis that spans the world, if any.
        axis = next((a for a in ("dp", "tp", "pp") if mesh.size(a) == world), None)
        if axis is not None and (whole.kind not in _FITS[axis] or whole.stated not in ("", axis, "world")):
            return None
        if axis is not None:
            axis_sets[axis] = [whole]
        explained.add(whole.ranks)
    busy = [gs for gs in sets.values() if gs.kind != "none" and len(gs.ranks) > 1]
    n_explained = sum(1 for gs in busy if gs.ranks in explained)
    stated_ok = sum(1 for a, lst in axis_sets.items() for gs in lst if gs.stated == a)
    # tp groups issue more, smaller collectives than dp groups (per-layer activations vs
    # gradient buckets) and sit on consecutive ranks.
    tp_like = 0
    if "tp" in axis_sets and axis_sets["tp"][0].kind == "reduce":
        tp = axis_sets["tp"][0].traffic
        tp_like += all(_contiguous(gs.ranks) for gs in axis_sets["tp"])
        if "dp" in axis_sets and axis_sets["dp"][0].kind == "reduce":
            dp = axis_sets["dp"][0].traffic
            tp_like += tp.n_collectives > dp.n_collectives
            tp_like += tp.coll_bytes / max(1, tp.n_collectives) < dp.coll_bytes / max(1, dp.n_collectives)
        else:
            tp_like -= 1
    axes_used = sum(1 for a in ("tp", "dp", "pp") if mesh.size(a) > 1 and a in axis_sets)
    score = (n_explained, stated_ok, tp_like, -axes_used, mesh.dp, mesh.order == DEFAULT_ORDER)
    return _Candidate(mesh, score, axis_sets)


def _contiguous(ranks) -> bool:
    rs = sorted(ranks)
    return rs == list(range(rs[0], rs[0] + len(rs)))


def _candidates(world: int, sets: dict[frozenset[int], _GroupSet], fixed: dict[str, int],
                orders: list[tuple[str, ...]]) -> list[_Candidate]:
    sizes = {len(s) for s in sets} | {1}
    out = []
    tps = [fixed["tp"]] if "tp" in fixed else [d for d in _divisors(world) if d in sizes]
    pps = [fixed["pp"]] if "pp" in fixed else [d for d in _divisors(world) if d in sizes]
    for tp in tps:
        for pp in pps:
            if world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if "dp" in fixed and fixed["dp"] != dp:
                continue
            for order in orders:
                c = _evaluate(Mesh(tp, dp, pp, order), sets)
                if c is not None:
                    out.append(c)
    return out


def infer_layout(job: Job, declared: str | dict[str, Any] | None = None) -> LayoutDecision:
    """The layout of ``job``: declared, from its manifest, or inferred from its groups."""
    world = job.world_size
    if world < 1:
        raise EchoError(f"{job.source or 'job'}: world size is 0")
    if job.manifest.layout.cp > 1:
        cp = job.manifest.layout.cp
        raise EchoError(f"{job.source or 'job'}: traced with context parallelism (each sequence split over {cp} "
                        "ranks); re-scaling, re-staging and injecting read tp x dp x pp layouts only: trace the "
                        "configuration at the layout wanted instead")
    spec = parse_layout(declared) if isinstance(declared, str) else dict(declared or {})
    traffic = group_traffic(job)
    sets = _group_sets(job, traffic)
    reasons: list[str] = []
    m = job.manifest.layout
    manifest_ok = m.dp > 0 and m.tp > 0 and m.pp > 0 and m.dp * m.tp * m.pp == world
    orders = [spec["order"]] if "order" in spec else [DEFAULT_ORDER] + [
        o for o in itertools.permutations(AXES) if o != DEFAULT_ORDER]

    fixed: dict[str, int] = {}
    if spec.get("dp") or spec.get("tp") or spec.get("pp"):
        tp, pp = int(spec.get("tp", 1)), int(spec.get("pp", 1))
        dp = int(spec.get("dp", world // max(1, tp * pp)))
        if dp * tp * pp != world:
            raise OptionError("layout", f"dp*tp*pp = {dp}*{tp}*{pp} = {dp * tp * pp}, but the job has "
                                        f"{world} ranks")
        fixed = {"dp": dp, "tp": tp, "pp": pp}
        source = "declared"
        reasons.append(f"declared dp={dp},tp={tp},pp={pp}")
    elif manifest_ok:
        fixed = {"dp": m.dp, "tp": m.tp, "pp": m.pp}
        source = f"manifest:{m.source or 'unspecified'}"
        reasons.append(f"layout from the job manifest (source {m.source or 'unspecified'})")
    elif stated := _stated_sizes(job, world):
        fixed = stated
        source = "stated:group-roles"
        reasons.append(f"the groups' stated roles (e.g. Megatron's group names) give dp={stated['dp']},"
                       f"tp={stated['tp']},pp={stated['pp']}")
    else:
        source = "inferred:groups"

    cands = _candidates(world, sets, fixed, orders)
    if not cands:
        if fixed:
            # The groups do not show this layout (e.g. a job without tp groups): trust it,
            # in the first order asked for.
            mesh = Mesh(fixed["tp"], fixed["dp"], fixed["pp"], orders[0])
            reasons.append(f"the process groups do not show this layout; rank order "
                           f"{'-'.join(orders[0])} assumed")
            best = _Candidate(mesh, (), {})
        else:
            raise OptionError("layout", "the process groups do not form a tp x dp x pp mesh in any "
                                        "rank order; declare the layout (dp=..,tp=..,pp=..[,order=tp-dp-pp])")
    else:
        cands.sort(key=lambda c: c.score, reverse=True)
        best = cands[0]
        mesh = best.mesh
        for axis, lst in sorted(best.axis_sets.items()):
            t = lst[0].traffic
            reasons.append(f"{len(lst)} group(s) of {len(lst[0].ranks)} ranks carry {t.describe()} -> {axis}")
        if not best.axis_sets:
            reasons.append("no process group tells the layout apart: every rank taken as a "
                           "data-parallel replica")
            if source.startswith("inferred"):
                source = "inferred:default-dp"
        informative = [a for a in best.axis_sets if 1 < mesh.size(a) < world]
        tied = [c for c in cands if c.score[:-1] == best.score[:-1] and c.mesh.order != mesh.order]
        if not informative or tied:
            reasons.append(f"rank order {'-'.join(mesh.order)} assumed (the groups do not tell "
                           "orders apart)")
        else:
            reasons.append(f"rank order {'-'.join(mesh.order)} matches the groups")
        if not fixed and world > 1 and mesh.dp == world and best.axis_sets.get("dp"):
            reasons.append(f"one group of all {world} ranks reads as data parallelism; a job split by "
                           f"tensor parallelism alone reads the same: declare its layout (tp={world}) if so")

    roles: dict[int, str] = {}
    for axis, lst in best.axis_sets.items():
        for gs in lst:
            for g in gs.groups:
                roles[g.id] = axis
    for g in job.manifest.groups:
        if g.id in roles:
            continue
        stated = ROLE_NAMES.get(g.role, "unknown")
        role = stated if stated not in ("unknown", "custom") else geometric_role(mesh, list(g.ranks))
        if role:
            roles[g.id] = role

    ep = int(spec.get("ep", 0)) or (m.ep if manifest_ok else 0)
    if not ep:
        a2a_sizes = {len(gs.ranks) for gs in sets.values() if gs.traffic.collectives.get(pb.COLL_ALL_TO_ALL)}
        ep = max(a2a_sizes) if a2a_sizes else 0
        if ep:
            reasons.append(f"all-to-all over groups of {ep} ranks -> ep={ep}")
    zero = spec.get("zero")
    if zero is None:
        zero = m.zero_stage if manifest_ok and m.zero_stage else detect_zero(mesh, job, traffic)
        if zero and not (manifest_ok and m.zero_stage):
            reasons.append("reduce-scatter/all-gather on the dp groups -> ZeRO stage 1")
    micro = int(spec.get("microbatches", 0)) or (m.microbatches if manifest_ok else 0)
    return LayoutDecision(mesh=mesh, ep=ep, microbatches=micro, zero=int(zero), source=source,
                          roles=roles, reasons=reasons)


def _stated_sizes(job: Job, world: int) -> dict[str, int] | None:
    """dp, tp, pp from the groups whose role the trace states (Megatron-core names its
    groups), when each stated axis has one group size and they multiply to the world."""
    sizes: dict[str, set[int]] = {}
    for g in job.manifest.groups:
        axis = ROLE_NAMES.get(g.role, "")
        if axis in AXES:
            sizes.setdefault(axis, set()).add(len(g.ranks))
    if not sizes or any(len(v) != 1 for v in sizes.values()):
        return None
    tp, pp = (min(sizes.get(a, {1})) for a in ("tp", "pp"))
    dp = min(sizes["dp"]) if "dp" in sizes else world // (tp * pp)
    return {"dp": dp, "tp": tp, "pp": pp} if dp * tp * pp == world else None


def geometric_role(mesh: Mesh, ranks: list[int]) -> str:
    """'dp'/'tp'/'pp'/'world' when the group is exactly one of the mesh's axis groups."""
    if len(ranks) == mesh.world and mesh.world > 1:
        return "world"
    s = frozenset(ranks)
    for axis in ("tp", "dp", "pp"):
        if mesh.size(axis) == len(ranks) > 1 and s == frozenset(mesh.group_ranks(ranks[0], [axis])):
            return axis
    return ""


def detect_zero(mesh: Mesh, job: Job, traffic: dict[int, GroupTraffic] | None = None) -> int:
    """1 when the groups that span data parallelism alone carry reduce-scatter or all-gather
    (a group across the tp ranks too, as a mixture of experts' token exchange, is not a
    gradient shard's)."""
    traffic = traffic if traffic is not None else group_traffic(job)
    if mesh.dp < 2:
        return 0
    for g in job.manifest.groups:
        ranks = list(g.ranks)
        if not spans_axis(mesh, ranks, "dp") or spans_axis(mesh, ranks, "tp") or spans_axis(mesh, ranks, "pp"):
            continue
        t = traffic.get(g.id)
        if t and (t.collectives.get(pb.COLL_REDUCE_SCATTER) or t.collectives.get(pb.COLL_ALL_GATHER)):
            return 1
    return 0


def spans_axis(mesh: Mesh, ranks: list[int], axis: str) -> bool:
    return len({mesh.coords(r)[axis] for r in ranks}) > 1
