"""scale (data parallelism) on small hand-built Jobs whose structure the test states itself."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError, OptionError
from echo_et.ir import GraphBuilder, JobBuilder, check_job
from echo_et.ir.schema import pb
from echo_et.passes import infer_layout, scale
from echo_et.passes.mesh import Mesh

GRAD_BYTES = 4 << 20
TP_BYTES = 64 << 10
ACT_BYTES = 128 << 10


def make_3d_job(dp: int = 2, tp: int = 2, pp: int = 2, *, zero: int = 0, roles: bool = False,
                order: tuple[str, ...] = ("tp", "dp", "pp")) -> tuple:
    """A Megatron-like job: per (tp, pp) one graph shared by every dp replica; tp all-reduces
    inside each stage, activations sent stage to stage on "pp", gradients reduced on "dp"."""
    mesh = Mesh(tp, dp, pp, order)
    jb = JobBuilder("synthetic-3d", mesh.world, source_format="synthetic")
    role = (lambda r: r) if roles else (lambda r: "")
    group_of: dict[tuple[str, int], int] = {}
    for axis in ("tp", "dp", "pp"):
        for ranks in mesh.groups([axis]):
            gid = jb.group(ranks, name=f"{axis}{ranks[0]}", role=role(axis))
            for r in ranks:
                group_of[(axis, r)] = gid
    graphs = {}
    for t in range(tp):
        for p in range(pp):
            b = GraphBuilder(f"t{t}p{p}")
            cpu = b.stream(pb.STREAM_CPU_THREAD, "main")
            gpu = b.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0)
            comm = b.stream(pb.STREAM_GPU_COMM, "nccl", device=0)
            b.declare_group("tp", tp)
            b.declare_group("dp", dp)
            b.declare_group("pp", pp)
            last = b.cpu_op("step", cpu, duration_ns=10).id
            if p > 0:
                last = b.p2p(False, "recv_act", comm, group="pp", peer=p - 1, nbytes=ACT_BYTES,
                             duration_ns=1000, deps=[last]).id
            for layer in range(2):
                k = b.compute(f"gemm{layer}", gpu, kernel_class=pb.KC_GEMM, duration_ns=50_000,
                              deps=[last])
                k.annotations.phase = "forward"
                k.annotations.layer = layer + 2 * p
                last = b.collective("tp_allreduce", comm, coll_type=pb.COLL_ALL_REDUCE, group="tp",
                                    in_bytes=TP_BYTES, duration_ns=5000, deps=[k.id]).id
            if p < pp - 1:
                last = b.p2p(True, "send_act", comm, group="pp", peer=p + 1, nbytes=ACT_BYTES,
                             duration_ns=1000, deps=[last]).id
            k = b.compute("bwd", gpu, duration_ns=100_000, deps=[last])
            k.annotations.phase = "backward"
            if zero:
                rs = b.collective("grad_rs", comm, coll_type=pb.COLL_REDUCE_SCATTER, group="dp",
                                  in_bytes=GRAD_BYTES, out_bytes=GRAD_BYTES // dp,
                                  duration_ns=20_000, deps=[k.id])
                opt = b.compute("adam", gpu, kernel_class=pb.KC_OPTIMIZER, duration_ns=40_000,
                                deps=[rs.id])
                opt.annotations.phase = "optimizer"
                b.collective("param_ag", comm, coll_type=pb.COLL_ALL_GATHER, group="dp",
                             in_bytes=GRAD_BYTES // dp, out_bytes=GRAD_BYTES, duration_ns=20_000,
                             deps=[opt.id])
            else:
                ar = b.collective("grad_ar", comm, coll_type=pb.COLL_ALL_REDUCE, group="dp",
                                  in_bytes=GRAD_BYTES, duration_ns=20_000, deps=[k.id])
                opt = b.compute("adam", gpu, kernel_class=pb.KC_OPTIMIZER, duration_ns=40_000,
                                deps=[ar.id])
                opt.annotations.phase = "optimizer"
            graphs[(t, p)] = b.build()
            jb.add_graph(graphs[(t, p)])
    for r in range(mesh.world):
        c = mesh.coords(r)
        jb.bind(r, f"t{c['tp']}p{c['pp']}", {a: group_of[(a, r)] for a in ("tp", "dp", "pp")},
                measured_step_ns=1_000_000)
    job = jb.build()
    assert check_job(job) == []
    return job, mesh


def colls_of(job, rank, key=None):
    g = job.graph_of(rank)
    return [(n.collective.type, n.collective.group, n.collective.in_bytes, n.collective.out_bytes)
            for n in g.nodes if n.kind == pb.KIND_COLLECTIVE and (key is None or n.collective.group == key)]


def test_infer_layout_from_traffic_without_roles() -> None:
    job, mesh = make_3d_job(2, 2, 2)
    d = infer_layout(job)
    assert (d.dp, d.tp, d.pp) == (2, 2, 2)
    assert d.mesh.order == ("tp", "dp", "pp")
    assert d.source.startswith("inferred:")
    # Every tp/dp/pp group got the role its name says (the names were set by make_3d_job).
    for g in job.manifest.groups:
        assert d.roles[g.id] == g.name.rstrip("0123456789")
    assert any("-> tp" in r for r in d.reasons) and any("-> pp" in r for r in d.reasons)


def test_infer_layout_detects_another_rank_order() -> None:
    job, _ = make_3d_job(2, 2, 2, order=("tp", "pp", "dp"))
    d = infer_layout(job)
    assert d.mesh.order == ("tp", "pp", "dp")


def test_declared_layout_wins_and_is_checked() -> None:
    job, _ = make_3d_job(2, 2, 2)
    d = infer_layout(job, "dp=2,tp=2,pp=2")
    assert d.source == "declared"
    with pytest.raises(EchoError, match="8 ranks"):
        infer_layout(job, "dp=4,tp=2,pp=2")
    with pytest.raises(EchoError, match="unknown key"):
        infer_layout(job, "dq=2")


@pytest.mark.parametrize("new_dp", [1, 2, 8, 128])
def test_scale_dp_keeps_allreduce_bytes_and_rebuilds_groups(new_dp: int) -> None:
    job, mesh = make_3d_job(2, 2, 2)
    before = job.manifest.SerializeToString(deterministic=True)
    out, report = scale(job, dp=new_dp)
    assert job.manifest.SerializeToString(deterministic=True) == before  # input untouched
    assert check_job(out) == []
    new = Mesh(2, new_dp, 2)
    assert out.world_size == new.world
    assert len(out.graph_ids()) == 4  # one per (tp, pp), whatever the dp
    assert (out.manifest.layout.dp, out.manifest.layout.tp, out.manifest.layout.pp) == (new_dp, 2, 2)
    for r in (0, new.world - 1, new.world // 2 + 1):
        c = new.coords(r)
        dp_group = out.resolve_group(r, "dp")
        assert list(dp_group.ranks) == new.group_ranks(r, ["dp"])
        assert list(out.resolve_group(r, "tp").ranks) == new.group_ranks(r, ["tp"])
        assert list(out.resolve_group(r, "pp").ranks) == new.group_ranks(r, ["pp"])
        # Same per-rank sequence as the template rank, all-reduce bytes unchanged.
        t = mesh.rank({**c, "dp": c["dp"] % 2})
        assert colls_of(out, r) == colls_of(job, t)
    assert report.resized_collectives == 0


def test_scale_zero1_resizes_shards_and_optimizer() -> None:
    job, _ = make_3d_job(2, 2, 2, zero=1)
    out, report = scale(job, dp=8)
    assert check_job(out) == []
    assert out.manifest.layout.zero_stage == 1
    rs, ag = [c for c in colls_of(out, 0, "dp")]
    assert rs[0] == pb.COLL_REDUCE_SCATTER and rs[2] == GRAD_BYTES and rs[3] == GRAD_BYTES // 8
    assert ag[0] == pb.COLL_ALL_GATHER and ag[2] == GRAD_BYTES // 8 and ag[3] == GRAD_BYTES
    opt = [n for n in out.graph_of(0).nodes if n.annotations.phase == "optimizer"]
    assert [n.duration_ns for n in opt] == [40_000 * 2 // 8]
    assert report.rescaled_optimizer_nodes == 4


def test_scale_refuses_tp_and_bad_inputs() -> None:
    job, _ = make_3d_job(2, 2, 2)
    with pytest.raises(EchoError, match="echo-et trace"):
        scale(job, tp=4)
    with pytest.raises(OptionError, match="not a multiple of 8 GPUs per node") as err:
        scale(job, dp=3, gpus_per_node=8)
    assert err.value.option == "gpus_per_node"
    with pytest.raises(EchoError, match="ZeRO"):
        scale(job, dp=4, zero=1)


def test_scale_to_many_ranks_shares_graphs_and_keeps_the_manifest_small() -> None:
    job, _ = make_3d_job(2, 2, 2)
    out, _ = scale(job, dp=512, layout="dp=2,tp=2,pp=2")
    assert out.world_size == 2048
    assert len(out.graph_ids()) == 4
    assert len(out.manifest.bindings) == 2048
    # Bindings and groups are the only per-rank cost: well under 100 bytes per rank.
    assert len(out.manifest.SerializeToString()) < 100 * out.world_size


def test_select_ranks_keeps_contained_groups_and_refuses_straddling_ones() -> None:
    from echo_et.passes.select import parse_ranks, select_ranks

    job, mesh = make_3d_job(2, 1, 1)  # two ranks, one dp group
    one = select_ranks(job, [1, 0])
    assert check_job(one) == [] and one.world_size == 2
    assert one.binding(0).graph == job.binding(1).graph
    job3, _ = make_3d_job(2, 2, 2)
    with pytest.raises(EchoError, match="not selected"):
        select_ranks(job3, parse_ranks("0-3"))
    assert parse_ranks("0-2,5") == [0, 1, 2, 5]


def test_a_training_job_with_one_replica_is_not_grown_into_unsynchronised_replicas() -> None:
    """Traced at dp=1, a training step reduces no gradients over data parallelism (the
    workloads skip a collective over one rank): scaling it to dp > 1 would predict replicas
    that never synchronise. Refused in one line naming what to do instead; a Job at dp=1
    that does reduce over its dp group (a synthetic one here) still scales."""
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads import GPTConfig, build_gpt

    for cfg in (GPTConfig(layers=2, hidden=32, heads=4, seq=16, micro_batch=1, vocab=64),
                GPTConfig.megatron(layers=2, hidden=32, heads=4, seq=16, micro_batch=1, vocab=64)):
        job = trace(build_gpt(cfg), ParallelLayout(tp=2, pp=2, microbatches=2),
                    TraceOptions(device="meta", warmup_steps=0)).job
        for kw in ({"dp": 4}, {"dp": 4, "pp": 1}):
            with pytest.raises(EchoError, match="one data-parallel replica.*train apart") as e:
                scale(job, **kw)
            assert "\n" not in str(e.value) and "--" not in str(e.value)
        assert scale(job, pp=1)[0].world_size == 2          # dp unchanged: nothing to grow
    synthetic, _ = make_3d_job(1, 2, 2, roles=True)
    assert scale(synthetic, dp=4)[0].world_size == 16


def test_megatrons_per_replica_groups_never_span_data_parallelism() -> None:
    """At dp=1 Megatron's model-parallel group is the whole world and, at tp 1 and pp 2, its
    embedding group is too; neither spans data parallelism (they are per replica), whatever
    their ranks say."""
    from echo_et.passes.regroup import group_shape

    mesh = Mesh(1, 1, 2)
    for desc in ("mp", "embd"):
        g = pb.ProcessGroup(id=1, name=desc, desc=desc, ranks=[0, 1], role=pb.ROLE_CUSTOM)
        assert not group_shape(mesh, g, "world").spans_dp
    g = pb.ProcessGroup(id=1, name="world", desc="default_pg", ranks=[0, 1], role=pb.ROLE_WORLD)
    assert group_shape(mesh, g, "world").spans_dp


@pytest.mark.parametrize(("desc", "role", "spans"), [
    ("", "", True),                              # a group of every rank, unexplained: the world
    ("", "world", True),
    ("", "tp", False),                           # a TP-only Job's one group: per replica
    ("", "pp", False),
    ("EMBEDDING_GROUP", "", False),              # Megatron-core's per-replica groups, by name
    ("MODEL_PARALLEL_GROUP", "", False),
    ("POSITION_EMBEDDING_GROUP", "", False),
    ("embd", "", False),                         # the tracer's
])
def test_one_replica_group_of_every_rank_spans_dp_only_when_it_is_the_world(desc, role, spans) -> None:
    from echo_et.passes.regroup import group_shape

    mesh = Mesh(tp=4, dp=1, pp=1)
    g = pb.ProcessGroup(id=1, name="g", desc=desc, ranks=[0, 1, 2, 3])
    assert group_shape(mesh, g, role).spans_dp is spans
