"""The configuration files of an ASTRA-sim export, held to the contract (the rules
``files-present``, ``network-config``, ``system-config``, ``remote-memory``, ``comm-group`` and
``start-offsets`` of :mod:`echo_et.converters.astra_sim.check`, which documents them), and
where its rank files are (``workload_prefix``)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from echo_et.ir.checker import IssueCollector

from .configs import FILE_NAMES, TOPOLOGIES, WORKLOAD_PREFIX

_LIST_LINE = re.compile(r"^\s*([A-Za-z_]+)\s*:\s*\[(.*)\]\s*(#.*)?$")


def parse_network_yaml(text: str) -> dict[str, list[str]]:
    """The ``key: [a, b]`` lines of an ASTRA-sim analytical network file."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = _LIST_LINE.match(line)
        if m:
            out[m.group(1)] = [v.strip() for v in m.group(2).split(",") if v.strip()]
    return out


def network_shape(folder: Path, out: IssueCollector) -> tuple[int | None, int | None]:
    """The NPUs the network declares and its dimensions ((None, None) when it cannot be read)."""
    path = folder / FILE_NAMES["network"]
    where = str(path)
    if not path.is_file():
        out.add("files-present", "network file is missing", where)
        return None, None
    cfg = parse_network_yaml(path.read_text(errors="replace"))
    keys = ("topology", "npus_count", "bandwidth", "latency")
    missing = [k for k in keys if k not in cfg]
    if missing:
        out.add("network-config", f"missing {', '.join(missing)}", where)
        return None, None
    dims = len(cfg["topology"])
    if any(len(cfg[k]) != dims for k in keys) or dims == 0:
        out.add("network-config", "topology, npus_count, bandwidth and latency differ in length", where)
        return None, None
    for t in cfg["topology"]:
        if t not in TOPOLOGIES:
            out.add("network-config", f"unknown topology {t!r}", where)
    try:
        counts = [int(c) for c in cfg["npus_count"]]
        bws = [float(b) for b in cfg["bandwidth"]]
        lats = [float(x) for x in cfg["latency"]]
    except ValueError:
        out.add("network-config", "npus_count, bandwidth and latency must be numbers", where)
        return None, None
    if any(c <= 1 for c in counts):
        out.add("network-config", f"npus_count {counts}: every dimension needs more than 1 NPU", where)
    if any(not b > 0 for b in bws):
        out.add("network-config", f"bandwidth {bws}: must be positive", where)
    if any(x < 0 for x in lats):
        out.add("network-config", f"latency {lats}: must not be negative", where)
    return math.prod(counts), dims


def _json(path: Path, rule: str, out: IssueCollector):
    if not path.is_file():
        out.add("files-present", "file is missing", str(path))
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        out.add(rule, f"not valid JSON ({e})", str(path))
        return None


def system_settings(folder: Path, dims: int | None, out: IssueCollector) -> tuple[int | None, bool]:
    """preferred-dataset-splits (None when invalid) and whether roofline is on."""
    path = folder / FILE_NAMES["system"]
    cfg = _json(path, "system-config", out)
    if cfg is None:
        return None, False
    if not isinstance(cfg, dict):
        out.add("system-config", "not a JSON object", str(path))
        return None, False
    splits = cfg.get("preferred-dataset-splits")
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        out.add("system-config", f"preferred-dataset-splits is {splits!r}; it must be an integer >= 1 "
                "(0 makes ASTRA-sim divide by zero)", str(path))
        splits = None
    for key in ("all-reduce-implementation", "all-gather-implementation",
                "reduce-scatter-implementation", "all-to-all-implementation"):
        impl = cfg.get(key)
        if impl is None and f"{key}-custom" not in cfg:
            out.add("system-config", f"{key} is missing", str(path))
        elif impl is not None and (not isinstance(impl, list) or (dims and len(impl) != dims)):
            out.add("system-config", f"{key} must list one algorithm per network dimension ({dims})",
                    str(path))
    return splits, bool(cfg.get("roofline-enabled", 0))


def check_remote_memory(folder: Path, out: IssueCollector) -> None:
    path = folder / FILE_NAMES["remote_memory"]
    cfg = _json(path, "remote-memory", out)
    if cfg is not None and (not isinstance(cfg, dict) or "memory-type" not in cfg):
        out.add("remote-memory", "no memory-type", str(path))


def comm_groups(folder: Path, npus: int | None, out: IssueCollector) -> dict[str, set[int]]:
    path = folder / FILE_NAMES["comm_group"]
    if not path.is_file():
        return {}
    cfg = _json(path, "comm-group", out)
    groups: dict[str, set[int]] = {}
    if cfg is None:
        return groups
    if not isinstance(cfg, dict):
        out.add("comm-group", "not a JSON object", str(path))
        return groups
    for key, ranks in cfg.items():
        if not key.isdigit() or int(key) <= 0:
            out.add("comm-group", f"group id {key!r} is not a positive integer (0 means world)", str(path))
            continue
        if (not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks)
                or len(set(ranks)) != len(ranks)):
            out.add("comm-group", f"group {key}: members must be distinct integer ranks", str(path))
            continue
        if len(ranks) < 2:
            out.add("comm-group", f"group {key} has {len(ranks)} member(s); a group needs 2", str(path))
        if npus is not None and any(r < 0 or r >= npus for r in ranks):
            out.add("comm-group", f"group {key} names a rank outside 0..{npus - 1}", str(path))
        groups[str(int(key))] = set(ranks)
    return groups


def workload_prefix(folder: Path) -> str:
    """The prefix of the rank files: the one ``run.sh`` names, else the one with a ``.0.et``."""
    run = folder / FILE_NAMES["run"]
    if run.is_file():
        m = re.search(r"--workload-configuration=(\S+)", run.read_text(errors="replace"))
        if m:
            return m.group(1).strip("\"'")
    found = sorted(p.name[: -len(".0.et")] for p in folder.glob("*.0.et"))
    return found[0] if len(found) == 1 else WORKLOAD_PREFIX


def check_offsets(folder: Path, npus: int, out: IssueCollector) -> None:
    path = folder / FILE_NAMES["offsets"]
    if not path.is_file():
        return
    cfg = _json(path, "start-offsets", out)
    vals = cfg.get("start_offset_us") if isinstance(cfg, dict) else None
    if (not isinstance(vals, list) or len(vals) != npus
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in vals)):
        out.add("start-offsets", f"start_offset_us must list {npus} whole, non-negative numbers of µs", str(path))
