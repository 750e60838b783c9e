"""Tracing the distinct ranks on several processes (echo_et.trace.parallel) gives the Job a
serial trace gives, byte for byte, and a child that fails costs only time."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="meta-device tracing needs torch (the trace extra)")

from echo_et.ir.io import save_job  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, parallel, trace  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

SMALL = GPTConfig.megatron(layers=4, hidden=64, heads=4, seq=32, micro_batch=1, vocab=256, recompute=True)


def _job_bytes(tmp_path, name: str, layout: ParallelLayout, jobs: int, verify: str = "stage") -> dict[str, bytes]:
    job = trace(build_gpt(SMALL), layout, TraceOptions(device="meta", verify=verify, warmup_steps=0,
                                                        jobs=jobs, check=False)).job
    out = tmp_path / name
    save_job(job, out)
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.skipif(not parallel.can_fork(), reason="parallel tracing forks (Linux only)")
@pytest.mark.parametrize(("layout", "verify"), [
    (ParallelLayout(dp=2, tp=2, pp=4, microbatches=5), "stage"),
    (ParallelLayout(dp=1, tp=2, pp=2, microbatches=3), "all"),
])
def test_parallel_trace_is_the_serial_trace(tmp_path, monkeypatch, layout, verify) -> None:
    serial = _job_bytes(tmp_path, "serial", layout, 1, verify)
    forks = []
    real_fork = parallel.os.fork

    def counted_fork():
        forks.append(1)
        return real_fork()

    monkeypatch.setattr(parallel.os, "fork", counted_fork)
    forked = _job_bytes(tmp_path, "forked", layout, 2, verify)
    assert forks, "no rank was traced in a child"
    assert serial.keys() == forked.keys()
    assert serial == forked


@pytest.mark.skipif(not parallel.can_fork(), reason="parallel tracing forks (Linux only)")
def test_a_failed_child_is_traced_again_by_the_parent(tmp_path, monkeypatch) -> None:
    """A child that dies sends nothing: its ranks are traced in the parent, same Job."""
    import os

    layout = ParallelLayout(dp=1, tp=1, pp=4, microbatches=4)
    serial = _job_bytes(tmp_path, "serial", layout, 1)
    parent = os.getpid()
    real = parallel.pickle.dumps

    def dies_in_child(obj, *a, **k):
        if os.getpid() != parent:
            os._exit(9)
        return real(obj, *a, **k)

    monkeypatch.setattr(parallel.pickle, "dumps", dies_in_child)
    assert _job_bytes(tmp_path, "forked", layout, 3) == serial


def test_shares_deal_ranks_round_robin() -> None:
    assert parallel.shares([1, 2, 3, 4, 5], 2) == [[1, 3, 5], [2, 4]]
    assert parallel.shares([7], 4) == [[7]]
    assert parallel.shares([], 2) == [[]]
