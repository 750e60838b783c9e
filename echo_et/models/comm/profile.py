"""Calibration profiles and presets: one small versioned JSON format for both.

A preset (``presets/<name>.json``, shipped with the package) holds spec-sheet values and is
marked ``"calibrated": false``. A profile written by ``echo-et calibrate`` holds fitted
values, ``"calibrated": true``, the preset it started from, its sources (file name, kind,
sha256, collective, ranks, samples) and its fit error. Files are written deterministically:
sorted keys, numbers rounded to 6 significant digits, no paths or timestamps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_GPUS_PER_NODE
from echo_et.models.comm.nccl_graphs import NcclSystem
from echo_et.models.comm.params import flatten, nest
from echo_et.models.profile_file import dumps_profile, read_model_json, rounded, write_profile_json

SCHEMA = "echo-et/comm-profile/1"
# Parameters the model gained after profiles of this schema were first written. A profile
# without them takes them from the preset it started from (else ``a100-ib``), so older
# profiles keep loading; everything else must be present.
ADDED_PARAMS = ("tree_net_eff_many", "chan_us", "net_chan_us")


@dataclass(frozen=True)
class Profile:
    name: str
    calibrated: bool
    gpus_per_node: int
    params: dict[str, float]                      # flat parameter names, see params.py
    description: str = ""
    hardware: dict[str, str] = field(default_factory=dict)
    gpu_match: tuple[str, ...] = ()
    base_preset: str = ""
    sources: tuple[dict[str, Any], ...] = ()
    fit: dict[str, Any] = field(default_factory=dict)
    nccl: NcclSystem = field(default_factory=NcclSystem)   # the NCCL release and node NCCL sees
    # GB/s per GPU of the network the NICs are rated for, when a what-if copy was given one
    # (``CommModel.with_overrides(inter_bw_gbps=)``); 0: the node's NICs (:func:`rated_net_gbps`).
    # Not written to a profile file.
    rated_net_gbps: float = 0.0


def rated_net_gbps(p: Profile) -> float:
    """GB/s per GPU of network that the profile's node is rated for: what ``--inter-bw``
    states. A what-if copy's given rate, else the NICs NCCL sees in the node (``nccl.node``:
    ``nic_bw`` each, ``nics_per_node`` of them shared by the node's GPUs; a GPU uses at most
    one NIC's worth when there are more NICs than GPUs)."""
    if p.rated_net_gbps > 0:
        return p.rated_net_gbps
    node = p.nccl.node
    return node.nic_bw * min(node.nics_per_node, p.gpus_per_node) / p.gpus_per_node


def preset_names() -> list[str]:
    folder = resources.files("echo_et.models.comm") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_preset(name: str) -> Profile:
    names = preset_names()
    if name not in names:
        raise EchoError(f"unknown preset {name!r} (presets: {', '.join(names)})")
    text = (resources.files("echo_et.models.comm") / "presets" / f"{name}.json").read_text("utf-8")
    return from_json(json.loads(text), f"preset {name}")


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    return from_json(read_model_json(p, p.name, "calibration profile"), p.name)


def from_json(obj: Any, where: str) -> Profile:
    if not isinstance(obj, dict):
        raise EchoError(f"{where}: a profile must be a JSON object, not {json.dumps(obj)[:40]}")
    if obj.get("schema") != SCHEMA:
        raise EchoError(f"{where}: schema is {json.dumps(obj.get('schema'))[:40]}, expected {SCHEMA!r}")
    params = obj.get("params")
    if not isinstance(params, dict):
        raise EchoError(f"{where}: no 'params' object")
    gpn = obj.get("gpus_per_node")
    if isinstance(gpn, bool) or not isinstance(gpn, int) or not 1 <= gpn <= MAX_GPUS_PER_NODE:
        raise EchoError(f"{where}: gpus_per_node must be an integer in 1..{MAX_GPUS_PER_NODE}, got "
                        f"{json.dumps(gpn)[:40]}")
    base = obj.get("base_preset")
    missing = [n for n in ADDED_PARAMS if not _has(params, n)]
    if missing:
        defaults = load_preset(base if base in preset_names() else "a100-ib").params
        params = _with_defaults(params, {n: defaults[n] for n in missing})
    if "nccl" in obj:
        nccl = NcclSystem.from_json(obj["nccl"], where)
    else:    # written before the model knew NCCL's tuner: the preset it started from (else a100-ib)
        nccl = load_preset(base if base in preset_names() else "a100-ib").nccl
    return Profile(
        name=str(_field(obj, "name", str, "a string", where) or ""),
        calibrated=bool(_field(obj, "calibrated", bool, "true or false", where)),
        gpus_per_node=gpn,
        params=flatten(params, where),
        description=str(_field(obj, "description", str, "a string", where) or ""),
        hardware=_hardware(_field(obj, "hardware", dict, "an object", where) or {}, where),
        gpu_match=tuple(t.lower() for t in _strings(_field(obj, "gpu_match", list, "a list", where) or [],
                                                     "gpu_match", where)),
        base_preset=str(_field(obj, "base_preset", str, "a string", where) or ""),
        sources=tuple(_field(obj, "sources", list, "a list", where) or ()),
        fit=dict(_field(obj, "fit", dict, "an object", where) or {}),
        nccl=nccl,
    )


def _field(obj: dict, key: str, kind: type, shown: str, where: str) -> Any:
    """``obj[key]`` when it is of ``kind`` (absent or null: None); another type is one line."""
    value = obj.get(key)
    if value is None or isinstance(value, kind):
        return value
    raise EchoError(f"{where}: {key} must be {shown}, got {json.dumps(value)[:40]}")


def _hardware(block: dict, where: str) -> dict[str, str]:
    """The node's description (GPU, links, NICs): each value a string or a number."""
    for k, v in block.items():
        if isinstance(v, dict | list) or v is None:
            raise EchoError(f"{where}: hardware.{k} must be a string or a number, got {json.dumps(v)[:40]}")
    return {str(k): str(v) for k, v in block.items()}


def _strings(items: list, key: str, where: str) -> list[str]:
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise EchoError(f"{where}: {key}[{i}] must be a string, got {json.dumps(t)[:40]}")
    return items


def _has(nested: dict, name: str) -> bool:
    family, _, proto = name.partition(".")
    value = nested.get(family)
    return value is not None if not proto else isinstance(value, dict) and proto in value


def _with_defaults(nested: dict, defaults: dict[str, float]) -> dict:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in nested.items()}
    for name, value in defaults.items():
        family, _, proto = name.partition(".")
        if proto:
            fam = out.setdefault(family, {})
            if isinstance(fam, dict):
                fam[proto] = value
        else:
            out[family] = value
    return out


def to_json(p: Profile) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "name": p.name,
        "calibrated": p.calibrated,
        "gpus_per_node": p.gpus_per_node,
        "params": rounded(nest(p.params)),
        "nccl": rounded(p.nccl.to_json()),
    }
    if p.description:
        out["description"] = p.description
    if p.hardware:
        out["hardware"] = dict(p.hardware)
    if p.gpu_match:
        out["gpu_match"] = list(p.gpu_match)
    if p.base_preset:
        out["base_preset"] = p.base_preset
    if p.sources:
        out["sources"] = rounded(list(p.sources))
    if p.fit:
        out["fit"] = rounded(p.fit)
    return out


def dumps(p: Profile) -> str:
    return dumps_profile(to_json(p))


def write_profile(p: Profile, path: str | Path) -> None:
    write_profile_json(to_json(p), path)
