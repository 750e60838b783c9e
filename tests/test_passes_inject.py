"""inject: DDP buckets on a single-GPU graph whose gradients the test defines itself."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError, OptionError
from echo_et.ir import GraphBuilder, JobBuilder, check_job
from echo_et.ir.schema import pb
from echo_et.ir.units import parse_bytes
from echo_et.passes.inject import bucket_gradients, inject_dp

MiB = 1 << 20
# (shape, dtype) of each gradient, in the order the backward produces them.
GRADS = [([1024, 1024], "float"), ([1024], "float"), ([2048, 4096], "float"), ([4096], "float"),
         ([4096, 2048], "float"), ([2048], "c10::Half")]


def grad_bytes(shape, dtype) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * (2 if dtype == "c10::Half" else 4)


def make_single_gpu_job(*, gpu: bool = True, shapes: bool = True):
    """Forward kernels, then per gradient an evaluate_function wrapper with a backward kernel
    and an AccumulateGrad op, then the optimizer step."""
    b = GraphBuilder("rank0")
    cpu = b.stream(pb.STREAM_CPU_THREAD, "thread 1")
    dev = b.stream(pb.STREAM_GPU_COMPUTE, "stream 7", device=0) if gpu else None
    t = 0

    def op(name, dur, parent=None, launch=False):
        nonlocal t
        n = b.cpu_op(name, cpu, start_ns=t, duration_ns=dur,
                     deps=[(parent.id, pb.DEP_CONTROL)] if parent else [])
        if launch and dev is not None:
            ln = b.cpu_op("cudaLaunchKernel", cpu, kind=pb.KIND_LAUNCH, start_ns=t + 1,
                          duration_ns=2, deps=[(n.id, pb.DEP_CONTROL)])
            b.compute(f"{name}_kernel", dev, start_ns=t + 5, duration_ns=3 * dur,
                      deps=[(ln.id, pb.DEP_LAUNCH)])
        return n

    op("aten::linear", 100, launch=True)
    t += 200
    for i, (shape, dtype) in enumerate(GRADS):
        wrap = op(f"autograd::engine::evaluate_function: MmBackward0#{i}", 50, launch=True)
        t += 60
        outer = op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 20)
        t += 2
        acc = op("torch::autograd::AccumulateGrad", 10, parent=outer)
        if shapes:
            acc.cpu.shapes = str([shape])
            acc.cpu.dtypes = str([dtype])
        del wrap
        t += 30
    op("Optimizer.step#SGD.step", 100, launch=True)
    t += 200
    jb = JobBuilder("single", 1, source_format="kineto")
    jb.add_graph(b.build())
    jb.bind(0, "rank0", measured_step_ns=t)
    job = jb.build()
    assert check_job(job) == []
    return job


def expected_buckets(first_cap: int, cap: int) -> list[int]:
    """DDP's rule written out for GRADS (one open bucket per dtype)."""
    out, open_, closed = [], {}, {}
    for shape, dtype in GRADS:
        size = open_.get(dtype, 0) + grad_bytes(shape, dtype)
        if size >= (cap if closed.get(dtype) else first_cap):
            out.append(size)
            closed[dtype] = 1
            open_.pop(dtype, None)
        else:
            open_[dtype] = size
    return out + list(open_.values())


@pytest.mark.parametrize("bucket_mb", [25.0, 4.0])
def test_inject_all_reduce_buckets_follow_ddp(bucket_mb: float) -> None:
    job = make_single_gpu_job()
    before = job.graph_of(0).content_hash()
    out, report = inject_dp(job, dp=1024, bucket_mb=None if bucket_mb == 25.0 else bucket_mb)
    assert job.graph_of(0).content_hash() == before
    assert check_job(out) == []
    assert out.world_size == 1024 and len(out.graph_ids()) == 1
    assert report.param_bytes == sum(grad_bytes(s, d) for s, d in GRADS)
    first = MiB if bucket_mb == 25.0 else int(bucket_mb * MiB)
    assert sorted(report.bucket_bytes) == sorted(expected_buckets(first, int(bucket_mb * MiB)))
    g = out.graph_of(0)
    colls = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert [n.collective.type for n in colls] == [pb.COLL_ALL_REDUCE] * report.buckets
    assert [n.collective.in_bytes for n in colls] == report.bucket_bytes
    comm_stream = g.stream(colls[0].stream)
    assert comm_stream.kind == pb.STREAM_GPU_COMM
    accs = {n.id: n for n in g.nodes if n.name == "torch::autograd::AccumulateGrad"}
    for c in colls:
        kinds = {d.kind: d.id for d in c.deps}
        assert kinds[pb.DEP_DATA] in accs          # issued after its last gradient's hook
        assert g.node(kinds[pb.DEP_SYNC]).kind == pb.KIND_COMPUTE  # after the kernel before it
    # The optimizer's kernel waits for every bucket.
    opt_kernel = next(n for n in g.nodes if n.name == "Optimizer.step#SGD.step_kernel")
    assert {d.id for d in opt_kernel.deps if d.kind == pb.DEP_SYNC} == {c.id for c in colls}
    assert out.resolve_group(1023, "dp").ranks[-1] == 1023


def test_inject_zero1_reduce_scatter_then_all_gather() -> None:
    job = make_single_gpu_job()
    out, report = inject_dp(job, dp=8, zero=1)
    assert check_job(out) == []
    colls = [n.collective for n in out.graph_of(0).nodes if n.kind == pb.KIND_COLLECTIVE]
    k = report.buckets
    assert [c.type for c in colls] == [pb.COLL_REDUCE_SCATTER] * k + [pb.COLL_ALL_GATHER] * k
    for rs, size in zip(colls[:k], report.bucket_bytes, strict=True):
        assert rs.out_bytes == -(-size // 8) and rs.in_bytes == rs.out_bytes * 8
    for ag, rs in zip(colls[k:], colls[:k], strict=True):
        assert ag.in_bytes == rs.out_bytes and ag.out_bytes == rs.in_bytes


def test_inject_cpu_only_trace_uses_host_comm_thread_and_param_bytes_fallback() -> None:
    job = make_single_gpu_job(gpu=False, shapes=False)
    with pytest.raises(OptionError, match="total parameter bytes") as err:
        inject_dp(job, dp=4)
    assert err.value.option == "param_bytes"
    out, report = inject_dp(job, dp=4, param_bytes=parse_bytes("60MiB"))
    assert check_job(out) == []
    assert report.param_bytes == 60 * MiB and report.gradients == len(GRADS)
    assert "spread over" in report.param_source
    g = out.graph_of(0)
    colls = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert g.stream(colls[0].stream).kind == pb.STREAM_CPU_THREAD
    opt = next(n for n in g.nodes if n.name == "Optimizer.step#SGD.step")
    assert {d.id for d in opt.deps if d.kind == pb.DEP_SYNC} == {c.id for c in colls}


def test_bucket_assignment_caps() -> None:
    class G:
        def __init__(self, i, n):
            self.nbytes, self.dtype = n, ""
            self.node = pb.Node(id=i, start_ns=10 * i)

    sizes = [MiB // 2, MiB // 2, MiB, 30 * MiB, 1]
    buckets = bucket_gradients([G(i, n) for i, n in enumerate(sizes)], MiB, 25 * MiB)
    assert [sum(g.nbytes for g in b) for b in buckets] == [MiB, 31 * MiB, 1]


def test_inject_refuses_bad_input() -> None:
    job = make_single_gpu_job()
    out, _ = inject_dp(job, dp=2)
    with pytest.raises(EchoError, match="already data-parallel .*dp=2.*echo-et scale"):
        inject_dp(out, dp=4)
    with pytest.raises(OptionError, match="12 is not a multiple of 8 GPUs per node") as err:
        inject_dp(job, dp=12, gpus_per_node=8)
    assert err.value.option == "gpus_per_node"
