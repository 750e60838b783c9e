"""SimAI / AICB text workloads (the input of SimAI's ``astra-sim-alibabacloud``).

Format (read by ``Workload::initialize_workload`` in aliyun/SimAI; written by AICB's
``SimAI_training_workload_generator``/``AIOB_simAI_workload_generator``):

- Line 1: the parallelism policy, then ``key: value`` pairs:
  ``HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 ep: 16 pp: 12 vpp: 8 ga: 24
  all_gpus: 9216 checkpoints: 0 checkpoint_initiates: 0 pp_comm 50331648``.
  ``model_parallel_NPU_group`` is the tensor-parallel size (TP), ``ep`` the expert-parallel
  size, ``pp`` the pipeline stages, ``vpp`` virtual stages, ``ga`` micro-batches per step,
  ``all_gpus`` the world size, ``pp_comm`` the bytes one stage sends to the next.
  Older files (``MICRO`` micro-benchmarks, AICB model workloads) carry fewer keys.
- Line 2: the number of layer lines that follow.
- One line per layer, 12 whitespace-separated columns: ``name reserved(-1) fwd_compute
  fwd_comm_type fwd_comm_bytes ig_compute ig_comm_type ig_comm_bytes wg_compute
  wg_comm_type wg_comm_bytes update_time``.

Semantics, as SimAI runs them:

- Compute times are SimAI ticks = **nanoseconds** (``CLOCK_PERIOD 1``; SimAI reports
  ``ticks / 1000`` as µs; AICB writes AIOB's µs measurements ×1000). 1 is AICB's
  placeholder for "no compute" and is not turned into a node.
- Comm types ``ALLREDUCE``, ``ALLGATHER``, ``REDUCESCATTER``, ``ALLTOALL``, ``NONE``; the
  suffix picks the group: none = tensor-parallel group for forward and input-gradient
  comm, data-parallel group for weight-gradient comm; ``_EP`` the expert-parallel group;
  ``_DP_EP`` the data-parallel group among equal experts. Sizes are per-rank bytes of the
  buffer SimAI's ring cuts into one chunk per rank: an all-gather's output (the IR's
  ``in_bytes`` is its shard, size / n), a reduce-scatter's input.
  ``BROADCAST`` (AICB's input broadcast; SimAI itself ignores it) is kept as a broadcast
  from group rank 0. ``MICRO`` workloads run every collective on all ranks.
- Groups as SimAI's ``MockNcclGroup`` builds them: TP groups are consecutive ranks; with
  rank = tp + TP*(pp + PP*dp), a DP group fixes (tp, pp); the DP group splits into EP
  groups of consecutive dp indices and DP_EP groups of equal index within EP groups.
- Order (``Workload::iterate_*``): forward layer by layer, compute then its blocking comm;
  then backward from the last layer: input-gradient compute and comm, weight-gradient
  compute, and the weight-gradient comm issued without waiting (it only has to finish by
  the end of the step). ``DATA``, ``MODEL`` and ``HYBRID_DATA_MODEL``/``_MODEL_DATA`` differ
  as in SimAI (no forward comm for DATA, no input-gradient comm for the first layer, ...).

What is not modelled, counted in the Job's ``dropped``: pipeline transfers (SimAI itself
adds the pipeline bubble analytically from ``pp_comm``; every stage runs the same layer
list, so all ranks share one graph), activation checkpointing (inert in SimAI), the
``update_time`` column (a fixed delay after each collective), comm of 0 bytes and comm on a
one-rank group (SimAI creates no communicator for it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from echo_et.errors import EchoError, OptionError
from echo_et.ir import GraphBuilder, Job, JobBuilder
from echo_et.ir.collectives import SIMAI_NAMES
from echo_et.ir.limits import (
    INT64_MAX,
    MAX_BYTES,
    MAX_MICROBATCHES,
    MAX_NS,
    MAX_PIPELINE_STAGES,
    MAX_WORLD_SIZE,
    fills_nodes,
)
from echo_et.ir.schema import pb

POLICIES = (
    "MICRO", "DATA", "MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA", "HYBRID_TRANSFORMER",
    "HYBRID_TRANSFORMER_FWD_IN_BCKWD", "HYBRID_DLRM", "HYBRID_DLRM_ENHANCED",
    "HYBRID_CUSTOMIZED", "DISTRIBUTED_INFERENCE",
)
SUPPORTED = frozenset(POLICIES[:7])
_COMM_TYPES = SIMAI_NAMES  # the format's exact tokens; the IR keeps every collective spelling
_SUFFIX_GROUP = {"_EP": "ep", "_DP_EP": "dp_ep"}
_HEADER_KEYS = {
    "model_parallel_NPU_group": "tp", "ep": "ep", "pp": "pp", "vpp": "vpp", "ga": "ga",
    "all_gpus": "all_gpus", "checkpoints": "checkpoints",
    "checkpoint_initiates": "checkpoint_initiates", "pp_comm": "pp_comm",
}
PLACEHOLDER_NS = 1
_GPU_IN_NAME = re.compile(r"_(A100|A800|H100|H800|H20|H200|B200)(?:[_.]|$)")


@dataclass
class Comm:
    type: int
    group: str      # "tp", "dp", "ep", "dp_ep" or "world"
    nbytes: int


@dataclass
class Layer:
    name: str
    line: int
    fwd_ns: int
    fwd_comm: Comm | None
    ig_ns: int
    ig_comm: Comm | None
    wg_ns: int
    wg_comm: Comm | None
    update_ns: int


@dataclass
class Workload:
    policy: str
    header: dict[str, int]
    layers: list[Layer]
    ignored_tokens: int = 0
    missing_layers: int = 0     # declared on line 2 but not in the file


# -- parsing ----------------------------------------------------------------------------------
def sniff(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", errors="strict")
    except (OSError, UnicodeDecodeError):
        return False
    lines = head.splitlines()
    if len(lines) < 2 or not lines[0].split():
        return False
    return lines[0].split()[0] in POLICIES and lines[1].strip().isdigit()


def _int(tok: str, where: str, what: str, hi: int = INT64_MAX) -> int:
    try:
        v = int(tok)
    except ValueError:
        raise EchoError(f"{where}: {what} {tok[:40]!r} is not an integer") from None
    if v < 0 and what != "reserved column":
        raise EchoError(f"{where}: {what} {v} is negative")
    if abs(v) > hi:
        raise EchoError(f"{where}: {what} {tok[:40]} is out of range (at most {hi})")
    return v


# Largest value of each header key: counts bound the work and memory a conversion spends.
_HEADER_MAX = {"tp": MAX_WORLD_SIZE, "ep": MAX_WORLD_SIZE, "pp": MAX_PIPELINE_STAGES,
               "vpp": MAX_PIPELINE_STAGES, "ga": MAX_MICROBATCHES, "all_gpus": MAX_WORLD_SIZE,
               "checkpoints": 1 << 20, "checkpoint_initiates": 1 << 20, "pp_comm": MAX_BYTES}


def _parse_header(line: str, where: str) -> tuple[str, dict[str, int]]:
    toks = line.split()
    if not toks:
        raise EchoError(f"{where}: line 1 is empty; a SimAI workload starts with its parallelism policy")
    policy = toks[0]
    if policy not in POLICIES:
        raise EchoError(f"{where}: line 1: {policy!r} is not a SimAI parallelism policy "
                        f"({', '.join(POLICIES)})")
    header: dict[str, int] = {}
    i = 1
    while i < len(toks):
        key = toks[i].rstrip(":")
        if key in _HEADER_KEYS and i + 1 < len(toks):
            name = _HEADER_KEYS[key]
            header[name] = _int(toks[i + 1], f"{where}: line 1", key, _HEADER_MAX[name])
            i += 2
            if key in ("checkpoints", "checkpoint_initiates"):
                i += header[_HEADER_KEYS[key]]  # the layer indices that follow the count
        else:
            i += 1
    return policy, header


def _comm(type_tok: str, size_tok: str, default_group: str, where: str, what: str) -> Comm | None:
    size = _int(size_tok, where, f"{what} bytes", MAX_BYTES)
    if type_tok == "NONE":
        return None
    base, group = type_tok, default_group
    for suffix, g in _SUFFIX_GROUP.items():
        if type_tok.endswith(suffix) and type_tok[: -len(suffix)] in _COMM_TYPES:
            base, group = type_tok[: -len(suffix)], g
    if base not in _COMM_TYPES:
        raise EchoError(f"{where}: {what} type {type_tok!r} is not a SimAI comm type "
                        "(ALLREDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, BROADCAST, NONE, "
                        "with optional _EP or _DP_EP)")
    return Comm(_COMM_TYPES[base], group, size)


def parse(path: Path) -> Workload:
    where = str(path)
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise EchoError(f"{where}: not a text file") from None
    lines = text.splitlines()
    if len(lines) < 2:
        raise EchoError(f"{where}: a SimAI workload needs a header line and a layer count")
    policy, header = _parse_header(lines[0], where)
    if policy not in SUPPORTED:
        raise EchoError(f"{where}: line 1: policy {policy} is not supported (supported: "
                        f"{', '.join(sorted(SUPPORTED))})")
    count = _int(lines[1].strip() or "?", f"{where}: line 2", "layer count")
    # SimAI reads whitespace-separated tokens, not lines; keep the line of each token.
    toks: list[tuple[str, int]] = [(t, i + 3) for i, ln in enumerate(lines[2:]) for t in ln.split()]
    missing = 0
    if len(toks) < 12 * count:
        if len(toks) % 12:
            raise EchoError(f"{where}: line 2 declares {count} layers of 12 columns, but only "
                            f"{len(toks)} values follow (layer {len(toks) // 12 + 1} is incomplete)")
        # Complete rows but fewer than declared (AICB has written such counts): keep the rows
        # that are there and count the rest as missing.
        missing = count - len(toks) // 12
        count = len(toks) // 12
    need = 12 * count
    default_fwd = "world" if policy == "MICRO" else "tp"
    default_wg = "world" if policy == "MICRO" else "dp"
    layers = []
    for k in range(count):
        row = toks[12 * k: 12 * k + 12]
        vals = [t for t, _ in row]
        w = f"{where}: line {row[0][1]}"
        _int(vals[1], w, "reserved column")
        layers.append(Layer(
            name=vals[0], line=row[0][1],
            fwd_ns=_int(vals[2], w, "forward compute time", MAX_NS),
            fwd_comm=_comm(vals[3], vals[4], default_fwd, w, "forward comm"),
            ig_ns=_int(vals[5], w, "input-gradient compute time", MAX_NS),
            ig_comm=_comm(vals[6], vals[7], default_fwd, w, "input-gradient comm"),
            wg_ns=_int(vals[8], w, "weight-gradient compute time", MAX_NS),
            wg_comm=_comm(vals[9], vals[10], default_wg, w, "weight-gradient comm"),
            update_ns=_int(vals[11], w, "update time", MAX_NS),
        ))
    return Workload(policy, header, layers, ignored_tokens=len(toks) - need,
                    missing_layers=missing)


# -- parallel groups --------------------------------------------------------------------------
@dataclass
class Layout:
    world: int
    tp: int
    pp: int
    dp: int
    ep: int

    @property
    def dp_ep(self) -> int:
        return self.dp // self.ep

    def coords(self, rank: int) -> tuple[int, int, int]:
        tp = rank % self.tp
        rest = rank // self.tp
        return tp, rest % self.pp, rest // self.pp

    def rank(self, tp: int, pp: int, dp: int) -> int:
        return tp + self.tp * (pp + self.pp * dp)

    def group_of(self, key: str, rank: int) -> tuple[int, ...]:
        tp, pp, dp = self.coords(rank)
        if key == "world":
            return tuple(range(self.world))
        if key == "tp":
            return tuple(self.rank(t, pp, dp) for t in range(self.tp))
        if key == "pp":
            return tuple(self.rank(tp, p, dp) for p in range(self.pp))
        if key == "dp":
            return tuple(self.rank(tp, pp, d) for d in range(self.dp))
        e, d = dp % self.ep, dp // self.ep
        if key == "ep":
            return tuple(self.rank(tp, pp, x + self.ep * d) for x in range(self.ep))
        if key == "dp_ep":
            return tuple(self.rank(tp, pp, e + self.ep * x) for x in range(self.dp_ep))
        raise KeyError(key)

    def size(self, key: str) -> int:
        return {"world": self.world, "tp": self.tp, "pp": self.pp, "dp": self.dp,
                "ep": self.ep, "dp_ep": self.dp_ep}[key]


_ROLES = {"world": "world", "tp": "tp", "pp": "pp", "dp": "dp", "ep": "ep", "dp_ep": "custom"}


def layout_for(wl: Workload, world: int, where: str) -> Layout:
    h = wl.header
    tp = h.get("tp", 0) or (1 if wl.policy in ("DATA", "MICRO") else world)
    pp = h.get("pp", 0) or 1
    ep = h.get("ep", 0) or 1
    if world % (tp * pp):
        raise EchoError(f"{where}: world size {world} is not a multiple of TP {tp} x PP {pp}")
    dp = world // (tp * pp)
    if dp % ep:
        raise EchoError(f"{where}: data-parallel size {dp} (= {world} / (TP {tp} x PP {pp})) "
                        f"is not a multiple of EP {ep}")
    return Layout(world, tp, pp, dp, ep)


# -- graph ------------------------------------------------------------------------------------
class _GraphMaker:
    def __init__(self, wl: Workload, lay: Layout, jb: JobBuilder):
        self.wl = wl
        self.lay = lay
        self.jb = jb
        self.gb = GraphBuilder("simai", wl.policy)
        self.compute = self.gb.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0)
        self.used: set[str] = set()

    def comp(self, layer: Layer, idx: int, phase: str, ns: int, deps: list[int | None]) -> int | None:
        if ns <= PLACEHOLDER_NS:
            if ns == PLACEHOLDER_NS:
                self.jb.drop("simai_placeholder_compute_1ns")
            return None
        n = self.gb.compute(f"{layer.name}.{phase}", self.compute, duration_ns=ns,
                            deps=[d for d in deps if d is not None], op=layer.name)
        self._annotate(n, idx, phase)
        return n.id

    def comm(self, layer: Layer, idx: int, phase: str, c: Comm | None,
             deps: list[int | None]) -> int | None:
        if c is None:
            return None
        if c.nbytes == 0:
            self.jb.drop("simai_zero_byte_comm")
            return None
        if self.lay.size(c.group) <= 1:
            self.jb.drop("simai_comm_on_one_rank_group")
            return None
        stream = self.gb.stream(pb.STREAM_GPU_COMM, f"comm:{c.group}", device=0)
        self.used.add(c.group)
        in_b = out_b = c.nbytes
        n = self.lay.size(c.group)
        # SimAI's size is the buffer its ring cuts into n chunks (MockNcclGroup's flow models
        # send (n-1)/n of it per rank): an all-gather's output, a reduce-scatter's input
        if c.type == pb.COLL_ALL_GATHER:
            in_b = -(-c.nbytes // n)
        elif c.type == pb.COLL_REDUCE_SCATTER:
            out_b = c.nbytes // n
        node = self.gb.collective(f"{layer.name}.{phase}_comm", stream, coll_type=c.type,
                                  group=c.group, in_bytes=in_b, out_bytes=out_b,
                                  root=0 if c.type == pb.COLL_BROADCAST else None,
                                  deps=[d for d in deps if d is not None])
        node.attrs["update_ns"] = str(layer.update_ns)
        self._annotate(node, idx, phase)
        return node.id

    @staticmethod
    def _annotate(node: pb.Node, idx: int, phase: str) -> None:
        node.annotations.phase = "forward" if phase == "fwd" else "backward"
        node.annotations.layer = idx
        node.attrs["simai_phase"] = phase

    def build(self):
        p = self.wl.policy
        layers = self.wl.layers
        if p == "MICRO":
            for i, ly in enumerate(layers):
                self.comm(ly, i, "wg", ly.wg_comm, [])
            return self.gb.build()
        prev: int | None = None

        def after(*ids: int | None) -> int | None:
            for x in reversed(ids):
                if x is not None:
                    return x
            return None

        for i, ly in enumerate(layers):
            c = self.comp(ly, i, "fwd", ly.fwd_ns, [prev])
            prev = after(prev, c)
            if p != "DATA":
                prev = after(prev, self.comm(ly, i, "fwd", ly.fwd_comm, [prev]))
        wait: list[int | None] = [prev]
        for i in range(len(layers) - 1, -1, -1):
            ly = layers[i]
            if p == "DATA":
                w = self.comp(ly, i, "wg", ly.wg_ns, wait)
                self.comm(ly, i, "wg", ly.wg_comm, [w] if w is not None else wait)
                if i > 0:
                    g = self.comp(ly, i, "ig", ly.ig_ns, [w] if w is not None else wait)
                    wait = [g] if g is not None else ([w] if w is not None else wait)
                continue
            g = self.comp(ly, i, "ig", ly.ig_ns, wait)
            base = [g] if g is not None else wait
            if p.startswith("HYBRID_TRANSFORMER"):
                gc = self.comm(ly, i, "ig", ly.ig_comm, base)  # blocking
                base = [gc] if gc is not None else base
                w = self.comp(ly, i, "wg", ly.wg_ns, base)
                base = [w] if w is not None else base
                self.comm(ly, i, "wg", ly.wg_comm, base)
                wait = base
            else:  # MODEL, HYBRID_DATA_MODEL, HYBRID_MODEL_DATA
                gc = self.comm(ly, i, "ig", ly.ig_comm, base) if i > 0 else None
                w = self.comp(ly, i, "wg", ly.wg_ns, base)
                wbase = [w] if w is not None else base
                if p != "MODEL":
                    self.comm(ly, i, "wg", ly.wg_comm, wbase)
                wait = wbase + ([gc] if gc is not None else [])
        return self.gb.build()


def read(paths: list[Path], options) -> Job:
    if len(paths) != 1:
        raise EchoError("give one SimAI workload file at a time")
    path = paths[0]
    where = str(path)
    wl = parse(path)
    world = options.world_size or wl.header.get("all_gpus", 0)
    if not world:
        raise OptionError("world_size", f"{where}: the header has no all_gpus; give the world size")
    lay = layout_for(wl, world, where)
    jb = JobBuilder(options.name or path.stem, world, source_format="simai")
    m = jb.job.manifest
    m.provenance.inputs.append(path.name)
    graph = _GraphMaker(wl, lay, jb).build()
    # The groups the header declares (EP ones only for MoE), plus any group a node uses.
    declared = ["tp", "pp"] + ([] if wl.policy == "MICRO" else ["dp"])
    declared += ["ep", "dp_ep"] if lay.ep > 1 else []
    for key in declared:
        if lay.size(key) > 1:
            graph.header.group_sizes[key] = lay.size(key)
    for key in {n.collective.group for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE}:
        graph.header.group_sizes[key] = lay.size(key)
    jb.add_graph(graph)
    keys = sorted(graph.header.group_sizes)
    ids: dict[tuple[str, tuple[int, ...]], int] = {}
    for r in range(world):
        binding = {}
        for key in keys:
            ranks = lay.group_of(key, r)
            gid = ids.get((key, ranks))
            if gid is None:
                gid = jb.group(ranks, name=f"{key}{len(ids)}", role=_ROLES[key], desc=key)
                ids[(key, ranks)] = gid
            binding[key] = gid
        jb.bind(r, graph.id, binding)
    m.layout.tp, m.layout.pp, m.layout.dp, m.layout.ep = lay.tp, lay.pp, lay.dp, lay.ep
    m.layout.vpp = wl.header.get("vpp", 0)
    m.layout.microbatches = wl.header.get("ga", 0)
    m.layout.source = "declared"
    # SimAI's nodes of 8 unless told: recorded only where the world fills them (the checker's
    # node-fill rule); otherwise unknown, for --gpus-per-node to say
    if options.gpus_per_node or fills_nodes(m.world_size, 8):
        m.hardware.gpus_per_node = options.gpus_per_node or 8
    gpu = _GPU_IN_NAME.search(path.name)
    if gpu:
        m.hardware.gpu_name = gpu.group(1)
    m.attrs["simai_policy"] = wl.policy
    for k, v in sorted(wl.header.items()):
        m.attrs[f"simai_{k}"] = str(v)
    if lay.pp > 1:
        jb.drop("simai_pipeline_transfers_not_modelled", lay.pp - 1)
    if wl.header.get("checkpoints") or wl.header.get("checkpoint_initiates"):
        jb.drop("simai_checkpointing_ignored")
    if wl.missing_layers:
        jb.drop("simai_declared_layers_missing", wl.missing_layers)
    if wl.ignored_tokens:
        jb.drop("simai_values_after_declared_layers", wl.ignored_tokens)
    return jb.build()
