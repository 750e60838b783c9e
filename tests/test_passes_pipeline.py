"""Pipeline re-staging: the generated 1F1B schedule and re-staged traced GPT Jobs."""

from __future__ import annotations

import pytest

from echo_et.passes.pipeline import schedule
from echo_et.passes.stage_write import p2p_stream_name


class _RecordingLink:
    """Stands in for the workload's StageLink: records the transfers one_f_one_b posts."""

    def __init__(self, stage: int, stages: int, log: list):
        self.stage, self.stages, self.log = stage, stages, log
        self.first, self.last = stage == 0, stage == stages - 1

    def _p2p(self, *ops):
        self.log.append(("P2P", ops))

    def recv_forward(self, mb):
        if not self.first:
            self._p2p((False, -1))

    def send_forward(self, out, mb):
        if not self.last:
            self._p2p((True, 1))

    def recv_backward(self, mb):
        if not self.last:
            self._p2p((False, 1))

    def send_backward(self, grad, mb):
        if not self.first:
            self._p2p((True, -1))

    def send_forward_recv_backward(self, out, send_mb, recv_mb):
        if not self.last:
            self._p2p((True, 1), (False, 1))

    def send_backward_recv_forward(self, grad, send_mb, recv_mb):
        if not self.first:
            self._p2p((True, -1), (False, -1))


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 1), (2, 4), (4, 2), (4, 8), (3, 5)])
def test_schedule_is_the_workloads_1f1b(stages: int, microbatches: int) -> None:
    """The generated order equals what the GPT workload's own one_f_one_b posts."""
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.workloads import pipeline
    for stage in range(stages):
        log: list = []
        link = _RecordingLink(stage, stages, log)
        pipeline.one_f_one_b(link, microbatches,
                             lambda mb, inp, log=log: log.append(("F", mb)),
                             lambda mb, i, o, g, log=log: log.append(("B", mb)))
        assert schedule(stage, stages, microbatches) == log, (stage, stages, microbatches)


def test_schedule_sends_match_receives() -> None:
    stages, m = 4, 6
    for s in range(stages - 1):
        sends = sum(1 for it in schedule(s, stages, m) if it[0] == "P2P" for op in it[1] if op == (True, 1))
        recvs = sum(1 for it in schedule(s + 1, stages, m) if it[0] == "P2P" for op in it[1] if op == (False, -1))
        assert sends == recvs == m


def test_p2p_stream_names_follow_the_tracer() -> None:
    assert p2p_stream_name("host-comm:pp:send:1", False, 3) == "host-comm:pp:recv:3"
    assert p2p_stream_name("gpu0-comm:pp:recv:0", True, 1) == "gpu0-comm:pp:send:1"
    assert p2p_stream_name("nccl", True, 1) == "nccl"


# -- host time that no layer owns ------------------------------------------------------------
def _op(b, cpu, name: str, start: int, dur: int, *, phase: str = "forward", mb: int = 0,
        layer: int | None = None):
    n = b.cpu_op(name, cpu, start_ns=start, duration_ns=dur)
    n.annotations.phase = phase
    n.annotations.microbatch = mb
    if layer is not None:
        n.annotations.layer = layer
    return n


def test_units_keep_the_host_time_between_them() -> None:
    """A unit remembers the gap before it (glue code between layers) and is placed that far
    after the unit before it in the new schedule."""
    from echo_et.ir import GraphBuilder
    from echo_et.ir.schema import pb
    from echo_et.passes.stage_read import _split_layers
    from echo_et.passes.stage_write import Emitter

    b = GraphBuilder("g")
    cpu = b.stream(pb.STREAM_CPU_THREAD, "main")
    nodes = [_op(b, cpu, "embed", 0, 10), _op(b, cpu, "l0", 25, 30, layer=0),
             _op(b, cpu, "l1", 70, 20, layer=1), _op(b, cpu, "head", 100, 5)]
    units, pre, post = _split_layers(nodes)
    assert (pre.lead_ns, units[0].lead_ns, units[1].lead_ns, post.lead_ns) == (0, 15, 15, 10)
    e = Emitter("new", {"g": {s.id: s for s in b.graph.header.streams}})
    e.clock = 1000
    made = e.unit("g", units[1], mb=0, stage=0)
    assert made[0].start_ns == 1015 and e.clock == 1035
    made = e.unit("g", post, mb=0, stage=0)
    assert made[0].start_ns == 1045


def test_block_glue_is_the_median_gap_less_p2p() -> None:
    """Between micro-batch blocks the schedule spends host time (posting, Python) that no
    block owns; the P2P in the gap is counted apart (the schedule posts it again)."""
    from echo_et.ir import GraphBuilder
    from echo_et.ir.schema import pb
    from echo_et.passes.stage_read import _block_glue

    b = GraphBuilder("g")
    cpu = b.stream(pb.STREAM_CPU_THREAD, "main")
    p2p_stream = b.stream(pb.STREAM_CPU_THREAD, "host-comm:pp:send:1")
    blocks = {("forward", 0): [_op(b, cpu, "f0", 0, 100)],
              ("forward", 1): [_op(b, cpu, "f1", 130, 100, mb=1)],        # gap 30, p2p 20
              ("backward", 0): [_op(b, cpu, "b0", 250, 100, phase="backward")],   # gap 20
              ("backward", 1): [_op(b, cpu, "b1", 400, 100, phase="backward", mb=1)]}  # gap 50
    p2p = [b.p2p(True, "pp:send", p2p_stream, group="pp", peer=1, nbytes=64, start_ns=105,
                 duration_ns=20)]
    assert _block_glue(blocks, p2p) == 20      # glue 10, 20, 50 -> median 20
    assert _block_glue(blocks, []) == 30
    assert _block_glue({}, []) == 0


def test_optimizer_scaled_as_a_whole() -> None:
    """A stage with a share of the parameters runs the template's optimizer with its whole
    timeline (operators and the gaps between them) stretched by that share."""
    from echo_et.ir import GraphBuilder
    from echo_et.ir.schema import pb
    from echo_et.passes.stage_read import Unit
    from echo_et.passes.stage_write import Emitter

    b = GraphBuilder("g")
    cpu = b.stream(pb.STREAM_CPU_THREAD, "main")
    step = _op(b, cpu, "Optimizer.step", 100, 100, phase="optimizer")
    inner = b.cpu_op("aten::add_", cpu, start_ns=120, duration_ns=40, deps=[(step.id, pb.DEP_CONTROL)])
    e = Emitter("new", {"g": {s.id: s for s in b.graph.header.streams}})
    made = e.unit("g", Unit([step, inner]), mb=None, stage=0, scale=0.5)
    assert [(n.start_ns, n.duration_ns) for n in made] == [(0, 50), (10, 20)]
