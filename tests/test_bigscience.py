"""The public validation targets of ``benchmarks/bigscience.py`` (BigScience's layout search
for BLOOM on 384 A100s, Megatron-DeepSpeed) agree with themselves and with the memory bound:
every run's logged throughput follows from its logged seconds by the Megatron-LM paper's FLOPs
count, every run that ran fits its GPU by the lower bound, the layout the notes report out of
memory is refused, and the layout choice is judged within one day's runs."""

from __future__ import annotations

import json

import pytest

from conftest import load_benchmark, shared_path


@pytest.fixture(scope="module")
def bigscience():
    return load_benchmark("bigscience")


def test_transcribed_runs_are_consistent(bigscience) -> None:
    assert bigscience.table_problems() == []
    rows = bigscience.bigscience_rows()
    assert len(rows) == 96
    assert all(r["tp"] * r["pp"] * r["dp"] == 384 for r in rows[:93])
    assert all(r["layers"] % r["pp"] == 0 for r in rows[:64])
    assert rows[0]["measured_ms"] == 143310.0 and rows[63]["measured_ms"] == 115550.0
    assert {r["date"] for r in rows} == {"02-21", "02-23", "02-24", "02-25", "02-26", "02-27", "02-28"}
    assert [r["optimizer"] for r in rows].count("bf16") == 17 and rows[76]["optimizer"] == "bf16"
    assert {r["date"] for r in rows if r["optimizer"] == "bf16"} == {"02-28"}
    # the one-node runs: TP8 alone on 8 GPUs, batch 512 (their logged TFLOP/s hold only on 8 GPUs
    # and batch 512, which table_problems checked above)
    assert [(r["layers"], r["tp"], r["pp"], r["dp"], r["micro_batch"], r["global_batch"], r["optimizer"])
            for r in rows[93:]] == [(6, 8, 1, 1, 2, 512, "fp16")] * 2 + [(10, 8, 1, 1, 1, 512, "fp16")]
    # the uneven runs: DeepSpeed's 'type:transformer' on 78 layers and 12 stages (7 x 11, 1),
    # and 'type:transformer|embedding' on 106 (8, 9 x 10, 8)
    assert [(r["layers"], r["first_stage_layers"], r["last_stage_layers"]) for r in (rows[64], rows[75])] \
        == [(78, 7, 1), (106, 8, 8)]
    assert all("first_stage_layers" not in r for r in rows[:64])
    # BLOOM's own layout, partitioned 'type:transformer|embedding': 5, 6 x 10, 5 of 70 layers
    bloom = rows[92]
    assert (bloom["layers"], bloom["heads"], bloom["tp"], bloom["pp"], bloom["dp"], bloom["micro_batch"]) == \
        (70, 112, 4, 12, 8, 2)
    assert (bloom["first_stage_layers"], bloom["last_stage_layers"], bloom["measured_ms"]) == (5, 5, 104500.0)


def test_a_mistyped_run_is_caught(bigscience, monkeypatch) -> None:
    original, original_uneven = bigscience.BIGSCIENCE_RUNS, bigscience.UNEVEN_RUNS
    runs = list(original)
    runs[2] = ("02-21", 72, 14336, 64, 4, 8, 12, 4, 2048, 132.69, 130.34)   # seconds mistyped
    monkeypatch.setattr(bigscience, "BIGSCIENCE_RUNS", tuple(runs))
    assert bigscience.table_problems() == ["row 2 (02-21): 132.69 s gives 121.49 TFLOP/s, not 130.34"]
    runs[2] = ("02-21", 72, 14336, 64, 8, 8, 12, 4, 2048, 123.69, 130.34)   # 768 GPUs
    monkeypatch.setattr(bigscience, "BIGSCIENCE_RUNS", tuple(runs))
    assert "row 2 (02-21): the layout does not divide the GPUs, the model or the batch" in bigscience.table_problems()
    monkeypatch.setattr(bigscience, "BIGSCIENCE_RUNS", original)
    uneven = list(bigscience.UNEVEN_RUNS)
    uneven[-1] = (*uneven[-1][:11], 8, 9)      # 106 layers: 89 left for 10 stages
    monkeypatch.setattr(bigscience, "UNEVEN_RUNS", tuple(uneven))
    assert bigscience.table_problems() == [
        "row 75 (02-27): the layout does not divide the GPUs, the model or the batch"]
    monkeypatch.setattr(bigscience, "UNEVEN_RUNS", original_uneven)
    original_bf16 = bigscience.BF16_RUNS
    bf16 = list(original_bf16)
    bf16[0] = (*bf16[0][:9], 161.54, *bf16[0][10:])     # the 106-layer bfloat16 row, digits exchanged
    monkeypatch.setattr(bigscience, "BF16_RUNS", tuple(bf16))
    assert bigscience.table_problems() == ["row 76 (02-28): 161.54 s gives 108.03 TFLOP/s, not 149.75"]
    monkeypatch.setattr(bigscience, "BF16_RUNS", original_bf16)
    one_node = list(bigscience.ONE_NODE_RUNS)
    one_node[0] = (*one_node[0][:8], 2048, *one_node[0][9:])    # the column's batch, not the heading's
    monkeypatch.setattr(bigscience, "ONE_NODE_RUNS", tuple(one_node))
    assert bigscience.table_problems() == ["row 93 (02-21): 130.43 s gives 573.62 TFLOP/s, not 143.48"]


def test_bad_options_are_one_line_exit_2(bigscience, capsys) -> None:
    assert bigscience.main(["--rows", "3,96"]) == 2
    assert capsys.readouterr().err == "error: --rows 3,96: row indices are 0-95\n"
    assert bigscience.main(["--rows", "x"]) == 2
    assert capsys.readouterr().err == "error: --rows x: row indices are 0-95\n"
    assert bigscience.main(["--compute-profile", "/nonexistent/candidate.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --compute-profile") and err.count("\n") == 1


def test_every_run_that_ran_fits_and_the_one_out_of_memory_is_refused(bigscience) -> None:
    """The footprint is a lower bound: no run the notes measured is refused with the runs'
    settings (ZeRO stage 1, full recomputation, float16 on 80 GB), and the notes' TP8 x PP1 x
    DP48 run, "OOM", is refused."""
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    from echo_et.errors import EchoError
    from echo_et.experiments.config_rows import workload_for

    for row in bigscience.bigscience_rows():
        cfg, layout = workload_for(row, bigscience.run_options(optimizer=row["optimizer"]))
        # DeepSpeed's bfloat16 optimizer: fp32 gradients all-reduced whole, Adam sharded
        assert (cfg.dtype, cfg.grad_buffer_dtype, cfg.grad_reduce_scatter, layout.zero) == (
            ("bfloat16", "float32", False, 1) if row["optimizer"] == "bf16" else ("float16", "float16", True, 1))
    oom = {**bigscience.bigscience_rows()[41], "tp": 8, "pp": 1, "dp": 48, "micro_batch": 1}
    with pytest.raises(EchoError, match="does not fit the GPU's memory"):
        workload_for(oom, bigscience.run_options())


def test_layout_choice_is_judged_within_each_day(bigscience) -> None:
    """Two days measured the same two layouts; the pick is judged against each day's own
    fastest, never against the other day's (the notes say the cluster got faster between)."""
    base = {"layers": 72, "hidden": 14336, "heads": 64, "seq": 2048, "vocab": 250000, "global_batch": 2048,
            "micro_batch": 4}
    rows = [{**base, "date": "02-23", "tp": 8, "pp": 6, "dp": 8, "measured_ms": 120.0, "predicted_ms": 100.0},
            {**base, "date": "02-23", "tp": 8, "pp": 12, "dp": 4, "measured_ms": 123.0, "predicted_ms": 99.0},
            {**base, "date": "02-25", "tp": 8, "pp": 6, "dp": 8, "measured_ms": 114.0, "predicted_ms": 100.0},
            {**base, "date": "02-25", "tp": 8, "pp": 12, "dp": 4, "measured_ms": 117.0, "predicted_ms": 101.0}]
    got = bigscience.same_day_choices(rows)
    assert got["models"] == 2 and got["same"] == 1
    assert got["max_regret_pct"] == pytest.approx(2.5)


def test_the_memory_bound_stays_below_every_measured_run(bigscience, capsys) -> None:
    """60 of the runs logged the memory a GPU used (nvidia-smi): echo-et's footprint, a lower
    bound by design, is below every one of them, and not vacuously (at least a third of the
    measurement on every row)."""
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    bounds = bigscience.memory_bounds()
    assert len(bounds) == 60
    ratios = [bound / gb for _, gb, bound in bounds]
    assert max(ratios) < 1.0 and min(ratios) > 0.33
    assert bigscience.main(["--memory"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 61 and out[0].split()[-1] == "bound/measured"


def test_the_error_breakdown_groups_by_tp_micro_batch_and_heads(bigscience) -> None:
    """Where the table's miss is: by TP degree, at TP4 and TP8 by micro-batch, by head count; a
    row without a prediction counts nowhere."""
    rows = [{"tp": 8, "micro_batch": 1, "heads": 64, "error_pct": -20.0},
            {"tp": 8, "micro_batch": 4, "heads": 128, "error_pct": -10.0},
            {"tp": 2, "micro_batch": 2, "heads": 64, "error_pct": 4.0},
            {"tp": 4, "micro_batch": 2, "heads": 96, "error_pct": None},
            {"tp": 4, "micro_batch": 1, "heads": 64, "error_pct": -30.0}]
    rows = [{"pp": 12, "dp": 384 // (12 * r["tp"]), **r} for r in rows]
    # a one-node run counts in its own group only
    rows.append({"tp": 8, "pp": 1, "dp": 1, "micro_batch": 2, "heads": 64, "error_pct": -16.0})
    got = bigscience.error_breakdown(rows)
    assert list(got) == ["heads<=64", "heads>64", "one node (TP8)", "tp2", "tp4", "tp4 mb1", "tp8", "tp8 mb1",
                         "tp8 mb4"]
    assert got["one node (TP8)"]["rows"] == 1
    assert got["tp8"] == {"rows": 2, "mape_pct": 15.0, "mean_signed_pct": -15.0, "within_10_pct": 0}
    assert got["heads<=64"] == {"rows": 3, "mape_pct": 18.0, "mean_signed_pct": -15.33, "within_10_pct": 1}


def test_one_run_predicts_end_to_end(bigscience, tmp_path, capsys) -> None:
    """The benchmark's whole path on two runs (TP2 x PP12 x DP16, micro-batch 2, float16; BLOOM's
    layout under the bfloat16 optimizer): traced, timed by the shipped presets and simulated,
    their rows, errors and breakdown printed and written."""
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    shared_path("measurements/vtrain-a100/trace/a100")
    out = tmp_path / "one.json"
    assert bigscience.main(["--rows", "46,92", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert " 46 02-25     72  14336    64   2  12  16   2  2048     112500.0" in printed
    assert " 92 02-28     70  14336   112   4  12   8   2  2048     104500.0" in printed
    assert "by bf16 optimizer:" in printed and "fp16 optimizer:" in printed and "tp2:" in printed
    record = json.loads(out.read_text(encoding="utf-8"))
    row, bloom = record["rows"]
    assert row["row"] == 46 and row["date"] == "02-25" and row["measured_ms"] == 112500.0
    assert 0.8 * 112500 < row["predicted_ms"] < 1.2 * 112500
    # BLOOM's own layout under DeepSpeed's bfloat16 optimizer, on 5, 6 x 10, 5 layers
    assert (bloom["row"], bloom["optimizer"], bloom["first_stage_layers"]) == (92, "bf16", 5)
    assert 0.8 * 104500 < bloom["predicted_ms"] < 1.2 * 104500
    assert record["summary"]["by"]["tp2"]["rows"] == 1 and record["comm"] == "vtrain-calibrated"
