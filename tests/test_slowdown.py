"""The overlap-slowdown model: reading the Echo kernel dataset, fitting, honest evaluation."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from conftest import shared_path
from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, pb
from echo_et.models.slowdown import (
    SlowdownModel,
    cross_validate,
    default_model,
    fit,
    grouped_folds,
    read_csv_samples,
    samples_from_job,
)
from echo_et.models.slowdown.kernels import classify_kernel, short_kernel_name
from echo_et.models.slowdown.model import DEFAULT_CLASSES, DEFAULT_GLOBAL

CSV = "slowdown/echo-a100-gpt2/merged_features.csv"


@pytest.fixture(scope="module")
def samples():
    return read_csv_samples(shared_path(CSV))


def test_csv_columns_mean_what_we_read(samples) -> None:
    """The file's own ``slowdown`` column is (duration - ground_truth) / (overlap * ground_truth)."""
    with open(shared_path(CSV), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(samples) == len(rows) == 619
    assert sum(1 for x in samples if x.overlap > 0) == sum(1 for r in rows if float(r["overlap_ratio"]) > 0)
    for x, r in zip(samples, rows, strict=True):
        if x.overlap > 0:
            s = (x.observed_ns - x.isolated_ns) / (x.overlap * x.isolated_ns)
            assert s == pytest.approx(float(r["slowdown"]), abs=1e-3, rel=1e-3)
        assert x.name == r["kShortName"]


def test_grouped_folds_never_share_a_kernel_name(samples) -> None:
    folds = grouped_folds(samples, 5)
    seen: dict[str, int] = {}
    for x, f in zip(samples, folds, strict=True):
        assert seen.setdefault(x.group, f) == f
    sizes = np.bincount(folds)
    assert len(sizes) == 5 and sizes.min() > 0


def test_shipped_defaults_are_the_fit_of_the_dataset(samples) -> None:
    m = fit(samples, per_kernel=False)
    assert m.global_s == pytest.approx(DEFAULT_GLOBAL, abs=1e-4)
    assert set(m.classes) == set(DEFAULT_CLASSES)
    for k, v in DEFAULT_CLASSES.items():
        assert m.classes[k] == pytest.approx(v, abs=1e-4), k


def test_fit_follows_the_data(samples) -> None:
    """In the file, GammaBeta (layer-norm backward) kernels run ~4x longer when overlapped,
    sgemm kernels barely change."""
    gb = [x for x in samples if x.name == "GammaBetaBackwardCUDAKernel_32x32" and x.overlap >= 0.9]
    sg = [x for x in samples if x.name.startswith("ampere_sgemm") and x.overlap >= 0.9]
    assert np.median([x.observed_ns / x.isolated_ns for x in gb]) > 3
    assert abs(np.median([x.observed_ns / x.isolated_ns for x in sg]) - 1) < 0.05
    m = fit(samples)
    assert m.s_for("GammaBetaBackwardCUDAKernel_32x32", "norm") > 2
    assert m.s_for("ampere_sgemm_128x64_tn", "gemm") < 0.1
    # time-weighted: on the training data the model reproduces the summed overlapped time
    ov = [x for x in samples if x.overlap > 0]
    pred = sum(x.isolated_ns * m.factor_for(x.name, x.kernel_class, x.overlap) for x in ov)
    assert pred == pytest.approx(sum(x.observed_ns for x in ov), rel=0.03)


def test_grouped_cross_validation_beats_a_constant_factor(samples) -> None:
    cv = cross_validate(samples, 5)
    assert cv["folds"] == 5 and cv["overlapped"] == 404
    assert cv["model"]["fold_sum_abs_error_pct"] < cv["constant"]["fold_sum_abs_error_pct"]


def test_factor_lookup_clipping_and_cap() -> None:
    m = SlowdownModel(global_s=0.5, classes={"gemm": 0.1, "norm": -1.0}, kernels={"my_kernel": 3.0}, max_factor=2.0)
    assert m.factor_for("void ns::my_kernel<float>(float*)", "gemm", 0.5) == 2.0  # 1 + 3*0.5 capped at 2
    assert m.factor_for("other_kernel", "gemm", 1.0) == pytest.approx(1.1)
    assert m.factor_for("other_kernel", "norm", 1.0) == 1.0  # negative slowdown clipped to 0
    assert m.factor_for("other_kernel", "conv", 0.5) == pytest.approx(1.25)  # global
    node = pb.Node(name="x", kind=pb.KIND_COMPUTE)
    node.compute.op = "ampere_sgemm_128x64_tn"
    assert m.factor(node, 100, 0.0) == 1.0
    assert m.factor(node, 100, 1.0) == pytest.approx(1.1)  # classified as gemm from its name


def test_kernel_names_and_classes() -> None:
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, " \
           "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
    assert short_kernel_name(name) == "vectorized_elementwise_kernel"
    assert classify_kernel(name) == "elementwise"
    assert classify_kernel("ampere_sgemm_128x64_tn") == "gemm"
    assert classify_kernel("fmha_cutlassB_f32_aligned_64x64_k64_dropout_sm80") == "attention"
    assert classify_kernel("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<float>()") \
        == "norm"


def test_model_file_round_trip_and_bad_files(tmp_path) -> None:
    m = default_model()
    p = tmp_path / "m.json"
    m.save(p)
    back = SlowdownModel.load(p)
    assert back.to_json() == m.to_json()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(EchoError, match="not a JSON slowdown model"):
        SlowdownModel.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(EchoError, match="not an echo-et slowdown model"):
        SlowdownModel.load(tmp_path / "other.json")
    (tmp_path / "nan.json").write_text(json.dumps({"format": "echo-et-slowdown/1", "global": "nan"}))
    with pytest.raises(EchoError, match="global = nan is not a number"):
        SlowdownModel.load(tmp_path / "nan.json")


def test_bad_csv_is_refused(tmp_path) -> None:
    p = tmp_path / "x.csv"
    p.write_text("a,b\n1,2\n")
    with pytest.raises(EchoError, match="missing column"):
        read_csv_samples(p)
    p.write_text("kShortName,ground_truth,duration,overlap_ratio\nk,10,abc,0.5\n")
    with pytest.raises(EchoError, match=r"x.csv:2: .* not numbers"):
        read_csv_samples(p)
    p.write_text("kShortName,ground_truth,duration,overlap_ratio\nk,10,12,1.5\n")
    with pytest.raises(EchoError, match="overlap_ratio in"):
        read_csv_samples(p)


def test_samples_from_a_jobs_own_kernels() -> None:
    """Kernel k runs twice alone (100 ns) and once fully under an all-reduce (160 ns)."""
    jb = JobBuilder("j", 1)
    g = jb.group([0], name="0")
    gb = GraphBuilder("g")
    s, c = gb.stream(pb.STREAM_GPU_COMPUTE, "s", device=0), gb.stream(pb.STREAM_GPU_COMM, "c", device=0)
    gb.compute("k", s, start_ns=0, duration_ns=100)
    gb.compute("k", s, start_ns=200, duration_ns=100)
    gb.compute("k", s, start_ns=400, duration_ns=160)
    gb.collective("ar", c, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=8, start_ns=390, duration_ns=200)
    jb.add_graph(gb.build())
    jb.bind(0, "g", {"dp": g})
    got = samples_from_job(jb.build())
    assert len(got) == 1
    x = got[0]
    assert (x.name, x.isolated_ns, x.observed_ns, x.overlap) == ("k", 100.0, 160.0, 1.0)
    m = fit(got, prior=default_model())
    assert 0 < m.kernels["k"] < 0.6  # 0.6 measured, shrunk toward the prior's class factor
