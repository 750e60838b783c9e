"""Pipeline re-staging: the generated 1F1B schedule and re-staged traced GPT Jobs."""

from __future__ import annotations

import pytest

from echo_et.passes.pipeline import p2p_stream_name, schedule


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
    pipeline = pytest.importorskip("echo_et.workloads.pipeline")
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
