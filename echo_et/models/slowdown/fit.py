"""Fitting the slowdown model: from a kernel dataset (CSV) or from a Job's own kernels.

A *sample* is one kernel execution: its short name and class, its isolated duration, its
duration as observed, and the fraction of it that overlapped communication.

Fit (time-weighted, shrunk toward the level above)::

    s_global = sum(t - t_iso) / sum(t_iso * r)                over overlapped samples
    s_class  = (sum_c(t - t_iso) + P * s_global) / (sum_c(t_iso * r) + P)
    s_kernel = (sum_k(t - t_iso) + P * s_class)  / (sum_k(t_iso * r) + P)

with ``P`` the overlapped isolated time of a few typical samples, so that a class or
kernel seen once does not get an extreme factor. With a prior model (fitting a Job's
kernels), the prior's factors replace ``s_global`` / ``s_class`` as shrinkage targets.
"""

from __future__ import annotations

import csv
import math
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from echo_et.errors import EchoError
from echo_et.ir.intervals import covered_length, merge_intervals
from echo_et.ir.job import Job
from echo_et.ir.schema import COMM_KINDS, pb
from echo_et.models.slowdown.kernels import classify_kernel, node_kernel_class, node_kernel_name, short_kernel_name
from echo_et.models.slowdown.model import SlowdownModel

PRIOR_SAMPLES = 5          # shrinkage weight, in "typical overlapped samples"
ISOLATED_BELOW = 0.05      # a kernel instance overlapping less than this counts as isolated


@dataclass(frozen=True)
class Sample:
    name: str          # short kernel name
    group: str         # what a grouped split keeps together (full kernel name)
    kernel_class: str
    isolated_ns: float
    observed_ns: float
    overlap: float     # fraction of the kernel that overlapped communication, 0..1


# -- inputs --------------------------------------------------------------------------------------
_CSV_NEEDS = ("ground_truth", "duration", "overlap_ratio")


def read_csv_samples(path: str | os.PathLike[str]) -> list[Sample]:
    """Rows of an Echo-slowdown ``merged_features.csv``: ``ground_truth`` is the isolated
    duration (ns, 1-GPU run), ``duration`` the duration in the 2-GPU run, ``overlap_ratio``
    the overlapped fraction; names from ``kDemangledName`` / ``kShortName`` / ``Kernel Name``."""
    p = Path(path)
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in _CSV_NEEDS if c not in header]
            name_col = next((c for c in ("kDemangledName", "Kernel Name", "kShortName") if c in header), None)
            if missing or name_col is None:
                need = missing + ([] if name_col else ["kDemangledName or kShortName"])
                raise EchoError(f"{p}: not a slowdown CSV (missing column(s): {', '.join(need)})")
            out = []
            for line, row in enumerate(reader, start=2):
                try:
                    iso = float(row["ground_truth"])
                    obs = float(row["duration"])
                    r = float(row["overlap_ratio"])
                except (TypeError, ValueError):
                    raise EchoError(f"{p}:{line}: ground_truth/duration/overlap_ratio are not numbers") from None
                if not (0 < iso < math.inf and 0 < obs < math.inf and 0.0 <= r <= 1.0 + 1e-9):
                    raise EchoError(f"{p}:{line}: durations must be finite and > 0, and overlap_ratio in [0, 1]")
                full = row[name_col] or row.get("kShortName", "")
                short = row.get("kShortName") or short_kernel_name(full)
                out.append(Sample(short, full, classify_kernel(full), iso, obs, min(1.0, r)))
    except UnicodeDecodeError:
        raise EchoError(f"{p}: not a text CSV file") from None
    except csv.Error as e:  # a field beyond csv's limit (128 KiB), a NUL byte
        raise EchoError(f"{p}: not a readable CSV file ({e})") from None
    if not out:
        raise EchoError(f"{p}: no kernel rows")
    return out


def samples_from_job(job: Job) -> list[Sample]:
    """Kernels of a Job that ran both alone and overlapped with communication.

    Per distinct graph (measured times), each GPU compute kernel's overlap with the
    communication kernels of its rank is measured; instances of the same kernel (same
    name and shapes) that overlapped less than 5% give its isolated time (median), the
    others become samples."""
    out: list[Sample] = []
    for gid in job.graph_ids():
        g = job.graph(gid)
        comm = [(n.start_ns, n.start_ns + n.duration_ns) for n in g.nodes
                if n.kind in COMM_KINDS and n.duration_ns > 0]
        if not comm:
            continue
        lo, hi = merge_intervals(np.array([a for a, _ in comm], dtype=np.int64),
                                 np.array([b for _, b in comm], dtype=np.int64))
        kernels = [n for n in g.nodes if n.kind == pb.KIND_COMPUTE and n.duration_ns > 0]
        if not kernels:
            continue
        s = np.array([n.start_ns for n in kernels], dtype=np.int64)
        e = s + np.array([n.duration_ns for n in kernels], dtype=np.int64)
        ratio = covered_length(lo, hi, s, e) / np.maximum(e - s, 1)
        by_kernel: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, n in enumerate(kernels):
            by_kernel[(node_kernel_name(n), n.compute.shapes)].append(i)
        for (name, _shapes), idx in by_kernel.items():
            alone = [kernels[i].duration_ns for i in idx if ratio[i] < ISOLATED_BELOW]
            if not alone:
                continue
            iso = float(np.median(alone))
            for i in idx:
                if ratio[i] >= ISOLATED_BELOW:
                    out.append(Sample(short_kernel_name(name), name, node_kernel_class(kernels[i]), iso,
                                      float(kernels[i].duration_ns), float(min(1.0, ratio[i]))))
    return out


# -- fitting -------------------------------------------------------------------------------------
def fit(samples: list[Sample], *, prior: SlowdownModel | None = None, source: str = "",
        per_kernel: bool = True) -> SlowdownModel:
    """Fit a :class:`SlowdownModel` (see the module docstring)."""
    ov = [x for x in samples if x.overlap > 0]
    if not ov:
        raise EchoError(f"{source or 'samples'}: no kernel overlapped communication; nothing to fit")
    weight = np.array([x.isolated_ns * x.overlap for x in ov])
    extra = np.array([x.observed_ns - x.isolated_ns for x in ov])
    p_w = PRIOR_SAMPLES * float(np.median(weight))
    if prior is None:
        s_global = float(extra.sum() / weight.sum())
    else:
        s_global = prior.global_s
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    ksums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    kclass: dict[str, str] = {}
    for x, w, d in zip(ov, weight, extra, strict=True):
        sums[x.kernel_class][0] += d
        sums[x.kernel_class][1] += w
        ksums[x.name][0] += d
        ksums[x.name][1] += w
        kclass.setdefault(x.name, x.kernel_class)
    classes = dict(prior.classes) if prior is not None else {}
    for c, (d, w) in sums.items():
        target = classes.get(c, s_global)
        classes[c] = (d + p_w * target) / (w + p_w)
    kernels = dict(prior.kernels) if prior is not None else {}
    if per_kernel:
        for k, (d, w) in ksums.items():
            target = kernels.get(k, classes.get(kclass[k], s_global))
            kernels[k] = (d + p_w * target) / (w + p_w)
    model = SlowdownModel(global_s=s_global, classes=classes, kernels=kernels,
                          max_factor=prior.max_factor if prior is not None else 8.0, source=source)
    model.fit = {
        "method": "time-weighted, shrunk toward class/global",
        "samples": len(samples),
        "overlapped": len(ov),
        "kernels": len(ksums),
        "prior_weight_ns": round(p_w, 1),
        "prior": prior.source if prior is not None else "",
    }
    return model
