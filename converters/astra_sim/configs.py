"""The configuration files that go with an ASTRA-sim workload: network YAML, system JSON,
remote-memory JSON, communicator groups and the ``run.sh`` that runs them.

Defaults (all overridable from ``echo-et export astra-sim``):

- GPUs per node: ``--gpus-per-node``, else the Job's hardware, else 8.
- One network dimension when the world fits in one node, else two: intra-node and
  inter-node (the second needs the congestion-unaware binary: the congestion-aware one
  supports one dimension only).
- Topology ``Switch`` per dimension (NVSwitch inside a node, a switched fabric across).
- Bandwidth in GB/s (= bytes/ns) per GPU and direction: ``--intra-bw``/``--inter-bw``, else
  the Job's hardware, else 400 (intra, HGX-H100 NVLink as in ASTRA-sim's validated
  ``HGX-H100-validated.yml``) and 50 (inter, one 400 Gb/s NIC per GPU).
- Latency ``--latency`` ns per link (0, or 1 ns to 1 s), else 936.25 ns (the validated
  HGX-H100 value).
- System: the validated HGX-H100 system file (LIFO, endpoint delay 10 ns, ring algorithms,
  localBWAware) with ``preferred-dataset-splits`` 4 and 1 active chunk per dimension.
- Remote memory: ``NO_MEMORY_EXPANSION`` (the export never emits memory nodes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from echo_et.errors import EchoError, OptionError
from echo_et.ir.limits import check_node_fill
from echo_et.ir.units import check_gbps, check_latency_ns

TOPOLOGIES = ("Ring", "FullyConnected", "Switch")
ALL_TO_ALL_MAPPINGS = ("p2p", "ring")
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_INTRA_BW = 400.0
DEFAULT_INTER_BW = 50.0
DEFAULT_LATENCY_NS = 936.25
DEFAULT_SPLITS = 4
WORKLOAD_PREFIX = "workload"
FILE_NAMES = {
    "network": "network.yml",
    "system": "system.json",
    "remote_memory": "remote_memory.json",
    "comm_group": "comm_group.json",
    "run": "run.sh",
    "offsets": "start_offsets.json",
}
LOCAL_MEM_BW = 1600       # GB/s, system.json local-mem-bw (ASTRA-sim's example value)
ENDPOINT_DELAY_NS = 10    # system.json endpoint-delay


@dataclass
class ExportOptions:
    gpus_per_node: int | None = None
    intra_bw: float | None = None     # GB/s
    inter_bw: float | None = None     # GB/s
    latency: float | None = None      # ns, every dimension
    intra_latency: float | None = None  # ns, first dimension (overrides ``latency``)
    inter_latency: float | None = None  # ns, second dimension (overrides ``latency``)
    topology: str | None = None       # one name, or one per dimension separated by commas
    splits: int = DEFAULT_SPLITS
    align_start: bool = False         # start every rank at 0 instead of its measured offset
    host_time: str = "keep"           # "keep" (CPU nodes) or "fold" (only the order it imposes)
    # "p2p": every all-to-all as per-peer COMM_SEND/COMM_RECV (NCCL's grouped send/recv:
    # (N-1)/N of the bytes); "ring": even ones as ASTRA-sim's ALL_TO_ALL collective, whose
    # ring algorithm moves (N-1)/2 of them.
    all_to_all: str = "p2p"


@dataclass
class Network:
    topology: list[str]
    npus_count: list[int]
    bandwidth: list[float]
    latency: list[float]

    @property
    def npus(self) -> int:
        return math.prod(self.npus_count)


def _positive(value: float | None, option: str, what: str) -> None:
    if value is not None and not value > 0:
        raise OptionError(option, f"{what} must be positive, got {value}")


def _rate(value: float | None, option: str, what: str) -> None:
    """A bandwidth between a bit per second and the fastest link (an ASTRA-sim run at 1e-300
    GB/s never ends)."""
    if value is not None:
        try:
            check_gbps(value, f"{what} {value!r} GB/s")
        except EchoError as e:
            raise OptionError(option, str(e)) from None


def network_for(world_size: int, hw_gpus_per_node: int, hw_intra: float, hw_inter: float,
                opts: ExportOptions) -> Network:
    """The network of a cluster with ``world_size`` GPUs, from options and Job hardware."""
    _rate(opts.intra_bw, "intra_bw", "intra-node bandwidth")
    _rate(opts.inter_bw, "inter_bw", "inter-node bandwidth")
    _positive(opts.gpus_per_node, "gpus_per_node", "GPUs per node")
    if opts.latency is not None:
        try:
            check_latency_ns(opts.latency)
        except EchoError as e:
            raise OptionError("latency", str(e)) from None
    if world_size < 2:
        raise EchoError(f"ASTRA-sim needs at least 2 NPUs; the job has {world_size}")
    gpn = opts.gpus_per_node or hw_gpus_per_node or DEFAULT_GPUS_PER_NODE
    intra = opts.intra_bw or hw_intra or DEFAULT_INTRA_BW
    inter = opts.inter_bw or hw_inter or DEFAULT_INTER_BW
    for v, option, what in ((opts.intra_latency, "intra_latency", "intra-node latency"),
                            (opts.inter_latency, "inter_latency", "inter-node latency")):
        if v is not None and v < 0:
            raise OptionError(option, f"{what} must not be negative, got {v}")
    lat = DEFAULT_LATENCY_NS if opts.latency is None else float(opts.latency)
    lat_intra = lat if opts.intra_latency is None else float(opts.intra_latency)
    lat_inter = lat if opts.inter_latency is None else float(opts.inter_latency)
    if world_size <= gpn or gpn == 1:
        counts = [world_size]
        bws = [intra if world_size <= gpn else inter]
        lats = [lat_intra if world_size <= gpn else lat_inter]
    else:
        check_node_fill(world_size, gpn)
        counts = [gpn, world_size // gpn]
        bws = [intra, inter]
        lats = [lat_intra, lat_inter]
    topo = _topology(opts.topology, len(counts))
    return Network(topo, counts, [float(b) for b in bws], lats)


def _topology(spec: str | None, dims: int) -> list[str]:
    if not spec:
        return ["Switch"] * dims
    names = [s.strip() for s in spec.split(",") if s.strip()]
    by_lower = {t.lower(): t for t in TOPOLOGIES}
    out = []
    for s in names:
        if s.lower() not in by_lower:
            raise OptionError("topology", f"topology {s!r}: not one of {', '.join(TOPOLOGIES)}")
        out.append(by_lower[s.lower()])
    if len(out) == 1:
        out *= dims
    if len(out) != dims:
        raise OptionError("topology", f"topology names {len(out)} dimensions, the network has {dims}")
    return out


def _num(x: float) -> str:
    return repr(float(x))


def network_yaml(net: Network) -> str:
    return (
        "# ASTRA-sim analytical network, written by echo-et\n"
        f"topology: [ {', '.join(net.topology)} ]\n"
        f"npus_count: [ {', '.join(str(c) for c in net.npus_count)} ]\n"
        f"bandwidth: [ {', '.join(_num(b) for b in net.bandwidth)} ]  # GB/s per link\n"
        f"latency: [ {', '.join(_num(x) for x in net.latency)} ]  # ns\n"
    )


def system_json(dims: int, splits: int) -> str:
    if splits < 1:
        raise OptionError("splits", f"preferred-dataset-splits must be >= 1, got {splits}")
    cfg = {
        "scheduling-policy": "LIFO",
        "endpoint-delay": ENDPOINT_DELAY_NS,
        "active-chunks-per-dimension": 1,
        "preferred-dataset-splits": splits,
        "all-reduce-implementation": ["ring"] * dims,
        "all-gather-implementation": ["ring"] * dims,
        "reduce-scatter-implementation": ["ring"] * dims,
        "all-to-all-implementation": ["ring"] * dims,
        "collective-optimization": "localBWAware",
        "local-mem-bw": LOCAL_MEM_BW,
        "boost-mode": 0,
        "roofline-enabled": 0,
    }
    return json.dumps(cfg, indent=2, sort_keys=True) + "\n"


def remote_memory_json() -> str:
    return json.dumps({"memory-type": "NO_MEMORY_EXPANSION"}, indent=2) + "\n"


def offsets_json(offsets_us: dict[int, int], npus: int) -> str:
    """Each rank's start offset in µs (its first node's length): a rank's step in ASTRA-sim is
    its finish cycles minus 1000 x its offset."""
    return json.dumps({"start_offset_us": [int(offsets_us.get(r, 0)) for r in range(npus)]}) + "\n"


def comm_group_json(groups: dict[int, list[int]]) -> str:
    return json.dumps({str(k): list(v) for k, v in sorted(groups.items())}, indent=1) + "\n"


def run_sh(npus: int, with_groups: bool) -> str:
    """The exact ASTRA-sim command line for this folder. It runs from its own folder with
    relative paths, so the comm-group path never contains the substring "empty" (which
    ASTRA-sim would read as "no file"), and it fails unless every rank printed its
    ``finished`` line (ASTRA-sim exits 0 even when a rank never finished, and what it exits
    with after a crash past the last finished line is not what decides)."""
    group_arg = f"  --comm-group-configuration={FILE_NAMES['comm_group']} \\\n" if with_groups else ""
    return f"""#!/bin/sh
# Runs ASTRA-sim (analytical backend) on this export. Written by echo-et.
# ASTRA_SIM_BIN: e.g. <astra-sim>/build/astra_analytical/build/bin/AstraSim_Analytical_Congestion_Unaware
# (the congestion-aware binary supports one-dimensional networks only).
set -eu
cd "$(dirname "$0")"
: "${{ASTRA_SIM_BIN:?set ASTRA_SIM_BIN to the ASTRA-sim analytical binary}}"
mkdir -p log
# Its output line by line where stdbuf exists: ASTRA-sim master can crash in its statistics
# after every rank finished (context-parallel rings: "a callable is removed", then a heap
# abort), and a crash must not swallow the finished lines still in its buffer.
line_buffered=""
if command -v stdbuf >/dev/null 2>&1; then line_buffered="stdbuf -oL"; fi
$line_buffered "$ASTRA_SIM_BIN" \\
  --workload-configuration={WORKLOAD_PREFIX} \\
  --system-configuration={FILE_NAMES['system']} \\
  --network-configuration={FILE_NAMES['network']} \\
  --remote-memory-configuration={FILE_NAMES['remote_memory']} \\
{group_arg}  --logging-folder=log | tee log/stdout.txt
finished=$(grep -Ec 'sys\\[[0-9]+\\] finished' log/stdout.txt || true)
if [ "$finished" -ne {npus} ]; then
  echo "echo-et: only $finished of {npus} ranks finished (see log/err.log)" >&2
  exit 1
fi
"""
