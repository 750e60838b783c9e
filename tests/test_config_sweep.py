"""sweep --configs: every CSV row traced on the meta device and predicted, in row order."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.errors import EchoError, OptionError
from echo_et.experiments.config_csv import read_configs
from echo_et.experiments.config_rows import ConfigSweepOptions, layout_family, workload_for
from echo_et.experiments.config_sweep import predict_row, run_config_sweep

pytest.importorskip("torch", reason="meta-device tracing needs torch (the trace extra)")
runner = CliRunner()

HEADER = "layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp"
TINY = dict(layers=2, hidden=64, heads=4, seq=32, micro_batch=1, global_batch=4, tp=2, pp=1, dp=2)


def _csv(tmp_path, text: str):
    p = tmp_path / "configs.csv"
    p.write_text(text)
    return p


def test_read_configs(tmp_path) -> None:
    p = _csv(tmp_path, "\ufeff" + HEADER + ",vocab,measured_ms\n2,64,4,32,1,4,2,1,2,1000,12.5\n"
                       " 4 ,64,4,32,2,8,1,2,2,,\n")
    rows = read_configs(p)
    assert rows[0] == {**TINY, "vocab": 1000, "measured_ms": 12.5}
    assert rows[1]["layers"] == 4 and rows[1]["vocab"] is None and rows[1]["measured_ms"] is None


@pytest.mark.parametrize("text, needle", [
    ("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp\n1,2,3,4,5,6,7,8\n", "missing column 'dp'"),
    (HEADER + ",speed\n" + "1," * 9 + "2\n", "unknown column 'speed'"),
    (HEADER + "\n2,64,4,32,1,4,two,1,2\n", "line 2: tp 'two' is not an integer"),
    (HEADER + ",measured_ms\n2,64,4,32,1,4,2,1,2,-3\n", "measured_ms '-3'"),
    (HEADER + "\n", "no configuration rows"),
    ("", "empty"),
])
def test_read_configs_refuses(tmp_path, text, needle) -> None:
    with pytest.raises(OptionError) as e:
        read_configs(_csv(tmp_path, text))
    assert e.value.option == "configs" and needle in str(e.value)


def test_workload_for_names_the_numbers() -> None:
    opts = ConfigSweepOptions()
    for bad, needle in (({"tp": 3}, "tp (3) must divide heads (4)"),
                        ({"pp": 3, "tp": 1}, "pp (3) must divide layers (2)"),
                        ({"global_batch": 5}, "global batch (5) is not a multiple of micro-batch x dp (1 x 2 = 2)")):
        with pytest.raises(EchoError, match=r".*") as e:
            workload_for({**TINY, **bad}, opts)
        assert needle in str(e.value)
    cfg, lay = workload_for(TINY, opts)
    assert lay.microbatches == 2 and cfg.vocab == 50257 and cfg.padded_vocab(2) == 50432


def test_layout_family() -> None:
    assert layout_family({"tp": 4, "pp": 2, "dp": 1}) == "tp-heavy"
    assert layout_family({"tp": 1, "pp": 4, "dp": 2}) == "pp-heavy"
    assert layout_family({"tp": 2, "pp": 1, "dp": 4}) == "dp-heavy"
    assert layout_family({"tp": 2, "pp": 2, "dp": 1}) == "mixed"
    assert layout_family({"tp": 1, "pp": 1, "dp": 1}) == "single"


def test_predict_row_and_its_breakdown() -> None:
    row = predict_row({**TINY, "measured_ms": 1.0}, ConfigSweepOptions(recompute=True))
    assert "error" not in row, row
    assert row["predicted_ms"] > 0
    assert row["error_pct"] == pytest.approx(100 * (row["predicted_ms"] - 1.0), rel=1e-3)
    assert row["compute_ms"] > 0 and row["compute_ms"] <= row["predicted_ms"] + 1e-6
    assert row["family"] == "mixed"
    # recomputation re-runs the forward: more compute on the same configuration
    plain = predict_row({**TINY, "measured_ms": 1.0}, ConfigSweepOptions(recompute=False))
    assert plain["compute_ms"] < row["compute_ms"]


def test_sweep_cli_rows_in_order_with_errors_and_mape(tmp_path) -> None:
    p = _csv(tmp_path, HEADER + ",measured_ms\n"
                               "2,64,4,32,1,4,2,1,2,5.0\n"
                               "2,64,4,32,1,4,3,1,1,5.0\n"      # tp 3 does not divide 4 heads
                               "2,64,4,32,2,4,1,2,1,\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["sweep", "--configs", str(p), "-o", str(out), "--recompute", "--gpu", "a100",
                            "--gpus-per-node", "8", "--intra-bw", "150GB/s", "--inter-bw", "800Gb/s/node",
                            "--workers", "1", "--no-plot", "--json"])
    assert r.exit_code == 1, r.output      # a row failed: exit 1, and the last line says so
    assert r.stderr.splitlines()[-1] == f"1 of 3 rows failed (see {out / 'results.json'})"
    got = json.loads(r.stdout)
    rows = got["rows"]
    assert [x["tp"] for x in rows] == [2, 3, 1]
    assert isinstance(rows[0]["predicted_ms"], float) and rows[0]["error_pct"] is not None
    assert "tp (3) must divide heads (4)" in rows[1]["error"]
    assert rows[2]["error_pct"] is None and rows[2]["predicted_ms"] > 0
    assert got["mape_pct"] == pytest.approx(abs(rows[0]["error_pct"]))
    saved = json.loads((out / "results.json").read_text())
    assert saved["rows"] == rows and saved["options"]["cluster"]["inter_bw_gbps_per_gpu"] == 12.5
    table = (out / "table.txt").read_text()
    assert "MAPE" in table
    # each row that ran carries its rates; the table shows its MFU
    for x in (rows[0], rows[2]):
        assert x["tokens_per_s"] == pytest.approx(4 * 32 / (x["predicted_ms"] / 1e3), rel=1e-4)
        assert x["mfu_pct"] == pytest.approx(100 * x["model_tflops_per_gpu"] / 312, rel=1e-3)
        assert f" {x['mfu_pct']:.1f}\n" in table
    assert "mfu_pct" not in rows[1] and table.splitlines()[0].split()[-1] == "MFU_%"


@pytest.mark.parametrize("extra, text, needle", [
    (["--gpu", "tpu"], HEADER + "\n2,64,4,32,1,4,2,1,2\n", "--gpu: unknown GPU 'tpu' (presets: a100"),
    ([], "layers,hidden\n1,2\n", "--configs: configs.csv: missing column 'heads'"),
    ([], HEADER + ",color\n" + "1," * 9 + "red\n", "unknown column 'color'"),
    (["--intra-bw", "quick"], HEADER + "\n2,64,4,32,1,4,2,1,2\n", "--intra-bw:"),
    (["--dp", "2"], HEADER + "\n2,64,4,32,1,4,2,1,2\n", "cannot be combined with --configs"),
])
def test_sweep_cli_bad_input_writes_nothing(tmp_path, extra, text, needle) -> None:
    p = _csv(tmp_path, text)
    out = tmp_path / "out"
    r = runner.invoke(app, ["sweep", "--configs", str(p), "-o", str(out), *extra])
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert not out.exists()


def test_every_row_failing_is_an_error() -> None:
    with pytest.raises(EchoError, match="no configuration could run"):
        run_config_sweep([{**TINY, "tp": 3}], ConfigSweepOptions(), workers=1)


def test_a_sweep_no_row_of_which_runs_is_one_error_line(tmp_path) -> None:
    """Rows that fail before any row ran are held back: if none runs, the command says one
    line (the first row's error) and exits 2; once a row runs, the held rows are said first."""
    bad = "layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n2,64,4,32,1,4,0,1,2\n2,64,4,32,1,8,2,1,3\n"
    r = runner.invoke(app, ["sweep", "--configs", str(_csv(tmp_path, bad)), "--workers", "1", "--no-plot",
                            "-o", str(tmp_path / "out")])
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == ["error: no configuration could run; first: tp must be >= 1, got 0"], r.stderr
    good = bad + "2,64,4,32,1,4,1,1,1\n"
    r = runner.invoke(app, ["sweep", "--configs", str(_csv(tmp_path, good)), "--workers", "1", "--no-plot",
                            "-o", str(tmp_path / "out2")])
    assert r.exit_code == 1, r.output
    lines = [line for line in r.stderr.splitlines() if line.startswith("[")]
    assert [line[:5] for line in lines] == ["[1/3]", "[2/3]", "[3/3]"] and "tp must be >= 1" in lines[0]


def test_trace_cli_global_batch_and_cluster(tmp_path) -> None:
    out = tmp_path / "job"
    r = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "2", "--hidden", "64", "--heads", "4",
                            "--seq", "32", "--micro-batch", "1", "--global-batch", "6", "--dp", "3",
                            "--device", "meta", "--verify", "stage", "--warmup", "0", "--recompute",
                            "--gpu", "h100", "--gpus-per-node", "4", "--inter-bw", "400Gb/s/node",
                            "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    from echo_et.ir import load_job

    job = load_job(out)
    assert job.manifest.layout.microbatches == 2
    h = job.manifest.hardware
    assert h.gpu_name == "h100" and h.gpus_per_node == 4 and h.inter_node_bw_gbps == pytest.approx(12.5)
    assert json.loads(job.manifest.attrs["trace.workload"])["recompute"] is True
    bad = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "2", "--hidden", "64", "--heads",
                              "4", "--micro-batch", "2", "--global-batch", "6", "--dp", "2", "--device", "meta",
                              "-o", str(tmp_path / "bad")])
    assert bad.exit_code == 2
    assert "global batch (6) is not a multiple of micro-batch x dp (2 x 2 = 4)" in bad.stderr
    assert not (tmp_path / "bad").exists()


def test_scatter_gather_flag_reaches_the_trace_and_the_row_options(tmp_path) -> None:
    """``--no-scatter-gather-tensors-in-pipeline`` (Megatron's flag) switches the workload's
    1/tp pipeline sends off: recorded in the Job (workload and command), in a row's options,
    and refused where no configuration is traced."""
    from echo_et.ir import load_job
    from echo_et.ir.schema import pb

    base = ["trace", "--workload", "megatron-gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq",
            "16", "--micro-batch", "1", "--microbatches", "2", "--tp", "2", "--pp", "2", "--device", "meta",
            "--verify", "stage", "--warmup", "0"]
    sent = {}
    for flag in ([], ["--no-scatter-gather-tensors-in-pipeline"]):
        out = tmp_path / f"job{len(flag)}"
        r = runner.invoke(app, [*base, *flag, "-o", str(out)])
        assert r.exit_code == 0, r.output
        job = load_job(out)
        on = not flag
        assert json.loads(job.manifest.attrs["trace.workload"])["scatter_gather_tensors_in_pipeline"] is on
        assert ("--no-scatter-gather-tensors-in-pipeline" in job.manifest.provenance.command) is not on
        sent[on] = {n.p2p.bytes for n in job.graph_of(0).nodes if n.kind == pb.KIND_SEND}
    assert sent == {True: {16 * 64}, False: {16 * 64 * 2}}      # fp16 [16, 1, 64], halved at tp 2
    cfg, _ = workload_for(TINY, ConfigSweepOptions(scatter_gather_tensors_in_pipeline=False))
    assert not cfg.scatter_gather_tensors_in_pipeline
    assert workload_for(TINY, ConfigSweepOptions())[0].scatter_gather_tensors_in_pipeline
    r = runner.invoke(app, ["sweep", str(tmp_path / "job0"), "--dp", "2", "-o", str(tmp_path / "sw"),
                            "--no-scatter-gather-tensors-in-pipeline"])
    assert r.exit_code == 2 and "only applies with --configs" in r.stderr


def test_grad_sync_flag_reaches_every_row(tmp_path) -> None:
    """``sweep --configs --grad-sync overlap``: every row's workload reduces its gradients in
    buckets during the backward, the options in results.json say so, and a bad mode is one
    line with nothing written."""
    # 50M parameters, four buckets of 25 MB (at hidden 512 the per-call host time of the
    # buckets outweighs what overlapping hides)
    p = _csv(tmp_path, HEADER + ",vocab\n4,1024,8,512,2,32,1,1,8,1024\n")
    got = {}
    for mode in ("after-backward", "overlap"):
        out = tmp_path / mode
        r = runner.invoke(app, ["sweep", "--configs", str(p), "-o", str(out), "--grad-sync", mode, "--json"])
        assert r.exit_code == 0, r.output
        got[mode] = json.loads((out / "results.json").read_text())
        assert got[mode]["options"]["grad_sync"] == mode
    rows = {m: g["rows"][0] for m, g in got.items()}
    assert rows["overlap"]["exposed_comm_ms"] < rows["after-backward"]["exposed_comm_ms"]
    cfg, _ = workload_for(TINY, ConfigSweepOptions(grad_sync="overlap"))
    assert cfg.grad_sync == "overlap"
    r = runner.invoke(app, ["sweep", "--configs", str(p), "-o", str(tmp_path / "bad"), "--grad-sync", "never"])
    assert r.exit_code == 2 and "--grad-sync: 'never' is not one of" in r.stderr
    assert not (tmp_path / "bad").exists()


def _pid_and_square(x: int) -> tuple[int, int]:
    import os

    return os.getpid(), x * x


def test_map_rows_keeps_order_and_replaces_workers(monkeypatch) -> None:
    """Rows come back in task order, and a worker is a new process after ROWS_PER_WORKER rows
    (a long-lived worker's heap only grows)."""
    from collections import Counter

    from echo_et.experiments import config_sweep, executors

    monkeypatch.setattr(executors, "ROWS_PER_WORKER", 2)
    seen: list[int] = []
    out = config_sweep.map_rows(_pid_and_square, list(range(9)), 2, lambda i, r: seen.append(i))
    assert [sq for _, sq in out] == [x * x for x in range(9)]
    assert sorted(seen) == list(range(9))
    per_worker = Counter(p for p, _ in out)
    assert max(per_worker.values()) <= 2 and len(per_worker) >= 5
    assert config_sweep.map_rows(_pid_and_square, [3], 1) == [(__import__("os").getpid(), 9)]


def _square_or_die(x: int) -> int:
    import os
    import signal

    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


def test_map_rows_turns_a_dead_worker_into_that_rows_failure() -> None:
    """The calibration loops and benchmarks map rows too: a killed worker costs its row only."""
    from echo_et.experiments import config_sweep

    out = config_sweep.map_rows(_square_or_die, list(range(6)), 2)
    assert out[3] == {"error": "worker died: killed by signal 9 (out of memory?)"}
    assert [out[i] for i in (0, 1, 2, 4, 5)] == [0, 1, 4, 16, 25]
    got = config_sweep.map_rows(_square_or_die, [3, 2], 2, failed=lambda m: m)
    assert got == ["worker died: killed by signal 9 (out of memory?)", 4]


def test_config_sweep_on_a_local_dask_cluster_matches_local() -> None:
    pytest.importorskip("distributed", reason="the dask executor is optional (pip install 'dask[distributed]')")
    rows = [TINY, {**TINY, "tp": 1}]
    local = run_config_sweep(rows, ConfigSweepOptions(), executor="local", workers=1)
    dask = run_config_sweep(rows, ConfigSweepOptions(), executor="dask", workers=1)
    assert dask.executor == "dask"
    assert [r["predicted_ms"] for r in dask.rows] == [r["predicted_ms"] for r in local.rows]


def test_missing_ray_is_an_option_error() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        with pytest.raises(OptionError, match="the ray executor needs ray"):
            run_config_sweep([TINY], ConfigSweepOptions(), executor="ray", workers=1)
    else:
        pytest.skip("ray is installed: the missing-package error cannot be shown")


def test_the_table_names_the_fastest_layout_of_each_model() -> None:
    """Rows of one model at one global batch on one number of GPUs are alternatives: the table
    names the fastest (the first on a tie) and the others predicted within 5 % of it (its
    shortlist); a model with one layout, or failed rows, get none."""
    from echo_et.experiments.config_sweep import ConfigSweepResult

    base = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "micro_batch": 1, "global_batch": 16,
            "compute_ms": 1.0, "exposed_comm_ms": 0.0, "bubble_ms": 0.0, "host_idle_ms": 0.0, "error_pct": None}
    rows = [{**base, "tp": 2, "pp": 2, "dp": 2, "predicted_ms": 30.0, "mfu_pct": 10.0},
            {**base, "tp": 1, "pp": 2, "dp": 4, "predicted_ms": 20.0, "mfu_pct": 15.0},
            {**base, "tp": 1, "pp": 1, "dp": 8, "predicted_ms": 20.0, "mfu_pct": 15.0},
            {**base, "tp": 8, "pp": 1, "dp": 1, "predicted_ms": None, "error": "does not fit"},
            {**base, "hidden": 512, "tp": 1, "pp": 1, "dp": 8, "predicted_ms": 5.0, "mfu_pct": 1.0},
            {**base, "tp": 1, "pp": 1, "dp": 4, "predicted_ms": 1.0, "mfu_pct": 1.0}]
    result = ConfigSweepResult(rows, ConfigSweepOptions(), "local")
    assert result.fastest_lines() == [
        "fastest of 3 layouts for 4 layers, hidden 256, 8 heads, seq 128, global batch 16 on 8 GPUs: row 1 "
        "(tp 1, pp 2, dp 4, micro-batch 1), 20.000 ms, MFU 15.0 %; within 5 % of it: row 2"]
    assert result.table().splitlines()[-2] == result.fastest_lines()[0]
    # measured rows: how the pick fared against the measured fastest
    measured = [{**r, "measured_ms": m} for r, m in zip(rows, (25.0, 30.0, 24.0, 1.0, 5.0, 1.0), strict=True)]
    lines = ConfigSweepResult(measured, ConfigSweepOptions(), "local").fastest_lines()
    assert lines[0].endswith("; measured fastest: row 2, the pick measured +25.0 % slower")
    assert lines[1] == ("layout choice against the measurements: the predicted fastest is the measured fastest for "
                        "0 of 1 models and within 5 % of it for 0; mean regret 25.00 %, max 25.00 %; the measured "
                        "fastest is on the shortlist (predicted within 5 % of the fastest) for 1 of 1, which holds "
                        "66.7 % of the layouts")
    measured[1]["measured_ms"] = 10.0
    lines = ConfigSweepResult(measured, ConfigSweepOptions(), "local").fastest_lines()
    assert lines[0].endswith("MFU 15.0 %; within 5 % of it: row 2; measured fastest too")
    assert "measured fastest for 1 of 1" in lines[1]


def test_the_shortlist_holds_the_layouts_within_the_band_in_predicted_order() -> None:
    """The shortlist starts with the pick and takes every layout predicted within 5 % of it,
    nearest first; a measured fastest outside it counts against it."""
    from echo_et.experiments.config_sweep import SHORTLIST_BAND, choice_summary, layout_choices

    base = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "micro_batch": 1, "global_batch": 16}
    times = ((100.0, 130.0), (104.0, 101.0), (105.0, 120.0), (105.1, 90.0), (102.0, 125.0))
    rows = [{**base, "tp": 1, "pp": 1, "dp": 8, "micro_batch": i + 1, "predicted_ms": p, "measured_ms": m}
            for i, (p, m) in enumerate(times)]
    assert SHORTLIST_BAND == 0.05
    (choice,) = layout_choices(rows)
    assert choice.pick == 0 and choice.shortlist == (0, 4, 1, 2)      # 105.1 is past 105.0
    assert choice.measured_best == 3
    summary = choice_summary([choice])
    assert summary["best_in_shortlist"] == 0 and summary["shortlist_share_pct"] == 80.0
    rows[3]["predicted_ms"] = 105.0
    assert layout_choices(rows)[0].shortlist == (0, 4, 1, 2, 3)
    assert choice_summary(layout_choices(rows))["best_in_shortlist"] == 1
