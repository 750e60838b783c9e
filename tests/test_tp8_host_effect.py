"""benchmarks/tp8_host_effect.py: the layer-pass and hidden-size comparisons that
docs/accuracy.md quotes from vTrain's measured rows (nothing predicted, nothing fitted)."""

from __future__ import annotations

import statistics

from conftest import load_benchmark, shared_path

COLUMNS = ("tensor parallelism,pipeline parallelism,data parallelism,global batch,micro batch,# layers,"
           "sequence length,hidden size,iteration time (ms)")


def test_rows_that_differ_in_the_hidden_size_alone_are_paired(tmp_path) -> None:
    bench = load_benchmark("tp8_host_effect")
    csv = tmp_path / "rows.csv"
    csv.write_text("\ufeff" + COLUMNS + "\n" + "\n".join([
        "4,1,1,4,1,24,1024,1024,100.0",
        "4,1,1,4,1,24,1024,2048,90.0",    # the twin of the row above
        "4,1,1,4,1,12,1024,2048,50.0",    # no twin at hidden 1024
        "1,1,2,4,1,24,1024,1024,100.0",
        "1,1,2,4,1,24,1024,2048,125.0",
        "1,2,1,4,1,24,1024,1024,80.0",    # another layout, same tp and micro-batch
        "1,2,1,4,1,24,1024,2048,120.0",
    ]) + "\n")
    assert bench.hidden_ratios(csv) == {(4, 1): [0.9], (1, 1): [1.25, 1.5]}


def test_the_measured_four_way_rows_run_faster_at_the_larger_hidden_size() -> None:
    """The contradiction accuracy.md ("Choosing the layout") describes, as measured."""
    bench = load_benchmark("tp8_host_effect")
    ratios = bench.hidden_ratios(shared_path("measurements/vtrain-a100/data/ground_truth_single.csv"))
    assert len(ratios[(4, 1)]) == 48 and len(ratios[(4, 2)]) == 36
    assert max(ratios[(4, 1)] + ratios[(4, 2)]) < 0.94 and statistics.median(ratios[(4, 1)]) < 0.91
    assert max(ratios[(8, 1)] + ratios[(8, 2)]) < 0.99
    assert min(ratios[(1, 1)] + ratios[(2, 1)]) > 1.0
