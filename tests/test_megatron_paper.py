"""The public validation targets of ``benchmarks/megatron_paper.py`` (Table 1 of arXiv
2104.04473) agree with themselves: every row's parameter count follows from its shape by the
paper's eq. 2 and its aggregate petaFLOP/s from its per-GPU throughput, and the iteration
times come from the paper's eq. 3; a mistyped value is caught."""

from __future__ import annotations

import pytest

from conftest import load_benchmark


@pytest.fixture(scope="module")
def paper():
    return load_benchmark("megatron_paper")


def test_transcribed_table_is_consistent(paper) -> None:
    assert paper.table_problems() == []
    rows = paper.paper_rows(1)
    assert [r["dp"] for r in rows] == [32, 32, 32, 32, 32, 32, 24, 15, 9, 6]
    # GPT-3 scale check of eq. 3: 145.6B, batch 2304 at 148 TFLOP/s on 1536 GPUs
    assert rows[6]["measured_ms"] == pytest.approx(24817.4, abs=0.1)
    # each row's run settings from the paper's scripts (examples/sc21/run_table_1.sh)
    rows = paper.paper_rows()
    assert [r["micro_batch"] for r in rows] == [16, 16, 16, 8, 4, 2, 2, 1, 1, 1]
    assert [r["ddp"] for r in rows].count("torch") == 4 and all(
        (r["ddp"] == "torch") == (r["pp"] == 1) for r in rows)
    assert [r["layers_per_virtual_stage"] for r in rows] == [0, 0, 0, 0, 0, 5, 5, 3, 1, 0]


def test_a_run_setting_that_does_not_fit_is_caught(paper, monkeypatch) -> None:
    runs = list(paper.PAPER_RUNS)
    runs[7] = (1, "local", 5)            # 96 layers over pp 16 are 6 a stage: not 5 a chunk
    monkeypatch.setattr(paper, "PAPER_RUNS", tuple(runs))
    assert paper.table_problems() == ["310.1B: 5 layers per virtual stage do not fit the row"]
    runs[7] = (7, "local", 3)            # 2160 sequences are not a multiple of 7 x 15
    monkeypatch.setattr(paper, "PAPER_RUNS", tuple(runs))
    assert paper.table_problems() == ["310.1B: micro-batch 7 or DDP 'local' does not fit the row"]


def test_a_mistyped_row_is_caught(paper, monkeypatch) -> None:
    table = list(paper.PAPER_TABLE_1)
    row = list(table[4])
    row[2] = 8192 * 2          # hidden
    table[4] = tuple(row)
    monkeypatch.setattr(paper, "PAPER_TABLE_1", tuple(table))
    assert paper.table_problems()[0].startswith("39.1B: the shape gives")
    row = list(paper.PAPER_TABLE_1[4])
    row[2], row[8] = 8192, 183   # throughput
    table[4] = tuple(row)
    monkeypatch.setattr(paper, "PAPER_TABLE_1", tuple(table))
    assert paper.table_problems() == ["39.1B: 183 TFLOP/s x 512 GPUs is not 70.8 PFLOP/s"]


def test_a_missing_candidate_profile_is_one_line_exit_2(paper, capsys) -> None:
    assert paper.main(["--compute-profile", "/nonexistent/candidate.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --compute-profile") and err.count("\n") == 1


def test_every_layout_fits_its_80gb_a100_only_with_the_recomputation_it_ran(paper) -> None:
    """The memory bound is a lower bound: each of the paper's ten runs, which recomputed whole
    layers on 80 GB A100s, fits it; without recomputation none would (the 76.1B row, at TP8 x
    PP4 and micro-batch 2, only with the plain 1F1B: its interleaved schedule keeps more
    forwards in flight), and with selective recomputation the 7.5B row at micro-batch 16, the
    interleaved 145.6B and 529.6B rows and the 1T row would not."""
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    from echo_et.errors import EchoError
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for
    from echo_et.models.cluster import Cluster

    cluster = Cluster.parse(gpu="a100-80gb", gpus_per_node=8, inter_bw="1600Gb/s/node")
    refused: dict[str, list[str]] = {}
    for level in ("full", "selective", "none"):
        opts = ConfigSweepOptions(cluster=cluster, recompute=level != "none",
                                  recompute_granularity=level.replace("none", "full"))
        refused[level] = []
        for row in paper.paper_rows():
            try:
                workload_for(row, opts)
            except EchoError as e:
                assert "does not fit the GPU's memory" in str(e), e
                refused[level].append(row["params_b"])
    assert refused == {"full": [], "selective": [7.5, 145.6, 529.6, 1008.0],
                       "none": [1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0]}
