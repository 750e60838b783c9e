"""Compute-model profiles: one small versioned JSON file for presets and fitted profiles.

A profile is a GPU data sheet (``gpu``, see :mod:`~echo_et.models.compute.gpus`) plus the
fitted efficiency parameters (``params``), settings, and, for a fitted profile, its sources
(file name, kind, sha256, samples) and fit errors. The shipped ``a100`` preset is the profile
``echo-et calibrate compute`` fits from ``../shared/data``; the other presets pair their own
data sheet with the a100 efficiencies (``"calibrated": false``: not measured on that GPU).
Files are deterministic: sorted keys, numbers rounded to 6 significant digits, no paths or
timestamps.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.limits import checked_float
from echo_et.models.compute.gpus import DATASHEETS, GpuSpec, gpu_names, resolve_gpu
from echo_et.models.compute.roofline import EFF_MAX, PARAM_DEFAULTS, SUSTAINED_PARAM
from echo_et.models.profile_file import dumps_profile, read_model_json, rounded, write_profile_json

SCHEMA = "echo-et/compute-profile/1"
FITTED_PRESET = "a100"
FP32_MATMUL = ("fp32", "tf32")
# Parameters added after profiles of this schema were first written: a profile without them
# takes the default, so older profiles keep loading.
ADDED_PARAMS = ("host_launch_ns", "host_collective_ns", SUSTAINED_PARAM)
# An added parameter that defaults to another one of the same profile (a profile written before
# collectives had their own host time issued them like any operator).
ADDED_LIKE = {"host_collective_ns": "host_launch_ns"}
# What a parameter may be (besides the efficiencies, in (EFF_MIN, EFF_MAX]): a host or kernel
# time of up to a second per operator, a K of half efficiency up to a million.
PARAM_MAX = {"kernel_overhead_ns": 1e9, "host_launch_ns": 1e9, "host_collective_ns": 1e9, "gemm_k_half": 1e6}
EFF_MIN = 1e-4   # an efficiency of 0.01 %: below it a kernel's time overflows any step


@dataclass(frozen=True)
class ComputeProfile:
    name: str
    gpu: GpuSpec
    params: dict[str, float]
    calibrated: bool = False
    fp32_matmul: str = "fp32"          # "tf32" when torch.backends.cuda.matmul.allow_tf32 is on
    description: str = ""
    params_from: str = ""              # the profile the efficiencies were fitted as, when transferred
    sources: tuple[dict[str, Any], ...] = ()
    fit: dict[str, Any] = field(default_factory=dict)

    def for_gpu(self, key: str) -> ComputeProfile:
        """These efficiencies on another GPU's data sheet (a what-if: not measured there)."""
        key = resolve_gpu(key)
        if key == self.gpu.key:
            return self
        return replace(self, name=f"{key}:{self.name}", gpu=DATASHEETS[key], calibrated=False,
                       params_from=self.params_from or self.name,
                       description=f"{DATASHEETS[key].name} data sheet with the efficiencies of profile "
                                   f"{self.name!r} (fitted on {self.gpu.name}; not measured on this GPU)")


def default_profile(gpu: str) -> ComputeProfile:
    """A GPU's data sheet with the default (unfitted) efficiencies: the prior a fit starts from."""
    key = resolve_gpu(gpu)
    return ComputeProfile(name=f"{key}-defaults", gpu=DATASHEETS[key], params=dict(PARAM_DEFAULTS),
                          description=f"{DATASHEETS[key].name} data sheet with default efficiencies (not fitted)")


def preset_names() -> list[str]:
    return gpu_names()


def load_preset(name: str) -> ComputeProfile:
    key = resolve_gpu(name)
    text = (resources.files("echo_et.models.compute") / "presets" / f"{FITTED_PRESET}.json").read_text("utf-8")
    fitted = from_json(json.loads(text), f"preset {FITTED_PRESET}")
    return fitted.for_gpu(key)


def load_profile(path: str | Path) -> ComputeProfile:
    p = Path(path)
    return from_json(read_model_json(p, p.name, "compute profile"), p.name)


def flatten(nested: dict[str, Any], where: str, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in nested.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, where, name + "."))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[name] = float(v)
        else:
            raise EchoError(f"{where}: parameter {name} must be a number, got {_shown(v)}")
    return out


def nest(flat: dict[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flat.items():
        head, _, tail = k.partition(".")
        if tail:
            out.setdefault(head, {})[tail] = v
        else:
            out[head] = v
    return out


def check_params(params: dict[str, float], where: str) -> dict[str, float]:
    given = set(params)
    unknown = sorted(given - set(PARAM_DEFAULTS))
    if unknown:
        raise EchoError(f"{where}: unknown parameter {unknown[0]} (known: {', '.join(sorted(PARAM_DEFAULTS))})")
    params = {**{n: PARAM_DEFAULTS[n] for n in ADDED_PARAMS if n not in params}, **params}
    for n, like in ADDED_LIKE.items():
        if n not in given:
            params[n] = params[like]
    missing = sorted(set(PARAM_DEFAULTS) - set(params))
    if missing:
        raise EchoError(f"{where}: missing parameter {missing[0]}")
    for k, v in params.items():
        if "_eff." in k and not (math.isfinite(v) and EFF_MIN <= v <= EFF_MAX.get(k, 1.0)):
            lo = "(0" if v <= 0 else f"[{EFF_MIN:g}"
            raise EchoError(f"{where}: {k} must be in {lo}, {EFF_MAX.get(k, 1.0):g}], got {v}")
        if "_eff." not in k:
            checked_float(v, f"params.{k}", lo=0.0, hi=PARAM_MAX.get(k, 1e9), where=where)
    return params


def from_json(obj: Any, where: str) -> ComputeProfile:
    if not isinstance(obj, dict):
        raise EchoError(f"{where}: a compute profile must be a JSON object, not {_type_name(obj)}")
    if obj.get("schema") != SCHEMA:
        raise EchoError(f"{where}: schema is {_shown(obj.get('schema'))}, expected {SCHEMA!r}")
    if not isinstance(obj.get("params"), dict):
        raise EchoError(f"{where}: no 'params' object")
    if not isinstance(obj.get("gpu"), dict):
        raise EchoError(f"{where}: no 'gpu' object (the data sheet)")
    settings = _field(obj, "settings", dict, "an object", where) or {}
    fp32 = settings.get("fp32_matmul", "fp32")
    if fp32 not in FP32_MATMUL:
        raise EchoError(f"{where}: settings.fp32_matmul must be one of {', '.join(FP32_MATMUL)}, got {_shown(fp32)}")
    sources = _field(obj, "sources", list, "a list", where) or []
    for i, src in enumerate(sources):
        if not isinstance(src, dict):
            raise EchoError(f"{where}: sources[{i}] must be an object, got {_shown(src)}")
    return ComputeProfile(
        name=_field(obj, "name", str, "a string", where) or "",
        gpu=GpuSpec.from_json(obj["gpu"], where),
        params=check_params(flatten(obj["params"], where), where),
        calibrated=bool(_field(obj, "calibrated", bool, "true or false", where)),
        fp32_matmul=fp32,
        description=_field(obj, "description", str, "a string", where) or "",
        params_from=_field(obj, "params_from", str, "a string", where) or "",
        sources=tuple(sources),
        fit=dict(_field(obj, "fit", dict, "an object", where) or {}),
    )


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number")


def _field(obj: dict, key: str, kind: type, shown: str, where: str) -> Any:
    """``obj[key]`` when it is of ``kind`` (absent or null: None); another type is one line."""
    value = obj.get(key)
    if value is None or isinstance(value, kind):
        return value
    raise EchoError(f"{where}: {key} must be {shown}, got {_shown(value)}")


def to_json(p: ComputeProfile) -> dict[str, Any]:
    out: dict[str, Any] = {
        "schema": SCHEMA,
        "name": p.name,
        "calibrated": p.calibrated,
        "gpu": rounded(p.gpu.to_json()),
        "params": rounded(nest(p.params)),
        "settings": {"fp32_matmul": p.fp32_matmul},
    }
    for key, val in (("description", p.description), ("params_from", p.params_from)):
        if val:
            out[key] = val
    if p.sources:
        out["sources"] = rounded(list(p.sources))
    if p.fit:
        out["fit"] = rounded(p.fit)
    return out


def dumps(p: ComputeProfile) -> str:
    return dumps_profile(to_json(p))


def write_profile(p: ComputeProfile, path: str | Path) -> None:
    write_profile_json(to_json(p), path)
