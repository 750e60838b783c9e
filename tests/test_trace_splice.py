"""Splicing the recording into a converted profile (torch-free, on a hand-built profile)."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, check_graph
from echo_et.ir.schema import pb
from echo_et.trace.identity import structure_hash
from echo_et.trace.records import CommRecord
from echo_et.trace.splice import splice

CTRL = pb.DEP_CONTROL


def _profile(thread_id: int = 4242):
    """A CPU profile as the Kineto reader gives it: nested host ops on one thread."""
    gb = GraphBuilder("rank0")
    s = gb.stream(pb.STREAM_CPU_THREAD, f"cpu:{thread_id}", native_id=thread_id)

    def op(name, start, end, parent=None):
        deps = [(parent, CTRL)] if parent else []
        return gb.cpu_op(name, s, start_ns=start, duration_ns=end - start, deps=deps).id

    fwd = op("echo:phase=forward:mb=0:stage=1", 0, 1000)
    layer = op("echo:layer=3", 10, 900, fwd)
    op("aten::mm", 20, 100, layer)
    grp = op("echo:group=tp", 120, 400, layer)
    comm = op("echo:comm#0", 130, 330, grp)
    op("aten::copy_", 150, 250, comm)          # the recording's local fill: 100 ns
    op("echo:wait#0", 340, 350, grp)
    op("aten::add", 500, 600, layer)
    op("echo:comm#1", 920, 950, fwd)           # an async send never waited for
    bwd = op("echo:phase=backward:mb=0:stage=1", 1050, 1400)
    op("echo:begin:layer=3", 1100, 1101, bwd)
    op("aten::mm", 1110, 1200, bwd)
    op("echo:end:layer=3", 1300, 1301, bwd)
    op("aten::sum", 1320, 1330, bwd)
    return gb.build()


RECORDS = [
    CommRecord(0, "all_reduce", (4, 5), "g1", "tp", 64, 64, "float32", waited=True),
    CommRecord(1, "send", (1, 5), "g2", "pp", 128, 0, "float32", peer=0, waited=False),
]


def _splice(graph=None, records=RECORDS):
    return splice(graph or _profile(), records, ["tp", "pp"], graph_id="rank5", device="cpu",
                  where="layout test, rank 5")


def _by_name(graph, name):
    return [n for n in graph.nodes if n.name == name]


def test_markers_and_fills_are_gone_and_comm_is_typed():
    res = _splice()
    g = res.graph
    assert not [n for n in g.nodes if n.name.startswith("echo:")]
    assert not _by_name(g, "aten::copy_")
    (coll,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    c = coll.collective
    assert (c.type, c.in_bytes, c.out_bytes, c.dtype, c.group, c.seq) == (
        pb.COLL_ALL_REDUCE, 64, 64, "float32", "tp", 0)
    assert coll.duration_ns == 0 and coll.attrs["timing"] == "placeholder"
    (send,) = [n for n in g.nodes if n.kind == pb.KIND_SEND]
    assert (send.p2p.group, send.p2p.peer, send.p2p.bytes) == ("pp", 0, 128)
    assert dict(g.header.group_sizes) == {"tp": 2, "pp": 2}
    assert check_graph(g) == []


def test_issue_wait_and_streams():
    g = _splice().graph
    streams = {s.id: s for s in g.header.streams}
    (issue,) = _by_name(g, "issue:all_reduce")
    (coll,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    (wait,) = _by_name(g, "wait:all_reduce")
    assert streams[issue.stream].name == "host:0" and streams[issue.stream].native_id == 0
    assert streams[coll.stream].name == "host-comm:tp"
    assert (issue.id, pb.DEP_DATA) in [(d.id, d.kind) for d in coll.deps]
    assert wait.kind == pb.KIND_SYNC and (coll.id, pb.DEP_SYNC) in [(d.id, d.kind) for d in wait.deps]
    (send,) = [n for n in g.nodes if n.kind == pb.KIND_SEND]
    assert streams[send.stream].name == "host-comm:pp:send:0"


def test_fill_time_is_cut_out_of_the_thread():
    g = _splice().graph
    (issue,) = _by_name(g, "issue:all_reduce")
    assert (issue.start_ns, issue.duration_ns) == (130, 100)   # 200 ns span minus 100 ns fill
    (add,) = _by_name(g, "aten::add")
    assert add.start_ns == 400                                  # 500 - 100
    (first_mm, _) = _by_name(g, "aten::mm")
    assert first_mm.start_ns == 20                              # before the fill: unmoved


def test_annotations_from_spans_and_backward_markers():
    g = _splice().graph
    fwd_mm, bwd_mm = _by_name(g, "aten::mm")
    a = fwd_mm.annotations
    assert (a.phase, a.layer, a.microbatch, a.stage) == ("forward", 3, 0, 1)
    (coll,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert coll.annotations.layer == 3 and coll.annotations.phase == "forward"
    b = bwd_mm.annotations
    assert (b.phase, b.layer) == ("backward", 3)
    (after,) = _by_name(g, "aten::sum")                         # after the end marker
    assert after.annotations.phase == "backward" and not after.annotations.HasField("layer")


def test_unobserved_wait_goes_to_the_end_of_the_thread():
    res = _splice()
    g = res.graph
    (w,) = _by_name(g, "wait:unobserved")
    (send,) = [n for n in g.nodes if n.kind == pb.KIND_SEND]
    assert [(d.id, d.kind) for d in w.deps] == [(send.id, pb.DEP_SYNC)]
    assert w.id == max(n.id for n in g.nodes if n.stream == w.stream)
    assert res.dropped["ex_situ_wait_not_observed"] == 1


def test_structure_ignores_times_and_thread_ids():
    a = _splice(_profile(thread_id=1)).graph
    b = _splice(_profile(thread_id=2)).graph
    for n in b.nodes:
        n.start_ns += 7
    assert structure_hash(a) == structure_hash(b)
    b.nodes[0].name = "aten::bmm"
    assert structure_hash(a) != structure_hash(b)


def test_a_record_missing_from_the_profile_is_an_error():
    extra = [*RECORDS, CommRecord(2, "all_reduce", (4, 5), "g1", "tp", 8, 8, "float32")]
    with pytest.raises(EchoError, match=r"rank 5: 1 recorded communication calls .*#2 all_reduce"):
        splice(_profile(), extra, ["tp", "pp", "tp"], graph_id="rank5", device="cpu",
               where="layout test, rank 5")


def _cuda_profile():
    """A GPU profile: host ops launching kernels; the fill inside the comm span is a memcpy."""
    gb = GraphBuilder("rank0")
    h = gb.stream(pb.STREAM_CPU_THREAD, "cpu:1", native_id=1)
    d = gb.stream(pb.STREAM_GPU_COMPUTE, "gpu0:stream7", device=0, native_id=7)
    mm = gb.cpu_op("aten::mm", h, start_ns=0, duration_ns=100).id
    l1 = gb.cpu_op("cudaLaunchKernel", h, kind=pb.KIND_LAUNCH, start_ns=10, duration_ns=10,
                   deps=[(mm, CTRL)]).id
    gb.compute("gemm", d, start_ns=30, duration_ns=120, deps=[(l1, pb.DEP_LAUNCH)])
    relu = gb.cpu_op("aten::relu", h, start_ns=170, duration_ns=25).id
    l0 = gb.cpu_op("cudaLaunchKernel", h, kind=pb.KIND_LAUNCH, start_ns=180, duration_ns=10,
                   deps=[(relu, CTRL)]).id
    span = gb.cpu_op("echo:comm#0", h, start_ns=200, duration_ns=100).id
    cp = gb.cpu_op("aten::copy_", h, start_ns=210, duration_ns=70, deps=[(span, CTRL)]).id
    l2 = gb.cpu_op("cudaMemcpyAsync", h, kind=pb.KIND_LAUNCH, start_ns=220, duration_ns=10,
                   deps=[(cp, CTRL)]).id
    gb.memcpy("Memcpy DtoD", d, nbytes=64, direction="DtoD", start_ns=240, duration_ns=10,
              deps=[(l2, pb.DEP_LAUNCH)])
    gb.cpu_op("echo:wait#0", h, start_ns=310, duration_ns=2)
    # launched before the collective was issued, running after it: the GPU lags the host
    gb.compute("relu_kernel", d, start_ns=320, duration_ns=20, deps=[(l0, pb.DEP_LAUNCH)])
    add = gb.cpu_op("aten::add", h, start_ns=400, duration_ns=50).id
    l3 = gb.cpu_op("cudaLaunchKernel", h, kind=pb.KIND_LAUNCH, start_ns=410, duration_ns=10,
                   deps=[(add, CTRL)]).id
    gb.compute("add_kernel", d, start_ns=430, duration_ns=10, deps=[(l3, pb.DEP_LAUNCH)])
    return gb.build()


def test_gpu_streams_launch_and_stream_waits():
    g = splice(_cuda_profile(), RECORDS[:1], ["tp"], graph_id="rank5", device="cuda",
               where="layout test, rank 5").graph
    assert check_graph(g) == []
    assert not [n for n in g.nodes if n.kind == pb.KIND_MEMCPY or n.name == "aten::copy_"]
    assert not [n for n in g.nodes if n.kind == pb.KIND_SYNC]   # the wait is a stream wait
    streams = {s.id: s for s in g.header.streams}
    (issue,) = _by_name(g, "issue:all_reduce")
    (coll,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    (relu,) = _by_name(g, "relu_kernel")
    (add,) = _by_name(g, "add_kernel")
    assert streams[coll.stream].kind == pb.STREAM_GPU_COMM
    assert streams[coll.stream].name == "gpu0-comm:tp" and streams[coll.stream].device == 0
    deps = {(x.id, x.kind) for x in coll.deps}
    assert deps == {(issue.id, pb.DEP_LAUNCH), (relu.id, pb.DEP_SYNC)}
    assert (coll.id, pb.DEP_SYNC) in {(x.id, x.kind) for x in add.deps}
    # the 70 ns fill left the host thread; the later launch and its kernel moved with it
    (launch,) = [n for n in g.nodes if n.kind == pb.KIND_LAUNCH and n.start_ns > 200]
    assert (launch.start_ns, add.start_ns) == (340, 360)
