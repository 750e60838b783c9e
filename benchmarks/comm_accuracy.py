"""Accuracy of the NCCL cost model on the shared nccl-tests logs (A100, 1-32 GPUs), side by
side with a 3-parameter alpha-beta baseline fitted on the same data. Prints markdown tables.

    python benchmarks/comm_accuracy.py [--data ../shared/data/nccl-tests/echo-a100]

Experiments: in-sample (fit on all logs, error per log); extrapolation (fit on 1-16 GPUs,
predict 32; fit on 1-8, predict 16 and 32), with the error per size band. Errors are absolute
percentage errors of the predicted nccl-tests time per size; MAPE = their mean.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echo_et.models.comm import nccl, nccl_tests  # noqa: E402
from echo_et.models.comm.baseline import AlphaBeta  # noqa: E402
from echo_et.models.comm.calibrate import fit_profile, samples_from_runs  # noqa: E402
from echo_et.models.comm.evaluate import evaluate_samples  # noqa: E402
from echo_et.models.comm.fit import predict_samples  # noqa: E402
from echo_et.models.comm.profile import load_preset  # noqa: E402

LOGS = (1, 2, 4, 8, 16, 32)
EXPERIMENTS = (
    ("in-sample (fit 1-32)", LOGS, LOGS),
    ("fit 1-16, predict 32", (1, 2, 4, 8, 16), (32,)),
    ("fit 1-8, predict 16 and 32", (1, 2, 4, 8), (16, 32)),
)


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared/data/nccl-tests/echo-a100")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    args = ap.parse_args()
    samples = {}
    for n in LOGS:
        runs = nccl_tests.read_log(args.data / f"nccl_{n}.log")
        samples[n] = samples_from_runs(runs, args.gpus_per_node)[0]

    print("| experiment | log | sizes | model MAPE all | model MAPE <64KiB | model MAPE 64KiB-1MiB "
          "| model MAPE >=1MiB | model median 4KiB-1MiB | alpha-beta MAPE all | alpha-beta MAPE >=1MiB "
          "| alpha-beta median 4KiB-1MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    fits = {}
    for label, train, test in EXPERIMENTS:
        train_samples = [s for n in train for s in samples[n]]
        t0 = time.perf_counter()
        prof, _ = fit_profile(train_samples, [], load_preset("a100-ib"), args.gpus_per_node)
        fit_s = time.perf_counter() - t0
        fits[label] = (prof, fit_s)
        base = AlphaBeta.fit(train_samples)
        for n in test:
            ours = evaluate_samples(samples[n], lambda s, P=prof.params: predict_samples(P, s))
            theirs = evaluate_samples(samples[n], base.predict)
            print(f"| {label} | nccl_{n}.log ({n} GPUs) | {ours['sizes']} | {pct(ours['mape_percent'])} "
                  f"| {pct(ours['mape_lt_64kib_percent'])} | {pct(ours['mape_64kib_1mib_percent'])} "
                  f"| {pct(ours['mape_ge_1mib_percent'])} | {pct(ours['median_4kib_1mib_percent'])} "
                  f"| {pct(theirs['mape_percent'])} | {pct(theirs['mape_ge_1mib_percent'])} "
                  f"| {pct(theirs['median_4kib_1mib_percent'])} |")

    print()
    print("| experiment | fit time (s) | alpha (us) | beta (us/log2 N) | bandwidth (GB/s) |")
    print("|---|---|---|---|---|")
    for label, train, _ in EXPERIMENTS:
        base = AlphaBeta.fit([s for n in train for s in samples[n]])
        print(f"| {label} | {fits[label][1]:.1f} | {base.alpha_us:.1f} | {base.beta_us:.1f} "
              f"| {base.bandwidth_gbps:.1f} |")

    print()
    print("Fit 1-16, predict 32, per size (IR bytes; measured = min of out-of-place and in-place):")
    print()
    print("| bytes | measured (us) | predicted (us) | error % | algorithm/protocol |")
    print("|---|---|---|---|---|")
    prof16 = fits[EXPERIMENTS[1][0]][0]
    held = samples[32]
    pred = predict_samples(prof16.params, held)
    _, picks = nccl.choose(prof16.params, "all_reduce", np.array([x.nbytes for x in held], dtype=float),
                           held[0].placement)
    for x, p, pick in zip(held, pred, picks, strict=True):
        print(f"| {x.nbytes} | {x.time_us:.1f} | {p:.1f} | {100 * (p / x.time_us - 1):+.1f} | {'/'.join(pick)} |")

    print()
    print("Algorithm/protocol the in-sample profile picks (size ranges, IR bytes):")
    prof = fits[EXPERIMENTS[0][0]][0]
    for n in LOGS[1:]:
        s = samples[n]
        _, picks = nccl.choose(prof.params, "all_reduce", np.array([x.nbytes for x in s], dtype=float),
                               s[0].placement)
        spans: list[str] = []
        start = 0
        for i in range(1, len(s) + 1):
            if i == len(s) or picks[i] != picks[start]:
                spans.append(f"{'/'.join(picks[start])} {s[start].nbytes}-{s[i - 1].nbytes}")
                start = i
        print(f"- {n} GPUs: " + "; ".join(spans))


if __name__ == "__main__":
    main()
