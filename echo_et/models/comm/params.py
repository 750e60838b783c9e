"""The parameters of the NCCL cost model: names, units, how sure a preset is of each, and
which measurements can pin each down.

A parameter set is a flat ``dict[str, float]``; protocol-specific entries are named
``<family>.<protocol>`` (``base_us.LL128``). Profiles and presets store them nested by family
(``{"base_us": {"LL": ...}}``); :func:`nest` / :func:`flatten` convert.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from echo_et.errors import EchoError
from echo_et.models.profile_file import rounded

PROTOCOLS = ("LL", "LL128", "Simple")

# Bytes of payload per byte moved: LL sends 4 B of data with a 4 B flag, LL128 120 B of
# every 128 B line. These are properties of the protocols, not of the hardware.
PROTOCOL_PAYLOAD = {"LL": 0.5, "LL128": 120.0 / 128.0, "Simple": 1.0}


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: what it means, and how a fit treats it.

    ``sigma`` is the log-space spread of the prior around the preset value (how far data
    may move it cheaply); ``stage`` says which measurements identify it: ``intra`` (one
    node), ``net`` (several nodes) or ``fixed`` (not identifiable from collective timings;
    kept at the preset value).
    """

    name: str
    unit: str
    stage: str
    sigma: float
    doc: str


def _proto(family: str, unit: str, stage: str, sigma: float, doc: str) -> list[ParamSpec]:
    return [ParamSpec(f"{family}.{p}", unit, stage, sigma, f"{doc} ({p})") for p in PROTOCOLS]


SPECS: tuple[ParamSpec, ...] = (
    ParamSpec("host_launch_us", "us", "intra", 1.0,
              "host time per GPU and iteration when one thread drives several GPUs (nccl-tests "
              "-g N); only used to read such measurements, never part of an estimate"),
    ParamSpec("local_setup_us", "us", "intra", 1.0, "fixed cost of a one-rank collective (a local copy)"),
    ParamSpec("local_copy_gbps", "GB/s", "intra", 1.0, "device-to-device copy rate of a one-rank collective"),
    ParamSpec("nvlink_gbps", "GB/s", "intra", 0.5, "per-GPU intra-node bandwidth NCCL can use (all channels)"),
    ParamSpec("net_gbps", "GB/s", "net", 0.7, "per-GPU inter-node bandwidth (its NIC share)"),
    *_proto("base_us", "us", "intra", 1.0, "fixed setup of a collective kernel"),
    *_proto("nvlink_hop_us", "us", "intra", 1.0, "latency of one intra-node step"),
    *_proto("net_hop_us", "us", "net", 1.0, "latency of one inter-node step"),
    ParamSpec("chan_us", "us", "intra", 1.0, "serial cost per channel a kernel runs on"),
    ParamSpec("net_chan_us", "us", "net", 1.0,
              "serial proxy cost per channel and network hop (NCCL's proxy thread posts each)"),
    ParamSpec("p2p_chan_gbps", "GB/s", "intra", 0.5,
              "what one channel of a send/recv carries (NCCL splits a send/recv over channels by size)"),
    ParamSpec("cap_gbps.LL", "GB/s", "intra", 1.0, "throughput limit of the LL protocol (all channels)"),
    ParamSpec("cap_gbps.LL128", "GB/s", "intra", 1.0, "throughput limit of the LL128 protocol (all channels)"),
    ParamSpec("tree_simple_cap_gbps", "GB/s", "net", 1.0, "throughput limit of the tree with Simple"),
    *_proto("ramp_bytes", "B", "intra", 2.0,
            "message size at which NCCL runs all channels; smaller messages use fewer"),
    ParamSpec("channels", "", "intra", 0.7, "channels at full size (the ramp starts at 1/channels)"),
    ParamSpec("ring_loop_extra_steps", "steps", "intra", 1.0,
              "extra step-equivalents a ring spends per loop (loop start/end)"),
    ParamSpec("tree_net_eff", "", "net", 0.3,
              "network efficiency of the tree relative to the ring on two nodes (NCCL's tree factor)"),
    ParamSpec("tree_net_eff_many", "", "net", 0.3,
              "network efficiency of the tree relative to the ring on three or more nodes (NCCL's "
              "per-channel tree limit for 4+ nodes over the NIC's channel rate)"),
    ParamSpec("tree_chunk_bytes", "B", "net", 1.5, "tree pipeline chunk (all channels): the fill cost"),
    ParamSpec("chain_chunk_bytes", "B", "intra", 1.5,
              "broadcast/reduce chain pipeline chunk (all channels): the fill cost; a profile "
              "without it takes its tree_chunk_bytes"),
    ParamSpec("reduce_gbps", "GB/s", "fixed", 0.3,
              "reduction throughput, fused into the transfers (binds only below the link rates), so not fitted"),
    ParamSpec("nvls_tree_net_eff", "", "net", 0.3,
              "network efficiency of the NVLS-tree across nodes relative to the ring's network rate"),
    ParamSpec("nvls_tree_hop_us", "us", "net", 1.0,
              "latency of one NVLS-tree network hop (its proxy serves every tree peer of every "
              "NVLS channel); a profile without it takes its net_hop_us.Simple"),
    ParamSpec("nvls_gbps", "GB/s", "fixed", 0.3,
              "NVLink-SHARP all-reduce bus bandwidth inside a node; 0 where the switch has none"),
)

# Collectives whose NVLink and network rates a fit may set apart from all-reduce's (the
# reference, 1.0): NCCL runs them with other kernels, chunk sizes and (send/recv) channels.
PER_COLLECTIVE = ("all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
                  "sendrecv", "hypercube")
SPECS = SPECS + tuple(
    ParamSpec(f"coll_nvlink_eff.{c}", "", "intra", 0.3,
              f"NVLink rate (and protocol limits) {c} reaches, relative to all-reduce's") for c in PER_COLLECTIVE
) + tuple(
    ParamSpec(f"coll_net_eff.{c}", "", "net", 0.3,
              f"network rate {c} reaches, relative to all-reduce's") for c in PER_COLLECTIVE
)
# Parameters a profile or preset may leave out, with their defaults: the per-collective rates
# (1.0: as all-reduce) and a send/recv channel's rate (NCCL's rate of one NVLink, 20 GB/s on
# Volta and Ampere, 20.6 on Hopper); written only when a fit moved them, so profiles from before
# keep their bytes.
P2P_CHAN_GBPS = 20.0
OPTIONAL: dict[str, float] = {
    **{s.name: 1.0 for s in SPECS if s.name.startswith(("coll_nvlink_eff.", "coll_net_eff."))},
    "p2p_chan_gbps": P2P_CHAN_GBPS,
    "nvls_tree_net_eff": 1.0,
}
# Parameters a profile or preset may leave out, defaulting to another of its parameters (what
# the model used before it had them), and written only when they differ from it.
DEFAULTS_FROM: dict[str, str] = {"nvls_tree_hop_us": "net_hop_us.Simple", "chain_chunk_bytes": "tree_chunk_bytes"}
# the collectives NCCL runs as grouped send/recv: the samples that identify p2p_chan_gbps
P2P_PATTERNS = ("all_to_all", "gather", "scatter", "sendrecv", "hypercube")

SPEC_BY_NAME: dict[str, ParamSpec] = {s.name: s for s in SPECS}
NAMES: tuple[str, ...] = tuple(s.name for s in SPECS)


# Every parameter (us, GB/s, bytes, channels, steps) lies in this range, or is 0 where 0 is
# allowed: a denormal rate (5e-324 GB/s) or 1e300 us would overflow the model's arithmetic.
PARAM_MIN = 1e-12
PARAM_MAX = 1e15


def flatten(nested: Mapping[str, object], where: str) -> dict[str, float]:
    """``{"base_us": {"LL": 5}}`` -> ``{"base_us.LL": 5.0}``, checking names and values."""
    out: dict[str, float] = {}
    for key, value in nested.items():
        if isinstance(value, Mapping):
            for sub, v in value.items():
                out[f"{key}.{sub}"] = _number(v, f"{where}: {key}.{sub}")
        else:
            out[key] = _number(value, f"{where}: {key}")
    for name, default in OPTIONAL.items():
        out.setdefault(name, default)
    for name, like in DEFAULTS_FROM.items():
        if like in out:
            out.setdefault(name, out[like])
    unknown = sorted(set(out) - set(NAMES))
    if unknown:
        raise EchoError(f"{where}: unknown parameter(s) {', '.join(unknown)}")
    missing = [n for n in NAMES if n not in out]
    if missing:
        raise EchoError(f"{where}: missing parameter(s) {', '.join(missing)}")
    for name, v in out.items():
        if v < 0 or (v == 0 and name != "nvls_gbps" and not name.startswith(("base_us", "ring_loop"))):
            raise EchoError(f"{where}: parameter {name} must be positive, got {v}")
        if v > PARAM_MAX or 0 < v < PARAM_MIN:   # a time in us, a rate in GB/s, bytes, channels
            raise EchoError(f"{where}: parameter {name} = {v:g} is out of range ({PARAM_MIN:g} to {PARAM_MAX:g})")
    return out


def nest(flat: Mapping[str, float]) -> dict[str, object]:
    """The inverse of :func:`flatten`, in :data:`NAMES` order."""
    out: dict[str, object] = {}
    for name in NAMES:
        if name in OPTIONAL and flat.get(name, OPTIONAL[name]) == OPTIONAL[name]:
            continue
        if name in DEFAULTS_FROM and _same(flat.get(name), flat.get(DEFAULTS_FROM[name])):
            continue
        family, _, proto = name.partition(".")
        if proto:
            out.setdefault(family, {})[proto] = flat[name]  # type: ignore[index]
        else:
            out[family] = flat[name]
    return out


def _same(a: float | None, b: float | None) -> bool:
    """Equal as a profile writes them (6 significant digits): a default that round-trips."""
    return a is not None and b is not None and rounded(a) == rounded(b)


def _number(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise EchoError(f"{where} must be a number, got {v!r}")
    f = float(v)
    if f != f or f in (float("inf"), float("-inf")):
        raise EchoError(f"{where} must be finite")
    return f
