"""inject on a multi-rank Job traced with one data-parallel replica (TP and PP ranks): DDP's
buckets added to each distinct graph, every replica's groups re-derived. Checked on a real
tensor-parallel Kineto trace (fixtures/traces/tp_gloo2) and against Jobs traced at the
target dp by the ex-situ tracer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_et.converters import ReadOptions, read
from echo_et.errors import EchoError, OptionError
from echo_et.ir import check_job
from echo_et.ir.schema import pb
from echo_et.passes.gradients import last_backward
from echo_et.passes.inject import inject_dp
from echo_et.sim import simulate

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "traces"
TP_GLOO = FIXTURES / "tp_gloo2"


def _colls(job, rank: int, key: str | None = None) -> list[tuple]:
    out = []
    for n in job.graph_of(rank).nodes:
        if n.kind == pb.KIND_COLLECTIVE and (key is None or n.collective.group == key):
            c = n.collective
            out.append((c.type, tuple(job.resolve_group(rank, c.group).ranks), c.in_bytes, c.out_bytes))
    return out


@pytest.fixture(scope="module")
def tp_job():
    return read(sorted(TP_GLOO.glob("*.kineto.json.gz")), None, ReadOptions())


def test_real_tensor_parallel_trace_gets_one_bucket_set_per_rank_and_replica(tp_job) -> None:
    """Two gloo ranks of one TP2 model copy, two micro-batches accumulated per step: DDP
    reduces each rank's own parameter shards once (the last micro-batch's backward), over the
    ranks holding the same shard; the TP group (the traced world) stays inside each replica."""
    run = json.loads((TP_GLOO / "run.json").read_text())
    before = {gid: tp_job.graph(gid).content_hash() for gid in tp_job.graph_ids()}
    with pytest.raises(EchoError, match="already data-parallel.*declare that layout \\(e.g. tp=2\\)"):
        inject_dp(tp_job, dp=4)    # read as DP2: its one group is the world
    from echo_et.passes import infer_layout

    assert any("tensor parallelism alone reads the same: declare its layout (tp=2)" in r
               for r in infer_layout(tp_job).reasons)
    out, report = inject_dp(tp_job, dp=4, layout="tp=2")
    assert {gid: tp_job.graph(gid).content_hash() for gid in tp_job.graph_ids()} == before
    assert check_job(out) == [] and out.world_size == 8
    assert out.manifest.layout.dp == 4 and out.manifest.layout.tp == 2
    assert out.manifest.layout.source == "injected(declared)"
    assert report.param_bytes == 2 * run["param_bytes_per_rank"]
    assert [g.gradients for g in report.per_graph] == [len(run["param_shapes_per_rank"])] * 2
    for r in range(8):
        groups = {out.group(g).role: tuple(out.group(g).ranks) for g in out.binding(r).groups.values()}
        assert groups[pb.ROLE_DP] == tuple(range(r % 2, 8, 2))
        assert groups[pb.ROLE_TP] == (r - r % 2, r - r % 2 + 1)
        dp = _colls(out, r, "dp")
        assert dp == [(pb.COLL_ALL_REDUCE, groups[pb.ROLE_DP], run["param_bytes_per_rank"],
                       run["param_bytes_per_rank"])]
        traced = _colls(tp_job, r % 2)
        assert [c[2] for c in _colls(out, r) if c not in dp] == [c[2] for c in traced]
        assert {c[1] for c in _colls(out, r) if c not in dp} == {groups[pb.ROLE_TP]}
    assert simulate(out).step_time_ns > 0


def test_refusals(tp_job) -> None:
    with pytest.raises(OptionError, match="single-rank trace") as e:
        inject_dp(tp_job, dp=2, layout="tp=2", param_bytes=1 << 20)
    assert e.value.option == "param_bytes"
    with pytest.raises(OptionError, match="16 is not a multiple of 3 GPUs per node"):
        inject_dp(tp_job, dp=8, layout="tp=2", gpus_per_node=3)
    # a graph that already reduces over its one-rank data-parallel group
    out, _ = inject_dp(tp_job, dp=1, layout="tp=2")
    with pytest.raises(EchoError, match="already communicates over its data-parallel group 'dp'"):
        inject_dp(out, dp=2, layout="tp=2")


def test_gradient_accumulation_keeps_the_last_backward() -> None:
    def op(i: int, name: str, start: int, dur: int = 1, shapes: str = "", parent: int | None = None, mb=None):
        n = pb.Node(id=i, name=name, kind=pb.KIND_CPU_OP, start_ns=start, duration_ns=dur)
        n.cpu.op, n.cpu.shapes = name, shapes
        if parent is not None:
            n.deps.add(id=parent, kind=pb.DEP_CONTROL)
        if mb is not None:
            n.annotations.microbatch = mb
        return n

    acc = "torch::autograd::AccumulateGrad"
    # two passes over the same two parameters, a forward op between them
    nodes = [op(1, "aten::linear", 0), op(2, acc, 10, shapes="[[4]]"), op(3, acc, 20, shapes="[[8]]"),
             op(4, "aten::linear", 30), op(5, acc, 40, shapes="[[4]]"), op(6, acc, 50, shapes="[[8]]")]
    accs = [n for n in nodes if n.name == acc]
    assert [n.id for n in last_backward(accs, nodes)] == [5, 6]
    # identical layers in one backward: no forward between them, every gradient kept
    inner = [op(7, "autograd::engine::evaluate_function: AddmmBackward0", 25),
             op(8, "aten::mm", 26, parent=7)]
    assert [n.id for n in last_backward(accs, nodes[1:3] + inner + nodes[4:])] == [2, 3, 5, 6]
    # identical layers, and another thread's op (a data loader's) between their gradients:
    # the training loop's thread (it marks the profiler's step) ran no forward there
    step = op(20, "ProfilerStep#3", 0, dur=100)
    loader = op(21, "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 25)
    loader.stream = 1
    accs2 = [op(2, acc, 10, shapes="[[4]]"), op(3, acc, 20, shapes="[[4]]"),
             op(5, acc, 30, shapes="[[4]]"), op(6, acc, 40, shapes="[[4]]")]
    assert [n.id for n in last_backward(accs2, [step, loader, *accs2])] == [2, 3, 5, 6]
    assert [n.id for n in last_backward(accs2, [loader, *accs2])] == [5, 6]   # no step marker: read as two
    # two backward calls over different parameters: one step's gradients, all kept
    other = [*nodes[:5], op(6, acc, 50, shapes="[[16]]")]
    assert [n.id for n in last_backward([n for n in other if n.name == acc], other)] == [2, 3, 5, 6]
    # the tracer's micro-batch annotation decides when present
    tagged = [op(1, acc, 0, mb=0), op(2, acc, 1, mb=1), op(3, acc, 2, mb=1)]
    assert [n.id for n in last_backward(tagged, tagged)] == [2, 3]


def test_untimed_graph_is_refused() -> None:
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads import GPTConfig, build_gpt

    cfg = GPTConfig(layers=2, hidden=64, heads=4, seq=32, micro_batch=1, vocab=256)
    job = trace(build_gpt(cfg), ParallelLayout(tp=2, pp=1, dp=1), TraceOptions(device="meta", warmup_steps=0),
                workload_attrs=cfg.to_json()).job
    with pytest.raises(EchoError, match="traced on the meta device.*`echo-et trace`"):
        inject_dp(job, dp=2)


@pytest.fixture(scope="module")
def traced():
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads import GPTConfig, build_gpt

    cfg = GPTConfig(layers=4, hidden=256, heads=4, seq=32, micro_batch=2, vocab=256, bucket_mb=0.5)
    cache: dict[tuple[int, int], object] = {}

    def get(dp: int, zero: int):
        if (dp, zero) not in cache:
            cache[dp, zero] = trace(build_gpt(cfg), ParallelLayout(tp=2, pp=2, dp=dp, microbatches=4, zero=zero),
                                    TraceOptions(device="cpu", warmup_steps=0), workload_attrs=cfg.to_json()).job
        return cache[dp, zero]

    return get


@pytest.mark.parametrize("zero", [0, 1])
def test_injected_job_reduces_what_the_job_traced_at_that_dp_reduces(traced, zero) -> None:
    """A TP2 x PP2 gpt Job traced with one replica (four micro-batches accumulated, CPU), given
    two replicas by inject with the workload's bucket cap: every rank's data-parallel
    reductions (type, members, bytes; ZeRO-1's reduce-scatter and all-gather per bucket) are
    those of the Job traced at dp = 2, and its other communication is unchanged. The second
    stage's received activation, a leaf autograd accumulates a gradient for, is not a bucket's."""
    one, two = traced(1, 0), traced(2, zero)
    out, report = inject_dp(one, dp=2, zero=zero, bucket_mb=0.5)
    assert check_job(out) == [] and out.world_size == 8
    assert report.buckets > 4    # several buckets per rank
    for r in range(8):
        assert _colls(out, r, "dp") == _colls(two, r, "dp"), r
        rest = sorted(c for c in _colls(out, r) if c not in _colls(out, r, "dp"))
        assert rest == sorted(c for c in _colls(two, r) if c not in _colls(two, r, "dp")), r
    assert simulate(out).step_time_ns > 0


def test_inject_one_replica_then_scale_is_inject_at_that_dp(tp_job) -> None:
    """``inject --dp 1`` gives a Job whose gradients are reduced over a one-rank group, which
    ``scale --dp N`` (and so ``sweep --dp``) then grows: the same Job as injecting N."""
    from echo_et.passes import scale

    one, _ = inject_dp(tp_job, dp=1, layout="tp=2")
    assert check_job(one) == [] and one.manifest.layout.dp == 1 and one.manifest.layout.tp == 2
    grown, _ = scale(one, dp=4)
    direct, _ = inject_dp(tp_job, dp=4, layout="tp=2")
    for r in range(8):
        assert _colls(grown, r) == _colls(direct, r)


def test_gradients_without_shapes() -> None:
    """A gradient recorded as no dense tensor (no dims, no dtype: a sparse embedding's) is
    left out of the buckets and said so; one recorded without its shape stops a multi-rank
    inject in one line, since its ranks cannot share one total of parameter bytes."""
    run = json.loads((TP_GLOO / "run.json").read_text())
    for shapes, dtypes in (('[[]]', '[""]'), ("", "")):
        job = read(sorted(TP_GLOO.glob("*.kineto.json.gz")), None, ReadOptions())
        g = job.graph("rank0")
        accs = [n for n in g.nodes if n.cpu.op == "torch::autograd::AccumulateGrad"]
        recorded = accs[-1].cpu.shapes      # one parameter (the shapes are unique), in both backwards
        first_dims = json.loads(recorded)[0]
        for n in accs:
            if n.cpu.shapes == recorded:
                n.cpu.shapes, n.cpu.dtypes = shapes, dtypes
        if shapes:
            out, report = inject_dp(job, dp=2, layout="tp=2")
            assert check_job(out) == []
            assert report.per_graph[0].param_source.endswith("(1 without a dense gradient left out)")
            n = 1
            for d in first_dims:
                n *= d
            assert report.per_graph[0].param_bytes == run["param_bytes_per_rank"] - 4 * n
            assert report.per_graph[1].param_bytes == run["param_bytes_per_rank"]
        else:
            with pytest.raises(EchoError, match="graph rank0: 1 of 6 AccumulateGrad ops have no usable "
                                                "shape/dtype; every rank's gradients need their shapes"):
                inject_dp(job, dp=2, layout="tp=2")


@pytest.mark.parametrize(("shapes", "dtypes", "undefined"), [
    ("[[]]", '[""]', True),                                   # Kineto: a sparse or undefined tensor
    ("[[]]", '["Tensor(nullptr (uninitialized))"]', True),    # the host ET's spelling
    ("[[]]", '["float"]', False),                             # a dense scalar
    ("[[4]]", '[""]', False),                                 # dims without a dtype: unsized, not undefined
    ("", "", False),                                          # nothing recorded
])
def test_undefined_input(shapes, dtypes, undefined) -> None:
    from echo_et.passes.gradients import undefined_input

    n = pb.Node(id=1, name="torch::autograd::AccumulateGrad", kind=pb.KIND_CPU_OP)
    n.cpu.shapes, n.cpu.dtypes = shapes, dtypes
    assert undefined_input(n) is undefined
