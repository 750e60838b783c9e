"""The ex-situ tracer: one device plays the distinct ranks of a dp x tp x pp job in turn.

Which ranks are traced (``verify="sample"``, the default): ranks are grouped into candidate
classes, coarse to fine, and each class is accepted only when traced samples agree:

1. one class per pipeline stage (all tp and dp ranks of stage s);
2. per (stage, tp rank);
3. every rank on its own.

For each class the lowest and the highest rank are traced (for a stage: tp 0 / dp 0 and the
last tp / last dp rank) and their graphs' structure hashes (:mod:`echo_et.trace.identity`)
compared. Equal hashes accept the class: its ranks share the lowest rank's graph. Different
hashes split the class into the next level's classes, down to tracing every rank. A class
whose graphs use a process group that is not a layout group (tp, dp, pp, world) is always
split to single ranks, because which group an untraced rank would use cannot be derived.
So the ranks traced are proven to share a graph by content; the untraced ranks of an
accepted class are inferred from the two ends of the class agreeing (the rank enters the
workload only through its layout coordinates). ``verify="all"`` traces every rank and
groups them by hash: a full proof at world-size cost. ``verify="stage"`` traces only the
lowest rank of each pipeline stage (of each stage and context-parallel rank, whose ring
exchanges have peers of their own) and gives it to the whole stage: for workloads whose
tensor-parallel ranks and data-parallel replicas are symmetric by construction (the built-in
GPT: proven for small models by tracing every rank, tests/test_trace_meta.py); a stage graph
that uses a process group outside the layout is refused.

Ranks whose graphs have equal hashes, in any class, share one graph in the Job; the graph
keeps the timings of its lowest traced rank.
"""

from __future__ import annotations

import gc
import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from echo_et.errors import CheckError, EchoError, OptionError
from echo_et.ir import Job, JobBuilder, check_job
from echo_et.ir.conventions import WORKLOAD_ATTR
from echo_et.ir.limits import MAX_TRACE_STEPS, fills_nodes
from echo_et.trace.identity import structure_hash
from echo_et.trace.layout import CP_ROLE, DERIVED_ROLES, EP_ROLE, ROLES, ParallelLayout
from echo_et.trace.parallel import can_fork, trace_in_parallel
from echo_et.trace.records import CommRecord
from echo_et.trace.session import RankRun, trace_rank

VERIFY_MODES = ("sample", "all", "stage")
_UNSET_DESC = ("", "undefined")


@dataclass
class TraceOptions:
    device: str = "cpu"
    verify: str = "sample"
    memory_limit_bytes: int | None = None
    warmup_steps: int = 1
    measured_steps: int = 1
    replay: bool = True            # meta device: record repeated units once (direct.py)
    memo: bool = True              # meta device: a call repeated with the same metadata is not run again (memo.py)
    jobs: int = 1                  # meta device: processes tracing the distinct ranks (parallel.py)
    check: bool = True             # run the IR checker on the Job (sweeps of proven workloads skip it)
    name: str = ""
    command: str = ""
    progress: Callable[[str], None] | None = None


@dataclass
class TraceResult:
    job: Job
    traced_ranks: list[int]
    peak_memory_bytes: dict[int, int]
    wall_s: float
    rank_wall_s: dict[int, float] = field(default_factory=dict)

    @property
    def graphs(self) -> int:
        return len(self.job.graph_ids())

    def summary(self) -> dict[str, Any]:
        return {
            "world_size": self.job.world_size,
            "traced_ranks": len(self.traced_ranks),
            "traced": self.traced_ranks,
            "graphs": self.graphs,
            "peak_memory_bytes": {str(r): b for r, b in sorted(self.peak_memory_bytes.items())},
            "wall_s": round(self.wall_s, 3),
        }


def group_key(layout: ParallelLayout, rank: int, rec: CommRecord) -> str:
    """The graph-local key of the group a record used: a layout role when its members are
    that role's group of ``rank``, else ``world``, else the group's description or name."""
    ranks = tuple(rec.group_ranks)
    desc = rec.group_desc if rec.group_desc not in _UNSET_DESC else ""
    if desc in layout.roles + DERIVED_ROLES and ranks == layout.group_ranks(desc, rank):
        return desc
    for role in layout.roles:
        if ranks == layout.group_ranks(role, rank):
            return role
    for role in DERIVED_ROLES:
        if layout.is_member(role, rank) and ranks == layout.group_ranks(role, rank):
            return role
    if ranks == tuple(range(layout.world_size)):
        return "world"
    return desc or f"pg:{rec.group_name}"


def _layout_key(key: str) -> bool:
    return key in ROLES or key in (CP_ROLE, EP_ROLE) or key in DERIVED_ROLES or key == "world"


class _Tracer:
    def __init__(self, build_fn: Callable, layout: ParallelLayout, options: TraceOptions):
        self.build_fn = build_fn
        self.layout = layout
        self.options = options
        self.runs: dict[int, RankRun] = {}
        self.hashes: dict[int, str] = {}
        self.rep: dict[int, int] = {}          # rank -> traced rank whose graph it shares

    def say(self, msg: str) -> None:
        if self.options.progress is not None:
            self.options.progress(msg)

    def _trace(self, rank: int) -> tuple[RankRun, str]:
        r = trace_rank(self.build_fn, self.layout, rank, device=self.options.device,
                       key_of=lambda rk, rec: group_key(self.layout, rk, rec),
                       memory_limit_bytes=self.options.memory_limit_bytes,
                       warmup_steps=self.options.warmup_steps,
                       measured_steps=self.options.measured_steps,
                       replay=self.options.replay, memo=self.options.memo)
        return r, structure_hash(r.graph)

    def _keep(self, rank: int, r: RankRun, digest: str) -> None:
        c = self.layout.coords(rank)
        self.runs[rank] = r
        self.hashes[rank] = digest
        cp = f", cp {c['cp']}" if "cp" in c else ""
        self.say(f"traced rank {rank} (pp {c['pp']}, tp {c['tp']}, dp {c['dp']}{cp}): "
                 f"{len(r.graph)} nodes, {len(r.records)} comm calls, "
                 f"peak {r.peak_memory_bytes} B, "
                 + (f"{r.measured_steps} measured steps, " if r.measured_steps > 1 else "")
                 + f"{r.wall_s:.1f} s")

    def run(self, rank: int) -> str:
        if rank not in self.runs:
            self._keep(rank, *self._trace(rank))
        return self.hashes[rank]

    def prefetch(self) -> None:
        """With ``jobs`` > 1 on the meta device, trace the ranks a ``stage`` or ``all``
        verification will run on several cores first (:mod:`echo_et.trace.parallel`)."""
        opts = self.options
        if opts.jobs <= 1 or opts.device != "meta" or opts.verify not in ("stage", "all") or not can_fork():
            return
        if opts.verify == "all":
            ranks = list(range(self.layout.world_size))
        else:
            firsts: dict[tuple[int, int], int] = {}
            for r in range(self.layout.world_size):
                firsts.setdefault(self._stage_of(r), r)
            ranks = sorted(firsts.values())
        if len(ranks) < 2:
            return
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)   # no OpenMP pool: a fork must not inherit one (its threads are not copied)
        try:
            got = trace_in_parallel(ranks, opts.jobs, self._trace)
        finally:
            torch.set_num_threads(threads)
        for r in sorted(got):
            self._keep(r, *got[r])

    def _stage_of(self, rank: int) -> tuple[int, int]:
        """(pipeline stage, context-parallel rank): the class ``verify="stage"`` traces once."""
        c = self.layout.coords(rank)
        return c["pp"], c.get("cp", 0)

    def custom_keys(self, rank: int) -> bool:
        g = self.runs[rank].graph
        return any(not _layout_key(k) for k in g.header.group_sizes)

    def resolve(self, members: Sequence[int], level: int) -> None:
        levels: list[Callable[[int], Any]] = [
            lambda r: self.layout.coords(r)["pp"],
            lambda r: (*self._stage_of(r), self.layout.coords(r)["tp"]),
        ]
        if self.layout.cp > 1:       # each context-parallel rank's ring has its own peers
            levels.insert(1, self._stage_of)
        if self.options.verify == "all" or level >= len(levels):
            for r in members:
                self.run(r)
                self.rep[r] = r
            return
        key_of = self._stage_of if self.options.verify == "stage" else levels[level]
        classes: dict[Any, list[int]] = {}
        for r in members:
            classes.setdefault(key_of(r), []).append(r)
        for key in sorted(classes):
            cls = sorted(classes[key])
            if self.options.verify == "stage":
                self.run(cls[0])
                if self.custom_keys(cls[0]):
                    raise EchoError(f"layout {self.layout.describe()}: rank {cls[0]} uses a process "
                                    "group outside the layout; trace it with verify sample or all")
                for r in cls:
                    self.rep[r] = cls[0]
                continue
            samples = sorted({cls[0], cls[-1]})
            hashes = {self.run(s) for s in samples}
            if len(hashes) == 1 and not any(self.custom_keys(s) for s in samples):
                for r in cls:
                    self.rep[r] = cls[0]
            else:
                why = ("graphs differ" if len(hashes) > 1 else "non-layout process groups")
                self.say(f"class {key} ({len(cls)} ranks): {why}; splitting")
                self.resolve(cls, level + 1)

    def trace(self) -> TraceResult:
        t0 = time.perf_counter()
        # What was imported so far lives for the whole process: freezing it keeps the
        # collections that free each rank's model from walking torch's import heap.
        gc.freeze()
        try:
            self.prefetch()
            self.resolve(list(range(self.layout.world_size)), 0)
        finally:
            gc.unfreeze()
        job = self.assemble()
        issues = check_job(job) if self.options.check else []
        if issues:
            raise CheckError(f"ex-situ job of layout {self.layout.describe()} fails the "
                             f"checker: {issues[0]}")
        return TraceResult(job=job, traced_ranks=sorted(self.runs),
                           peak_memory_bytes={r: run.peak_memory_bytes
                                              for r, run in self.runs.items()},
                           wall_s=time.perf_counter() - t0,
                           rank_wall_s={r: run.wall_s for r, run in self.runs.items()})

    # -- job assembly ------------------------------------------------------------------
    def assemble(self) -> Job:
        lay = self.layout
        opts = self.options
        world = lay.world_size
        jb = JobBuilder(opts.name or "ex-situ", world, source_format="ex-situ")
        m = jb.job.manifest
        if opts.command:
            m.provenance.command = opts.command
        m.layout.dp, m.layout.tp, m.layout.pp = lay.dp, lay.tp, lay.pp
        if lay.cp > 1:
            m.layout.cp = lay.cp
        if lay.ep > 1:
            m.layout.ep = lay.ep
        m.layout.microbatches = lay.microbatches
        m.layout.zero_stage = lay.zero
        m.layout.source = "traced"

        # Keyed by (role, first member): hashing a group's member tuple per rank is quadratic.
        group_id: dict[tuple[str, int], int] = {}
        for role in lay.roles:
            for i, ranks in enumerate(lay.all_groups(role)):
                group_id[(role, ranks[0])] = jb.group(ranks, name=f"{role}{i}", desc=role, role=role)
        derived = sorted({k for r in self.runs for k in self.runs[r].graph.header.group_sizes
                          if k in DERIVED_ROLES})
        for role in derived:
            for i, ranks in enumerate(lay.all_groups(role)):
                group_id[(role, ranks[0])] = jb.group(ranks, name=f"{role}{i}", desc=role,
                                                      role="custom")
        uses_world = any("world" in self.runs[r].graph.header.group_sizes for r in self.runs)
        all_ranks = tuple(range(world))
        if uses_world:
            group_id[("world", 0)] = jb.group(all_ranks, name="world", desc="default_pg", role="world")

        # One graph per distinct structure: the lowest traced rank with that hash.
        graph_of_hash: dict[str, int] = {}
        for r in sorted(self.runs):
            graph_of_hash.setdefault(self.hashes[r], r)
        used: set[int] = set()
        for r in range(world):
            used.add(graph_of_hash[self.hashes[self.rep[r]]])
        dropped: Counter = Counter()
        for g in sorted(used):
            run = self.runs[g]
            graph = run.graph
            c = lay.coords(g)
            cp = f" cp rank {c['cp']}" if "cp" in c else ""
            graph.header.name = f"pp stage {c['pp']}{cp} (traced as rank {g})"
            graph.header.attrs["trace.rank"] = str(g)
            graph.header.attrs["trace.device"] = opts.device
            jb.add_graph(graph)
            dropped.update(run.dropped)

        for r in range(world):
            rep = self.rep[r]
            gid = graph_of_hash[self.hashes[rep]]
            groups = {role: group_id[(role, lay.group_first(role, r))] for role in lay.roles}
            for role in derived:
                if role in self.runs[gid].graph.header.group_sizes:
                    groups[role] = group_id[(role, lay.group_first(role, r))]
            if uses_world:
                groups["world"] = group_id[("world", 0)]
            if r in self.runs:
                # A rank issues hundreds of thousands of calls on a handful of groups: each
                # group is looked at once, made in the order of its first call, and a key two
                # groups share goes to the one called last, as call by call.
                last: dict[tuple[str, str, tuple[int, ...]], int] = {}
                first: dict[tuple[str, str, tuple[int, ...]], CommRecord] = {}
                for i, rec in enumerate(self.runs[r].records):
                    group = (rec.group_name, rec.group_desc, rec.group_ranks)
                    if group not in first:
                        first[group] = rec
                    last[group] = i
                made: dict[tuple[str, str, tuple[int, ...]], tuple[str, int]] = {}
                for group, rec in first.items():
                    key = group_key(lay, r, rec)
                    if not _layout_key(key):
                        made[group] = (key, jb.group(rec.group_ranks, name=rec.group_name,
                                                     desc=rec.group_desc, role="custom"))
                for group in sorted(made, key=last.__getitem__):
                    key, made_id = made[group]
                    groups[key] = made_id
            jb.bind(r, f"rank{gid}", groups, measured_step_ns=self.runs[gid].measured_step_ns)
        for reason in sorted(dropped):
            jb.drop(reason, dropped[reason])
        m.attrs["trace.device"] = opts.device
        m.attrs["trace.verify"] = opts.verify
        m.attrs["trace.measured_steps"] = str(opts.measured_steps)
        m.attrs["trace.traced_ranks"] = ",".join(str(r) for r in sorted(self.runs))
        m.attrs["trace.peak_memory_bytes"] = json.dumps(
            {str(r): self.runs[r].peak_memory_bytes for r in sorted(self.runs)}, sort_keys=True)
        return jb.build()


def trace(build_fn: Callable, layout: ParallelLayout, options: TraceOptions | None = None, *,
          workload_attrs: dict[str, Any] | None = None) -> TraceResult:
    """Trace the job that ``build_fn`` defines at ``layout`` (build_fn contract:
    :mod:`echo_et.trace.context`); returns the Job for the whole world and what it cost."""
    options = options or TraceOptions()
    if options.verify not in VERIFY_MODES:
        raise EchoError(f"verify mode {options.verify!r} is not one of {', '.join(VERIFY_MODES)}")
    if options.warmup_steps < 0:
        raise EchoError(f"warm-up steps must be >= 0, got {options.warmup_steps}")
    if options.measured_steps < 1:
        raise EchoError(f"measured steps must be >= 1, got {options.measured_steps}")
    for option, n in (("warmup", options.warmup_steps), ("steps", options.measured_steps)):
        if n > MAX_TRACE_STEPS:
            raise OptionError(option, f"{n:,} steps: each traced rank runs the whole model once per step; "
                                      f"the limit is {MAX_TRACE_STEPS:,}")
    if options.device not in ("cpu", "meta") and not options.device.startswith("cuda"):
        raise EchoError(f"device {options.device!r}: use cpu, meta or cuda[:N]")
    if options.device == "meta" and options.measured_steps != 1:
        raise EchoError(f"measured steps = {options.measured_steps}: nothing is timed on the "
                        "meta device, trace it with one step")
    if options.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise EchoError(f"layout {layout.describe()}: device {options.device} requested but "
                            "torch sees no CUDA device")
    result = _Tracer(build_fn, layout, options).trace()
    m = result.job.manifest
    if workload_attrs:
        m.attrs[WORKLOAD_ATTR] = json.dumps(workload_attrs, sort_keys=True)
    if options.device.startswith("cuda"):
        import torch

        m.hardware.gpu_name = torch.cuda.get_device_name(options.device)
        if fills_nodes(m.world_size, torch.cuda.device_count()):   # else unknown (the node-fill rule)
            m.hardware.gpus_per_node = torch.cuda.device_count()
    return result
