"""Facts read straight from Kineto JSON files, for tests to compare converter output with.

Deliberately independent of ``echo_et.converters.kineto``: plain ``json`` and simple scans,
so a test compares the converter against the file, not against itself.
"""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from math import prod
from pathlib import Path

CPU_CATS = ("cpu_op", "user_annotation", "python_function")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


_LOADED: dict[tuple[str, bool], dict] = {}


def load(path: Path, *, exact: bool = False, fresh: bool = False) -> dict:
    """The JSON document (shared between tests: do not modify it unless ``fresh``); with
    ``exact`` floats are Decimals (no rounding)."""
    key = (str(path), exact)
    if not fresh and key in _LOADED:
        return _LOADED[key]
    with open(path, "rb") as raw:
        gz = raw.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rt") if gz else open(path)) as f:
        doc = json.load(f, parse_float=Decimal) if exact else json.load(f)
    if not fresh:
        _LOADED[key] = doc
    return doc


def forget() -> None:
    """Drop the shared documents (a module's tests are done with them)."""
    _LOADED.clear()


def events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def steps(doc: dict) -> dict[int, dict]:
    out = {}
    for e in events(doc):
        m = re.fullmatch(r"ProfilerStep#(\d+)", e.get("name", ""))
        if m and e.get("cat") in CPU_CATS:
            out.setdefault(int(m.group(1)), e)
    return out


def window(doc: dict, step: int) -> tuple[float, float]:
    e = steps(doc)[step]
    return e["ts"], e["ts"] + e["dur"]


def runtime_by_corr(doc: dict) -> dict[int, dict]:
    return {e["args"]["correlation"]: e for e in events(doc)
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}


def gpu_ops_launched_in(doc: dict, win: tuple[float, float] | None, cats=GPU_CATS) -> list[dict]:
    """GPU events whose launch call starts inside ``win`` (all when ``win`` is None)."""
    rt = runtime_by_corr(doc)
    out = []
    for e in events(doc):
        if e.get("cat") not in cats:
            continue
        launch = rt.get(e["args"].get("correlation"))
        if win is None or (launch is not None and win[0] <= launch["ts"] < win[1]):
            out.append(e)
    return sorted(out, key=lambda e: e["ts"])


def nccl_kernels_launched_in(doc: dict, win) -> list[dict]:
    return [e for e in gpu_ops_launched_in(doc, win, ("kernel",))
            if e["name"].startswith(("nccl", "rccl"))]


def enclosing(doc: dict, ev: dict, prefix: str) -> dict | None:
    """The innermost host op named ``prefix...`` on ev's thread whose span holds ev's start."""
    best = None
    for e in events(doc):
        if e.get("cat") in CPU_CATS and e["tid"] == ev["tid"] and e.get("name", "").startswith(prefix) \
                and e["ts"] <= ev["ts"] <= e["ts"] + e["dur"]:
            if best is None or e["ts"] >= best["ts"]:
                best = e
    return best


def nelems(dims) -> int:
    return prod(dims) if dims else 1
