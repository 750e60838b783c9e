"""Activation recomputation at Megatron's two granularities: selective (the core attention
checkpointed, Megatron's ``--recompute-activations``) and full (each layer checkpointed,
``--recompute-granularity full``). Both must leave the gradients exactly as without
recomputation, and each must recompute what Megatron does, no more."""

from __future__ import annotations

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="tracing and real runs need torch (the trace extra)")

from typer.testing import CliRunner  # noqa: E402

from echo_et.cli.main import app  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 2, "vocab": 96}   # fused softmax
ROW = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 2,
       "tp": 1, "pp": 1, "dp": 1}


def _block_grads(cfg: GPTConfig, group, checkpoint_layer: bool) -> list[torch.Tensor]:
    from echo_et.workloads.megatron import checkpoint, megatron_block_class

    gen = torch.Generator().manual_seed(3)
    block = megatron_block_class()(cfg, 1, group, gen=gen, device="cpu", dtype=torch.float32)
    x = torch.randn(cfg.seq, cfg.micro_batch, cfg.hidden, generator=torch.Generator().manual_seed(5),
                    requires_grad=True)
    y = checkpoint(block, x) if checkpoint_layer else block(x)
    y.square().sum().backward()
    return [x.grad, *(p.grad for p in block.parameters())]


@pytest.mark.parametrize("granularity", ["selective", "full"])
def test_recomputed_gradients_equal_the_plain_ones(world_of_one, granularity: str) -> None:
    """A Megatron layer's gradients (input and every parameter) are bit-identical with
    either granularity of recomputation (dropout off: a recomputed mask would differ)."""
    plain = _block_grads(GPTConfig.megatron(**SMALL, dtype="float32", dropout=0.0), world_of_one, False)
    cfg = GPTConfig.megatron(**SMALL, dtype="float32", dropout=0.0, recompute=True,
                             recompute_granularity=granularity)
    got = _block_grads(cfg, world_of_one, cfg.recomputes_layers)
    assert len(got) == len(plain) == 13
    for a, b in zip(got, plain, strict=True):
        assert a is not None and torch.equal(a, b)


def _op_counts(cfg: GPTConfig, phase: str) -> Counter:
    job = trace(build_gpt(cfg), ParallelLayout(), TraceOptions(device="meta", replay=False,
                                                               warmup_steps=0)).job
    return Counter(name for name, _, _, (ph, *_) in kernel_ops(job.graph_of(0)) if ph == phase)


def test_each_granularity_recomputes_what_megatron_does() -> None:
    """Per layer and micro-batch, the backward phase of a selective run holds the core
    attention's forward once more (its two batched GEMMs, the fused softmax, the attention
    dropout) and none of the layer's linear layers; a full run holds the whole layer's forward
    (the four linear GEMMs, both layer norms) once more."""
    base = GPTConfig.megatron(**SMALL)
    none = _op_counts(base, "backward")
    sel = _op_counts(GPTConfig.megatron(**SMALL, recompute=True, recompute_granularity="selective"), "backward")
    full = _op_counts(GPTConfig.megatron(**SMALL, recompute=True), "backward")
    layer_passes = SMALL["layers"] * 1    # one micro-batch traced
    extra_sel, extra_full = sel - none, full - none
    assert extra_sel["aten::bmm"] == 2 * layer_passes
    assert extra_sel["echo::scaled_upper_triang_masked_softmax"] == layer_passes
    assert extra_sel["aten::native_dropout"] == layer_passes
    assert extra_sel["aten::mm"] == extra_sel["aten::addmm"] == extra_sel["aten::native_layer_norm"] == 0
    assert extra_full["aten::native_layer_norm"] == 2 * layer_passes
    assert extra_full["aten::mm"] + extra_full["aten::addmm"] == 4 * layer_passes
    assert extra_full["aten::bmm"] == 2 * layer_passes
    assert sum(extra_full.values()) > sum(extra_sel.values()) > 0


def test_granularity_is_validated_and_recorded() -> None:
    with pytest.raises(EchoError, match="recompute granularity 'some' is not one of full, selective"):
        GPTConfig.megatron(recompute=True, recompute_granularity="some").validate(ParallelLayout())
    cfg, _ = workload_for(ROW, ConfigSweepOptions(recompute=True))     # Megatron's --checkpoint-activations
    assert cfg.recomputes_layers and not cfg.recomputes_core_attention
    assert cfg.to_json()["recompute_granularity"] == "full"
    cfg, _ = workload_for(ROW, ConfigSweepOptions(recompute=True, recompute_granularity="selective"))
    assert cfg.recomputes_core_attention and not cfg.recomputes_layers
    assert "recompute_granularity" not in GPTConfig.megatron().to_json()
    assert "recompute_granularity" not in ConfigSweepOptions().to_json()
    assert ConfigSweepOptions(recompute=True).to_json()["recompute_granularity"] == "full"


def test_cli_flag_implies_recompute_and_refuses_unknown_levels(tmp_path) -> None:
    runner = CliRunner()
    base = ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16",
            "--global-batch", "2", "--vocab", "96", "--json"]
    bad = runner.invoke(app, [*base, "--recompute-granularity", "partial", "-o", str(tmp_path / "x")])
    assert bad.exit_code != 0
    assert bad.output.strip().splitlines()[-1] == \
        "error: --recompute-granularity: 'partial' is not one of full, selective"
    assert not (tmp_path / "x").exists()
    steps = {}
    for name, extra in (("none", []), ("selective", ["--recompute-granularity", "selective"]),
                        ("full", ["--recompute"])):
        res = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        steps[name] = (tmp_path / name / "summary.json").read_text()
    ms = {k: json.loads(v)["step_time_ns"] for k, v in steps.items()}
    assert ms["none"] < ms["selective"] < ms["full"]
    sweep = runner.invoke(app, ["sweep", "JOB", "--dp", "2", "--recompute-granularity", "full",
                                "-o", str(tmp_path / "s")])
    assert sweep.exit_code != 0 and "--recompute-granularity only applies with --configs" in sweep.output


def test_sweep_configs_passes_the_granularity_to_every_row(tmp_path) -> None:
    """`sweep --configs` predicts each row at the granularity given, and records it."""
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,vocab\n2,64,4,16,1,2,1,1,1,96\n")
    runner = CliRunner()
    ms = {}
    for level in ("full", "selective"):
        res = runner.invoke(app, ["sweep", "--configs", str(csv), "--recompute-granularity", level,
                                  "--workers", "1", "--no-plot", "--json", "-o", str(tmp_path / level)])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        assert out["options"]["recompute"] is True and out["options"]["recompute_granularity"] == level
        ms[level] = out["rows"][0]["predicted_ms"]
    assert ms["selective"] < ms["full"]
