"""What the 8-way tensor-parallel miss is made of, read from vTrain's measured iterations alone.

Data: ``../shared/data/measurements/vtrain-a100/data/ground_truth_single.csv`` (1,440
Megatron-DeepSpeed iterations on one node of A100s). Only rows without pipeline parallelism
are used, so that one rank's work per iteration is ``layers x micro-batches`` layer passes
(forward, recomputed forward, backward) and the time per layer pass compares layouts with
the same micro-batches per rank:

- processes per node: TP1 x DP8 and TP4 x DP2 run eight processes on the node, TP1 x DP2 and
  TP4 x DP1 two and four: if eight processes contended for the host's CPUs, the first two
  would be slower per layer pass than the last two;
- the size of the tensor-parallel group: TP8 against TP4 (both one pipeline, the same
  micro-batches): the difference per layer pass, divided by the six tensor-parallel
  all-reduces of a layer pass (two in the forward, two in the recomputed forward, two in the
  backward), is what each 8-way all-reduce costs more than a 4-way one.

Nothing is fitted; the script prints, per (hidden, micro-batch), the median over layer counts
and global batches of each ratio.

A second table pairs every row at hidden 2048 with the row of the same layout, batch,
micro-batch and layer count at hidden 1024 (pipelines included): a layer at 2048 holds 3.7
times the FLOPs of one at 1024 (sequence 1,024) and the same operators, so where the host
binds the ratio of their times cannot fall below 1 in any model that prices the same host
work per operator; it prints, per (tp, micro-batch), the pairs and the least, median and
largest ratio of the measured times.

    python benchmarks/tp8_host_effect.py
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

DATA = Path(__file__).resolve().parents[1].parent / "shared/data/measurements/vtrain-a100/data/ground_truth_single.csv"
ALLREDUCES_PER_LAYER_PASS = 6


def per_layer_pass_us(path: Path) -> dict[tuple[int, int, int, int], dict[tuple[int, int], float]]:
    """(hidden, micro-batch, layers, micro-batches per rank) -> (tp, dp) -> us per layer pass
    (rows compared have the same work per rank; what differs is the layout)."""
    out: dict[tuple[int, int, int, int], dict[tuple[int, int], float]] = defaultdict(dict)
    with path.open(encoding="utf-8-sig") as f:
        for r in csv.DictReader(f):
            if int(r["pipeline parallelism"]) != 1:
                continue
            tp, dp, mb = int(r["tensor parallelism"]), int(r["data parallelism"]), int(r["micro batch"])
            layers, gb = int(r["# layers"]), int(r["global batch"])
            passes = layers * gb // (mb * dp)
            key = (int(r["hidden size"]), mb, layers, gb // (mb * dp))
            out[key][(tp, dp)] = float(r["iteration time (ms)"]) * 1e3 / passes
    return out


def ratio(rows, a: tuple[int, int], b: tuple[int, int]) -> dict[tuple[int, int], float]:
    """Median over layers and batches of rows[a] / rows[b], per (hidden, micro-batch)."""
    got: dict[tuple[int, int], list[float]] = defaultdict(list)
    for (h, mb, _, _), d in rows.items():
        if a in d and b in d:
            got[(h, mb)].append(d[a] / d[b])
    return {k: statistics.median(v) for k, v in got.items()}


def extra_us(rows) -> dict[tuple[int, int], float]:
    """Median of (TP8 - TP4) per layer pass / 6 all-reduces, per (hidden, micro-batch)."""
    got: dict[tuple[int, int], list[float]] = defaultdict(list)
    for (h, mb, _, _), d in rows.items():
        if (8, 1) in d and (4, 1) in d:
            got[(h, mb)].append((d[(8, 1)] - d[(4, 1)]) / ALLREDUCES_PER_LAYER_PASS)
    return {k: statistics.median(v) for k, v in got.items()}


def hidden_ratios(path: Path) -> dict[tuple[int, int], list[float]]:
    """(tp, micro-batch) -> measured time at hidden 2048 / at hidden 1024, one per pair of rows
    that differ in the hidden size alone."""
    times: dict[tuple, dict[int, float]] = defaultdict(dict)
    with path.open(encoding="utf-8-sig") as f:
        for r in csv.DictReader(f):
            layout = tuple(int(r[c]) for c in ("tensor parallelism", "pipeline parallelism", "data parallelism",
                                               "global batch", "micro batch", "# layers", "sequence length"))
            times[layout][int(r["hidden size"])] = float(r["iteration time (ms)"])
    out: dict[tuple[int, int], list[float]] = defaultdict(list)
    for layout, by_hidden in times.items():
        if 1024 in by_hidden and 2048 in by_hidden:
            out[(layout[0], layout[4])].append(by_hidden[2048] / by_hidden[1024])
    return dict(out)


def main() -> int:
    if not DATA.is_file():
        print(f"error: {DATA} is absent (../shared/data)", file=sys.stderr)
        return 2
    rows = per_layer_pass_us(DATA)
    dp8 = ratio(rows, (1, 8), (1, 2))
    tp4dp2 = ratio(rows, (4, 2), (4, 1))
    tp8 = ratio(rows, (8, 1), (4, 1))
    extra = extra_us(rows)
    print(f"{'hidden':>6} {'mb':>3} {'us/pass TP4':>11} {'TP1xDP8/TP1xDP2':>16} {'TP4xDP2/TP4xDP1':>16} "
          f"{'TP8/TP4':>8} {'extra us per 8-way all-reduce':>30}")
    for k in sorted(extra):
        base = statistics.median(d[(4, 1)] for (h, mb, _, _), d in rows.items() if (h, mb) == k and (4, 1) in d)
        print(f"{k[0]:>6} {k[1]:>3} {base:>11.0f} {dp8.get(k, float('nan')):>16.3f} "
              f"{tp4dp2.get(k, float('nan')):>16.3f} {tp8[k]:>8.3f} {extra[k]:>30.0f}")
    print()
    print(f"{'tp':>3} {'mb':>3} {'pairs':>5} {'hidden 2048 / hidden 1024: least':>33} {'median':>7} {'largest':>8}")
    for (tp, mb), rs in sorted(hidden_ratios(DATA).items()):
        print(f"{tp:>3} {mb:>3} {len(rs):>5} {min(rs):>33.3f} {statistics.median(rs):>7.3f} {max(rs):>8.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
