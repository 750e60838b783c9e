"""The llama architecture of megatron-gpt (``--arch llama``: RMSNorm, SwiGLU, no linear biases,
rotary positions, an untied output layer; ``--kv-heads`` grouped-query attention, ``--ffn-hidden``,
``--flash-attn``): the layer computes what a Llama layer computes, the model holds Llama's
parameters, the memory bound and the FLOPs count what it runs, the kernels price at what AICB
measured for Megatron's Llama layers on A100, and the command line takes and refuses it."""

from __future__ import annotations

import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="the workload's layer needs torch (pip install -e '.[dev]')")

import torch.nn.functional as F  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from conftest import saved_activation_bytes  # noqa: E402
from echo_et.cli.main import app  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.models.footprint import layer_activation_bytes, stage_parameters  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

runner = CliRunner()
SMALL = {"layers": 2, "hidden": 64, "heads": 8, "kv_heads": 2, "ffn_hidden": 96, "seq": 32, "micro_batch": 2,
         "vocab": 96, "arch": "llama"}


def _llama(**kw) -> GPTConfig:
    return GPTConfig.megatron(**{**SMALL, **kw})


# -- what the model holds and counts -----------------------------------------------------------
@pytest.mark.parametrize("shape, params", [
    # Llama-2 7B and 70B (Touvron et al. 2023; the Hugging Face checkpoints' parameter counts)
    ({"layers": 32, "hidden": 4096, "heads": 32, "ffn_hidden": 11008}, 6_738_415_616),
    ({"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "ffn_hidden": 28672}, 68_976_648_192),
])
def test_the_parameter_count_is_llamas(shape: dict, params: int) -> None:
    cfg = GPTConfig.megatron(arch="llama", vocab=32000, seq=4096, **shape)
    assert not cfg.tie_embeddings and cfg.dropout == 0.0       # Megatron-LM's Llama recipes
    assert cfg.parameters() == params
    kv = cfg.hidden // cfg.heads * cfg.query_groups
    stages = [stage_parameters(layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn_size, vocab=cfg.padded_vocab(1),
                               seq=cfg.seq, tp=1, pp=4, stage=s, kv=kv, llama=True) for s in range(4)]
    assert sum(stages) == params


@pytest.mark.parametrize("stage", [0, 1])
def test_each_stages_gradient_all_reduce_is_the_bounds_parameters(stage: int) -> None:
    """What one TP rank of each pipeline stage reduces over the data-parallel ranks (one
    all-reduce of every gradient, 2 bytes each in float16) is what the memory bound counts
    for it: no bias, no learned positions, no embedding shared between the ends."""
    from echo_et.trace.compare import ex_situ_comms

    cfg = _llama()
    layout = ParallelLayout(tp=2, pp=2, dp=2, microbatches=2)
    job = trace(build_gpt(cfg), layout, TraceOptions(device="meta", warmup_steps=0)).job
    rank = layout.rank_of(tp=0, dp=0, pp=stage)
    # the last stage also averages each micro-batch's 4-byte loss over the data-parallel group
    calls = [(kind, group, nbytes) for kind, nbytes, group in ex_situ_comms(job, rank)
             if group in ("dp", "embd") and nbytes > 4]
    want = stage_parameters(layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn_size, vocab=cfg.padded_vocab(2),
                            seq=cfg.seq, tp=2, pp=2, stage=stage, kv=cfg.hidden // cfg.heads * 2, llama=True)
    assert calls == [("all_reduce", "dp", 2 * want)]


def test_the_flops_are_six_per_weight_and_token_plus_attention() -> None:
    cfg = GPTConfig.megatron(arch="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                             seq=8192, vocab=128256)
    h, s, f, kv, v = cfg.hidden, cfg.seq, cfg.ffn_size, 1024, cfg.padded_vocab(1)
    weights = 2 * h * h + 2 * h * kv + 3 * h * f
    tokens = 16 * s
    model, hardware = cfg.step_flops(16)
    assert model == tokens * (6 * cfg.layers * weights + 12 * cfg.layers * s * h + 6 * h * v)
    assert hardware == model
    # the plain GPT count is unchanged by the general formula (Narayanan et al.'s eq. 3)
    gpt = GPTConfig.megatron(layers=24, hidden=2048, heads=16, seq=1024)
    assert gpt.step_flops(8)[0] == pytest.approx(72 * 8 * 1024 * 24 * 2048 ** 2 * (
        1 + 1024 / (6 * 2048) + gpt.padded_vocab(1) / (12 * 24 * 2048)), rel=1e-12)


# -- what the layer computes -----------------------------------------------------------------
def _reference_layer(block, x: torch.Tensor) -> torch.Tensor:
    """A Llama layer written from its definition, with the block's weights: RMSNorm, grouped
    QKV, rotary embedding (rotate-half), causal grouped-query attention, SwiGLU MLP."""
    s, b, h = x.shape
    np_, ng, hn = block.np, block.ng, block.hn

    def rms(t, w):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rope(t):                                       # t: [s, b, heads, hn]
        inv = 1.0 / (10000.0 ** (torch.arange(0, hn, 2, dtype=t.dtype) / hn))
        ang = torch.outer(torch.arange(s, dtype=t.dtype), inv)
        ang = torch.cat((ang, ang), -1)[:, None, None, :]
        t1, t2 = t.chunk(2, -1)
        return t * ang.cos() + torch.cat((-t2, t1), -1) * ang.sin()

    mixed = rms(x, block.ln1.weight) @ block.qkv.weight.t()
    groups = mixed.view(s, b, ng, (np_ // ng + 2) * hn)
    q = groups[..., : np_ // ng * hn].reshape(s, b, np_, hn)
    k, v = groups[..., np_ // ng * hn: -hn], groups[..., -hn:]
    q, k = rope(q), rope(k)
    rep = np_ // ng
    k, v = k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)
    att = F.scaled_dot_product_attention(*(t.permute(1, 2, 0, 3) for t in (q, k, v)), is_causal=True)
    x = x + att.permute(2, 0, 1, 3).reshape(s, b, h) @ block.proj.weight.t()
    up = rms(x, block.ln2.weight) @ block.fc1.weight.t()
    a, g = up.chunk(2, -1)
    return x + (F.silu(a) * g) @ block.fc2.weight.t()


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("kv_heads", [2, 8])
def test_the_layer_is_a_llama_layer(world_of_one, flash: bool, kv_heads: int) -> None:
    """Forward and backward of the megatron-gpt llama layer (unfused core attention or flash,
    grouped or one key/value head per query head) against the layer written out."""
    from echo_et.workloads.megatron import megatron_block_class

    cfg = _llama(kv_heads=kv_heads, flash_attention=flash, dtype="float32")
    block = megatron_block_class()(cfg, 1, world_of_one, gen=torch.Generator().manual_seed(3), device="cpu",
                                   dtype=torch.float64)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    x = torch.randn(cfg.seq, cfg.micro_batch, cfg.hidden, dtype=torch.float64, requires_grad=True)
    got = block(x)
    want = _reference_layer(block, x)
    assert torch.allclose(got, want, atol=1e-4)   # the rotary frequencies are fp32
    g = torch.randn_like(got)
    (gx,) = torch.autograd.grad(got, x, g)
    (wx,) = torch.autograd.grad(want, x, g)
    assert torch.allclose(gx, wx, atol=1e-4)


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_flash_attention_computes_what_megatrons_core_attention_does(world_of_one, arch: str) -> None:
    """``--flash-attn`` swaps the core attention for one kernel, for either layer: the same
    weights give the same output and input gradient as Megatron's batched GEMMs and softmax."""
    from echo_et.workloads.megatron import megatron_block_class

    kw = {"arch": arch, "dtype": "float32", "dropout": 0.0}
    if arch == "gpt":
        kw.update(kv_heads=0, ffn_hidden=0)
    blocks = [megatron_block_class()(_llama(**kw, flash_attention=flash), 1, world_of_one,
                                     gen=torch.Generator().manual_seed(3), device="cpu", dtype=torch.float64)
              for flash in (False, True)]
    blocks[1].load_state_dict(blocks[0].state_dict())
    x = torch.randn(SMALL["seq"], SMALL["micro_batch"], SMALL["hidden"], dtype=torch.float64, requires_grad=True)
    outs = [b(x) for b in blocks]
    assert torch.allclose(outs[0], outs[1], atol=1e-9)
    g = torch.randn_like(outs[0])
    grads = [torch.autograd.grad(o, x, g)[0] for o in outs]
    assert torch.allclose(grads[0], grads[1], atol=1e-9)


@pytest.mark.parametrize("op", ["rms_norm", "swiglu", "rotary_pos_emb"])
def test_the_fused_kernels_gradients(op: str) -> None:
    from echo_et.workloads import fused

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(4, 2, 3, 8, dtype=torch.float64, generator=gen, requires_grad=True)
    if op == "rms_norm":
        w = torch.randn(8, dtype=torch.float64, generator=gen, requires_grad=True)
        assert torch.autograd.gradcheck(lambda x, w: fused.rms_norm(x, w, 1e-5), (x, w))
    elif op == "swiglu":
        assert torch.autograd.gradcheck(fused.swiglu, (x,))
    else:
        freqs = fused.rotary_freqs(4, 8, "cpu").double()
        assert torch.autograd.gradcheck(lambda t: fused.rotary_pos_emb(t, freqs), (x,))


def test_the_layer_saves_at_least_what_the_bound_counts(world_of_one) -> None:
    """The footprint's activations of a llama layer (flash attention, grouped keys, SwiGLU)
    are a lower bound of what the layer keeps for its backward, and a close one."""
    from echo_et.workloads.megatron import megatron_block_class

    cfg = _llama(flash_attention=True, dtype="float16", hidden=128, heads=8, kv_heads=2, ffn_hidden=352, seq=64)
    block = megatron_block_class()(cfg, 1, world_of_one, gen=None, device="cpu", dtype=torch.float16)
    x = torch.randn(cfg.seq, cfg.micro_batch, cfg.hidden, dtype=torch.float16, requires_grad=True)
    saved = saved_activation_bytes(block, x, exclude=list(block.parameters()) + [block.llama.freqs])
    kept, transient = layer_activation_bytes(seq=cfg.seq, micro_batch=cfg.micro_batch, hidden=cfg.hidden,
                                             heads=cfg.heads, tp=1, elem_bytes=2, recompute="none", dropout=False,
                                             ffn=cfg.ffn_size, kv=cfg.hidden // cfg.heads * 2, gated=True, flash=True)
    assert transient == 0
    assert kept <= saved <= 1.25 * kept


# -- what it traces, and what its kernels cost ---------------------------------------------------
def _layer_ops(cfg: GPTConfig, tp: int, device: str = "meta") -> list:
    job = trace(build_gpt(cfg), ParallelLayout(tp=tp), TraceOptions(device=device, warmup_steps=0,
                                                                     verify="stage")).job
    return kernel_ops(job.graph_of(0))


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_the_trace_runs_megatrons_llama_kernels(device: str) -> None:
    """On the meta device and in a real CPU run alike (its attention kernel is the CPU's)."""
    cfg = _llama(flash_attention=True, dtype="bfloat16")
    ops = Counter(name for name, _, _, (ph, *_) in _layer_ops(cfg, 2, device))
    layers = SMALL["layers"]
    assert ops["echo::rms_norm"] == 2 * layers + 1 and ops["echo::rms_norm_backward"] == 2 * layers + 1
    assert ops["echo::swiglu"] == layers and ops["echo::swiglu_backward"] == layers
    assert ops["echo::rotary_pos_emb"] == 2 * layers and ops["echo::rotary_pos_emb_backward"] == 2 * layers
    attention = "aten::_scaled_dot_product_flash_attention" + ("" if device == "meta" else "_for_cpu")
    assert ops[attention] == layers
    assert not any(n in ops for n in ("aten::native_layer_norm", "echo::bias_gelu", "aten::bmm",
                                      "echo::bias_dropout_add", "aten::addmm"))


def test_a_predicted_llama_prices_every_kernel() -> None:
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import retime_job, trace_row

    opts = ConfigSweepOptions(arch="llama", kv_heads=2, ffn_hidden=96, flash_attention=True, dtype="bfloat16")
    job = trace_row({"layers": 2, "hidden": 64, "heads": 8, "seq": 32, "micro_batch": 1, "global_batch": 4,
                     "tp": 2, "pp": 2, "dp": 1, "vocab": 96}, opts)
    _, report = retime_job(job, opts)
    assert not report.guessed_ops, report.guessed_ops


def test_aicbs_llama_layer_prices_as_measured(shared_data) -> None:
    """AICB measured Megatron's Llama-65B layer at TP8 on A100 (bf16, flash attention). The
    traced llama layer of that shape, priced by the shipped a100 preset, is within 3 % of the
    measured forward and 12 % of the backward, and within 5 % of the layer AICB's op list
    describes (`models.compute.layers`) priced by the same model once the traced backward's
    separate fp32 gradient accumulation is left out (Megatron-DeepSpeed's ``main_grad.add_``,
    which Megatron-LM's gradient-accumulation fusion folds into the weight-gradient GEMM). The
    preset's sustained ceiling was fitted on these files with the others, so the first check
    is in-sample for that one parameter. AICB's Llama-7B file is not used: its layer is faster
    than the A100's data-sheet peak allows, and calibration excludes it too."""
    from echo_et.models.compute.data import aicb_files, layer_samples, read_aicb_layers
    from echo_et.models.compute.layers import layer_backward, layer_forward
    from echo_et.models.compute.model import ComputeModel
    from echo_et.models.compute.profile import default_profile

    profile = default_profile("a100")
    model = ComputeModel(profile)
    files = {f.name.split("_")[0]: f for f in aicb_files(shared_data / "workloads" / "aicb") if "Llama" in f.name}
    assert sorted(files) == ["L65B-M1-C05", "L7B-M1-C04"]
    _, excluded = layer_samples(read_aicb_layers(files["L7B-M1-C04"]), profile.gpu.peak_flops("bf16"))
    assert len(excluded) == 2
    lt = read_aicb_layers(files["L65B-M1-C05"])
    sh = lt.shape
    cfg = GPTConfig.megatron(arch="llama", layers=1, hidden=sh.hidden, heads=sh.heads, ffn_hidden=sh.ffn,
                             seq=sh.seq, micro_batch=sh.micro_batch, vocab=32000, dtype="bfloat16",
                             flash_attention=True)
    traced = {"forward": 0, "backward": 0}
    accumulate = 0
    for name, shapes, dtypes, (phase, layer, *_) in _layer_ops(cfg, sh.tp):
        if layer == 0 and phase in traced:
            ns = model.op_time_ns(name, shapes, dtypes)
            traced[phase] += ns
            accumulate += ns if name == "aten::add_" else 0
    assert accumulate > 0
    described = {d: sum(model.op_time_ns(c.op, c.shapes, c.dtypes, c.attrs) for c in calls[0] + calls[1])
                 for d, calls in (("forward", layer_forward(sh)), ("backward", layer_backward(sh)))}
    assert abs(traced["forward"] / lt.forward_ns - 1) < 0.03
    assert abs(traced["backward"] / lt.backward_ns - 1) < 0.12
    assert abs(traced["forward"] / described["forward"] - 1) < 0.05
    assert abs((traced["backward"] - accumulate) / described["backward"] - 1) < 0.05
    # with Megatron-LM's gradient-accumulation fusion (what AICB's Megatron runs) the backward
    # is within 6 % of the measurement
    fused = sum(model.op_time_ns(name, shapes, dtypes)
                for name, shapes, dtypes, (phase, layer, *_) in _layer_ops(
                    cfg.replace(gradient_accumulation_fusion=True), sh.tp)
                if layer == 0 and phase == "backward")
    assert abs(fused / lt.backward_ns - 1) < 0.06, fused


# -- gradient-accumulation fusion ---------------------------------------------------------------
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_fused_accumulation_holds_what_the_separate_add_holds(world_of_one, sequence_parallel: bool) -> None:
    """With ``--gradient-accumulation-fusion`` every projection's weight gradient goes straight
    into its fp32 ``main_grad`` (no 16-bit gradient, no add): over three micro-batches every
    parameter's fp32 gradient is what the separate accumulation gives, up to the bfloat16
    rounding of each micro-batch's gradient that the fusion skips."""
    from echo_et.workloads.data_parallel import GradientSync, grad_of
    from echo_et.workloads.megatron import megatron_block_class

    blocks = []
    for fusion in (False, True):
        cfg = GPTConfig.megatron(layers=1, hidden=32, heads=4, seq=8, micro_batch=2, vocab=64, dtype="bfloat16",
                                 gradient_accumulation_fusion=fusion, sequence_parallel=sequence_parallel,
                                 dropout=0.0)
        block = megatron_block_class()(cfg, 1, world_of_one, gen=torch.Generator().manual_seed(2), device="cpu",
                                       dtype=torch.bfloat16)
        if blocks:
            block.load_state_dict(blocks[0].state_dict())
        GradientSync(list(block.parameters()), world_of_one, zero=0, bucket_bytes=1 << 20,
                     optimizer_factory=lambda ps: None, overlap=False, grad_dtype=torch.float32)
        blocks.append(block)
    gen = torch.Generator().manual_seed(9)
    for _ in range(3):
        x = torch.randn(8, 2, 32, generator=gen).to(torch.bfloat16)
        for block in blocks:
            block(x).float().square().sum().backward()
    for (name, plain), fused in zip(blocks[0].named_parameters(), blocks[1].parameters(), strict=True):
        assert plain.grad is None and fused.grad is None
        want, got = grad_of(plain), grad_of(fused)
        assert want.abs().sum() > 0
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * float(want.abs().max()), msg=name)
    assert not any(getattr(p, "grad_added_to_main_grad", False) for p in blocks[1].parameters())


def test_fused_accumulation_traces_no_add_and_prices_as_a_gemm() -> None:
    """Traced, the fusion replaces each weight's accumulation kernel by the GEMM's own
    accumulator (one ``echo::wgrad_gemm_accum_fp32`` per projection and micro-batch), and the
    compute model prices that GEMM as the plain one plus its fp32 accumulator's traffic."""
    from echo_et.models.compute.model import ComputeModel
    from echo_et.models.compute.profile import default_profile

    cfg = _llama(dtype="bfloat16", flash_attention=True)
    plain = Counter(n for n, _, _, (ph, *_) in _layer_ops(cfg, 2) if ph == "backward")
    fused = [(n, sh, dt) for n, sh, dt, (ph, *_) in _layer_ops(cfg.replace(gradient_accumulation_fusion=True), 2)
             if ph == "backward"]
    names = Counter(n for n, _, _ in fused)
    assert names["echo::wgrad_gemm_accum_fp32"] == 4 * cfg.layers + 1          # + the output layer
    assert names["aten::add_"] == plain["aten::add_"] - (4 * cfg.layers + 1)  # the norms' are still added
    assert names["aten::mm"] == plain["aten::mm"] - (4 * cfg.layers + 1)
    model = ComputeModel(default_profile("a100"))
    name, shapes, dtypes = next(f for f in fused if f[0] == "echo::wgrad_gemm_accum_fp32")
    x, g, c = json.loads(shapes)
    mm = model.op_time_ns("aten::mm", json.dumps([[g[1], g[0]], x]), json.dumps(["c10::BFloat16"] * 2))
    assert model.op_time_ns(name, shapes, dtypes) >= mm > 0
    # re-staging weighs a backward's pieces by what they accumulate: the fused GEMM writes main_grad
    from echo_et.ir.schema import pb
    from echo_et.passes.gradients import accumulated_bytes

    node = pb.Node(name=name)
    node.cpu.op, node.cpu.shapes, node.cpu.dtypes = name, shapes, dtypes
    assert accumulated_bytes(node) == c[0] * c[1] * 4


@pytest.mark.parametrize("kw, message", [
    ({"dtype": "float16"}, "needs a 16-bit model whose gradients are accumulated in fp32"),
    ({"dtype": "float32"}, "needs a 16-bit model"),
    ({"pipeline_engine": "deepspeed", "grad_sync": "after-backward"}, "gradient-accumulation fusion is Megatron-LM's"),
])
def test_fused_accumulation_needs_fp32_main_grads(kw: dict, message: str) -> None:
    with pytest.raises(EchoError, match=message):
        _llama(gradient_accumulation_fusion=True, **{"dtype": "bfloat16", **kw}).validate(ParallelLayout(pp=2))
    _llama(gradient_accumulation_fusion=True, dtype="float16",
           accumulate_allreduce_grads_in_fp32=True).validate(ParallelLayout())


# -- the rules, and the command line -------------------------------------------------------------
@pytest.mark.parametrize("kw, layout, message", [
    ({"kv_heads": 3}, ParallelLayout(), "key/value heads \\(3\\) must divide heads \\(8\\)"),
    ({"kv_heads": 2}, ParallelLayout(tp=4), "tp \\(4\\) must divide the key/value heads \\(2\\)"),
    ({"ffn_hidden": 90}, ParallelLayout(tp=4), "tp \\(4\\) must divide the MLP width \\(90\\)"),
    ({"arch": "mamba"}, ParallelLayout(), "architecture 'mamba' is not one of gpt, llama"),
    ({"kv_heads": -1}, ParallelLayout(), "kv_heads must be >= 0"),
])
def test_a_layout_the_model_cannot_run_is_refused(kw: dict, layout: ParallelLayout, message: str) -> None:
    with pytest.raises(EchoError, match=message):
        _llama(**kw).validate(layout)


@pytest.mark.parametrize("kw", [{"arch": "llama"}, {"kv_heads": 2}, {"flash_attention": True}])
def test_the_plain_gpt_flavour_refuses_megatrons_options(kw: dict) -> None:
    with pytest.raises(EchoError, match="is Megatron's \\(megatron-gpt\\)"):
        GPTConfig(layers=2, hidden=64, heads=8, **kw).validate(ParallelLayout())


def test_records_of_gpt_runs_are_unchanged() -> None:
    """A GPT configuration's record leaves the new options out; a Llama's keeps them."""
    assert not {"arch", "ffn_hidden", "kv_heads", "flash_attention"} & set(GPTConfig.megatron().to_json())
    assert {"arch": "llama", "ffn_hidden": 96, "kv_heads": 2}.items() <= _llama().to_json().items()


PREDICT = ["predict", "--arch", "llama", "--layers", "2", "--hidden", "64", "--heads", "8", "--kv-heads", "2",
           "--ffn-hidden", "96", "--seq", "32", "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2",
           "--flash-attn", "--dtype", "bfloat16", "--vocab", "96"]


def test_predict_runs_a_llama(tmp_path) -> None:
    res = runner.invoke(app, [*PREDICT, "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("Llama 2 layers, hidden 64, 8 heads, MLP 96, key/value heads 2, seq 32, "
                                 "flash attention")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["step_time_ns"] > 0
    # Megatron's own flag names are taken too
    alias = [{"--kv-heads": "--num-query-groups", "--ffn-hidden": "--ffn-hidden-size",
              "--flash-attn": "--use-flash-attn"}.get(a, a) for a in PREDICT]
    res2 = runner.invoke(app, [*alias, "-o", str(tmp_path / "out2")])
    assert res2.exit_code == 0, res2.output
    assert json.loads((tmp_path / "out2" / "summary.json").read_text())["step_time_ns"] == summary["step_time_ns"]


@pytest.mark.parametrize("change, message", [
    (["--kv-heads", "3"], "key/value heads (3) must divide heads (8)"),
    (["--arch", "rwkv"], "--arch: 'rwkv' is not one of gpt, llama"),
    (["--ffn-hidden", "-4"], "--ffn-hidden: -4: give a positive number"),
])
def test_predict_refuses_a_model_it_cannot_run_in_one_line(tmp_path, change: list, message: str) -> None:
    res = runner.invoke(app, [*PREDICT, *change, "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()


def test_sweep_takes_the_mlp_and_kv_columns(tmp_path) -> None:
    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,ffn_hidden,kv_heads\n"
                   "2,64,8,32,1,4,2,1,2,96,2\n2,64,8,32,1,4,2,1,2,,\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--arch", "llama", "--flash-attn", "--dtype",
                              "bfloat16", "-o", str(tmp_path / "out"), "--workers", "1", "--no-plot", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert [r.get("error") for r in rows] == [None, None]
    # the grouped, narrower-MLP row computes less than multi-head attention with a 4 x hidden MLP
    # (the steps of so small a model are the host's, the same for both)
    assert rows[0]["compute_ms"] < rows[1]["compute_ms"]


def test_trace_takes_the_architecture_and_says_it_in_the_command(tmp_path) -> None:
    from echo_et.ir import load_job

    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--arch", "llama", "--layers", "2", "--hidden",
                              "64", "--heads", "8", "--kv-heads", "2", "--seq", "32", "--vocab", "96", "--tp", "2",
                              "--device", "meta", "-o", str(tmp_path / "job")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "job")
    assert "--arch llama" in job.manifest.provenance.command and "--kv-heads 2" in job.manifest.provenance.command
    res = runner.invoke(app, ["trace", "--script", "x.py:build", "--arch", "llama", "-o", str(tmp_path / "j2")])
    assert res.exit_code == 2 and "--arch applies to the built-in workloads" in res.output
