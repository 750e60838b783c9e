"""Megatron-Core's ``--recompute-modules`` under selective recomputation: "core_attn" (the
default), "mlp" (the whole MLP checkpointed) and "layernorm" (the norms' outputs recomputed).
Each must recompute what Megatron-Core does, keep the gradients, keep what the memory bound
says it keeps, and be refused where Megatron-Core refuses it."""

from __future__ import annotations

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="tracing and real runs need torch (the trace extra)")

from typer.testing import CliRunner  # noqa: E402

from conftest import saved_activation_bytes  # noqa: E402
from echo_et.cli.main import app  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for  # noqa: E402
from echo_et.ir import load_job  # noqa: E402
from echo_et.models.footprint import layer_activation_bytes  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

runner = CliRunner()
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 2, "vocab": 96}


def _backward_ops(cfg: GPTConfig) -> Counter:
    job = trace(build_gpt(cfg), ParallelLayout(), TraceOptions(device="meta", replay=False, warmup_steps=0)).job
    return Counter(name for name, _, _, (ph, *_) in kernel_ops(job.graph_of(0)) if ph == "backward")


def _selective(modules: str, **kw) -> GPTConfig:
    return GPTConfig.megatron(**SMALL, recompute=True, recompute_granularity="selective", recompute_modules=modules,
                              **kw)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_each_module_recomputes_what_megatron_core_does(arch: str) -> None:
    """Per layer and micro-batch, the backward holds once more: with "mlp" the MLP's two
    GEMMs and its activation (GeLU, or SwiGLU), not the attention's; with "layernorm" the two
    norms; with "core_attn" the two batched GEMMs of the attention."""
    llama = {"arch": "llama", "kv_heads": 4} if arch == "llama" else {}
    none = _backward_ops(GPTConfig.megatron(**SMALL, **llama))
    layers = SMALL["layers"]
    mlp = _backward_ops(_selective("mlp", **llama)) - none
    gemms = mlp["aten::mm"] + mlp["aten::addmm"]
    assert gemms == 2 * layers and mlp["aten::bmm"] == 0
    act = "echo::swiglu" if llama else "echo::bias_gelu"
    assert mlp[act] == layers, mlp
    norm = "echo::rms_norm" if llama else "aten::native_layer_norm"
    norms = _backward_ops(_selective("layernorm", **llama)) - none
    assert norms[norm] == 2 * layers and norms["aten::mm"] + norms["aten::addmm"] == 0, norms
    both = _backward_ops(_selective("core_attn,mlp", **llama)) - none
    if not llama:
        assert both["aten::bmm"] == 2 * layers
    assert both["aten::mm"] + both["aten::addmm"] == 2 * layers


@pytest.mark.parametrize("modules", ["mlp", "layernorm", "core_attn,mlp,layernorm"])
def test_recomputed_gradients_equal_the_plain_ones(world_of_one, modules: str) -> None:
    """A Megatron layer's gradients (input and every parameter) are bit-identical with the
    modules recomputed (dropout off: a recomputed mask would differ)."""
    from echo_et.workloads.megatron import megatron_block_class

    def grads(cfg: GPTConfig) -> list:
        block = megatron_block_class()(cfg, 1, world_of_one, gen=torch.Generator().manual_seed(3), device="cpu",
                                       dtype=torch.float32)
        x = torch.randn(cfg.seq, cfg.micro_batch, cfg.hidden, generator=torch.Generator().manual_seed(5),
                        requires_grad=True)
        block(x).square().sum().backward()
        return [x.grad, *(p.grad for p in block.parameters())]

    plain = grads(GPTConfig.megatron(**SMALL, dtype="float32", dropout=0.0))
    got = grads(_selective(modules, dtype="float32", dropout=0.0))
    assert len(got) == len(plain) == 13
    for a, b in zip(got, plain, strict=True):
        assert a is not None and torch.equal(a, b)


@pytest.mark.parametrize("modules", ["core_attn,mlp", "mlp"])
def test_the_bound_keeps_what_the_layer_saves(world_of_one, modules: str) -> None:
    """With the MLP checkpointed the layer keeps its input and drops the activation's input
    and output: what the bound counts (within the norms' statistics, as for the granularities)."""
    from echo_et.workloads.megatron import megatron_block_class

    s, b, h, a = 64, 2, 128, 8
    cfg = GPTConfig.megatron(layers=1, hidden=h, heads=a, seq=s, micro_batch=b, vocab=96, dtype="float16",
                             dropout=0.1, recompute=True, recompute_granularity="selective", recompute_modules=modules)
    block = megatron_block_class()(cfg, 1, world_of_one, gen=torch.Generator().manual_seed(1), device="cpu",
                                   dtype=torch.float16)
    x = torch.randn(s, b, h, dtype=torch.float16, requires_grad=True)
    saved = saved_activation_bytes(block, x, exclude=list(block.parameters()))
    kept, transient = layer_activation_bytes(seq=s, micro_batch=b, hidden=h, heads=a, tp=1, elem_bytes=2,
                                             recompute="selective", modules=cfg.selective_modules())
    assert kept <= saved <= kept / 0.995
    none = layer_activation_bytes(seq=s, micro_batch=b, hidden=h, heads=a, tp=1, elem_bytes=2, recompute="none")[0]
    scores = layer_activation_bytes(seq=s, micro_batch=b, hidden=h, heads=a, tp=1, elem_bytes=2,
                                    recompute="selective")[1]
    mlp_act = 2 * 2 * s * b * 4 * h            # the GeLU's input and output, fp16
    attention = scores if "core_attn" in modules else 0
    assert kept == none - mlp_act - attention and transient == max(mlp_act, attention)


def test_the_bound_drops_the_norms_outputs() -> None:
    shape = {"seq": 2048, "micro_batch": 1, "hidden": 4096, "heads": 32, "tp": 4, "elem_bytes": 2}
    core = layer_activation_bytes(recompute="selective", **shape)
    norms = layer_activation_bytes(recompute="selective", modules=("core_attn", "layernorm"), **shape)
    assert core[0] - norms[0] == 2 * 2 * 2048 * 4096
    sp = layer_activation_bytes(recompute="selective", modules=("core_attn", "layernorm"), sequence_parallel=True,
                                **shape)
    assert layer_activation_bytes(recompute="selective", sequence_parallel=True, **shape)[0] - sp[0] == \
        2 * 2 * 2048 * 4096 // 4


def test_predict_prices_each_module_and_refuses_what_megatron_core_refuses(tmp_path) -> None:
    base = ["predict", "--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--micro-batch", "2",
            "--global-batch", "32", "--tp", "2", "--pp", "2", "--dp", "2", "--gpu", "a100", "--json"]
    ns = {}
    for name, extra in (("none", []), ("core", ["--recompute-granularity", "selective"]),
                        ("mlp", ["--recompute-granularity", "selective", "--recompute-modules", "mlp"]),
                        ("both", ["--recompute-granularity", "selective", "--recompute-modules", "mlp,core_attn"]),
                        ("full", ["--recompute"])):
        res = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        out = json.loads(res.stdout)
        ns[name] = out["step_time_ns"]
        if name == "both":
            assert out["prediction"]["recompute_modules"] == "core_attn,mlp"
    assert ns["none"] < ns["core"] < ns["both"] < ns["full"] and ns["none"] < ns["mlp"] < ns["both"]
    assert ns["both"] - ns["none"] == pytest.approx((ns["core"] - ns["none"]) + (ns["mlp"] - ns["none"]), rel=0.02)
    for extra, message in ((["--recompute-modules", "mlp"], "it says what selective recomputation recomputes"),
                           (["--recompute", "--recompute-modules", "mlp"], "it says what selective recomputation"),
                           (["--recompute-granularity", "selective", "--recompute-modules", "moe_act"],
                            "'moe_act' is not one of core_attn, mlp, layernorm (a mixture-of-experts"),
                           (["--recompute-granularity", "selective", "--recompute-modules", ","],
                            "name at least one module")):
        res = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / "x")])
        assert res.exit_code == 2, res.output
        assert len(res.stderr.strip().splitlines()) == 1 and "--recompute-modules: " in res.stderr, res.stderr
        assert message in res.stderr and not (tmp_path / "x").exists()
    with pytest.raises(EchoError, match="are selective recomputation's"):
        GPTConfig.megatron(recompute=True, recompute_modules="mlp").validate(ParallelLayout())
    with pytest.raises(EchoError, match="are Megatron's"):
        GPTConfig(recompute=True, recompute_granularity="selective", recompute_modules="mlp").validate(ParallelLayout())


def test_trace_and_sweep_take_the_modules(tmp_path) -> None:
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "2", "--hidden", "32", "--heads", "4",
                              "--seq", "16", "--vocab", "64", "--device", "meta", "--recompute-granularity",
                              "selective", "--recompute-modules", "layernorm,mlp", "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    assert "--recompute-modules mlp,layernorm" in load_job(tmp_path / "job").manifest.provenance.command
    row = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 2, "tp": 1, "pp": 1,
           "dp": 1}
    opts = ConfigSweepOptions(recompute=True, recompute_granularity="selective", recompute_modules="core_attn,mlp")
    assert workload_for(row, opts)[0].recomputes_mlp
    assert ConfigSweepOptions().to_json().get("recompute_modules") is None


def test_predict_says_what_the_backward_recomputes(tmp_path) -> None:
    """predict's first line names the recomputation it priced."""
    base = ["predict", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq", "32", "--global-batch", "2",
            "--vocab", "96"]
    for extra, said in (([], None), (["--recompute"], "(full recomputation)"),
                        (["--recompute", "--recompute-method", "block", "--recompute-num-layers", "1"],
                         "(full recomputation, block method, 1 layer)"),
                        (["--recompute-granularity", "selective"], "(selective recomputation)"),
                        (["--recompute-granularity", "selective", "--recompute-modules", "layernorm mlp"],
                         "(selective recomputation: mlp, layernorm)")):
        res = runner.invoke(app, [*base, *extra, "-o", str(tmp_path / str(len(extra)))])
        assert res.exit_code == 0, res.output
        first = res.stdout.splitlines()[0]
        assert ("recomputation" not in first) if said is None else (said in first), first
