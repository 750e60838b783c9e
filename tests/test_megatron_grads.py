"""How megatron-gpt reduces and applies its gradients: accumulated and data-parallel reduced
in fp32 (Megatron's ``--accumulate-allreduce-grads-in-fp32``, which it forces on with
bfloat16), and Megatron's distributed optimizer (``--use-distributed-optimizer``, ZeRO stage
1): the bytes each collective moves, the accumulation itself, the optimizer reading it, the
memory bound and the command-line flags."""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")

from typer.testing import CliRunner  # noqa: E402

from echo_et.cli.main import app  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for  # noqa: E402
from echo_et.ir import check_job, load_job  # noqa: E402
from echo_et.trace.compare import ex_situ_comms  # noqa: E402
from echo_et.trace.layout import ParallelLayout  # noqa: E402
from echo_et.trace.tracer import TraceOptions, trace  # noqa: E402
from echo_et.workloads import GPTConfig, Workload  # noqa: E402

runner = CliRunner()
SHAPE = {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "micro_batch": 2, "vocab": 64}


def _dp_bytes(cfg: GPTConfig) -> dict[str, int]:
    """Bytes of rank 0's data-parallel and shared-embedding all-reduces at TP2 x PP2 x DP2."""
    layout = ParallelLayout(tp=2, pp=2, dp=2, microbatches=3)
    Workload(gpt=cfg).validate(layout)
    job = trace(Workload(gpt=cfg).build_fn(), layout, TraceOptions(device="meta", warmup_steps=0)).job
    assert check_job(job) == []
    out = {}
    for kind, nbytes, group in ex_situ_comms(job, 0):
        if group in ("dp", "embd"):
            assert kind == "all_reduce" and group not in out
            out[group] = nbytes
    return out


def test_megatron_reduces_bf16_gradients_in_fp32_and_fp16_ones_in_fp16():
    """The data-parallel all-reduce and the tied embedding's all-reduce move 4 bytes per
    gradient with bfloat16 (Megatron forces fp32 accumulation there) and 2 with float16;
    the flag turns either way explicitly."""
    fp16 = _dp_bytes(GPTConfig.megatron(**SHAPE))
    bf16 = _dp_bytes(GPTConfig.megatron(**SHAPE, dtype="bfloat16"))
    assert set(fp16) == {"dp", "embd"}
    assert bf16 == {k: 2 * v for k, v in fp16.items()}
    assert _dp_bytes(GPTConfig.megatron(**SHAPE, dtype="bfloat16", accumulate_allreduce_grads_in_fp32=False)) == fp16
    assert _dp_bytes(GPTConfig.megatron(**SHAPE, accumulate_allreduce_grads_in_fp32=True)) == bf16
    # the embedding's gradient: its padded vocabulary's share of the TP split, in fp32
    assert bf16["embd"] == 4 * 256 * 32 // 2     # vocab 64 padded to 128 x tp 2, hidden 32, half per TP rank


def test_the_default_follows_megatron_and_only_its_optimizer_takes_the_flag():
    assert GPTConfig.megatron(dtype="bfloat16").grad_buffer_dtype == "float32"
    assert GPTConfig.megatron().grad_buffer_dtype == "float16"
    assert GPTConfig(dtype="bfloat16").grad_buffer_dtype == "bfloat16"      # plain DDP: the model's
    with pytest.raises(EchoError, match="gradients accumulated in fp32 need the megatron optimizer"):
        GPTConfig(accumulate_allreduce_grads_in_fp32=True).validate(ParallelLayout(dp=2))
    cfg, _ = workload_for({"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1,
                           "global_batch": 4, "tp": 1, "pp": 1, "dp": 2}, ConfigSweepOptions(dtype="bfloat16"))
    assert cfg.accumulate_allreduce_grads_in_fp32
    cfg, _ = workload_for({"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1,
                           "global_batch": 4, "tp": 1, "pp": 1, "dp": 2},
                          ConfigSweepOptions(dtype="bfloat16", accumulate_allreduce_grads_in_fp32=False))
    assert not cfg.accumulate_allreduce_grads_in_fp32


def test_fp32_main_grads_hold_the_exact_sum_and_the_optimizer_reads_them(world_of_one):
    """Each micro-batch's bfloat16 gradient is added into the fp32 ``main_grad`` and dropped
    (as Megatron's local DDP does); the sum is the fp32 sum of the 16-bit gradients, which a
    16-bit buffer would round; Megatron's optimizer steps on it, and the buffer is cleared."""
    from echo_et.workloads.data_parallel import GradientSync, grad_of
    from echo_et.workloads.megatron import MixedPrecisionAdam

    gen = torch.Generator().manual_seed(7)
    lin = torch.nn.Linear(16, 8).to(torch.bfloat16)
    opts: list[MixedPrecisionAdam] = []

    def factory(ps):
        opts.append(MixedPrecisionAdam(ps, None))
        return opts[0]

    sync = GradientSync(list(lin.parameters()), world_of_one, zero=0, bucket_bytes=1 << 20,
                        optimizer_factory=factory, overlap=False, grad_dtype=torch.float32)
    expected = {id(p): torch.zeros(p.shape, dtype=torch.float32) for p in lin.parameters()}
    for _ in range(3):
        x = (torch.randn(4, 16, generator=gen) * 100).to(torch.bfloat16)
        # the micro-batch's own 16-bit gradients, computed apart
        grads = torch.autograd.grad(lin(x).float().square().sum(), list(lin.parameters()))
        for p, g in zip(lin.parameters(), grads, strict=True):
            expected[id(p)] += g.float()
        lin(x).float().square().sum().backward()
    for p in lin.parameters():
        assert p.grad is None and p.main_grad.dtype == torch.float32
        assert torch.equal(grad_of(p), expected[id(p)])
    # what a bfloat16 buffer would hold differs: the fp32 sum is not a rounding of it
    assert any(not torch.equal(e.to(torch.bfloat16).float(), e) for e in expected.values())
    before = [m.clone() for m in opts[0].main]
    ref = [m.clone() for m in before]
    exp_avg = [torch.zeros_like(m) for m in ref]
    exp_avg_sq = [torch.zeros_like(m) for m in ref]
    steps = [torch.ones((), dtype=torch.float32) for _ in ref]
    torch._fused_adam_(ref, [expected[id(p)] for p in lin.parameters()], exp_avg, exp_avg_sq, [], steps,
                       amsgrad=False, maximize=False, **opts[0].hp)
    sync.finish_and_step()
    for got, want, old in zip(opts[0].main, ref, before, strict=True):
        assert torch.equal(got, want) and not torch.equal(got, old)
    assert all(not grad_of(p).any() for p in lin.parameters())


@pytest.mark.parametrize("grad_dtype", [None, torch.float32])
def test_the_distributed_optimizer_updates_the_weights_as_the_plain_one_does(world_of_one, grad_dtype):
    """Megatron's optimizer on a ZeRO-1 shard (here the whole buffer: one data-parallel rank)
    leaves the same bfloat16 weights as on the parameters themselves, with gradients
    accumulated in the model's dtype or in fp32."""
    from echo_et.workloads.data_parallel import GradientSync
    from echo_et.workloads.megatron import MixedPrecisionAdam

    weights = []
    for zero in (0, 1):
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
        model = model.to(torch.bfloat16)
        sync = GradientSync(list(model.parameters()), world_of_one, zero=zero, bucket_bytes=1 << 20,
                            optimizer_factory=lambda ps: MixedPrecisionAdam(ps, None), overlap=False,
                            grad_dtype=grad_dtype)
        gen = torch.Generator().manual_seed(11)
        for _ in range(2):
            model(torch.randn(4, 16, generator=gen).to(torch.bfloat16)).float().square().sum().backward()
        before = [p.detach().clone() for p in model.parameters()]
        sync.finish_and_step()
        after = [p.detach().clone() for p in model.parameters()]
        assert all(not torch.equal(a, b) for a, b in zip(after, before, strict=True))
        weights.append(after)
    assert all(torch.equal(a, b) for a, b in zip(*weights, strict=True))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_distributed_optimizer_scatters_the_gradients_and_gathers_the_weights(dtype):
    """ZeRO stage 1 with Megatron's optimizer (--use-distributed-optimizer): the shared
    embedding's gradient all-reduced first (its shard must hold both stages' share), the
    gradient buffer reduce-scattered over the data-parallel ranks (fp32 with bf16), the
    gradient norm summed over the whole world (each rank holds a shard), the 16-bit weights
    all-gathered; no data-parallel all-reduce."""
    from echo_et.ir.schema import pb

    cfg = GPTConfig.megatron(**SHAPE, dtype=dtype)
    layout = ParallelLayout(tp=2, pp=2, dp=2, microbatches=3, zero=1)
    Workload(gpt=cfg).validate(layout)
    job = trace(Workload(gpt=cfg).build_fn(), layout, TraceOptions(device="meta", warmup_steps=0)).job
    assert check_job(job) == [] and job.manifest.layout.zero_stage == 1
    plain = _dp_bytes(cfg)
    nodes = sorted(job.graph_of(0).nodes, key=lambda n: (n.start_ns, n.id))
    colls = [(n.collective.type, n.collective.in_bytes, n.collective.out_bytes, n.collective.group)
             for n in nodes if n.kind == pb.KIND_COLLECTIVE and n.annotations.phase == "optimizer"]
    grads, weights = plain["dp"], plain["dp"] // (2 if cfg.accumulate_allreduce_grads_in_fp32 else 1)
    # in float16 the loss scaler's overflow flag is agreed on over the world too, before the norm
    flags = [(pb.COLL_ALL_REDUCE, 4, 4, "world")] * (2 if dtype == "float16" else 1)
    assert colls == [(pb.COLL_ALL_REDUCE, plain["embd"], plain["embd"], "embd"),
                     (pb.COLL_REDUCE_SCATTER, grads, grads // 2, "dp"),
                     *flags,
                     (pb.COLL_ALL_GATHER, weights // 2, weights, "dp")]


def test_the_memory_bound_counts_fp32_gradients():
    from echo_et.models.footprint import check_fits, megatron_min_bytes, state_bytes_per_param

    assert state_bytes_per_param(2, 1, 4) == 2 + 4 + 12
    assert state_bytes_per_param(2, 4, 4) == 2 + 4 + 3
    shape = {"layers": 48, "hidden": 8192, "ffn": 4 * 8192, "vocab": 51200, "seq": 2048, "micro_batch": 1,
             "tp": 1, "pp": 3, "microbatches": 16, "elem_bytes": 2, "dp": 8, "heads": 64}
    _, fp16, _ = megatron_min_bytes(**shape)
    _, fp32, _ = megatron_min_bytes(**shape, grad_bytes=4)
    assert fp32 / fp16 == pytest.approx((2 + 4 + 1.5) / (2 + 2 + 1.5), rel=1e-6)
    check_fits(80.0, "a100-80gb", **shape)        # 5.5 bytes x 13.3B parameters fits...
    with pytest.raises(EchoError, match=r"weights, fp32 gradients and Adam states"):
        check_fits(80.0, "a100-80gb", **shape, grad_bytes=4)   # ... 7.5 bytes does not


TRACE = ["trace", "--workload", "megatron-gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq",
         "16", "--micro-batch", "1", "--microbatches", "2", "--dp", "2", "--device", "meta", "--verify",
         "stage", "--warmup", "0"]


@pytest.mark.parametrize("dtype, flag, fp32", [
    ("bfloat16", [], True), ("bfloat16", ["--no-accumulate-allreduce-grads-in-fp32"], False),
    ("float16", [], False), ("float16", ["--accumulate-allreduce-grads-in-fp32"], True)])
def test_trace_flag_reaches_the_job_and_its_command(tmp_path, dtype, flag, fp32):
    out = tmp_path / "job"
    r = runner.invoke(app, [*TRACE, "--dtype", dtype, *flag, "-o", str(out)])
    assert r.exit_code == 0, r.output
    job = load_job(out)
    assert json.loads(job.manifest.attrs["trace.workload"])["accumulate_allreduce_grads_in_fp32"] is fp32
    cmd = job.manifest.provenance.command
    assert (flag[0] in cmd.split()) if flag else ("accumulate-allreduce" not in cmd)
    params = 2 * (12 * 64 * 64 + 13 * 64) + 50304 * 64 + 16 * 64 + 2 * 64   # layers, vocab 50257 padded, pos, ln_f
    dp = sorted(c[1] for c in ex_situ_comms(job, 0) if c[2] == "dp")
    assert dp == [4, 4, params * (4 if fp32 else 2)]   # each micro-batch's loss (fp32), the gradients


def test_predict_takes_the_distributed_optimizer(tmp_path):
    out = tmp_path / "pred"
    r = runner.invoke(app, ["predict", "-o", str(out), "--layers", "2", "--hidden", "64", "--heads", "4",
                            "--seq", "16", "--global-batch", "4", "--dp", "2", "--dtype", "bfloat16",
                            "--use-distributed-optimizer", "--json"])
    assert r.exit_code == 0, r.output
    job = load_job(out / "job")
    assert job.manifest.layout.zero_stage == 1
    kinds = {c[0] for c in ex_situ_comms(job, 0) if c[2] == "dp"}
    assert kinds == {"all_reduce", "reduce_scatter", "all_gather"}   # the loss, the gradients, the weights
    cfg, layout = workload_for({"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1,
                                "global_batch": 4, "tp": 1, "pp": 1, "dp": 2},
                               ConfigSweepOptions(use_distributed_optimizer=True))
    assert layout.zero == 1


def test_flag_is_refused_where_nothing_takes_it(tmp_path):
    r = runner.invoke(app, [*TRACE[:2], "gpt", *TRACE[3:], "--accumulate-allreduce-grads-in-fp32",
                            "-o", str(tmp_path / "job")])
    assert r.exit_code == 2 and "need the megatron optimizer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "job").exists()
    r = runner.invoke(app, [*TRACE, "-o", str(tmp_path / "ok")])
    assert r.exit_code == 0, r.output
    for flag in ("--accumulate-allreduce-grads-in-fp32", "--use-distributed-optimizer", "--grad-sync overlap"):
        r = runner.invoke(app, ["sweep", str(tmp_path / "ok"), "--dp", "2", "-o", str(tmp_path / "sw"), *flag.split()])
        assert r.exit_code == 2 and f"{flag.split()[0]} only applies with --configs" in r.stderr


def test_float16_unscales_and_checks_the_gradients_before_the_norm():
    """Megatron's float16 path (its loss scaler; bfloat16 has none): one multi-tensor unscale
    and inf/NaN check over the fp32 main gradients, the flag all-reduced (MAX) over the
    model-parallel group and read on the host, before the gradient norm's all-reduce. The
    check reads and writes every gradient in fp32: 8 bytes each."""
    from echo_et.ir.schema import pb
    from echo_et.models.compute import ops

    layout = ParallelLayout(tp=2, pp=2, dp=2, microbatches=3)
    graphs = {}
    for dtype in ("float16", "bfloat16"):
        cfg = GPTConfig.megatron(**SHAPE, dtype=dtype)
        job = trace(Workload(gpt=cfg).build_fn(), layout, TraceOptions(device="meta", warmup_steps=0)).job
        assert check_job(job) == []
        graphs[dtype] = job.graph(job.graph_ids()[0]).nodes
        mp = [c for c in ex_situ_comms(job, 0) if c[2] == "mp"]
        assert mp == [("all_reduce", 4, "mp")] * (2 if dtype == "float16" else 1)
    names = {k: [n.name for n in v] for k, v in graphs.items()}
    check = "aten::_amp_foreach_non_finite_check_and_unscale_"
    assert names["float16"].count(check) == 1 and check not in names["bfloat16"]
    syncs = {k: sum(1 for n in v if n.kind == pb.KIND_SYNC) for k, v in graphs.items()}
    assert syncs["float16"] == syncs["bfloat16"] + 1
    # its place: after the last backward's gradients, before the norm
    order = names["float16"]
    assert order.index(check) < order.index("aten::_foreach_norm") < order.index("aten::_fused_adam_")
    # DeepSpeed's FP16_Optimizer reads the overflow from the norm and unscales after it, in one
    # pass over the gradients: no flag of its own, no second host read
    cfg = GPTConfig.megatron(**SHAPE, dtype="float16", pipeline_engine="deepspeed")
    job = trace(Workload(gpt=cfg).build_fn(), layout, TraceOptions(device="meta", warmup_steps=0)).job
    assert [c for c in ex_situ_comms(job, 0) if c[2] == "mp"] == [("all_reduce", 4, "mp")]
    ds = [n.name for n in job.graph(job.graph_ids()[0]).nodes]
    assert check not in ds and ds.index("aten::_foreach_norm") < ds.index("aten::_foreach_mul_") < ds.index(
        "aten::_fused_adam_")
    node = next(n for n in graphs["float16"] if n.name == check)
    elems = sum(math.prod(shape) for shape in json.loads(node.compute.shapes)[0])
    cost = ops.op_cost(node.compute.op, node.compute.shapes, node.compute.dtypes)
    assert cost.status == "priced" and sum(k.bytes for k in cost.kernels) == 8 * elems > 0


@pytest.mark.parametrize("overlap", [False, True])
def test_zero1_all_reducing_whole_leaves_the_weights_of_reduce_scatter(tmp_path, overlap):
    """Two gloo data-parallel ranks, each its own data: ZeRO stage 1 with the gradients
    all-reduced whole and each rank keeping its shard (DeepSpeed's "reduce_scatter": false,
    its bfloat16 optimizer) leaves every rank the weights of reduce-scattering them, and of the
    plain optimizer over the whole model, after the backward or overlapped with it."""
    from gpt_real_runs import dp_weights

    plain = dp_weights(tmp_path, zero=0, overlap=overlap)
    scattered = dp_weights(tmp_path, zero=1, overlap=overlap)
    whole = dp_weights(tmp_path, zero=1, reduce_scatter=False, overlap=overlap)
    for got in (scattered, whole):
        for rank in range(2):
            for a, b in zip(got[rank], plain[0], strict=True):
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert all(torch.equal(a, b) for a, b in zip(whole[0], whole[1], strict=True))


def test_zero1_without_reduce_scatter_all_reduces_the_whole_gradient_buffer():
    """DeepSpeed's bfloat16 optimizer as traced: the fp32 gradient buffer all-reduced whole over
    the data-parallel ranks (twice the reduce-scatter's bytes on the wire), the bfloat16 weights
    all-gathered after each rank's step on its shard; refused without ZeRO stage 1."""
    from echo_et.ir.schema import pb

    cfg = GPTConfig.megatron(**SHAPE, dtype="bfloat16", grad_reduce_scatter=False)
    assert cfg.to_json()["grad_reduce_scatter"] is False
    assert "grad_reduce_scatter" not in GPTConfig.megatron(**SHAPE).to_json()
    layout = ParallelLayout(tp=2, pp=2, dp=2, microbatches=3, zero=1)
    Workload(gpt=cfg).validate(layout)
    job = trace(Workload(gpt=cfg).build_fn(), layout, TraceOptions(device="meta", warmup_steps=0)).job
    assert check_job(job) == []
    plain = _dp_bytes(GPTConfig.megatron(**SHAPE, dtype="bfloat16"))
    nodes = sorted(job.graph_of(0).nodes, key=lambda n: (n.start_ns, n.id))
    colls = [(n.collective.type, n.collective.in_bytes, n.collective.group)
             for n in nodes if n.kind == pb.KIND_COLLECTIVE and n.annotations.phase == "optimizer"]
    assert colls == [(pb.COLL_ALL_REDUCE, plain["embd"], "embd"), (pb.COLL_ALL_REDUCE, plain["dp"], "dp"),
                     (pb.COLL_ALL_REDUCE, 4, "world"), (pb.COLL_ALL_GATHER, plain["dp"] // 4, "dp")]
    with pytest.raises(EchoError, match="need ZeRO stage 1"):
        cfg.validate(ParallelLayout(tp=2, pp=2, dp=2, microbatches=3))


def test_no_reduce_scatter_flag_on_predict_and_its_refusal(tmp_path):
    base = ["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "16", "--global-batch", "4",
            "--dp", "2", "--dtype", "bfloat16"]
    r = runner.invoke(app, [*base, "--no-reduce-scatter", "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "--no-reduce-scatter changes how --use-distributed-optimizer" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
    steps = {}
    for name, extra in (("rs", []), ("ar", ["--no-reduce-scatter"])):
        r = runner.invoke(app, [*base, "--use-distributed-optimizer", *extra, "-o", str(tmp_path / name), "--json"])
        assert r.exit_code == 0, r.output
        kinds = {c[0] for c in ex_situ_comms(load_job(tmp_path / name / "job"), 0) if c[2] == "dp"}
        assert kinds == ({"all_reduce", "reduce_scatter", "all_gather"} if name == "rs" else
                         {"all_reduce", "all_gather"})
        steps[name] = json.loads(r.stdout)["step_time_ns"]
    assert steps["ar"] > steps["rs"]          # twice the gradient bytes on the wire
    opts = ConfigSweepOptions(use_distributed_optimizer=True, grad_reduce_scatter=False)
    assert opts.to_json()["grad_reduce_scatter"] is False
    assert "grad_reduce_scatter" not in ConfigSweepOptions().to_json()
    row = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 4, "tp": 1, "pp": 1,
           "dp": 2}
    assert workload_for(row, opts)[0].grad_reduce_scatter is False
