"""Accuracy of the compute model on the measured A100 data in ../shared/data, held out.

Kernels (Echo's merged_features.csv, GPT-2 backward, FP32): every kernel is predicted by a
fit on the other kernels that never saw its group - leave-one-group-out over the kernel's
short name (``--group short``: e.g. all ``ampere_sgemm_128x32_tn`` together, or all 342
``vectorized_elementwise_kernel``) or over its functor (``--group functor``: e.g. all scalar
multiplies together). Layers (SimAI/AICB Megatron workloads): each file is predicted by a fit on
the kernels and the other files (the staged fit of ``echo-et calibrate compute``: kernels
set every efficiency, layers then the tensor-core GEMM and attention ones). "in-sample" rows
fit on everything and are only there to
show how much the split costs. A baseline shows what the fit buys: the data-sheet roofline
with default efficiencies (no fit).

    python benchmarks/compute_accuracy.py [--group short|functor] [--json]
    python benchmarks/compute_accuracy.py --profile a100     # a profile's own errors on this data

``--profile`` (a preset name or a profile file) prints that profile's errors on every kernel
and layer sample instead, e.g. the shipped ``a100`` preset after its iterations stage, whose
end-to-end parameters no kernel or layer sample saw.

Times are model outputs on this machine's CPU in well under a minute; no GPU is used.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from echo_et.models.compute import data
from echo_et.models.compute.fit import calibrate, errors, leave_group_out, predict, summary
from echo_et.models.compute.profile import default_profile

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
KERNELS = SHARED / "slowdown/echo-a100-gpt2/merged_features.csv"
WORKLOADS = SHARED / "workloads"


def load() -> tuple[list, list]:
    prior = default_profile("a100")
    ks, _ = data.read_kernel_samples(KERNELS)
    ls = []
    for f in data.aicb_files(WORKLOADS):
        lt = data.read_aicb_layers(f)
        if lt is not None:
            ls += data.layer_samples(lt, prior.gpu.peak_flops("bf16"))[0]
    return ks, ls


def _row(name: str, errs: list[float], meas: list[float] | None = None, pred: list[float] | None = None) -> dict:
    out = {"name": name, **summary(errs)}
    if meas is not None and pred is not None:
        out["sum_error_pct"] = 100.0 * (sum(pred) / sum(meas) - 1.0)
    return out


def profile_errors(name: str, as_json: bool) -> int:
    """A given profile's signed errors on every kernel and layer sample (no fit)."""
    from echo_et.errors import EchoError
    from echo_et.models.compute import ComputeModel

    try:
        prof = (ComputeModel.load(name) if Path(name).is_file() else ComputeModel.preset(name)).profile
    except EchoError as e:
        print(f"error: --profile: {e}", file=sys.stderr)
        return 2
    ks, ls = load()
    report = {"profile": prof.name, "per_source": {}, "layers": []}
    for src in ("kernels", "layers", "layers-excluded"):
        sel = [s for s in ks + ls if s.source == src]
        report["per_source"][src] = summary(errors(sel, prof))
    for s, e in zip(ls, errors(ls, prof), strict=True):
        report["layers"].append({"sample": s.label, "source": s.source, "measured_ms": s.measured_ns / 1e6,
                                 "predicted_ms": predict(s, prof) / 1e6, "error_pct": e})
    if as_json:
        print(json.dumps(report, indent=1, sort_keys=True))
        return 0
    print(f"## Profile {prof.name}: errors on the kernel and layer samples (nothing fitted here)\n")
    print("| source | n | MAPE % | bias % |")
    print("|---|---:|---:|---:|")
    for src, r in report["per_source"].items():
        print(f"| {src} | {r['n']} | {r['mape_pct']:.1f} | {r['bias_pct']:+.1f} |")
    print("\n| layer sample | source | measured ms | predicted ms | error % |")
    print("|---|---|---:|---:|---:|")
    for r in report["layers"]:
        print(f"| {r['sample']} | {r['source']} | {r['measured_ms']:.3f} | {r['predicted_ms']:.3f} | "
              f"{r['error_pct']:+.1f} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", choices=("short", "functor"), default="short")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", default=None, help="a preset name or profile file: print its errors on the data")
    a = ap.parse_args(argv)
    if not KERNELS.exists():
        print(f"needs {KERNELS}", file=sys.stderr)
        return 2
    if a.profile:
        return profile_errors(a.profile, a.json)
    prior = default_profile("a100")
    ks, ls = load()
    key = (lambda s: s.group) if a.group == "short" else data.functor_group
    report: dict = {"group": a.group, "kernels": [], "layers": [], "per_group": []}

    held = leave_group_out(ks, prior, key=key, only_source="kernels")
    errs = [e for _, e in held]
    meas = [s.measured_ns for s, _ in held]
    pred = [s.measured_ns * (1 + e / 100) for s, e in held]
    report["kernels"].append(_row(f"held out by {a.group} kernel name", errs, meas, pred))
    full = calibrate(ks + ls, prior)[0]
    report["kernels"].append(_row("in-sample (fit on all)", errors(ks, full), meas=[s.measured_ns for s in ks],
                                  pred=[predict(s, full) for s in ks]))
    report["kernels"].append(_row("baseline: data sheet, default efficiencies", errors(ks, prior),
                                  meas=[s.measured_ns for s in ks], pred=[predict(s, prior) for s in ks]))
    by: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for s, e in held:
        by[key(s)].append((e, s.measured_ns, s.measured_ns * (1 + e / 100)))
    for g in sorted(by, key=lambda g: -sum(m for _, m, _ in by[g])):
        v = by[g]
        report["per_group"].append({"group": g, "n": len(v), "measured_ms": sum(m for _, m, _ in v) / 1e6,
                                    "mape_pct": float(np.mean([abs(e) for e, _, _ in v])),
                                    "sum_error_pct": 100 * (sum(p for _, _, p in v) / sum(m for _, m, _ in v) - 1)})

    held_l = leave_group_out(ks + ls, prior, key=lambda s: s.group, only_source="layers")
    held_x = {s.label: e for s, e in leave_group_out(ks + ls, prior, key=lambda s: s.group,
                                                     only_source="layers-excluded")}
    for s, e in held_l:
        report["layers"].append({"sample": s.label, "measured_ms": s.measured_ns / 1e6,
                                 "held_out_error_pct": e, "fitted": True})
    for s in ls:
        if s.source != "layers":
            report["layers"].append({"sample": s.label, "measured_ms": s.measured_ns / 1e6,
                                     "held_out_error_pct": held_x.get(s.label), "fitted": False})
    report["layers_summary"] = _row("AICB layers, held out by file (fitted files only)", [e for _, e in held_l])
    if a.json:
        print(json.dumps(report, indent=1, sort_keys=True))
        return 0
    print(f"## Kernels (merged_features.csv, {len(ks)} samples)\n")
    print("| split | n | MAPE % | median APE % | p90 APE % | summed-time error % |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in report["kernels"]:
        print(f"| {r['name']} | {r['n']} | {r['mape_pct']:.1f} | {r['median_ape_pct']:.1f} | {r['p90_ape_pct']:.1f} "
              f"| {r['sum_error_pct']:+.1f} |")
    print(f"\n### Held out, per {a.group} group (by measured time)\n")
    print("| group | n | measured ms | MAPE % | summed-time error % |")
    print("|---|---:|---:|---:|---:|")
    for r in report["per_group"]:
        print(f"| {r['group'][:60]} | {r['n']} | {r['measured_ms']:.2f} | {r['mape_pct']:.1f} | "
              f"{r['sum_error_pct']:+.1f} |")
    print("\n## Layers (SimAI/AICB, per-layer forward / backward), held out by file\n")
    print("| workload, direction | measured ms | held-out error % | fitted |")
    print("|---|---:|---:|---|")
    for r in report["layers"]:
        e = r["held_out_error_pct"]
        print(f"| {r['sample']} | {r['measured_ms']:.3f} | {'-' if e is None else f'{e:+.1f}'} | "
              f"{'yes' if r['fitted'] else 'no (faster than peak)'} |")
    s = report["layers_summary"]
    print(f"\nfitted files: MAPE {s['mape_pct']:.1f}%, median {s['median_ape_pct']:.1f}% (n={s['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
