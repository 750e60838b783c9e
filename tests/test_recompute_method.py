"""Megatron's ``--recompute-method`` and ``--recompute-num-layers N`` under full recomputation:
"block" checkpoints the first N layers of each model chunk and keeps every activation of the
others; "uniform" checkpoints the layers in groups of N (the same recomputed forwards, fewer
inputs kept, a group's activations live at once in its backward). Each must recompute what
Megatron does, leave the gradients as they are, and be refused where Megatron refuses it."""

from __future__ import annotations

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="tracing and real runs need torch (the trace extra)")

from typer.testing import CliRunner  # noqa: E402

from echo_et.cli.main import app  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for  # noqa: E402
from echo_et.ir import load_job  # noqa: E402
from echo_et.models.footprint import chunk_activation_bytes, layer_activation_bytes, megatron_min_bytes  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

runner = CliRunner()
SMALL = {"layers": 6, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 2, "vocab": 96}
PREDICT = ["predict", "--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--micro-batch", "2",
           "--global-batch", "32", "--tp", "2", "--pp", "2", "--dp", "2", "--gpu", "a100", "--json"]


def _recomputed_layer_norms(cfg: GPTConfig, layout: ParallelLayout | None = None, rank: int = 0) -> int:
    """Layer norms a traced rank runs in its backward: two per recomputed layer forward."""
    job = trace(build_gpt(cfg), layout or ParallelLayout(), TraceOptions(device="meta", replay=False,
                                                                          warmup_steps=0)).job
    ops = Counter(name for name, _, _, (ph, *_) in kernel_ops(job.graph_of(rank)) if ph == "backward")
    return ops["aten::native_layer_norm"]


def test_block_recomputes_the_first_layers_of_each_chunk() -> None:
    """Six layers on one stage: the block method over 2 layers recomputes 2 layer forwards
    (4 layer norms in the backward), over 6 or more all 6, as full recomputation does; the
    uniform method in groups of 3 recomputes every layer, as in groups of 1. On two stages of
    3 layers, block 1 recomputes each stage's first layer (the second stage's, per micro-batch)."""
    full = _recomputed_layer_norms(GPTConfig.megatron(**SMALL, recompute=True))
    assert full == 2 * 6
    assert _recomputed_layer_norms(GPTConfig.megatron(**SMALL, recompute=True, recompute_method="block",
                                                      recompute_num_layers=2)) == 2 * 2
    for n in (6, 9):
        assert _recomputed_layer_norms(GPTConfig.megatron(**SMALL, recompute=True, recompute_method="block",
                                                          recompute_num_layers=n)) == full
    assert _recomputed_layer_norms(GPTConfig.megatron(**SMALL, recompute=True, recompute_num_layers=3)) == full
    # two stages of 3 layers: the first layer of each stage
    cfg = GPTConfig.megatron(**SMALL, recompute=True, recompute_method="block", recompute_num_layers=1)
    assert _recomputed_layer_norms(cfg, ParallelLayout(pp=2, microbatches=2), rank=1) == 2 * 1 * 2
    assert cfg.recomputed_layers(2) == 2 and cfg.recomputed_layers(1) == 1 and cfg.recomputed_layers(6) == 6


def test_recomputed_layers_count_each_model_chunk() -> None:
    """Interleaved (2 chunks a stage) and uneven stages: block N recomputes min(N, a chunk's
    layers) in every chunk."""
    cfg = GPTConfig.megatron(layers=24, hidden=64, heads=4, recompute=True, recompute_method="block",
                             recompute_num_layers=2, layers_per_virtual_stage=3)
    assert cfg.virtual_chunks(4) == 2 and cfg.recomputed_layers(4) == 4 * 2 * 2
    uneven = GPTConfig.megatron(layers=26, hidden=64, heads=4, recompute=True, recompute_method="block",
                                recompute_num_layers=7, first_stage_layers=5, last_stage_layers=5)
    assert uneven.stage_layer_counts(3) == (5, 16, 5) and uneven.recomputed_layers(3) == 5 + 7 + 5
    assert GPTConfig.megatron(layers=26, recompute=True).recomputed_layers(3) == 26
    assert GPTConfig.megatron(layers=26).recomputed_layers(3) == 0


def test_recomputed_gradients_equal_the_plain_ones(tmp_path) -> None:
    """A real one-process run of six layers, the first two of the stage recomputed (block) or
    groups of four (uniform): every parameter's gradient is the run's without recomputation."""
    from gpt_real_runs import real_grads

    real = {"layers": 6, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64,
            "grad_sync": "after-backward", "megatron": True, "dtype": "float32", "dropout": 0.0}
    ref = real_grads(tmp_path, microbatches=2, **real)
    for method, n in (("block", 2), ("uniform", 4)):
        got = real_grads(tmp_path, microbatches=2, recompute=True, recompute_method=method,
                         recompute_num_layers=n, **real)
        assert got.keys() == ref.keys() and len(ref) > 6 * 8
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-7, msg=k)


def test_a_chunks_activations_by_method() -> None:
    """The memory bound: block N keeps N inputs and the rest's activations, uniform N one input
    per group, with a group's activations the transient; N = 1 uniform is full recomputation."""
    shape = {"seq": 2048, "micro_batch": 1, "hidden": 4096, "heads": 32, "tp": 2, "elem_bytes": 2}
    full, none = (layer_activation_bytes(recompute=r, **shape) for r in ("full", "none"))
    per = {"full": full, "none": none}
    assert chunk_activation_bytes(per, "full", 8) == (8 * full[0], full[1])
    assert chunk_activation_bytes(per, "full", 8, "block", 3) == (3 * full[0] + 5 * none[0], full[1])
    assert chunk_activation_bytes(per, "full", 8, "block", 9) == (8 * full[0], full[1])
    assert chunk_activation_bytes(per, "full", 8, "uniform", 3) == (3 * full[0], 3 * none[0] - full[0])
    assert chunk_activation_bytes(per, "full", 8, "uniform", 1) == chunk_activation_bytes(per, "full", 8)
    assert chunk_activation_bytes(per, "none", 8, "block", 3) == (8 * none[0], 0)
    bound = {"layers": 32, "ffn": 4 * 4096, "vocab": 51200, "pp": 4, "microbatches": 8, "recompute": "full",
             **{k: v for k, v in shape.items()}}
    every = megatron_min_bytes(**bound)[2]
    half = megatron_min_bytes(**bound, recompute_method="block", recompute_layers=4)[2]
    kept_all = megatron_min_bytes(**{**bound, "recompute": "none"})[2]
    assert every < half < kept_all
    assert megatron_min_bytes(**bound, recompute_method="block", recompute_layers=8)[2] == every
    assert megatron_min_bytes(**bound, recompute_method="uniform", recompute_layers=4)[2] < half


def test_predicted_step_and_memory_lie_between_none_and_full(tmp_path) -> None:
    """24 layers on 2 stages: recomputing the first 4 of each stage's 12 costs a third of full
    recomputation's extra time; uniform groups of 4 cost what full recomputation does; a
    chunk's first 12 or more is full recomputation. The rates count the recomputed forwards."""
    out = {}
    for name, extra in (("none", []), ("full", ["--recompute"]),
                        ("block4", ["--recompute", "--recompute-method", "block", "--recompute-num-layers", "4"]),
                        ("block12", ["--recompute", "--recompute-method", "block", "--recompute-num-layers", "12"]),
                        ("uniform4", ["--recompute", "--recompute-num-layers", "4"])):
        res = runner.invoke(app, [*PREDICT, *extra, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        out[name] = json.loads(res.stdout)
    ns = {k: v["step_time_ns"] for k, v in out.items()}
    assert ns["none"] < ns["block4"] < ns["full"] == ns["block12"] == ns["uniform4"]
    assert ns["block4"] - ns["none"] == pytest.approx((ns["full"] - ns["none"]) / 3, rel=0.02)
    pred = out["block4"]["prediction"]
    assert pred["recompute_method"] == "block" and pred["recompute_num_layers"] == 4
    rates = {k: v["throughput"] for k, v in out.items()}
    extra = {k: rates[k]["hardware_flops"] - rates[k]["model_flops"] for k in ("block4", "full")}
    assert extra["block4"] * 3 == pytest.approx(extra["full"])


def test_refusals_are_one_line(tmp_path) -> None:
    """Without full recomputation, an unknown method, fewer than 1 layer, and the block method
    under DeepSpeed's pipeline engine: each one line, nothing written."""
    for extra, message in (
            (["--recompute-method", "block"], "--recompute-method: it says how full recomputation runs"),
            (["--recompute-granularity", "selective", "--recompute-num-layers", "2"],
             "--recompute-num-layers: it says how full recomputation runs"),
            (["--recompute", "--recompute-method", "stripe"],
             "--recompute-method: 'stripe' is not one of uniform, block"),
            (["--recompute", "--recompute-num-layers", "0"], "--recompute-num-layers: 0: give the layers, at least 1"),
            (["--recompute", "--recompute-method", "block", "--pipeline-engine", "deepspeed"],
             "the block recompute method is Megatron-LM's")):
        res = runner.invoke(app, [*PREDICT, *extra, "-o", str(tmp_path / "x")])
        assert res.exit_code == 2, (extra, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], res.stderr
        assert not (tmp_path / "x").exists()
    with pytest.raises(EchoError, match="are full recomputation's"):
        GPTConfig.megatron(recompute_num_layers=2).validate(ParallelLayout())
    res = runner.invoke(app, ["sweep", "JOB", "--dp", "2", "--recompute-method", "block", "-o", str(tmp_path / "s")])
    assert res.exit_code == 2 and "--recompute-method only applies with --configs" in res.output


def test_a_refused_block_row_names_every_layer_recomputed(tmp_path) -> None:
    """A layout the block method cannot fit but full recomputation can: the refusal says so."""
    res = runner.invoke(app, ["predict", "--layers", "40", "--hidden", "5120", "--heads", "40", "--seq", "2048",
                              "--global-batch", "64", "--micro-batch", "4", "--tp", "4", "--pp", "2", "--dp", "1",
                              "--gpu", "a100", "--recompute", "--recompute-method", "block", "--recompute-num-layers",
                              "14", "-o", str(tmp_path / "x")])
    assert res.exit_code == 2, res.output
    line = res.stderr.strip()
    assert len(line.splitlines()) == 1 and not (tmp_path / "x").exists()
    assert "full recomputation (block method, 14 layers)" in line
    assert "with every layer recomputed (the uniform method, 1 layer) it needs at least" in line


def test_trace_records_and_sweep_rows_take_their_own_layers(tmp_path) -> None:
    """trace records the flags in the Job's command; ``sweep --configs`` reads a row's
    recompute_num_layers column over the sweep's option."""
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "4", "--hidden", "32", "--heads", "4",
                              "--seq", "16", "--vocab", "64", "--device", "meta", "--recompute", "--recompute-method",
                              "block", "--recompute-num-layers", "2", "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    assert "--recompute-method block --recompute-num-layers 2" in load_job(tmp_path / "job").manifest.provenance.command
    row = {"layers": 8, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 2, "tp": 1, "pp": 1,
           "dp": 1}
    opts = ConfigSweepOptions(recompute=True, recompute_method="block", recompute_num_layers=2)
    assert workload_for(row, opts)[0].recompute_num_layers == 2
    assert workload_for({**row, "recompute_num_layers": 5}, opts)[0].recompute_num_layers == 5
    with pytest.raises(EchoError, match="are full recomputation's"):
        workload_for({**row, "recompute_num_layers": 5}, ConfigSweepOptions())
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,vocab,recompute_num_layers\n"
                   "8,64,4,16,1,2,1,1,1,96,2\n8,64,4,16,1,2,1,1,1,96,8\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--recompute", "--recompute-method", "block",
                              "--workers", "1", "--no-plot", "--json", "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["options"]["recompute_method"] == "block"
    assert out["rows"][0]["predicted_ms"] < out["rows"][1]["predicted_ms"]


def test_a_sweep_row_says_whether_it_recomputes(tmp_path) -> None:
    """``sweep --configs``: a row's recompute column (0 or 1) over the sweep's --recompute, at
    the sweep's granularity; any other value is that row's one-line error."""
    row = {"layers": 8, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 2, "tp": 1, "pp": 1,
           "dp": 1}
    assert workload_for({**row, "recompute": 1}, ConfigSweepOptions())[0].recomputes_layers
    assert not workload_for({**row, "recompute": 0}, ConfigSweepOptions(recompute=True))[0].recompute
    sel = ConfigSweepOptions(recompute=True, recompute_granularity="selective")
    assert workload_for({**row, "recompute": 1}, sel)[0].recomputes_core_attention
    with pytest.raises(EchoError, match="recompute must be 0 or 1, got 2"):
        workload_for({**row, "recompute": 2}, ConfigSweepOptions())
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,vocab,recompute\n"
                   "8,64,4,16,1,2,1,1,1,96,0\n8,64,4,16,1,2,1,1,1,96,1\n8,64,4,16,1,2,1,1,1,96,3\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--workers", "1", "--no-plot", "--json",
                              "-o", str(tmp_path / "s")])
    assert res.exit_code == 1, res.output             # a sweep with a failed row exits 1
    rows = json.loads(res.stdout)["rows"]
    assert rows[0]["predicted_ms"] < rows[1]["predicted_ms"]
    assert "recompute must be 0 or 1, got 3" in rows[2]["error"]
