"""Accuracy of the collective model on the shared nccl-tests logs, per cluster and collective,
next to the alpha-beta baseline fitted on the same data per collective and tier (latency
and bandwidth for one GPU, inside a node and across nodes; ``latency + log2(N) + bytes /
bandwidth`` where a tier spans several group sizes) and the single line across all.
Prints markdown tables (CPU time of the fits depends on the machine; the errors do not).

    python benchmarks/comm_accuracy.py [--data ../shared/data] [--quick]

A100 (``nccl-tests/echo-a100``, all_reduce on 1-32 GPUs):
1. in-sample (fit on all six logs) and leave-one-log-out (fit without the 16- or the 32-GPU
   log, predict it) errors, NCCL release chosen on each fit's own logs (``auto``);
2. the same leave-one-out errors for each modelled NCCL release held fixed (sensitivity);
3. leave-one-out with vTrain's single-node all-reduce tables added to the fitted logs;
4. per size, fit without the 32-GPU log: measured, predicted, error, NCCL's choice;
5. what the in-sample profile predicts for 64 and 128 GPUs (8 per node).
H100 (``nccl-tests/h100-c01``: all_gather, alltoall, reduce_scatter, sendrecv on one node,
all_reduce on 80 GPUs; NCCL 2.29.2 stated, the newest modelled release emulated):
6. one fit across the five logs: in-sample and leave-one-log-out, every log held out in turn;
7. per size, in-sample, the send/recv log (NCCL's size-split channels);
8. per size, in-sample, the 80-GPU all-reduce with NCCL's choices (2.28.3: NVLS-tree up to
   2 GiB, the ring from 4 GiB) and, for comparison, the same fit with 2.20.3's choices.
``--quick`` runs 1, 4 and 6 only; ``--h100`` runs 6-8 only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echo_et.models.comm import CommModel, nccl  # noqa: E402
from echo_et.models.comm.calibrate import read_measurements, samples_from_runs, stated_release  # noqa: E402
from echo_et.models.comm.evaluate import cross_validate  # noqa: E402
from echo_et.models.comm.fit import predict_samples  # noqa: E402
from echo_et.models.comm.nccl_releases import VERSIONS  # noqa: E402
from echo_et.models.comm.profile import load_preset  # noqa: E402
from echo_et.models.comm.topology import contiguous  # noqa: E402

LOGS = (1, 2, 4, 8, 16, 32)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def table(cv: dict, kinds=("in_sample", "leave_one_out"), fitted: str = "fit 1-32",
          collectives: dict[str, str] | None = None) -> None:
    print("| experiment | log | collective | NCCL | model MAPE >=1MiB | model median 4KiB-1MiB | model MAPE all "
          "| baseline per tier MAPE >=1MiB | baseline per tier median 4KiB-1MiB | one line MAPE >=1MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        for r in cv[kind]:
            m, b, one = r["model"], r["baseline"], r["baseline_one_line"]
            label = f"in-sample ({fitted})" if kind == "in_sample" else f"fit without {r['log']}"
            coll = (collectives or {}).get(r["log"], "all_reduce")
            print(f"| {label} | {r['log']} ({r['ranks']} GPUs) | {coll} | {r['nccl']} "
                  f"| {pct(m['mape_ge_1mib_percent'])} | {pct(m['median_4kib_1mib_percent'])} "
                  f"| {pct(m['mape_percent'])} | {pct(b['mape_ge_1mib_percent'])} "
                  f"| {pct(b['median_4kib_1mib_percent'])} | {pct(one['mape_ge_1mib_percent'])} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--h100", action="store_true", help="the H100 sections (6-8) only")
    args = ap.parse_args()
    if args.h100:
        h100(args.data, quick=False)
        return
    base = load_preset("a100-ib")
    runs = [r for n in LOGS for r in read_measurements(args.data / f"nccl-tests/echo-a100/nccl_{n}.log")]

    t0 = time.perf_counter()
    cv = cross_validate(runs, 8, base, "auto")
    print(f"## 1. A100: in-sample and leave-one-log-out (NCCL release: auto; {time.perf_counter() - t0:.0f} s "
          "CPU-timed)")
    print()
    table(cv)
    prof = cv["profiles"]["in_sample"]
    print()
    print("Release fit errors (multi-node samples, %) per fit: " + "; ".join(
        f"{k}: " + ", ".join(f"{v} {e:.2f}" for v, e in p.fit["nccl_version_mape_percent"].items())
        for k, p in cv["profiles"].items()))

    if not args.quick:
        print()
        print("## 2. A100: leave-one-log-out with the NCCL release held fixed")
        print()
        for version in VERSIONS:
            fixed = cross_validate(runs, 8, base, version)
            table(fixed, ("leave_one_out",))
            print()
        print("## 3. A100: leave-one-log-out with vTrain's 2-8 GPU all-reduce tables added to the fitted logs")
        print()
        tables = sorted((args.data / "measurements/vtrain-a100/trace/a100").glob("AR_GPU*_LUT"))
        extra = [r for t in tables for r in read_measurements(t)]
        with_tables = cross_validate(runs + extra, 8, base, "auto",
                                     held_out=[LOGS.index(16), LOGS.index(32)])
        table(with_tables, ("leave_one_out",))

    print()
    print("## 4. A100: fit without the 32-GPU log, per size (IR bytes; measured = min of out-of-place and "
          "in-place)")
    print()
    p32 = cv["profiles"]["nccl_32.log"]
    held = samples_from_runs([runs[LOGS.index(32)]], 8)[0]
    pred = predict_samples(p32.params, held, p32.nccl)
    _, picks = nccl.choose(p32.params, "all_reduce", np.array([x.nbytes for x in held], dtype=float),
                           held[0].placement, p32.nccl)
    print(f"NCCL {p32.nccl.version}")
    print()
    print("| bytes | measured (us) | predicted (us) | error % | algorithm/protocol/channels |")
    print("|---|---|---|---|---|")
    for x, p, c in zip(held, pred, picks, strict=True):
        print(f"| {x.nbytes} | {x.time_us:.1f} | {p:.1f} | {100 * (p / x.time_us - 1):+.1f} "
              f"| {c.algorithm}/{c.protocol}/{c.channels} |")

    if not args.quick:
        print()
        print("## 5. A100: predicted all-reduce on 64 and 128 GPUs (8 per node), in-sample profile")
        print()
        model = CommModel(prof)
        sizes = [1 << e for e in (12, 16, 17, 20, 24, 26, 28, 30, 32)]
        print("| GPUs | " + " | ".join(str(s) for s in sizes) + " |")
        print("|---|" + "---|" * len(sizes))
        for n in (64, 128):
            t, cs = model.estimate_sizes("all_reduce", sizes, contiguous(n, 8))
            print(f"| {n} | " + " | ".join(f"{x:.0f} us {c.algorithm}/{c.protocol}/{c.channels}"
                                          for x, c in zip(t, cs, strict=True)) + " |")

    h100(args.data, quick=args.quick)


H100_LOGS = ("1n8g-all_gather", "1n8g-alltoall", "1n8g-reduce_scatter", "1n8g-sendrecv", "10n80g-all_reduce")


def h100(data: Path, quick: bool) -> None:
    runs = [r for n in H100_LOGS for r in read_measurements(data / f"nccl-tests/h100-c01/{n}.log")]
    version = stated_release(runs)
    t0 = time.perf_counter()
    cv = cross_validate(runs, 8, load_preset("h100-ib"), version, held_out=list(range(len(runs))))
    print()
    print(f"## 6. H100: one fit across the five logs, in-sample and leave-one-log-out (NCCL {runs[0].nccl_version} "
          f"stated, {version} emulated; {time.perf_counter() - t0:.0f} s CPU-timed)")
    print()
    table(cv, fitted="fit on all five", collectives={r.source: r.collective for r in runs})
    prof = cv["profiles"]["in_sample"]
    print()
    print("Fitted per-collective rates (relative to all-reduce's): " + ", ".join(
        f"{k.partition('.')[2]} NVLink {v:.2f}" for k, v in sorted(prof.params.items())
        if k.startswith("coll_nvlink_eff.") and v != 1.0) + f"; send/recv {prof.params['p2p_chan_gbps']:.1f} GB/s "
        "per channel")
    if quick:
        return
    print()
    print("## 7. H100: the send/recv log per size, in-sample (one operation's channels as NCCL splits it)")
    print()
    run = runs[H100_LOGS.index("1n8g-sendrecv")]
    held = samples_from_runs([run], 8)[0]
    pred = predict_samples(prof.params, held, prof.nccl)
    _, picks = nccl.choose(prof.params, "sendrecv", np.array([x.nbytes for x in held], dtype=float),
                           held[0].placement, prof.nccl)
    print("| bytes | measured (us) | predicted (us) | error % | protocol/channels |")
    print("|---|---|---|---|---|")
    for x, p, c in zip(held, pred, picks, strict=True):
        print(f"| {x.nbytes} | {x.time_us:.1f} | {p:.1f} | {100 * (p / x.time_us - 1):+.1f} "
              f"| {c.protocol}/{c.channels} |")
    print()
    print("## 8. H100: the 80-GPU all-reduce per size, in-sample, with each release's choices")
    print()
    older = cross_validate(runs, 8, load_preset("h100-ib"), "2.20.3", held_out=[])["profiles"]["in_sample"]
    run = runs[H100_LOGS.index("10n80g-all_reduce")]
    held = samples_from_runs([run], 8)[0]
    sizes = np.array([x.nbytes for x in held], dtype=float)
    cols = []
    for p in (prof, older):
        _, picks = nccl.choose(p.params, "all_reduce", sizes, held[0].placement, p.nccl)
        cols.append((predict_samples(p.params, held, p.nccl), picks))
    print(f"| bytes | measured (us) | NCCL {prof.nccl.version}: predicted (us) | error % | algorithm/protocol/channels "
          f"| NCCL {older.nccl.version}: predicted (us) | error % | algorithm/protocol/channels |")
    print("|---|---|---|---|---|---|---|---|")
    for i, x in enumerate(held):
        row = " | ".join(f"{pred[i]:.1f} | {100 * (pred[i] / x.time_us - 1):+.1f} | "
                         f"{picks[i].algorithm}/{picks[i].protocol}/{picks[i].channels}" for pred, picks in cols)
        print(f"| {x.nbytes} | {x.time_us:.1f} | {row} |")


if __name__ == "__main__":
    main()
