"""Context parallelism (Megatron-Core's ``--context-parallel-size``, TE's ring attention):
the layout's groups and rank order, the load-balanced split, real gloo runs that give the
gradients of a run without it, the traced ring and its refusals."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.trace.layout import ParallelLayout

REAL = {"megatron": True, "layers": 2, "hidden": 32, "heads": 4, "seq": 16, "micro_batch": 2, "vocab": 64,
        "dropout": 0.0, "flash_attention": True, "grad_sync": "after-backward", "dtype": "float32"}


def test_rank_order_is_megatron_cores() -> None:
    """tp fastest, then cp, then dp, then pp ("tp-cp-ep-dp-pp"), and the groups that follow."""
    lay = ParallelLayout(tp=2, cp=2, dp=2, pp=2)
    assert lay.world_size == 16
    assert lay.coords(3) == {"tp": 1, "cp": 1, "dp": 0, "pp": 0}
    assert lay.coords(6) == {"tp": 0, "cp": 1, "dp": 1, "pp": 0}
    assert lay.rank_of(tp=1, dp=1, pp=1, cp=1) == 15
    assert lay.group_ranks("cp", 5) == (5, 7)
    assert lay.group_ranks("dp", 5) == (1, 5)
    assert lay.group_ranks("dp_cp", 5) == (1, 3, 5, 7)
    assert lay.group_ranks("pp", 5) == (5, 13)
    assert lay.group_ranks("embd", 5) == (5, 13)
    assert lay.group_ranks("mp", 3) == (2, 3, 10, 11)
    assert lay.roles == ("tp", "dp", "pp", "cp")
    # without context parallelism nothing changes: no cp coordinate, role or group
    plain = ParallelLayout(tp=2, dp=2, pp=2)
    assert plain.coords(5) == {"tp": 1, "dp": 0, "pp": 1} and plain.roles == ("tp", "dp", "pp")
    assert plain.group_ranks("dp_cp", 5) == plain.group_ranks("dp", 5)
    with pytest.raises(EchoError, match="unknown group role 'cp'"):
        plain.group_ranks("cp", 0)
    with pytest.raises(EchoError, match="cp must be >= 1"):
        ParallelLayout(cp=0)


def test_split_keeps_two_chunks_for_an_even_load() -> None:
    import torch

    from echo_et.workloads.context_parallel import split_sequence

    t = torch.arange(16).view(1, 16)
    assert split_sequence(t, 1, 4, 0).tolist() == [[0, 1, 14, 15]]
    assert split_sequence(t, 1, 4, 3).tolist() == [[6, 7, 8, 9]]
    every = sorted(x for r in range(4) for x in split_sequence(t, 1, 4, r).view(-1).tolist())
    assert every == list(range(16))
    with pytest.raises(EchoError, match="2 x 3 equal chunks"):
        split_sequence(t, 1, 3, 0)


LLAMA = {"arch": "llama", "kv_heads": 2, "ffn_hidden": 64}


@pytest.mark.parametrize("cp,extra", [(2, {}), (4, {}), (2, LLAMA), (2, {"recompute": True}),
                                      (2, {"cp_comm_type": "allgather"}), (4, {"cp_comm_type": "allgather"}),
                                      (2, {"cp_comm_type": "allgather", **LLAMA}),
                                      (2, {"cp_comm_type": "a2a"}), (4, {"cp_comm_type": "a2a"}),
                                      (2, {"cp_comm_type": "a2a", "recompute": True, **LLAMA})])
def test_real_run_gives_the_gradients_without_context_parallelism(tmp_path, cp: int, extra: dict) -> None:
    """cp gloo processes each hold 2 of the sequence's 2 cp chunks and run the ring for real
    (forward, backward, the recomputed forward): every send meets its receive and each
    parameter's gradient, averaged over the CP ranks as the reduction over dp x cp does, is
    that of one process holding the whole sequence; with the llama layer (rotary positions cut
    to the rank's chunks, grouped keys and values) too."""
    import torch
    from gpt_real_runs import real_grads

    kw = {**REAL, **extra}
    ref = real_grads(tmp_path, microbatches=2, **kw)
    got = real_grads(tmp_path, microbatches=2, cp=cp, **kw)
    assert got.keys() == ref.keys() and len(ref) > 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("extra", [{}, {"sequence_parallel": True}, {"cp_comm_type": "allgather"},
                                   {"cp_comm_type": "a2a", "sequence_parallel": True}])
def test_real_run_with_pipeline_and_tensor_parallelism(tmp_path, extra: dict) -> None:
    """TP2 x PP2 x CP2 (8 processes, the rank order above) gives the gradients of TP2 x PP2,
    parameter by parameter and TP rank by TP rank; with sequence parallelism too (each CP
    rank's positions split again over the TP ranks)."""
    import torch
    from gpt_real_runs import real_grads

    kw = {**REAL, **extra}
    ref = real_grads(tmp_path, microbatches=2, tp=2, pp=2, **kw)
    got = real_grads(tmp_path, microbatches=2, cp=2, tp=2, pp=2, **kw)
    assert got.keys() == ref.keys() and len(ref) > 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_dropout_block_backward_is_the_gradient_of_its_forward() -> None:
    """The CPU block with attention dropout: its backward (the kept mask, flash attention's
    formulas) is autograd's gradient of the same forward."""
    import torch

    from echo_et.workloads.context_parallel import _Block

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 4, 6, 8, requires_grad=True) for _ in range(3))
    block = _Block(0.3, 0.25)
    out, lse = block.forward(q, k, v, True)
    keep = block.state[0]
    assert keep is not None and (keep == 0).any()
    s = torch.matmul(q, k.transpose(-1, -2)) * 0.25
    s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.matmul(torch.softmax(s, -1) * keep, v)
    torch.testing.assert_close(out, ref)
    dout = torch.randn_like(ref)
    want = torch.autograd.grad(ref, (q, k, v), dout)
    got = block.backward(0, dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, True)
    for g, w, name in zip(got, want, "qkv", strict=True):
        torch.testing.assert_close(g, w, msg=name)


# -- traced and predicted --------------------------------------------------------------------
SHAPE = {"layers": 4, "hidden": 256, "heads": 8, "seq": 512, "micro_batch": 1}


def _trace(cp: int, **extra):
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads.gpt import build_gpt
    from echo_et.workloads.gpt_config import GPTConfig

    cfg = GPTConfig.megatron(**{**SHAPE, "flash_attention": True, "dtype": "bfloat16", **extra})
    lay = ParallelLayout(tp=2, pp=2, dp=2, cp=cp, microbatches=4)
    return trace(build_gpt(cfg), lay, TraceOptions(device="meta", verify="stage", warmup_steps=0)).job


def test_traced_job_holds_the_ring() -> None:
    """The Job: cp in its manifest, the cp and dp_cp groups, one graph per (stage, CP rank)
    that the checker passes; a layer's forward runs cp flash-attention blocks and its backward
    cp backward blocks, the keys and values sent cp - 1 times forward and cp times back (the
    last with the gradient only, then the gradient home); the gradients reduced over dp x cp."""
    from collections import Counter

    from echo_et._proto import echo_et_pb2 as pb
    from echo_et.ir import check_job
    from echo_et.ir.schema import ROLE_NAMES

    job = _trace(4)
    m = job.manifest
    assert (m.layout.tp, m.layout.pp, m.layout.dp, m.layout.cp, job.world_size) == (2, 2, 2, 4, 32)
    assert check_job(job) == []
    assert len(job.graph_ids()) == 8
    groups = {g.desc: (ROLE_NAMES[g.role], len(g.ranks)) for g in m.groups}
    assert groups["cp"] == ("cp", 4) and groups["dp_cp"] == ("custom", 8) and groups["dp"] == ("dp", 2)
    graph = job.graph(job.graph_ids()[0]).copy()
    graph.expand()
    names = Counter(n.name.split(" ")[0] for n in graph)
    per_layer = 2 * 4       # layers on the stage x micro-batches
    assert names["aten::_scaled_dot_product_flash_attention"] == 4 * per_layer
    assert names["aten::_scaled_dot_product_flash_attention_backward"] == 4 * per_layer
    # rank 0 of a ring of 4: forward, the keys and values (64 KiB) to rank 1, three times per
    # layer; backward, to rank 3: the keys, then keys with their gradient twice (128 KiB), then
    # the gradient, then the gradient home
    sends = Counter((n.p2p.peer, n.p2p.bytes) for n in graph if n.kind == pb.KIND_SEND and n.p2p.group == "cp")
    assert sends == {(1, 65536): 3 * per_layer, (3, 65536): 3 * per_layer, (3, 131072): 2 * per_layer}
    recvs = Counter((n.p2p.peer, n.p2p.bytes) for n in graph if n.kind == pb.KIND_RECV and n.p2p.group == "cp")
    assert recvs == {(3, 65536): 3 * per_layer, (1, 65536): 3 * per_layer, (1, 131072): 2 * per_layer}
    # the gradient reduction runs over dp x cp (the tied embedding's between the stages
    # first), nothing large over dp alone
    reduced = Counter(n.collective.group for n in graph if n.kind == pb.KIND_COLLECTIVE
                      and n.collective.in_bytes > 1 << 20)
    assert set(reduced) == {"dp_cp", "embd"}


def test_the_rings_half_blocks_are_priced_as_not_causal() -> None:
    """The ring's off-diagonal blocks attend to every key they get (``is_causal=False``,
    recorded on the node: the compute model takes attention as causal otherwise): per layer
    and micro-batch one causal block each way and cp - 1 that are not, and with the
    load-balanced split every CP rank's attention costs the same (a rank's half blocks are
    all its queries over half the keys, or half its queries over all of them: equal work)."""
    from collections import Counter

    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import models_for
    from echo_et.passes import retime_compute

    job = _trace(4)
    compute, _, _ = models_for(ConfigSweepOptions())
    timed, _ = retime_compute(job, compute)
    per_layer = 2 * 4
    spent = set()
    for r in (0, 2, 4, 6):          # the four CP ranks of TP rank 0 on the first stage
        graph = timed.graph_of(r).copy()
        graph.expand()
        blocks = [n for n in graph if n.name.startswith("aten::_scaled_dot_product_flash_attention")]
        assert Counter((n.name.endswith("backward"), n.attrs.get("is_causal", "")) for n in blocks) == {
            (False, ""): per_layer, (False, "0"): 3 * per_layer, (True, ""): per_layer, (True, "0"): 3 * per_layer}
        spent.add(sum(n.duration_ns for n in blocks))
    assert len(spent) == 1 and spent.pop() > 0


@pytest.mark.parametrize("comm_type,blocks,collectives,graphs", [
    ("allgather", 2, {"all_gather": 2, "reduce_scatter": 1}, 2),
    ("a2a", 1, {"all_to_all": 8}, 2),
])
def test_traced_job_holds_the_other_exchanges(comm_type: str, blocks: int, collectives: dict, graphs: int) -> None:
    """allgather: per layer and micro-batch, the keys and values gathered (forward, and again
    in the backward) and their gradient reduce-scattered, two flash blocks each way (the
    rank's two chunks, each over the keys up to it); a2a: the queries, keys and values and the
    output all-to-all'd each way, one flash block over the whole sequence, and every CP rank the
    same graph."""
    from collections import Counter

    from echo_et._proto import echo_et_pb2 as pb
    from echo_et.ir import check_job
    from echo_et.ir.schema import collective_name

    job = _trace(4, cp_comm_type=comm_type)
    assert check_job(job) == []
    assert len(job.graph_ids()) == graphs
    graph = job.graph(job.graph_ids()[0]).copy()
    graph.expand()
    names = Counter(n.name.split(" ")[0] for n in graph)
    per_layer = 2 * 4
    assert names["aten::_scaled_dot_product_flash_attention"] == blocks * per_layer
    assert names["aten::_scaled_dot_product_flash_attention_backward"] == blocks * per_layer
    got = Counter(collective_name(n.collective.type) for n in graph
                  if n.kind == pb.KIND_COLLECTIVE and n.collective.group == "cp")
    assert got == {k: v * per_layer for k, v in collectives.items()}
    assert not any(n.kind in (pb.KIND_SEND, pb.KIND_RECV) and n.p2p.group == "cp" for n in graph)


def test_context_parallelism_halves_a_ranks_work(tmp_path) -> None:
    """Predicted: each CP rank holds half the tokens, so its compute is near half that of the
    same replica without CP (more kernels, each smaller), on twice the GPUs; the model FLOPs
    are the same, so the MFU per GPU halves with the same step."""
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.predict_step import predict_config

    opts = ConfigSweepOptions(flash_attention=True, dtype="bfloat16")
    row = {**SHAPE, "hidden": 2048, "heads": 16, "seq": 16384, "global_batch": 8, "tp": 1, "pp": 1, "dp": 1}
    one = predict_config(row, opts)
    two = predict_config({**row, "cp": 2}, opts)
    assert len(two.result.ranks) == 2 * len(one.result.ranks)
    c1 = one.result.ranks[one.result.slowest_rank].breakdown()["compute_ns"]
    c2 = two.result.ranks[two.result.slowest_rank].breakdown()["compute_ns"]
    assert 0.45 < c2 / c1 < 0.62
    assert two.throughput["model_flops"] == one.throughput["model_flops"]
    assert two.config["cp"] == 2 and two.to_json()["config"]["cp"] == 2


@pytest.mark.parametrize("extra,message", [
    ({"flash_attention": False}, "needs megatron-gpt with flash attention"),
    ({"pipeline_engine": "deepspeed"}, "DeepSpeed's pipeline engine has none"),
    ({"recompute": True, "partition_activations": True}, "partitioned activation checkpoints are DeepSpeed's"),
    ({"seq": 502}, "must split into 2 x cp = 4 equal chunks"),
    ({"seq": 12, "sequence_parallel": True, "tp": 4}, "tp \\(4\\) must divide each context-parallel rank's 6 "
                                                      "positions"),
])
def test_refuses_what_megatron_core_refuses(extra: dict, message: str) -> None:
    from echo_et.workloads.gpt_config import GPTConfig

    extra = dict(extra)
    tp = extra.pop("tp", 2)
    cfg = GPTConfig.megatron(**{**SHAPE, "flash_attention": True, **extra})
    with pytest.raises(EchoError, match=message):
        cfg.validate(ParallelLayout(tp=tp, cp=2))


def test_memory_bound_splits_the_activations_and_the_optimizer() -> None:
    """The lower bound: a CP rank keeps the activations of seq / cp positions, and the
    optimizer's state is sharded over dp x cp; a refusal says so."""
    from echo_et.models.footprint import check_fits, megatron_min_bytes

    shape = dict(layers=32, hidden=4096, ffn=16384, vocab=50304, seq=65536, micro_batch=1, tp=8, pp=1,
                 microbatches=8, elem_bytes=2, heads=32, dp=2, recompute="selective", flash=True)
    one, two = megatron_min_bytes(**shape), megatron_min_bytes(**shape, cp=2)
    assert two[2] * 2 == pytest.approx(one[2], rel=1e-6)
    assert two[1] < one[1]
    with pytest.raises(EchoError, match="sharded over 2 data-parallel x 4 context-parallel ranks"):
        check_fits(1, "tiny", **shape, cp=4)


def test_jobs_passes_refuse_a_context_parallel_job(tmp_path) -> None:
    """Re-scaling reads tp x dp x pp layouts: a CP job is one clear refusal, never a guess."""
    from echo_et.passes.scale import scale

    with pytest.raises(EchoError, match="traced with context parallelism"):
        scale(_trace(2), dp=4)


# -- the command line ------------------------------------------------------------------------
CLI = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "1024", "--global-batch", "4",
       "--tp", "2", "--pp", "2", "--flash-attn", "--dtype", "bfloat16"]


def test_predict_trace_and_sweep_take_the_context_parallel_size(tmp_path) -> None:
    """``predict`` and ``trace`` take Megatron's --context-parallel-size, a sweep row its cp
    column (its gpus column then counts it); the same configuration predicts the same step
    either way, and the traced Job says cp in its manifest and in the command it records."""
    import json

    from typer.testing import CliRunner

    from echo_et.cli.main import app
    from echo_et.ir import load_job

    runner = CliRunner()
    res = runner.invoke(app, ["predict", *CLI, "--context-parallel-size", "2", "--json", "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    pred = json.loads(res.stdout)
    assert pred["config"]["cp"] == 2 and len(pred["rank_classes"]) >= 4
    assert sum(len(c) for c in pred["rank_classes"]) == 8
    text = runner.invoke(app, ["predict", *CLI, "--context-parallel-size", "2", "-o", str(tmp_path / "q")])
    assert text.exit_code == 0 and "tp 2 x pp 2 x dp 1 x cp 2 = 8 a100 GPUs" in text.output
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,cp,gpus\n"
                   "4,256,8,1024,1,4,2,2,1,2,8\n4,256,8,1024,1,4,2,2,1,1,4\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--flash-attn", "--dtype", "bfloat16", "--json",
                              "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    assert rows[0]["predicted_ms"] == pytest.approx(pred["step_time_ns"] / 1e6, abs=1e-4)
    assert rows[1]["predicted_ms"] != rows[0]["predicted_ms"]
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *CLI[:8], "--tp", "2", "--pp", "2", "--flash-attn",
                              "--context-parallel-size", "2", "--device", "meta", "--verify", "stage",
                              "-o", str(tmp_path / "t")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "t")
    assert job.manifest.layout.cp == 2 and job.world_size == 8
    assert "--context-parallel-size 2" in job.manifest.provenance.command


@pytest.mark.parametrize("args,message", [
    (["predict", *CLI[:-3], "--context-parallel-size", "2"], "needs megatron-gpt with flash attention"),
    (["predict", *CLI, "--context-parallel-size", "0"], "--context-parallel-size"),
    (["predict", *CLI, "--context-parallel-size", "3"], "must split into 2 x cp = 6 equal chunks"),
])
def test_bad_input_is_one_line(tmp_path, args: list, message: str) -> None:
    from typer.testing import CliRunner

    from echo_et.cli.main import app

    res = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "out")])
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()


def test_the_communication_type_on_the_command_line(tmp_path) -> None:
    """--cp-comm-type on predict (its header names it), on sweep --configs for the rows with a
    cp column, and its refusals: an unknown type, hierarchical a2a+p2p, a2a that cannot split
    a TP rank's heads."""
    import json

    from typer.testing import CliRunner

    from echo_et.cli.main import app

    runner = CliRunner()
    out = {}
    for kind in ("p2p", "allgather", "a2a"):
        res = runner.invoke(app, ["predict", *CLI, "--context-parallel-size", "2", "--cp-comm-type", kind,
                                  "-o", str(tmp_path / kind)])
        assert res.exit_code == 0, res.output
        assert ("x cp 2 = 8" if kind == "p2p" else f"x cp 2 ({kind}) = 8") in res.output
        out[kind] = json.loads((tmp_path / kind / "summary.json").read_text())
    steps = {k: v["step_time_ns"] for k, v in out.items()}
    assert len(set(steps.values())) == 3, steps
    assert out["a2a"]["prediction"]["cp_comm_type"] == "a2a" and "cp_comm_type" not in out["p2p"]["prediction"]
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,cp\n4,256,8,1024,1,4,2,2,1,2\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), "--flash-attn", "--dtype", "bfloat16",
                              "--cp-comm-type", "a2a", "--json", "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"][0]["predicted_ms"] == pytest.approx(steps["a2a"] / 1e6, abs=1e-4)
    for args, message in ((["--cp-comm-type", "ring"], "'ring' is not one of p2p, allgather, a2a"),
                          (["--cp-comm-type", "a2a+p2p"], "hierarchical context parallelism, is not modelled"),
                          (["--cp-comm-type", "a2a", "--context-parallel-size", "8", "--seq", "4096"],
                           "cp (8) must divide its 4")):
        res = runner.invoke(app, ["predict", *CLI, "--context-parallel-size", "2", *args, "-o", str(tmp_path / "x")])
        assert res.exit_code != 0 and message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    res = runner.invoke(app, ["sweep", str(tmp_path / "p2p" / "job"), "--dp", "2", "--cp-comm-type", "a2a",
                              "-o", str(tmp_path / "y")])
    assert res.exit_code != 0 and "--cp-comm-type only applies with --configs" in res.output


def test_sweep_rows_refuse_a_bad_cp(tmp_path) -> None:
    from typer.testing import CliRunner

    from echo_et.cli.main import app

    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,cp,gpus\n4,256,8,1024,1,4,2,2,1,2,4\n")
    res = CliRunner().invoke(app, ["sweep", "--configs", str(csv), "--flash-attn", "-o", str(tmp_path / "s")])
    assert res.exit_code != 0 and "gpus 4 is not tp x pp x dp x cp (2 x 2 x 1 x 2)" in res.output
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,cp\n4,256,8,1024,1,4,2,2,1,0\n")
    res = CliRunner().invoke(app, ["sweep", "--configs", str(csv), "--flash-attn", "--json", "-o", str(tmp_path / "t")])
    assert "cp must be >= 1" in res.output


def test_a_script_gets_the_context_parallel_groups() -> None:
    """A user's build function under a CP layout: ``ctx.cp_rank``, ``ctx.group("cp")`` and
    ``ctx.group("dp_cp")`` are Megatron-Core's groups, and the Job binds them (its cp groups
    with the cp role, dp_cp a derived group) and passes the checker."""
    import torch
    import torch.distributed as dist

    from echo_et._proto import echo_et_pb2 as pb
    from echo_et.ir import check_job
    from echo_et.trace.tracer import TraceOptions, trace

    seen: dict[int, tuple] = {}

    def build(ctx):
        cp, dp_cp = ctx.group("cp"), ctx.group("dp_cp")
        seen[ctx.rank] = (ctx.cp_rank, dist.get_world_size(cp), dist.get_world_size(dp_cp))

        def step():
            t = torch.ones(4, device=ctx.device)
            dist.all_reduce(t, group=cp)
            dist.all_reduce(t, group=dp_cp)
        return step

    lay = ParallelLayout(tp=2, cp=2, dp=2)
    job = trace(build, lay, TraceOptions(device="meta", verify="sample", warmup_steps=0)).job
    assert check_job(job) == []
    assert seen[0] == (0, 2, 4) and seen[7] == (1, 2, 4)      # the two ends of the one class traced
    roles = {g.desc: g.role for g in job.manifest.groups}
    assert roles["cp"] == pb.ROLE_CP and roles["dp_cp"] == pb.ROLE_CUSTOM
    binding = job.binding(3)
    by_id = {g.id: tuple(g.ranks) for g in job.manifest.groups}
    assert by_id[binding.groups["cp"]] == (1, 3) and by_id[binding.groups["dp_cp"]] == (1, 3, 5, 7)


def test_real_run_with_the_interleaved_schedule(tmp_path) -> None:
    """PP3 x CP2 with Megatron's interleaved schedule (two model chunks per stage, 6 gloo
    processes): the ring's exchanges and the pipeline's meet, and the gradients are those of
    one process."""
    import torch
    from gpt_real_runs import real_grads

    kw = {**REAL, "layers": 6}
    ref = real_grads(tmp_path, microbatches=3, **kw)
    got = real_grads(tmp_path, microbatches=3, cp=2, pp=3, layers_per_virtual_stage=1, **kw)
    assert got.keys() == ref.keys() and len(ref) > 6 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


def test_layout_search_tries_context_parallel_sizes(tmp_path) -> None:
    """``sweep --model NAME --gpus N --context-parallel 2,4``: every (tp, pp) also tried at
    each CP size that divides the GPUs with it, after the plain layout, each predicted; the
    table marks their rows, and the option is the layout search's only."""
    import json

    from typer.testing import CliRunner

    from echo_et.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["sweep", "--model", "llama2-7b", "--gpus", "4", "--global-batch", "8", "--micro-batch",
                              "1", "--context-parallel", "2,4", "--cp-comm-type", "allgather", "--dtype", "bfloat16",
                              "--flash-attn", "--use-distributed-optimizer", "--recompute", "--gpu", "a100-80gb",
                              "--workers", "1", "--no-plot", "-o", str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    assert "10 of 10 layouts run" in res.stderr
    rows = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    layouts = [(r["tp"], r["pp"], r["dp"], r.get("cp", 1)) for r in rows]
    assert layouts[:3] == [(1, 1, 4, 1), (1, 1, 2, 2), (1, 1, 1, 4)]
    assert all(r["tp"] * r["pp"] * r["dp"] * r.get("cp", 1) == 4 for r in rows)
    assert all(r.get("error") is None and r["predicted_ms"] > 0 for r in rows)
    assert "1F1B cp4" in res.stdout
    res = runner.invoke(app, ["sweep", "--configs", str(tmp_path / "x.csv"), "--context-parallel", "2",
                              "-o", str(tmp_path / "y")])
    assert res.exit_code != 0 and "--context-parallel and --expert-parallel sweep a model's layouts" in res.output
