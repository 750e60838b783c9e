"""Mixture of experts (Megatron-Core's MoE layer with the alltoall dispatcher) and expert
parallelism: the layout's groups and rank order, the refusals, real gloo runs whose reduced
gradients do not depend on how the experts are split, the traced layer's collectives and
bytes, the parameter and FLOP counts, the memory bound, and ``predict``."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.trace.layout import ParallelLayout


def test_expert_groups_are_cut_from_the_data_parallel_ranks() -> None:
    """ep consecutive dp x cp ranks (Megatron-Core's tp-cp-ep-dp-pp order with expert tensor
    parallelism tp), edp the ranks at the same place of every ep group, tp_ep their tp ranks
    too; nothing multiplies the world."""
    lay = ParallelLayout(tp=2, dp=4, pp=2, ep=2)
    assert lay.world_size == 16 and lay.roles == ("tp", "dp", "pp", "ep")
    assert lay.group_ranks("ep", 5) == (5, 7)
    assert lay.group_ranks("edp", 5) == (1, 5)
    assert lay.group_ranks("tp_ep", 5) == (4, 5, 6, 7)
    assert lay.group_ranks("ep", 9) == (9, 11)
    assert lay.expert_coords(7) == (1, 1)
    assert lay.all_groups("ep") == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    # with context parallelism the ep groups run over cp first, then dp (the dp_cp order)
    cp = ParallelLayout(tp=1, dp=2, cp=2, ep=4)
    assert cp.group_ranks("ep", 2) == (0, 1, 2, 3) == cp.group_ranks("dp_cp", 2)
    assert cp.group_ranks("edp", 3) == (3,)
    assert "ep=4" in cp.describe()
    with pytest.raises(EchoError, match=r"ep \(2\) must divide dp \(3\)"):
        ParallelLayout(dp=3, ep=2)
    with pytest.raises(EchoError, match="ep must be >= 1"):
        ParallelLayout(ep=0)
    # without expert parallelism: no role, and the derived groups are the dense ones
    plain = ParallelLayout(tp=2, dp=2)
    assert "ep" not in plain.roles and plain.group_ranks("edp", 1) == plain.group_ranks("dp", 1)


MOE = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 2, "vocab": 128, "num_experts": 4,
       "moe_topk": 2, "arch": "llama", "ffn_hidden": 96, "flash_attention": True, "dtype": "bfloat16"}


@pytest.mark.parametrize("change,layout,match", [
    ({"num_experts": 6}, {"dp": 4, "ep": 4}, r"ep \(4\) must divide the experts \(6\)"),
    ({"moe_topk": 5}, {"dp": 2, "ep": 2}, r"top-k 5\) must be from 1 to the experts \(4\)"),
    ({"moe_topk": 0}, {"dp": 2}, "top-k 0"),
    ({}, {"tp": 2, "dp": 2}, "needs sequence parallelism"),
    ({"num_experts": 0}, {"dp": 2, "ep": 2}, "needs a mixture of experts"),
    ({"num_experts": -1}, {"dp": 2}, "must be >= 0"),
    ({"recompute": True, "recompute_granularity": "selective", "recompute_modules": "mlp"}, {"dp": 2},
     "moe module"),
    ({"seq": 3, "micro_batch": 1, "moe_topk": 1}, {"dp": 2, "ep": 2}, "do not spread evenly"),
    ({"num_experts": 0, "moe_shared_ffn": 64}, {"dp": 2}, "a shared expert is a mixture of experts'"),
    ({"moe_shared_ffn": 65, "sequence_parallel": True}, {"dp": 2, "tp": 2}, r"tp \(2\) must divide the shared"),
    ({"moe_token_dispatcher": "flex"}, {"dp": 2}, "'flex' is not one of allgather, alltoall"),
    ({"moe_grouped_gemm": True, "arch": "gpt"}, {"dp": 2}, "grouped GEMM experts have no linear biases"),
    ({"moe_grouped_gemm": True, "num_experts": 0}, {"dp": 2}, "grouped GEMM is a mixture of experts'"),
    ({"moe_grouped_gemm": True, "num_experts": 3, "seq": 4, "micro_batch": 1, "moe_topk": 1}, {"dp": 2},
     "must spread evenly over the 3 experts"),
])
def test_configurations_the_software_cannot_run_are_refused(change: dict, layout: dict, match: str) -> None:
    from echo_et.workloads.gpt_config import GPTConfig

    cfg = GPTConfig.megatron(**{**MOE, **change})
    with pytest.raises(EchoError, match=match):
        cfg.validate(ParallelLayout(**layout))
    with pytest.raises(EchoError, match="Megatron-Core's"):
        GPTConfig(**{k: v for k, v in MOE.items() if k not in ("arch", "flash_attention")}).validate(
            ParallelLayout(dp=2))


def test_parameters_and_flops_count_experts() -> None:
    """Mixtral 8x7B (Jiang et al. 2024, arXiv 2401.04088): 46.7 B parameters, 12.9 B active
    per token; a token's MLP FLOPs are its k experts' plus the router's."""
    from echo_et.workloads.gpt_config import GPTConfig

    mixtral = GPTConfig.megatron(layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq=4096,
                                 vocab=32000, arch="llama", num_experts=8, moe_topk=2)
    assert mixtral.parameters() / 1e9 == pytest.approx(46.7, abs=0.1)
    dense = mixtral.replace(num_experts=0)
    # the active parameters: two experts' and the router's
    active = dense.parameters() + mixtral.layers * (3 * 4096 * 14336 + 8 * 4096)
    assert active / 1e9 == pytest.approx(12.9, abs=0.1)
    m, _ = mixtral.step_flops(1)
    d, _ = dense.step_flops(1)
    assert m - d == pytest.approx(3 * 4096 * 32 * (6 * 4096 * 14336 + 2 * 4096 * 8), rel=1e-12)
    # a shared expert of width S: a dense MLP's parameters and FLOPs more (a GPT MLP with its biases)
    shared = mixtral.replace(moe_shared_ffn=2048)
    assert shared.parameters() - mixtral.parameters() == 32 * 3 * 4096 * 2048
    assert shared.step_flops(1)[0] - m == pytest.approx(3 * 4096 * 32 * 6 * 4096 * 2048, rel=1e-12)
    gpt = GPTConfig.megatron(layers=2, hidden=64, heads=4, num_experts=4)
    assert gpt.replace(moe_shared_ffn=96).parameters() - gpt.parameters() == 2 * (2 * 64 * 96 + 96 + 64)


REAL = {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "micro_batch": 2, "vocab": 64, "num_experts": 4,
        "moe_topk": 2, "dropout": 0.0, "flash_attention": True, "dtype": "float32"}


@pytest.mark.parametrize("tp,extra", [(1, {}), (1, {"arch": "llama", "ffn_hidden": 48}),
                                      (2, {"sequence_parallel": True, "arch": "llama", "ffn_hidden": 48}),
                                      (2, {"sequence_parallel": True, "moe_shared_ffn": 64}),
                                      (1, {"recompute": True}), (1, {"moe_layer_freq": "([0]*1+[1]*1)"})])
def test_real_run_reduces_the_gradients_of_unsplit_experts(tmp_path, tp: int, extra: dict) -> None:
    """dp 4 gloo processes (x tp) run a step with the experts split over ep 2 and 4 ranks, and
    whole on every rank (ep 1), under either dispatcher: the tokens all-to-all'd to the experts'
    ranks and back (and all-gathered over the TP ranks), or every token of the TP x EP ranks
    gathered and the results reduce-scattered; the expert gradients reduced over the ranks
    holding the same experts and averaged over the data-parallel ranks, as Megatron-Core does:
    every parameter's reduced gradient is the same, parameter by parameter, rank by rank."""
    import torch
    from gpt_real_runs import real_moe_grads

    kw = {**REAL, **extra}
    ref = real_moe_grads(tmp_path, dp=4, tp=tp, ep=1, moe_token_dispatcher="alltoall", **kw)
    runs = [(ep, d) for ep in (2, 4) for d in ("alltoall", "allgather")] + [(1, "allgather")]
    for ep, dispatcher in runs:
        got = real_moe_grads(tmp_path, dp=4, tp=tp, ep=ep, moe_token_dispatcher=dispatcher, **kw)
        experts = 0
        for r, (g, want) in enumerate(zip(got, ref, strict=True)):
            assert set(g) <= set(want) and len(g) > 10
            experts += sum(".moe.fc" in k for k in g)
            for k in g:
                torch.testing.assert_close(g[k], want[k], rtol=1e-4, atol=1e-6,
                                           msg=f"ep {ep} {dispatcher} rank {r} {k}")
        # every rank holds its share of every MoE layer's experts: 2 matrices (with a GPT MLP's biases: 4)
        per = 2 if "arch" in extra else 4
        moe_layers = 1 if "moe_layer_freq" in extra else REAL["layers"]
        assert experts == 4 * tp * moe_layers * REAL["num_experts"] // ep * per
        assert any(".fc1." in k and ".moe." not in k for k in g) == ("moe_layer_freq" in extra)   # a dense MLP


# -- traced and predicted ------------------------------------------------------------------------
TRACED = {**MOE, "layers": 4, "hidden": 256, "heads": 8, "seq": 512, "micro_batch": 1, "ffn_hidden": 512,
          "num_experts": 8, "sequence_parallel": True, "moe_token_dispatcher": "alltoall"}


def _trace(layout: dict | None = None, **extra):
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads.gpt import build_gpt
    from echo_et.workloads.gpt_config import GPTConfig

    cfg = GPTConfig.megatron(**{**TRACED, **extra})
    lay = ParallelLayout(**(layout or {"tp": 2, "pp": 2, "dp": 4, "ep": 2}), microbatches=4)
    return trace(build_gpt(cfg), lay, TraceOptions(device="meta", verify="stage", warmup_steps=0)).job


def test_traced_job_holds_the_dispatch() -> None:
    """ep in the manifest and the ep, edp and tp_ep groups; per layer and micro-batch the
    tokens' counts gathered over tp_ep (forward), their rows all-to-all'd over ep twice each way
    (T k rows of h: 256 tokens x 2 x 256 x 2 bytes) and all-gathered / reduce-scattered over the
    TP ranks around the experts; the four local experts' GEMMs; the expert gradients reduced
    over edp, in fp32, the dense ones over dp."""
    from collections import Counter

    from echo_et._proto import echo_et_pb2 as pb
    from echo_et.ir import check_job
    from echo_et.ir.schema import ROLE_NAMES, collective_name

    job = _trace()
    m = job.manifest
    assert (m.layout.tp, m.layout.pp, m.layout.dp, m.layout.ep, job.world_size) == (2, 2, 4, 2, 16)
    assert check_job(job) == []
    assert len(job.graph_ids()) == 2
    groups = {g.desc: (ROLE_NAMES[g.role], len(g.ranks)) for g in m.groups}
    assert groups["ep"] == ("ep", 2) and groups["edp"] == ("custom", 2) and groups["tp_ep"] == ("custom", 4)
    graph = job.graph(job.graph_ids()[0]).copy()
    graph.expand()
    per_layer = 2 * 4        # layers on the stage x micro-batches
    comm = Counter((collective_name(n.collective.type), n.collective.group, n.collective.in_bytes)
                   for n in graph if n.kind == pb.KIND_COLLECTIVE)
    rows = 512 // 2 * 2      # a TP rank's tokens x top-k
    assert comm[("all_to_all", "ep", rows * 256 * 2)] == 4 * per_layer
    assert comm[("all_gather", "tp_ep", 8 * 8)] == per_layer
    assert comm[("all_gather", "tp", rows * 256 * 2)] == 2 * per_layer       # forward, and the RS's backward
    expert_params = 2 * 4 * (2 * 512 * 256 // 2 + 256 * 512 // 2)            # layers x local experts x (fc1 + fc2)
    reduced = {(n.collective.group, n.collective.in_bytes) for n in graph if n.kind == pb.KIND_COLLECTIVE
               and n.collective.in_bytes > 1 << 20}
    assert ("edp", 4 * expert_params) in reduced
    assert {g for g, _ in reduced} == {"edp", "dp"}
    names = Counter(n.name.split(" ")[0] for n in graph if n.kind == pb.KIND_COMPUTE)
    # fc1 and fc2 of 4 local experts, each way (the backward's data and weight gradients)
    assert names["aten::mm"] >= 3 * 2 * 4 * per_layer


@pytest.mark.parametrize("layout", [None, {"tp": 2, "pp": 2, "dp": 2, "cp": 2, "ep": 4}])
def test_a_moe_job_predicts_as_node_by_node(layout: dict | None) -> None:
    """The MoE job predicted in closed form (repeat blocks) is the node-by-node simulation to
    the ns; with context parallelism too, where each CP rank is a class of its own and the
    expert-parallel groups span them (their all-to-alls meet inside the layers' blocks)."""
    from placed_checks import assert_placed_as_expanded

    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import models_for
    from echo_et.passes import retime_compute

    compute, comm, slow = models_for(ConfigSweepOptions())
    timed, _ = retime_compute(_trace(layout, **({"seq": 1024} if layout else {})), compute)
    placed, expanded = assert_placed_as_expanded(timed, comm, slow)
    assert placed.events * 2 < expanded.events


def test_expert_parallelism_across_nodes_costs_more(tmp_path) -> None:
    """Predicted: the same job with its ep groups inside a node, then across nodes (2 GPUs a
    node: every ep group of tp 2 x ep 2 spans two nodes), pays for the all-to-alls on the
    network; the experts' compute is the same."""
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.predict_step import predict_config
    from echo_et.models.cluster import Cluster

    row = {k: TRACED[k] for k in ("layers", "hidden", "heads", "seq", "micro_batch")}
    row.update({"global_batch": 16, "tp": 2, "pp": 1, "dp": 4, "ep": 2})
    kw = {"arch": "llama", "ffn_hidden": 512, "flash_attention": True, "dtype": "bfloat16", "num_experts": 8,
          "sequence_parallel": True}
    inside = predict_config(row, ConfigSweepOptions(**kw))
    across = predict_config(row, ConfigSweepOptions(cluster=Cluster(gpus_per_node=2), **kw))

    def comm(p):
        return p.result.ranks[p.result.slowest_rank].breakdown()["comm_ns"]

    assert comm(across) > 1.5 * comm(inside)
    assert across.result.step_time_ns > inside.result.step_time_ns
    assert inside.to_json()["config"]["ep"] == 2


@pytest.mark.parametrize("extra", [{"moe_token_dispatcher": "alltoall"},
                                   {"moe_token_dispatcher": "alltoall", "recompute": True},
                                   {"moe_token_dispatcher": "allgather", "moe_grouped_gemm": True,
                                    "moe_shared_ffn": 64},
                                   {"moe_token_dispatcher": "alltoall", "moe_layer_freq": "[1,0]*2"}])
def test_meta_trace_equals_a_cpu_trace_on_every_rank(extra: dict) -> None:
    """The meta-device trace (each layer recorded once, nothing run) gives every rank the
    kernels and communication a CPU trace that runs every operator gives."""
    from echo_et.trace import TraceOptions, trace
    from echo_et.trace.compare import comm_ops, kernel_ops
    from echo_et.workloads import GPTConfig, build_gpt

    cfg = GPTConfig.megatron(**{**REAL, "layers": 4, "arch": "llama", "ffn_hidden": 48, "sequence_parallel": True,
                                "flash_attention": False,
                                **extra})
    lay = ParallelLayout(dp=2, tp=2, pp=2, ep=2, microbatches=3)
    opts = {"verify": "all", "warmup_steps": 0}
    cpu = trace(build_gpt(cfg), lay, TraceOptions(device="cpu", **opts)).job
    meta = trace(build_gpt(cfg), lay, TraceOptions(device="meta", **opts)).job

    # as tests/test_trace_meta.py: under the recorder's dispatch mode autograd's in-place
    # accumulations run out of place (index_select's and topk's backward too, topk's zeros made
    # from its input's shape), reading and writing the same tensors
    def norm(ops):
        out = []
        for o in ops:
            name = o[0].rstrip("_") if o[0] in ("aten::add_", "aten::index_add_", "aten::scatter_") else o[0]
            out.append(("aten::zeros",) if name in ("aten::zeros", "aten::new_zeros") else (name, *o[1:]))
        return out

    for r in range(lay.world_size):
        a, b = norm(kernel_ops(cpu.graph_of(r))), norm(kernel_ops(meta.graph_of(r)))
        assert len(a) > 50 and a == b, f"rank {r}"
        assert comm_ops(cpu.graph_of(r)) == comm_ops(meta.graph_of(r)), f"rank {r}"
        exchange = ("all_to_all", "ep") if extra["moe_token_dispatcher"] == "alltoall" else ("all_gather", "tp_ep")
        assert any(op[1:3] == exchange for op in comm_ops(meta.graph_of(r)))


CLI = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "512", "--micro-batch", "1", "--global-batch",
       "16", "--tp", "2", "--pp", "1", "--dp", "4", "--arch", "llama", "--ffn-hidden-size", "512", "--flash-attn",
       "--dtype", "bfloat16", "--sequence-parallel", "--num-experts", "8", "--moe-token-dispatcher-type", "alltoall"]


def test_predict_and_sweep_take_megatron_cores_flags(tmp_path) -> None:
    """``predict`` with Megatron-Core's MoE flags: the header says the experts, the summary
    records them and ep; ``sweep --configs`` reads an ep column with the same flags and gives the
    same step; what Megatron-Core cannot run is one line naming the constraint."""
    import json

    from typer.testing import CliRunner

    from echo_et.cli.main import app

    runner = CliRunner()
    res = runner.invoke(app, ["predict", *CLI, "--moe-router-topk", "2", "--expert-model-parallel-size", "2",
                              "-o", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert "tp 2 x pp 1 x dp 4, 8 experts (top-2, alltoall) over ep 2 = 8 a100 GPUs" in res.output
    summary = json.loads((tmp_path / "p" / "summary.json").read_text())
    assert summary["config"]["ep"] == 2 and summary["prediction"]["num_experts"] == 8
    assert any(a.startswith("mixture of experts (8 experts): routing is modelled as balanced")
               for a in summary["advice"])
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,ep\n4,256,8,512,1,16,2,1,4,2\n")
    res = runner.invoke(app, ["sweep", "--configs", str(csv), *CLI[CLI.index("--arch"):], "--json",
                              "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["rows"][0]["predicted_ms"] == pytest.approx(summary["step_time_ns"] / 1e6, abs=1e-4)
    res = runner.invoke(app, ["predict", *CLI, "--ep", "2", "--moe-grouped-gemm",
                              "--moe-shared-expert-intermediate-size", "256", "-o", str(tmp_path / "g")])
    assert res.exit_code == 0, res.output
    assert "8 experts (top-2, shared 256, alltoall, grouped GEMM) over ep 2" in res.output
    res = runner.invoke(app, ["predict", *CLI, "--ep", "2", "--moe-layer-freq", "([0]*1+[1]*3)",
                              "-o", str(tmp_path / "f")])
    assert res.exit_code == 0 and "(top-2, alltoall) in 3 of 4 layers over ep 2" in res.output, res.output
    grouped = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert grouped["prediction"]["moe_grouped_gemm"] and grouped["step_time_ns"] != summary["step_time_ns"]
    for args, message in ((["--ep", "3"], "ep (3) must divide dp (4)"),
                          (["--ep", "16"], "ep (16) must divide dp (4)"),
                          (["--num-experts", "6", "--ep", "4"], "ep (4) must divide the experts (6)"),
                          (["--moe-router-topk", "9"], "top-k 9) must be from 1 to the experts (8)"),
                          (["--num-experts", "0", "--ep", "2"], "needs a mixture of experts"),
                          (["--moe-router-topk", "0"], "--moe-router-topk"),
                          (["--num-experts", "-2"], "--num-experts"),
                          (["--moe-token-dispatcher-type", "flex"], "'flex' is not one of allgather, alltoall"),
                          (["--moe-layer-freq", "[1]*5"], "gives more than the model's 4 layers"),
                          (["--moe-layer-freq", "os.system('x')"], "write an integer")):
        res = runner.invoke(app, ["predict", *CLI, *args, "-o", str(tmp_path / "x")])
        assert res.exit_code != 0 and message in res.output and len(res.output.strip().splitlines()) == 1, res.output
        assert not (tmp_path / "x").exists()


def test_trace_cli_writes_the_moe_job_and_its_command(tmp_path) -> None:
    """``trace`` takes the same flags; the Job's manifest and provenance say them, ``layout``
    reads ep from it and does not take the tp_ep groups' gathers for ZeRO's, and ``scale``
    refuses to re-derive its expert groups (it cannot)."""
    from typer.testing import CliRunner

    from echo_et.cli.main import app
    from echo_et.ir import load_job
    from echo_et.passes.layout import infer_layout

    args = ["trace", "--workload", "megatron-gpt", "--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "512",
            "--micro-batch", "1", "--tp", "2", "--dp", "4", "--ep", "2", "--num-experts", "8", "--moe-ffn-hidden-size",
            "384", "--sequence-parallel", "--arch", "llama", "--flash-attn", "--dtype", "bfloat16", "--device", "meta",
            "--moe-token-dispatcher-type", "alltoall", "--verify", "stage", "--microbatches", "2"]
    res = CliRunner().invoke(app, [*args, "-o", str(tmp_path / "j")])
    assert res.exit_code == 0, res.output
    job = load_job(tmp_path / "j")
    assert job.manifest.layout.ep == 2
    said = job.manifest.provenance.command
    assert "--num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 384 --moe-token-dispatcher-type alltoall" in said
    assert "--expert-model-parallel-size 2" in said
    decision = infer_layout(job)
    assert (decision.ep, decision.zero) == (2, 0)
    res = CliRunner().invoke(app, ["scale", str(tmp_path / "j"), "--dp", "8", "-o", str(tmp_path / "s")])
    assert res.exit_code != 0 and "cannot re-derive it at another dp" in res.output
    res = CliRunner().invoke(app, [*args[:-2], "--microbatches", "3", "--ep", "3", "-o", str(tmp_path / "k")])
    assert res.exit_code != 0 and "ep (3) must divide dp (4)" in res.output and not (tmp_path / "k").exists()


def test_the_allgather_dispatcher_gathers_every_token_of_the_tp_ep_ranks() -> None:
    """Megatron-Core's default dispatcher: per layer and micro-batch the rank's 256 tokens of
    256 x 2 bytes gathered over tp_ep (4 ranks) and the summed rows reduce-scattered back (each
    mirrored in the backward), its probabilities and routing map gathered beside; no
    all-to-all; the Job checks."""
    from collections import Counter

    from echo_et._proto import echo_et_pb2 as pb
    from echo_et.ir import check_job
    from echo_et.ir.schema import collective_name

    job = _trace(moe_token_dispatcher="allgather")
    assert check_job(job) == []
    graph = job.graph(job.graph_ids()[0]).copy()
    graph.expand()
    per_layer = 2 * 4
    comm = Counter((collective_name(n.collective.type), n.collective.group, n.collective.in_bytes)
                   for n in graph if n.kind == pb.KIND_COLLECTIVE and n.collective.group in ("ep", "tp_ep"))
    tokens = 256 * 256 * 2
    probs = 256 * 2 * 2
    assert comm == {("all_gather", "tp_ep", tokens): 2 * per_layer,
                    ("reduce_scatter", "tp_ep", 4 * tokens): 2 * per_layer,
                    ("all_gather", "tp_ep", probs): per_layer, ("reduce_scatter", "tp_ep", 4 * probs): per_layer,
                    ("all_gather", "tp_ep", 256 * 8): per_layer}


def test_with_many_experts_across_nodes_the_alltoall_dispatcher_moves_less() -> None:
    """Predicted, 64 experts top-2 over ep 8 across nodes (TP1, 2 GPUs a node): the allgather
    dispatcher moves every token of 8 ranks to each (7 T h each way), the alltoall one each routed
    row once (7/8 T k h): its communication is the smaller by a fifth of the step's or more, the
    data-parallel reduction being the same under both."""
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.predict_step import predict_config
    from echo_et.models.cluster import Cluster

    row = {k: TRACED[k] for k in ("layers", "hidden", "heads", "seq", "micro_batch")}
    row.update({"global_batch": 8, "tp": 1, "pp": 1, "dp": 8, "ep": 8})
    kw = {"arch": "llama", "ffn_hidden": 512, "flash_attention": True, "dtype": "bfloat16", "num_experts": 64,
          "cluster": Cluster(gpus_per_node=2)}

    def comm(dispatcher: str) -> int:
        p = predict_config(row, ConfigSweepOptions(moe_token_dispatcher=dispatcher, **kw))
        return p.result.ranks[p.result.slowest_rank].breakdown()["comm_ns"]

    assert comm("alltoall") < 0.8 * comm("allgather")


def test_the_memory_bound_holds_a_ranks_share_of_the_experts() -> None:
    """Mixtral 8x7B at TP2 x PP4 x DP8: a rank holds 8 layers x 8 / ep experts of 3 x 4096 x
    14336 / 2 weights; with ep 8 their Adam state is not sharded (each rank alone holds its
    experts), with ep 1 it is over the 8 data-parallel ranks; the bound with ep 8 is under a
    third of ep 1's model state, and a layout that holds every expert on an 80 GB GPU is refused
    where ep 8 fits."""
    from echo_et.experiments.memory_check import check_memory, megatron_shape
    from echo_et.models.footprint import megatron_min_bytes, stage_expert_parameters
    from echo_et.workloads.gpt_config import GPTConfig
    from echo_et.workloads.model_shapes import model_shape

    cfg = GPTConfig.megatron(**{**model_shape("mixtral-8x7b").options(), "seq": 4096, "micro_batch": 1,
                                "sequence_parallel": True, "flash_attention": True, "recompute": True,
                                "dtype": "bfloat16"})
    kw = {"layers": 32, "hidden": 4096, "tp": 2, "pp": 4, "experts": 8, "expert_ffn": 14336, "llama": True}
    assert stage_expert_parameters(ep=8, **kw) == 8 * 3 * 4096 * 14336 // 2
    assert stage_expert_parameters(ep=1, **kw) == 8 * stage_expert_parameters(ep=8, **kw)
    one = megatron_min_bytes(**megatron_shape(cfg, ParallelLayout(tp=2, pp=4, dp=8, ep=1, microbatches=32)))
    eight = megatron_min_bytes(**megatron_shape(cfg, ParallelLayout(tp=2, pp=4, dp=8, ep=8, microbatches=32)))
    assert one[1] > 2.5 * eight[1] and one[2] == eight[2]
    with pytest.raises(EchoError, match="does not fit"):
        check_memory(cfg, ParallelLayout(tp=1, pp=1, dp=8, ep=1, microbatches=32), "a100-80gb")
    check_memory(cfg, ParallelLayout(tp=2, pp=4, dp=8, ep=8, microbatches=32), "a100-80gb")


def test_grouped_gemm_computes_what_the_sequential_experts_do() -> None:
    """``--moe-grouped-gemm``: the local experts' weights stacked and each GEMM one batched
    kernel (``aten::bmm``) give the output and the weight gradients of one GEMM per expert."""
    import torch

    from echo_et.workloads.gpt_config import GPTConfig
    from echo_et.workloads.moe import MoEMLP

    base = {"layers": 2, "hidden": 32, "heads": 4, "seq": 16, "micro_batch": 2, "arch": "llama", "ffn_hidden": 24,
            "num_experts": 4, "moe_topk": 2, "dtype": "float32", "moe_token_dispatcher": "alltoall"}

    def make(**kw):
        return MoEMLP(GPTConfig.megatron(**base, **kw), None, None, None, tokens=32,
                      gen=torch.Generator().manual_seed(1), device="cpu", dtype=torch.float32)

    seq, grp = make(), make(moe_grouped_gemm=True)
    with torch.no_grad():
        grp.router.copy_(seq.router)
        for i in range(4):
            grp.w1[i].copy_(seq.fc1[i])
            grp.w2[i].copy_(seq.fc2[i])
    x = torch.randn(16, 2, 32, generator=torch.Generator().manual_seed(2))
    a, b = seq(x), grp(x)
    torch.testing.assert_close(a, b)
    a.square().sum().backward()
    b.square().sum().backward()
    for i in range(4):
        torch.testing.assert_close(grp.w1.grad[i], seq.fc1[i].grad)
        torch.testing.assert_close(grp.w2.grad[i], seq.fc2[i].grad)
    assert all(p.expert for p in (grp.w1, grp.w2)) and len(grp.fc1) == 0


def test_the_moe_layer_frequency_is_megatron_cores() -> None:
    """``--moe-layer-freq``: every N-th layer from the first, or a pattern of 0s and 1s one per
    layer as Megatron-Core's list expression writes it (parsed, never evaluated); the parameter and
    FLOP counts add each kind of layer's; what is not a pattern of the layers is refused, before
    a huge one is built; the memory bound counts each stage's MoE layers."""
    from echo_et.experiments.memory_check import stage_moe_layers
    from echo_et.workloads.gpt_config import GPTConfig, moe_layer_pattern

    assert moe_layer_pattern("([0]*3+[1]*5)", 8) == (False,) * 3 + (True,) * 5
    assert moe_layer_pattern(" 2 ", 8) == moe_layer_pattern("[1,0]*4", 8) == (True, False) * 4
    assert moe_layer_pattern("1", 3) == (True,) * 3
    for bad, message in (("[0]*3+[1]*4", "gives 7 layers"), ("[2]*8", "0 \\(dense\\) or 1"), ("0", "from 1 to"),
                         ("__import__('os')", "write an integer"), ("[1]*10**12", "write an integer"),
                         ("[1]*1000000000000", "more than the model's 8 layers")):
        with pytest.raises(EchoError, match=message):
            moe_layer_pattern(bad, 8)
    all_moe = GPTConfig.megatron(layers=8, hidden=64, heads=4, num_experts=4, arch="llama")
    dense = all_moe.replace(num_experts=0)
    mixed = all_moe.replace(moe_layer_freq="([0]*2+[1]*6)")
    assert mixed.moe_layer_count() == 6
    assert 4 * mixed.parameters() == dense.parameters() + 3 * all_moe.parameters()
    assert 4 * mixed.step_flops(1)[0] == pytest.approx(dense.step_flops(1)[0] + 3 * all_moe.step_flops(1)[0])
    assert stage_moe_layers(mixed, 4) == (0, 2, 2, 2)
    # interleaved, chunks of 2 layers: stage 0 holds layers 0, 1, 4, 5 and stage 1 layers 2, 3, 6, 7
    assert stage_moe_layers(mixed.replace(virtual_stages_per_rank=2), 2) == (2, 4)
    with pytest.raises(EchoError, match="a MoE layer frequency is a mixture of experts'"):
        dense.replace(moe_layer_freq="2").validate(ParallelLayout())


def test_a_models_layouts_are_tried_with_expert_parallelism(tmp_path) -> None:
    """``sweep --model NAME --gpus N --expert-parallel 2,4,8``: every (tp, pp, micro-batch) also
    with each EP size that divides its dp and the experts (no more GPUs), the table and the
    fastest line saying it; asking for it without experts, or a size below 1, is refused."""
    import json

    from typer.testing import CliRunner

    from echo_et.cli.main import app
    from echo_et.experiments.layout_grid import candidate_layouts
    from echo_et.workloads.model_shapes import model_shape

    shape = model_shape("olmoe-1b-7b").options()
    rows = candidate_layouts(shape, gpus=16, global_batch=64, gpus_per_node=8, micro_batches=(2,),
                             expert_parallel=(2, 4, 8))
    by_layout: dict = {}
    for r in rows:
        by_layout.setdefault((r["tp"], r["pp"]), []).append(r.get("ep", 1))
    assert by_layout[(1, 1)] == [1, 2, 4, 8] and by_layout[(2, 1)] == [1, 2, 4, 8]
    assert by_layout[(1, 4)] == [1, 2, 4] and by_layout[(8, 2)] == [1]      # ep divides dp (4; 1)
    assert all(r["tp"] * r["pp"] * r["dp"] == 16 for r in rows)
    with pytest.raises(EchoError, match="splits a mixture of experts"):
        candidate_layouts({**shape, "num_experts": 0}, gpus=16, global_batch=64, gpus_per_node=8, expert_parallel=(2,))
    with pytest.raises(EchoError, match="must be >= 1"):
        candidate_layouts(shape, gpus=16, global_batch=64, gpus_per_node=8, expert_parallel=(0,))
    res = CliRunner().invoke(app, ["sweep", "--model", "olmoe-1b-7b", "--gpus", "4",
                                   "--global-batch", "8", "--micro-batch", "2", "--expert-parallel", "4",
                                   "--moe-token-dispatcher-type", "alltoall", "--flash-attn", "--dtype", "bfloat16",
                                   "--gpu", "h100", "--workers", "1", "--json", "-o", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)["rows"]
    assert any(r.get("ep") == 4 for r in got) and any("ep" not in r for r in got)
    table = (tmp_path / "s" / "table.txt").read_text()
    assert " ep4" in table and "fastest of" in table
    # without it, on a GPU that cannot hold every expert: refused, saying what would fit
    res = CliRunner().invoke(app, ["sweep", "--model", "olmoe-1b-7b", "--gpus", "4", "--global-batch", "8",
                                   "--micro-batch", "2", "--flash-attn", "--dtype", "bfloat16", "--workers", "1",
                                   "-o", str(tmp_path / "t")])
    assert res.exit_code != 0 and "--expert-parallel 2,4,8 splits the experts" in res.output


def test_a_moe_job_runs_in_astra_sim(tmp_path) -> None:
    """The timed MoE job exported for ASTRA-sim: its all-to-alls are each EP peer's send and
    receive (the export's default, NCCL's grouped point-to-point: rank 0's one peer in its ep
    group of 2 is rank 2), and the real analytical binary (``../shared/tools/astra-sim``, present
    in CI) finishes every rank."""
    import os

    from test_astra_sim_support import attr_value, read_et

    from conftest import REPO
    from echo_et.converters.astra_sim import ExportOptions
    from echo_et.experiments.astra_sim import export_with_report, run_astra_sim
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import models_for
    from echo_et.passes import retime_compute

    binary = os.environ.get("ASTRA_SIM_BIN") or str(REPO.parent / "shared" / "tools" / "astra-sim" / "bin"
                                                    / "astra_analytical")
    if not os.access(binary, os.X_OK):
        pytest.skip(f"needs the ASTRA-sim binary {binary} (../shared/tools/astra-sim, present in CI; or set "
                    "ASTRA_SIM_BIN)")
    compute, _, _ = models_for(ConfigSweepOptions())
    timed, _ = retime_compute(_trace(), compute)
    export_with_report(timed, tmp_path / "x", ExportOptions(gpus_per_node=8), expected=False)
    _, nodes = read_et(tmp_path / "x" / "workload.0.et")
    from chakra.schema.protobuf import et_def_pb2 as et

    to_peer = [n for n in nodes if n.type == et.COMM_SEND_NODE and attr_value(n, "comm_dst") == 2]
    # per layer and micro-batch 2 all-to-alls each way; 2 layers on the stage, 4 micro-batches
    assert len(to_peer) == 4 * 2 * 4 and {attr_value(n, "comm_size") for n in to_peer} == {256 * 2 * 256 * 2 // 2}
    res = run_astra_sim(tmp_path / "x", binary, timeout_s=300)
    assert len(res["finished_cycles"]) == 16 and res["step_ns"] > 0


def test_the_distributed_optimizer_shards_the_experts_over_edp() -> None:
    """With ZeRO 1 (Megatron's distributed optimizer) the expert gradients are reduce-scattered
    over the ranks holding the same experts (edp) and their updated weights all-gathered there,
    the dense ones over dp: each part's buffer sharded over its own group."""
    from collections import Counter

    from echo_et._proto import echo_et_pb2 as pb
    from echo_et.ir import check_job
    from echo_et.ir.schema import collective_name

    job = _trace({"tp": 2, "pp": 2, "dp": 4, "ep": 2, "zero": 1})
    assert check_job(job) == [] and job.manifest.layout.zero_stage == 1
    graph = job.graph(job.graph_ids()[0]).copy()
    graph.expand()
    big = Counter((collective_name(n.collective.type), n.collective.group) for n in graph
                  if n.kind == pb.KIND_COLLECTIVE and n.collective.in_bytes > 1 << 20)
    assert big[("reduce_scatter", "edp")] >= 1 and big[("reduce_scatter", "dp")] >= 1
    assert not any(g == "edp" and c == "all_reduce" for c, g in big)
    gathers = {(collective_name(n.collective.type), n.collective.group) for n in graph
               if n.kind == pb.KIND_COLLECTIVE and n.collective.group in ("edp", "dp")}
    assert {("all_gather", "edp"), ("all_gather", "dp")} <= gathers
