"""Several Kineto files (one per rank) -> one Job.

Rank of a file: ``distributedInfo.rank``, else a number in its name (``rank-3``, ``rank3``,
``worker3``, ``...3.json``), else ``--rank`` (one file only), else 0 for a lone file.
All files must agree on the world size and on the members of same-named process groups,
claim distinct ranks, overlap in time and share the chosen ProfilerStep; anything else is
refused with one line naming the file.

Partial jobs (fewer files than the world size) take one of two forms, recorded in the
manifest attr ``kineto.partial``:
  replicated  when the world size is stated (by a file or --world-size), every process
              group the traced ranks use is the whole world, nothing is
              point-to-point and the traced ranks issue the same collectives (the usual
              single-rank trace of a data-parallel job): the Job keeps the real world size
              and binds each untraced rank to the lowest traced rank's graph
              (``dropped["untraced_ranks_copied"]``; their measured step time is 0, unknown);
  renumbered  otherwise (e.g. 2 sampled ranks of 128 using unknown sub-groups): the Job
              holds the traced ranks renumbered 0..k-1 in rank order, its world size is k,
              every group keeps only its traced members, send/recv to untraced peers become
              communication of unknown peer, and a group whose traced members disagree on
              what they issued (sampled traces) is split into one group per member
              (``dropped["partial_job_group_split"]``); ``kineto.original_world_size`` keeps
              the real size, ``dropped["ranks_not_traced"]`` the missing count.
Either way the Job passes the checker; each graph keeps its file's rank in the header
attr ``kineto.rank`` and the manifest lists them in ``kineto.traced_ranks``.

Clock: each graph's times start at its own earliest kept event; ``RankBinding.
clock_offset_ns`` places it on the job clock whose 0 is the job's earliest kept event
(wall clock = ``baseTimeNanoseconds`` + ``ts`` when the file states its base).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Job, JobBuilder
from echo_et.ir.conventions import MEGATRON_AXIS_DESCS, NCCL_VERSION_ATTR
from echo_et.ir.limits import MAX_WORLD_SIZE, checked_int, fills_nodes
from echo_et.ir.schema import EQUAL_SIZE_COLLECTIVES, pb

from .build import RankContext, RankGraph, build_rank_graph
from .events import TraceFile, load_trace
from .groups import GroupUse, pg_config
from .payloads import IN_SPLIT_ATTR, OUT_SPLIT_ATTR
from .steps import choose_step, recording_span, window_of

_NAME_RANK = [
    re.compile(r"(?:^|[^a-z])rank[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"(?:^|[^a-z])worker[-_.]?(\d+)", re.IGNORECASE),
    re.compile(r"\.(\d{1,6})\.(?:pt\.trace\.)?json(?:\.gz)?$", re.IGNORECASE),
]
_MAX_CLOCK_GAP_NS = 60 * 10**9


def rank_of_name(name: str) -> int | None:
    for pat in _NAME_RANK:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def _int(v) -> int | None:
    return v if type(v) is int else None


def _ranks_and_world(files: list[TraceFile], options) -> tuple[list[int], int, bool]:
    """Rank of each file, the world size, and whether that size was stated (by a file or
    ``--world-size``) rather than inferred from the highest rank."""
    ranks: list[int] = []
    for tf in files:
        r = _int(tf.distributed.get("rank"))
        if r is None:
            r = rank_of_name(tf.name)
        if r is None and len(files) == 1:
            r = options.rank if options.rank is not None else 0
        if r is None:
            raise OptionError("rank", f"{tf.path}: cannot tell its rank (no distributedInfo.rank, no "
                                      "rank in the file name); convert it alone and give its rank")
        if r < 0:
            raise EchoError(f"{tf.path}: negative rank {r}")
        checked_int(r, "rank", hi=MAX_WORLD_SIZE - 1, where=str(tf.path))
        ranks.append(r)
    world = None
    world_file = None
    for tf in files:
        raw = tf.distributed.get("world_size")
        if raw is None:
            continue
        ws = checked_int(raw, "distributedInfo.world_size", lo=1, hi=MAX_WORLD_SIZE, where=str(tf.path))
        if world is not None and ws != world:
            raise EchoError(f"{tf.path}: world size {ws} disagrees with {world} of "
                            f"{world_file.name if world_file else '?'}; not one job")
        world, world_file = ws, tf
    seen: dict[int, TraceFile] = {}
    for tf, r in zip(files, ranks, strict=True):
        if r in seen:
            raise EchoError(f"{tf.path}: claims rank {r}, like {seen[r].path}")
        seen[r] = tf
    stated = world is not None or bool(options.world_size)
    if world is None:
        world = options.world_size or (max(ranks) + 1)
    for tf, r in zip(files, ranks, strict=True):
        if r >= world:
            raise EchoError(f"{tf.path}: rank {r} is outside world size {world}")
    return ranks, world, stated


def _check_one_job(files: list[TraceFile]) -> None:
    groups: dict[str, tuple[tuple[int, ...], TraceFile]] = {}
    for tf in files:
        for name, pg in pg_config(tf.distributed).items():
            prev = groups.get(name)
            if prev is not None and prev[0] != pg.ranks:
                raise EchoError(f"{tf.path}: process group {name!r} has ranks "
                                f"{list(pg.ranks)[:8]} but {prev[1].name} says "
                                f"{list(prev[0])[:8]}; not one job")
            groups.setdefault(name, (pg.ranks, tf))
    if len(files) < 2:
        return
    spans = []
    for tf in files:
        lo, hi = recording_span(tf)
        spans.append((tf.base_ns + lo, tf.base_ns + hi, tf))
    late = max(spans, key=lambda s: s[0])
    early = min(spans, key=lambda s: s[1])
    if late[0] - early[1] > _MAX_CLOCK_GAP_NS:
        gap = (late[0] - early[1]) / 1e9
        raise EchoError(f"{late[2].path}: starts {gap:.0f} s after {early[2].name} ends; "
                        "traces of different runs, not one job")
    backends = {str(tf.distributed.get("backend")) for tf in files if tf.distributed.get("backend")}
    if len(backends) > 1:
        raise EchoError(f"{files[-1].path}: backends differ across files "
                        f"({', '.join(sorted(backends))}); not one job")


def _job_name(paths: list[Path], options) -> str:
    if options.name:
        return options.name
    if len(paths) == 1:
        n = paths[0].name
        for suffix in (".gz", ".json", ".trace", ".pt"):
            n = n.removesuffix(suffix)
        return n
    parents = {p.parent.name for p in paths}
    return parents.pop() if len(parents) == 1 else "kineto"


def read_job(paths: list[Path], options) -> Job:
    files = [load_trace(p) for p in paths]
    ranks, world, world_stated = _ranks_and_world(files, options)
    order = sorted(range(len(files)), key=lambda i: ranks[i])
    files = [files[i] for i in order]
    ranks = [ranks[i] for i in order]
    _check_one_job(files)
    step = choose_step(files, options.step)

    built: list[tuple[int, TraceFile, RankGraph]] = []
    for tf, r in zip(files, ranks, strict=True):
        ctx = RankContext(
            graph_id=f"rank{r}", rank=r, world_size=world, window=window_of(tf, step),
            pgs=pg_config(tf.distributed), backend=str(tf.distributed.get("backend", "") or ""))
        try:
            built.append((r, tf, build_rank_graph(tf, ctx)))
        except EchoError as e:
            msg = str(e)
            raise EchoError(msg if msg.startswith(str(tf.path)) else f"{tf.path}: {msg}") from None
        tf.events = []  # let its events go before the next rank is built

    traced = sorted(ranks)
    mode = "complete"
    if traced != list(range(world)):
        # Copying the program to ranks nobody said exist would invent them.
        mode = "replicated" if world_stated and _replicable(built, world) else "renumbered"
    if mode == "renumbered":
        job_index = {r: i for i, r in enumerate(traced)}
        _renumber(built, job_index)
        split = _split_inconsistent_groups(built, job_index)
        job_world = len(traced)
    else:
        job_index = {r: r for r in range(world)}
        split = 0
        job_world = world

    jb = JobBuilder(_job_name(paths, options), job_world, source_format="kineto")
    m = jb.job.manifest
    m.step = step if step is not None else -1
    m.provenance.inputs.extend(sorted(p.name for p in paths))
    job_origin = min(rg.origin_ns for _, _, rg in built)
    dropped: Counter = Counter()
    bindings: dict[int, dict[str, int]] = {}
    for r, _tf, rg in built:
        jb.add_graph(rg.graph)
        bound: dict[str, int] = {}
        for key in sorted(rg.groups):
            use = rg.groups[key]
            mapped = [job_index[x] for x in use.ranks if x in job_index]
            role = "world" if (use.desc == "default_pg" or use.key == "0") \
                and len(use.ranks) == world else MEGATRON_AXIS_DESCS.get(use.desc, 0)
            bound[key] = jb.group(mapped, name=use.name, desc=use.desc, role=role)
        bindings[r] = bound
        jb.bind(job_index[r], rg.graph.id, bound, measured_step_ns=rg.measured_step_ns,
                clock_offset_ns=rg.origin_ns - job_origin)
        dropped.update(rg.dropped)
    if mode == "replicated":
        ref_rank, _, ref = built[0]
        ref_binding = jb.job.binding(ref_rank)
        for r in range(world):
            if r not in bindings:
                jb.bind(r, ref.graph.id, bindings[ref_rank],
                        clock_offset_ns=ref_binding.clock_offset_ns)
        jb.drop("untraced_ranks_copied", world - len(traced))
    for reason in sorted(dropped):
        jb.drop(reason, dropped[reason])
    backend = next((str(tf.distributed["backend"]) for _, tf, _ in built
                    if tf.distributed.get("backend")), "")
    if backend:
        m.attrs["kineto.backend"] = backend
    nccl = next((str(tf.distributed["nccl_version"]) for _, tf, _ in built
                 if isinstance(tf.distributed.get("nccl_version"), str)), "")
    if nccl and len(nccl) <= 32:
        m.attrs[NCCL_VERSION_ATTR] = nccl
    if mode != "complete":
        m.attrs["kineto.traced_ranks"] = ",".join(str(r) for r in traced)
        m.attrs["kineto.partial"] = mode
    if mode == "renumbered":
        jb.drop("ranks_not_traced", world - len(traced))
        jb.drop("partial_job_group_split", split)
        m.attrs["kineto.original_world_size"] = str(world)
    _hardware(jb, [tf for _, tf, _ in built], options)
    return jb.build()


def _replicable(built: list[tuple[int, TraceFile, RankGraph]], world: int) -> bool:
    """Untraced ranks can run the program of the lowest traced rank: every group used is
    the whole world, nothing is point-to-point, and the traced ranks issue the same
    collectives."""
    everyone = tuple(range(world))
    for _, _, rg in built:
        if any(use.ranks != everyone for use in rg.groups.values()):
            return False
        if any(n.kind in (pb.KIND_SEND, pb.KIND_RECV) for n in rg.graph.nodes):
            return False
    keys = set().union(*(rg.groups for _, _, rg in built))
    for key in keys:
        if len({_collective_signature(rg.graph, key) for _, _, rg in built}) > 1:
            return False
    return True


def _renumber(built: list[tuple[int, TraceFile, RankGraph]], job_index: dict[int, int]) -> None:
    """Restrict groups to traced members; point-to-point peers follow (an untraced peer
    makes the send/recv communication of unknown peer)."""
    for _, _, rg in built:
        for key, use in list(rg.groups.items()):
            kept = tuple(r for r in use.ranks if r in job_index)
            rg.graph.header.group_sizes[key] = len(kept)
            if kept != use.ranks:
                rg.dropped["all_to_all_splits_of_untraced_peers"] += _forget_splits(rg.graph, key)
            new_pos = {r: i for i, r in enumerate(kept)}
            for n in rg.graph.nodes:
                if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group == key:
                    peer = use.ranks[n.p2p.peer]
                    if peer in new_pos:
                        n.p2p.peer = new_pos[peer]
                    else:
                        _demote(n)
                        rg.dropped["p2p_peer_not_traced"] += 1
            rg.groups[key] = GroupUse(use.key, use.name, use.desc, kept, use.guess)


def _collective_signature(graph, key: str) -> tuple:
    nodes = [n for n in graph.nodes
             if n.kind == pb.KIND_COLLECTIVE and n.collective.group == key]
    nodes.sort(key=lambda n: n.collective.seq)
    return tuple((n.collective.type, n.collective.in_bytes
                  if n.collective.type in EQUAL_SIZE_COLLECTIVES else -1) for n in nodes)


def _p2p_pairs(graph, use: GroupUse, job_index: dict[int, int], rank: int) -> dict:
    """(sender, receiver, key) -> byte sizes in order, as this rank sees them."""
    out: dict[tuple, list[int]] = {}
    me = job_index[rank]
    for n in graph.nodes:
        if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group == use.key:
            peer = job_index[use.ranks[n.p2p.peer]]
            pair = (me, peer) if n.kind == pb.KIND_SEND else (peer, me)
            out.setdefault(pair + (use.key,), []).append(n.p2p.bytes)
    return out


def _forget_splits(graph, key: str) -> int:
    """Remove per-peer all-to-all sizes on a group that lost members (they name peers the
    Job no longer has). Returns how many collectives had them."""
    n_forgot = 0
    for n in graph.nodes:
        if n.kind == pb.KIND_COLLECTIVE and n.collective.group == key and (
                IN_SPLIT_ATTR in n.attrs or OUT_SPLIT_ATTR in n.attrs):
            n.attrs.pop(IN_SPLIT_ATTR, None)
            n.attrs.pop(OUT_SPLIT_ATTR, None)
            n_forgot += 1
    return n_forgot


def _demote(n: pb.Node) -> None:
    n.attrs["comm"] = "send" if n.kind == pb.KIND_SEND else "recv"
    n.ClearField("p2p")
    n.kind = pb.KIND_COMM_UNKNOWN


def _split_inconsistent_groups(built: list[tuple[int, TraceFile, RankGraph]],
                               job_index: dict[int, int]) -> int:
    """In a partial job, a group whose traced members disagree on what they issued (sampled
    or filtered traces) cannot be one group: each member keeps it alone (size 1) and its
    send/recv there become communication of unknown peer. Returns how many members."""
    members: dict[tuple, list[tuple[int, RankGraph, str]]] = {}
    for r, _, rg in built:
        for key, use in rg.groups.items():
            members.setdefault((use.name, use.ranks), []).append((r, rg, key))
    split = 0
    for ident in sorted(members):
        mem = members[ident]
        if len(mem) < 2:
            continue
        sigs = {_collective_signature(rg.graph, key) for _, rg, key in mem}
        sends: dict[tuple, list[int]] = {}
        recvs: dict[tuple, list[int]] = {}
        for r, rg, key in mem:
            for pair, sizes in _p2p_pairs(rg.graph, rg.groups[key], job_index, r).items():
                (sends if pair[0] == job_index[r] else recvs).setdefault(pair, sizes)
        if len(sigs) == 1 and sends == recvs:
            continue
        for r, rg, key in mem:
            use = rg.groups[key]
            rg.groups[key] = GroupUse(key, use.name, use.desc, (r,), "partial_job_group_split")
            rg.graph.header.group_sizes[key] = 1
            rg.dropped["all_to_all_splits_of_untraced_peers"] += _forget_splits(rg.graph, key)
            for n in rg.graph.nodes:
                if n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group == key:
                    _demote(n)
            split += 1
    return split


def _hardware(jb: JobBuilder, files: list[TraceFile], options) -> None:
    hw = jb.job.manifest.hardware
    names = next((tf.device_names for tf in files if tf.device_names), [])
    if names:
        hw.gpu_name = names[0]
    if options.gpus_per_node:
        hw.gpus_per_node = options.gpus_per_node
    elif names and fills_nodes(jb.job.manifest.world_size, len(names)):
        # the devices the trace saw, as nodes of the job: only where the world fills them
        # (the checker's node-fill rule); otherwise unknown, for --gpus-per-node to say
        hw.gpus_per_node = len(names)
