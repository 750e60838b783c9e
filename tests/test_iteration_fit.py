"""Fitting the compute model to measured iterations through GPU- and host-bound paths."""

from __future__ import annotations

from dataclasses import replace

import pytest

from echo_et.experiments.iteration_fit import PathSample, fit_iterations, path_ns, predicted_ns
from echo_et.ir.schema import pb
from echo_et.models.compute import ComputeModel


def _mm(m: int) -> pb.Node:
    n = pb.Node(id=1, name="aten::mm", kind=pb.KIND_COMPUTE)
    n.compute.op = "aten::mm"
    n.compute.shapes = f"[[{m}, 2048], [2048, 2048]]"
    n.compute.dtypes = '["c10::Half", "c10::Half"]'
    return n


def _launch() -> pb.Node:
    n = pb.Node(id=2, name="launch", kind=pb.KIND_LAUNCH)
    n.cpu.op = "aten::mm"
    return n


def _samples(truth: ComputeModel):
    """Configurations from tiny (host-bound) to large (GPU-bound) GEMMs, 'measured' with a
    known model."""
    out = []
    for m in (16, 64, 256, 1024, 4096, 16384):
        for n_ops in (500, 2000):
            gpu = PathSample([(_mm(m), n_ops)], 1e6)
            host = PathSample([(_launch(), n_ops)], 2e5)
            out.append((gpu, host, predicted_ns(gpu, host, truth)))
    return out


def test_fit_recovers_the_host_issue_time_and_the_regimes() -> None:
    prior = ComputeModel.preset("a100")
    truth = ComputeModel(replace(prior.profile, params={**prior.profile.params, "host_launch_ns": 40_000.0}))
    samples = _samples(truth)
    assert any(path_ns(h, truth) > path_ns(g, truth) for g, h, _ in samples)   # both regimes present
    assert any(path_ns(g, truth) > path_ns(h, truth) for g, h, _ in samples)
    model, info = fit_iterations(samples, prior)
    assert model.host_launch_ns == pytest.approx(40_000, rel=0.05)
    for g, h, measured in samples:
        assert predicted_ns(g, h, model) == pytest.approx(measured, rel=0.05)
    assert info["host_bound"] == sum(1 for g, h, _ in samples if path_ns(h, truth) > path_ns(g, truth))
    assert info["train_mean_abs_log_error"] < 0.05


def test_path_sample_travels_between_processes() -> None:
    s = PathSample([(_mm(64), 3), (_launch(), 5)], 123.0)
    back = PathSample.from_wire(s.to_wire())
    assert [(n.kind, n.name, c) for n, c in back.calls] == [(n.kind, n.name, c) for n, c in s.calls]
    assert back.rest_ns == 123.0
