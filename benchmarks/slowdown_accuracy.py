"""Accuracy of the overlap-slowdown model on the Echo A100 GPT-2 kernel dataset.

The source repository used the same CSV as training and test set; here every number
except the row marked "in-sample" comes from a k-fold split GROUPED BY KERNEL NAME (no
kernel name in both training and test folds), so it measures kernels the model never saw.
Metrics are over overlapped kernels (overlap_ratio > 0): share of kernels whose predicted
duration is within 5/10/15 % of the observed one, mean absolute percentage error, and the
error of the summed duration (what a step-time simulator adds up), overall and as the mean
absolute per-fold value.

    python benchmarks/slowdown_accuracy.py [CSV] [--folds 5] [--group demangled|short] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from echo_et.models.slowdown import SlowdownModel, fit, grouped_folds, read_csv_samples
from echo_et.models.slowdown.evaluate import error_metrics, predict_ns
from echo_et.models.slowdown.fit import Sample

DEFAULT_CSV = Path(__file__).resolve().parents[1].parent / "shared/data/slowdown/echo-a100-gpt2/merged_features.csv"


def _constant(s: float) -> SlowdownModel:
    return SlowdownModel(global_s=s, classes={}, kernels={}, max_factor=1e9, source=f"constant s={s:.4g}")


def _knn_predict(train: list[Sample], test: list[Sample], k: int = 7) -> np.ndarray:
    """k nearest neighbours on standardized (log isolated time, class one-hot); the median
    slowdown of the neighbours. Uses only features the simulator has for every kernel."""
    classes = sorted({x.kernel_class for x in train + test})

    def feats(xs: list[Sample]) -> np.ndarray:
        return np.array([[np.log10(x.isolated_ns)] + [float(x.kernel_class == c) for c in classes] for x in xs])

    tr = [x for x in train if x.overlap >= 0.2]
    a, b = feats(tr), feats(test)
    mu, sd = a.mean(0), a.std(0) + 1e-9
    a, b = (a - mu) / sd, (b - mu) / sd
    s_tr = np.array([(x.observed_ns / x.isolated_ns - 1) / x.overlap for x in tr])
    d = ((b[:, None, :] - a[None, :, :]) ** 2).sum(-1)
    nn = np.argsort(d, axis=1, kind="stable")[:, :k]
    s = np.maximum(0.0, np.median(s_tr[nn], axis=1))
    return np.array([x.isolated_ns * (1 + si * x.overlap) for x, si in zip(test, s, strict=True)])


def evaluate(samples: list[Sample], folds: int, group: str) -> list[dict]:
    if group == "short":
        samples = [Sample(x.name, x.name, x.kernel_class, x.isolated_ns, x.observed_ns, x.overlap) for x in samples]
    fold = np.array(grouped_folds(samples, folds))
    obs = np.array([x.observed_ns for x in samples])
    ov = np.array([x.overlap > 0 for x in samples])
    preds: dict[str, np.ndarray] = {name: np.zeros(len(samples)) for name in (
        "no slowdown (s = 0)", "constant s = 1.3 (Echo's baseline)", "constant s, median (fitted)",
        "constant s, time-weighted (fitted)", "k-NN, log time + class", "echo-et: per class, time-weighted")}
    for f in sorted(set(fold.tolist())):
        train = [x for x, k in zip(samples, fold, strict=True) if k != f]
        test_idx = np.flatnonzero(fold == f)
        test = [samples[i] for i in test_idx]
        tr_ov = [x for x in train if x.overlap >= 0.2]
        s_med = float(np.median([(x.observed_ns / x.isolated_ns - 1) / x.overlap for x in tr_ov]))
        s_tw = fit(train, per_kernel=False).global_s
        per_class = fit(train, per_kernel=True)
        models = {
            "no slowdown (s = 0)": _constant(0.0),
            "constant s = 1.3 (Echo's baseline)": _constant(1.3),
            "constant s, median (fitted)": _constant(s_med),
            "constant s, time-weighted (fitted)": _constant(s_tw),
            "echo-et: per class, time-weighted": per_class,
        }
        for name, m in models.items():
            preds[name][test_idx] = [predict_ns(m, x) for x in test]
        preds["k-NN, log time + class"][test_idx] = _knn_predict(train, test)
    rows = []
    for name, p in preds.items():
        rows.append({"model": name, "split": f"{len(set(fold.tolist()))}-fold grouped by {group} name",
                     **error_metrics(p[ov], obs[ov], fold[ov])})
    full = fit(samples, per_kernel=True)
    p = np.array([predict_ns(full, x) for x in samples])
    rows.append({"model": "echo-et with per-kernel factors, in-sample (train = test; NOT a valid estimate)",
                 "split": "none", **error_metrics(p[ov], obs[ov], fold[ov])})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="?", default=str(DEFAULT_CSV))
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--group", choices=("demangled", "short"), default="demangled")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not Path(args.csv).exists():
        print(f"{args.csv}: not found (needs ../shared/data)", file=sys.stderr)
        return 2
    samples = read_csv_samples(args.csv)
    rows = evaluate(samples, args.folds, args.group)
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    n_ov = sum(1 for x in samples if x.overlap > 0)
    print(f"{len(samples)} kernels, {n_ov} overlapped; split: {rows[0]['split']}")
    head = f"| {'model':<82} | ≤5% | ≤10% | ≤15% | MAPE % | sum err % | fold sum |err| % |"
    print(head)
    print("|" + "---|" * 7)
    for r in rows:
        print(f"| {r['model']:<82} | {100 * r['within_5pct']:.1f} | {100 * r['within_10pct']:.1f} | "
              f"{100 * r['within_15pct']:.1f} | {r['mape_pct']:.1f} | {r['sum_error_pct']:+.1f} | "
              f"{r['fold_sum_abs_error_pct']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
