"""How far echo-et's predictions of Megatron-DeepSpeed iterations are from measured ones.

Data: vTrain's 1,440 measured GPT iterations on one node of A100s
(``../shared/data/measurements/vtrain-a100/data/ground_truth_single.csv``; settings from its
README: A100, 8 per node, 150 GB/s intra-node, activation recomputation on, 1F1B, gradient
bucketing off). Every row is traced on the meta device (the ``megatron-gpt`` workload, fp16,
GPT-2 vocabulary, Megatron's selective recomputation, ``--recompute-granularity selective``:
the README says recomputation is on, not at which granularity, and of full, selective, none
and "all but the last stage" selective cross-validates best, docs/accuracy.md), its
compute timed by the compute model, its step simulated
(:mod:`echo_et.experiments.config_sweep`) with the collective model calibrated on vTrain's
all-reduce tables from the same kind of node (``trace/a100/AR_GPU{2..8}_1M_1024M_LUT``; the
README's nominal 150 GB/s is not imposed on it: ``--intra-bw`` does that).

The split never tests on what it fitted: K folds grouped by model shape (hidden size x
layers: 8 shapes, so a test fold's shapes were never seen in training). Per fold, the compute
model's end-to-end parameters (kernel overhead, host issue time per operator, tensor-core
GEMM and attention efficiencies) are fitted to the training rows only
(:mod:`echo_et.experiments.iteration_fit`: each row's GPU-bound and host-bound critical paths
under bounding models made from the prior, the longer one priced), and the test rows are
then simulated with the fold's fitted model. The prior is the shipped ``a100`` compute
preset *before* its iterations stage (``calibrate compute --kernels --layers``, re-fitted
here from ../shared/data): a prior fitted on iterations is refused.

Reported: MAPE over all rows and per layout family (TP-, PP-, DP-heavy: the largest degree;
mixed: a tie), the same for the uncalibrated prior and for a baseline (model FLOPs / peak x
a constant fitted per fold on the training rows), and the error distribution (``--plots``).

    python benchmarks/megatron_accuracy.py [--folds 5] [--workers 2] [--limit N]
        [--cache DIR] [--plots DIR] [--json OUT.json] [--write-configs CONFIGS.csv]
        [--recompute selective|full|none] [--sync-timers] [--gpu a100|a100-80gb]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.experiments.config_csv import REQUIRED
from echo_et.experiments.config_rows import ConfigSweepOptions, layout_family, workload_for
from echo_et.experiments.config_sweep import choice_summary, layout_choices, map_rows
from echo_et.experiments.iteration_fit import (
    PathSample,
    bounding_profiles,
    fit_iterations,
    fit_profile_on_iterations,
    read_iterations,
    simulate_row,
    simulate_row_profiles,
)
from echo_et.models.cluster import Cluster
from echo_et.models.compute import ComputeModel, write_profile
from echo_et.models.compute.calibration import calibrate_kernels_and_layers
from echo_et.models.compute.fit import END_TO_END_PARAMS

SHARED = Path(__file__).resolve().parents[1].parent / "shared/data"
DATA = SHARED / "measurements/vtrain-a100/data/ground_truth_single.csv"
KERNELS = SHARED / "slowdown/echo-a100-gpt2/merged_features.csv"
LAYERS = SHARED / "workloads"
COMM_TABLES = SHARED / "measurements/vtrain-a100/trace/a100"
PEAK_FP16_TFLOPS = 312.0
COLUMNS = {"# layers": "layers", "hidden size": "hidden", "attention heads": "heads",
           "sequence length": "seq", "micro batch": "micro_batch", "global batch": "global_batch",
           "tensor parallelism": "tp", "pipeline parallelism": "pp", "data parallelism": "dp",
           "iteration time (ms)": "measured_ms"}
REPORTED = END_TO_END_PARAMS


def vtrain_comm_profile(out: Path) -> Path:
    """The collective model calibrated on vTrain's all-reduce tables (2-8 A100 of the same kind
    of node as the measured iterations): what `echo-et calibrate nccl-tests
    .../AR_GPU*_LUT --gpus-per-node 8 -o OUT` writes."""
    from echo_et.models.comm.calibrate import fit_runs, read_measurements
    from echo_et.models.comm.profile import write_profile

    runs = [run for lut in sorted(COMM_TABLES.glob("AR_GPU*_LUT")) for run in read_measurements(lut)]
    write_profile(fit_runs(runs, 8)[0], out)
    return out


def read_rows(path: Path) -> list[dict]:
    with path.open(encoding="utf-8-sig") as f:
        return [{COLUMNS[k.strip()]: (float(v) if COLUMNS[k.strip()] == "measured_ms" else int(v))
                 for k, v in r.items() if k.strip() in COLUMNS} for r in csv.DictReader(f)]


def model_flops(row: dict) -> float:
    """Megatron's FLOPs of one iteration with activation recomputation (Narayanan et al.
    2021, eq. 3), per GPU."""
    b, s, n, h, v = row["global_batch"], row["seq"], row["layers"], row["hidden"], 50304
    return 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h)) / (row["tp"] * row["pp"] * row["dp"])


def shape_folds(rows: list[dict], k: int) -> list[int]:
    shapes = sorted({(r["hidden"], r["layers"]) for r in rows})
    fold_of_shape = {s: i % k for i, s in enumerate(shapes)}
    return [fold_of_shape[(r["hidden"], r["layers"])] for r in rows]


def err_pct(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def summary(preds: list[float], rows: list[dict]) -> dict:
    errs = [(err_pct(p, r["measured_ms"]), layout_family(r)) for p, r in zip(preds, rows, strict=True)
            if math.isfinite(p)]
    e = [x for x, _ in errs]
    fams = sorted({f for _, f in errs})
    return {"mape_pct": round(statistics.fmean(abs(x) for x in e), 2),
            "by_family": {f: round(statistics.fmean(abs(x) for x, g in errs if g == f), 2) for f in fams},
            "mean_signed_pct": round(statistics.fmean(e), 2),
            "median_abs_pct": round(statistics.median(abs(x) for x in e), 2),
            "within_10_pct": round(100 * sum(abs(x) <= 10 for x in e) / len(e), 1),
            "max_abs_pct": round(max(abs(x) for x in e), 1), "rows": len(e)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--limit", type=int, default=0, help="every n-th row only (quick runs)")
    ap.add_argument("--cache", default=None, help="folder keeping traced Jobs and simulations between runs")
    ap.add_argument("--intra-bw", default=None,
                    help="override the collective model's NVLink bandwidth (default: as calibrated)")
    ap.add_argument("--comm-profile", default=None,
                    help="calibrated collective profile (default: fitted here on vTrain's all-reduce tables)")
    ap.add_argument("--prior", default=None, help="compute profile to start from (default: the a100 preset)")
    ap.add_argument("--plots", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--write-configs", type=Path, default=None,
                    help="also write the rows as a `sweep --configs` CSV (with measured_ms)")
    ap.add_argument("--fit-all", type=Path, default=None,
                    help="also fit on ALL rows and write that profile (the shipped a100 preset)")
    ap.add_argument("--fit-only", action="store_true", help="with --fit-all: stop after writing it")
    ap.add_argument("--recompute", choices=("selective", "full", "none"), default="selective",
                    help="how the measured runs are read to recompute activations (docs/accuracy.md, "
                         "'Which recomputation the measured runs did'; default selective)")
    ap.add_argument("--gpu", default="a100",
                    help="the GPU whose data sheet the rows are priced on (vTrain's README says A100, not "
                         "which memory size: a100 is the 40 GB SXM4, a100-80gb the 80 GB; docs/accuracy.md)")
    ap.add_argument("--pipeline-engine", choices=("megatron", "deepspeed"), default="megatron",
                    help="the runs' pipeline read as Megatron-LM's 1F1B or DeepSpeed's PipelineEngine")
    ap.add_argument("--sync-timers", action="store_true",
                    help="Megatron's timers before its 2022 rewrite, which synchronise the device at every "
                         "micro-batch's forward, backward and pipeline exchange (docs/accuracy.md)")
    args = ap.parse_args(argv)
    if not args.data.is_file():
        print(f"needs {args.data} (../shared/data, absent in a fresh clone)", file=sys.stderr)
        return 2
    if args.prior:
        prior = ComputeModel.load(args.prior)
    else:   # the shipped a100 preset before its iterations stage: kernels and AICB layers only
        prior = ComputeModel(calibrate_kernels_and_layers(KERNELS, [LAYERS], name="a100").profile)
    if any(s.get("kind") == "iterations" for s in prior.profile.sources):
        print("the prior was fitted on measured iterations: give a --prior fitted on kernels and layers only",
              file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="echo-megatron-acc-"))
    comm_profile = args.comm_profile or str(vtrain_comm_profile(tmp / "vtrain-a100-allreduce.json"))
    opts = ConfigSweepOptions(
        cluster=Cluster.parse(gpu=args.gpu, gpus_per_node=8, intra_bw=args.intra_bw, inter_bw="800Gb/s/node"),
        recompute=args.recompute != "none", recompute_granularity="full" if args.recompute == "full" else "selective",
        dtype="float16", comm_profile=comm_profile, sync_timers=args.sync_timers,
        pipeline_engine=args.pipeline_engine)
    rows = read_rows(args.data)
    if args.limit:
        rows = rows[::args.limit]
    ok = []
    for r in rows:
        try:
            workload_for(r, opts)
            ok.append(r)
        except EchoError as e:
            print(f"skipped {r}: {e}", file=sys.stderr)
    rows = ok
    if args.write_configs:
        with args.write_configs.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow([*REQUIRED, "measured_ms"])
            for r in rows:
                w.writerow([*(r[k] for k in REQUIRED), r["measured_ms"]])
    fold = shape_folds(rows, args.folds)
    prior_path = tmp / "prior.json"
    prior.save(prior_path)
    gpu_p, host_p = bounding_profiles(prior, tmp)
    t0 = time.perf_counter()

    def run(profile: Path, want_path: bool, which: list[int]) -> list[dict]:
        tasks = [(rows[i], opts, str(profile), want_path, args.cache) for i in which]
        return map_rows(simulate_row, tasks, max(1, args.workers))

    everything = list(range(len(rows)))
    stash = None
    if args.cache:
        # what the stashed simulations depend on: the prior, the rows, the options, the
        # collective profile's content and the compute model's pricing code
        pricing = "".join((Path(__file__).resolve().parents[1] / "echo_et/models/compute" / f).read_text()
                          for f in ("ops.py", "kernels.py", "roofline.py"))
        digest = hashlib.sha256((prior_path.read_text() + json.dumps(rows) + repr(replace(opts, comm_profile=None))
                                 + Path(comm_profile).read_text() + pricing).encode()).hexdigest()[:16]
        stash = Path(args.cache) / f"bounds-{digest}.pkl"
    if stash is not None and stash.is_file():
        base, g_raw, h_raw = pickle.loads(stash.read_bytes())
    else:
        base = run(prior_path, False, everything)
        # one trace per row for both bounds (simulate_row_profiles)
        both = map_rows(simulate_row_profiles, [(rows[i], opts, (str(gpu_p), str(host_p)), True, args.cache)
                                                for i in everything], max(1, args.workers))
        g_raw, h_raw = [b[0] for b in both], [b[1] for b in both]
        if stash is not None:
            Path(args.cache).mkdir(parents=True, exist_ok=True)
            stash.write_bytes(pickle.dumps((base, g_raw, h_raw)))
    bounds = [(PathSample.from_wire(g["path"]), PathSample.from_wire(h["path"]))
              if "path" in g and "path" in h else None for g, h in zip(g_raw, h_raw, strict=True)]
    print(f"{len(rows)} rows traced and simulated (prior, both bounds) in {time.perf_counter() - t0:.0f} s",
          file=sys.stderr)
    if args.fit_all:
        # exactly `calibrate compute --kernels K --layers L --iterations DATA --recompute
        # --gpus-per-node 8 --intra-bw 150GB/s --inter-bw 800Gb/s/node --name a100`, from these simulations
        it_rows, it_excluded = read_iterations(args.data, opts)
        if [[r[k] for k in REQUIRED] for r in it_rows] != [[r[k] for k in REQUIRED] for r in rows]:
            print("--fit-all needs every row (no --limit)", file=sys.stderr)
            return 2
        cal = fit_profile_on_iterations(prior.profile, args.data, it_rows, bounds, opts, it_excluded)
        write_profile(cal.profile, args.fit_all)
        print(f"fitted on all rows: {cal.info} -> {args.fit_all}", file=sys.stderr)
        if args.fit_only:
            return 0
    pred = [math.nan] * len(rows)
    folds: dict[int, dict] = {}
    for k in range(args.folds):
        train = [i for i in everything if fold[i] != k and bounds[i] is not None]
        test = [i for i in everything if fold[i] == k]
        model, info = fit_iterations([(*bounds[i], rows[i]["measured_ms"] * 1e6) for i in train], prior)
        path = tmp / f"fold{k}.json"
        model.save(path)
        for i, g in zip(test, run(path, False, test), strict=True):
            pred[i] = g.get("predicted_ms", math.nan)
        folds[k] = {"test_shapes": sorted({(rows[i]["hidden"], rows[i]["layers"]) for i in test}),
                    "train_rows": len(train), "test_rows": len(test),
                    "params": {n: round(model.profile.params[n], 4) for n in REPORTED}, "fit": info,
                    "test_mape_pct": round(statistics.fmean(abs(err_pct(pred[i], rows[i]["measured_ms"]))
                                                            for i in test), 2)}
        print(f"fold {k}: {folds[k]}", file=sys.stderr)

    base_pred = [math.nan] * len(rows)
    for k in range(args.folds):
        c = statistics.median(rows[i]["measured_ms"] / (model_flops(rows[i]) / PEAK_FP16_TFLOPS / 1e9)
                              for i in range(len(rows)) if fold[i] != k)
        for i in range(len(rows)):
            if fold[i] == k:
                base_pred[i] = c * model_flops(rows[i]) / PEAK_FP16_TFLOPS / 1e9
    report = {"rows": len(rows), "folds": args.folds, "wall_s": round(time.perf_counter() - t0, 1),
              "family_rows": dict(sorted(Counter(layout_family(r) for r in rows).items())),
              "methods": {"echo-et, fitted per fold (cross-validated)": summary(pred, rows),
                          "echo-et, uncalibrated a100 preset": summary([b.get("predicted_ms", math.nan)
                                                                         for b in base], rows),
                          "baseline: FLOPs / peak x constant (per fold)": summary(base_pred, rows)},
              "fold_details": folds}
    per_row = [{**r, "family": layout_family(r), "fold": fold[i], "predicted_ms": round(pred[i], 3),
                "error_pct": round(err_pct(pred[i], r["measured_ms"]), 2),
                "baseline_error_pct": round(err_pct(base_pred[i], r["measured_ms"]), 2)}
               for i, r in enumerate(rows)]
    # Choosing a layout: per model at one global batch and GPU count, the layout predicted
    # fastest against the measured fastest (the baseline's times tie within a model: its
    # FLOPs per GPU do not depend on the layout, so it picks the first row).
    baseline_rows = [{**r, "predicted_ms": base_pred[i]} for i, r in enumerate(per_row)]
    report["layout_choice"] = {"echo-et, fitted per fold (cross-validated)": choice_summary(layout_choices(per_row)),
                               "baseline: FLOPs / peak x constant (per fold)":
                                   choice_summary(layout_choices(baseline_rows))}
    print(json.dumps({k: v for k, v in report.items() if k != "fold_details"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps({**report, "per_row": per_row}, indent=1) + "\n")
    if args.plots:
        from echo_et.experiments.plots import error_histogram_plot, predicted_vs_measured_plot

        args.plots.mkdir(parents=True, exist_ok=True)
        predicted_vs_measured_plot(per_row, args.plots / "megatron_predicted_vs_measured.png",
                                   title="1,440 Megatron iterations on 2-8 A100: cross-validated")
        error_histogram_plot({"echo-et (cross-validated)": [r["error_pct"] for r in per_row],
                              "baseline: FLOPs / peak x c": [r["baseline_error_pct"] for r in per_row]},
                             args.plots / "megatron_error_hist.png",
                             title="error distribution, 1,440 Megatron iterations")
    return 0


if __name__ == "__main__":
    sys.exit(main())
