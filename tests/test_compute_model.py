"""The compute model's roofline (monotonic, limits, quantisation), presets, profiles and fit."""

from __future__ import annotations

import json
import math

import pytest

from conftest import shared_path
from echo_et.errors import EchoError
from echo_et.models.compute import ComputeModel, gpu_names, resolve_gpu
from echo_et.models.compute import kernels as K
from echo_et.models.compute.fit import Sample, fit, predict
from echo_et.models.compute.profile import default_profile, dumps, from_json, load_profile, to_json
from echo_et.models.compute.roofline import gemm_utilisation, kernel_time_ns

BF = '"c10::BFloat16"'


def mm(m: ComputeModel, a: int, b: int, c: int, dtype: str = BF) -> int:
    return m.op_time_ns("aten::mm", f"[[{a}, {c}], [{c}, {b}]]", f"[{dtype}, {dtype}]")


@pytest.fixture(scope="module")
def a100() -> ComputeModel:
    return ComputeModel.preset("a100")


def test_presets_and_gpu_names():
    assert {"a100", "a100-80gb", "h100", "h800", "v100"} <= set(gpu_names())
    assert resolve_gpu("NVIDIA A100-SXM4-80GB") == "a100-80gb"
    assert resolve_gpu("NVIDIA A100-SXM4-40GB") == "a100"
    assert resolve_gpu("H100 80GB HBM3") == "h100"
    assert resolve_gpu("Tesla V100-SXM2-16GB") == "v100-16gb"
    with pytest.raises(EchoError) as e:
        resolve_gpu("tpu-v5")
    assert "presets: a100" in str(e.value) and "\n" not in str(e.value)
    h = ComputeModel.preset("h100")
    assert not h.profile.calibrated and h.profile.params == ComputeModel.preset("a100").profile.params
    assert h.profile.gpu.peak_tflops["bf16"] == pytest.approx(989.4)


def test_gemm_time_is_monotonic_in_every_dimension(a100):
    base = mm(a100, 2048, 2048, 2048)
    for a, b, c in ((4096, 2048, 2048), (2048, 4096, 2048), (2048, 2048, 4096)):
        assert mm(a100, a, b, c) > base
    prev = 0
    for n in (64, 128, 512, 1024, 2048, 4096, 8192, 16384):
        t = mm(a100, n, n, n)
        assert t >= prev
        prev = t


def test_gemm_limits_overhead_for_tiny_peak_fraction_for_huge(a100):
    p = a100.profile.params
    oh = p["kernel_overhead_ns"]
    assert oh <= mm(a100, 8, 8, 8) < oh + 1000     # one tile of one wave
    n = 16384
    t = mm(a100, n, n, n)
    ideal = 2 * n**3 / 312e12 * 1e9
    eff = ideal / t
    assert 0.5 * p["gemm_eff.tensor"] < eff <= p["gemm_eff.tensor"]


def test_wave_quantisation_one_more_tile_costs_a_wave():
    sms = 108
    # 108 tiles of 256x128 fill one wave; one more column of tiles needs a second wave
    full = gemm_utilisation(256 * 108, 128, 4096, 1, sms, True, 0.0)
    over = gemm_utilisation(256 * 108 + 256, 128, 4096, 1, sms, True, 0.0)
    assert full == pytest.approx(1.0)
    assert over < 0.75


def test_memory_bound_time_follows_bandwidth(a100):
    big = [1 << 24]
    t1 = a100.op_time_ns("aten::add", json.dumps([big, big]), '["float", "float"]')
    t2 = a100.op_time_ns("aten::add", json.dumps([[2 << 24], [2 << 24]]), '["float", "float"]')
    assert t2 > t1
    oh = a100.profile.params["kernel_overhead_ns"]
    assert (t2 - oh) / (t1 - oh) == pytest.approx(2.0, rel=0.01)
    h = ComputeModel.preset("h100")
    th = h.op_time_ns("aten::add", json.dumps([big, big]), '["float", "float"]')
    assert (t1 - oh) / (th - oh) == pytest.approx(3350 / 1555, rel=0.01)


def test_faster_gpu_is_faster_and_fp32_is_slower_than_tensor_cores(a100):
    for gpu in ("h100", "h800"):
        assert mm(ComputeModel.preset(gpu), 8192, 8192, 8192) < mm(a100, 8192, 8192, 8192)
    assert mm(ComputeModel.preset("v100"), 8192, 8192, 8192) > mm(a100, 8192, 8192, 8192)
    assert mm(a100, 4096, 4096, 4096, '"float"') > 5 * mm(a100, 4096, 4096, 4096)
    # BF16 has no tensor cores on V100: it runs at the FP32 rate
    v = ComputeModel.preset("v100")
    assert mm(v, 4096, 4096, 4096) > 4 * mm(v, 4096, 4096, 4096, '"c10::Half"')


def test_ops_without_gpu_work_cost_zero(a100):
    assert a100.op_time_ns("aten::view", "[[4, 4], []]", '["float", "ScalarList"]') == 0


def test_profile_round_trip_and_bad_files(tmp_path):
    p = default_profile("a100")
    assert from_json(json.loads(dumps(p)), "x") == from_json(to_json(p), "y")
    f = tmp_path / "c.json"
    f.write_text("{not json")
    with pytest.raises(EchoError, match="not a JSON compute profile"):
        load_profile(f)
    obj = to_json(p)
    obj["params"]["gemm_eff"]["tensor"] = 1.5
    f.write_text(json.dumps(obj))
    with pytest.raises(EchoError, match="gemm_eff.tensor must be in"):
        load_profile(f)
    obj = to_json(p)
    obj["schema"] = "other/1"
    f.write_text(json.dumps(obj))
    with pytest.raises(EchoError, match="schema"):
        load_profile(f)


def _synthetic_samples(truth) -> list[Sample]:
    out = []
    for i, n in enumerate((256, 512, 1024, 2048, 4096)):
        k = K.gemm(n, n, n, 1, "bf16", 3 * n * n * 2)
        s = Sample(((k, 1.0),), 0.0, group=f"g{i}", source="kernels")
        out.append(Sample(s.items, predict(s, truth), group=s.group, source="kernels"))
    for i, b in enumerate((1e5, 1e6, 1e7, 1e8, 1e9)):
        for cls in ("elementwise", "reduction"):
            s = Sample(((K.mem(cls, b), 2.0),), 0.0, group=f"m{i}{cls}", source="kernels")
            out.append(Sample(s.items, predict(s, truth), group=s.group, source="kernels"))
    return out


def test_fit_recovers_known_parameters_and_is_deterministic():
    prior = default_profile("a100")
    truth_params = dict(prior.params, **{"gemm_eff.tensor": 0.61, "mem_eff.elementwise": 0.83,
                                         "mem_eff.reduction": 0.55, "kernel_overhead_ns": 4000.0})
    truth = type(prior)(**{**prior.__dict__, "params": truth_params})
    samples = _synthetic_samples(truth)
    r1 = fit(samples, prior)
    r2 = fit(list(samples), prior)
    assert r1.profile.params == r2.profile.params
    p = r1.profile.params
    assert p["gemm_eff.tensor"] == pytest.approx(0.61, rel=0.02)
    assert p["mem_eff.elementwise"] == pytest.approx(0.83, rel=0.02)
    assert p["mem_eff.reduction"] == pytest.approx(0.55, rel=0.02)
    assert p["kernel_overhead_ns"] == pytest.approx(4000, rel=0.05)
    assert max(abs(predict(s, r1.profile) / s.measured_ns - 1) for s in samples) < 0.03


def test_fit_keeps_fixed_parameters_and_stays_in_bounds():
    prior = default_profile("a100")
    samples = [Sample(((K.gemm(4096, 4096, 4096, 1, "bf16", 1e8), 1.0),), 1.0, group="g", source="kernels")]
    r = fit(samples, prior, fixed=("gemm_eff.tensor",))
    assert r.profile.params["gemm_eff.tensor"] == prior.params["gemm_eff.tensor"]
    r = fit(samples, prior)    # impossibly fast: efficiency pinned at its bound
    assert r.profile.params["gemm_eff.tensor"] == 1.0
    assert all(math.isfinite(v) for v in r.profile.params.values())


def test_fit_needs_samples():
    with pytest.raises(EchoError, match="no samples"):
        fit([], default_profile("a100"))


def test_kernel_time_pays_the_overhead_per_kernel(a100):
    k = K.mem("elementwise", 0.0)
    assert kernel_time_ns(k, a100.profile.gpu, a100.profile.params) == a100.profile.params["kernel_overhead_ns"]


# -- real data -------------------------------------------------------------------------------
def test_merged_features_become_kernel_samples_with_shapes_from_the_model():
    from echo_et.models.compute.data import read_kernel_samples

    samples, excluded = read_kernel_samples(shared_path("slowdown/echo-a100-gpt2/merged_features.csv"))
    assert len(samples) == 587 and len(excluded) == 12
    gemms = [s for s in samples if s.items[0][0].kind == K.GEMM]
    assert len(gemms) == 96 and all(s.group.startswith("ampere_sgemm") for s in gemms)
    fc2 = next(s for s in samples if s.label.startswith("h11.mlp.c_proj.dgrad"))
    k = fc2.items[0][0]
    assert (k.m, k.n, k.k, k.math) == (8192, 3072, 768, "fp32")


def test_merged_features_reader_refuses_another_file(tmp_path):
    from echo_et.models.compute.data import read_kernel_samples

    src = shared_path("slowdown/echo-a100-gpt2/merged_features.csv").read_text("utf-8").splitlines()
    f = tmp_path / "m.csv"
    f.write_text("\n".join([src[0], *src[5:]]) + "\n")
    with pytest.raises(EchoError, match="row 1 is"):
        read_kernel_samples(f)


def test_aicb_layers_and_the_physically_impossible_ones():
    from echo_et.models.compute.data import layer_samples, read_aicb_layers

    base = shared_path("workloads/aicb/workload/simAI/model_workload")
    lt = read_aicb_layers(base / "G175B-M1-C03_GPT175B_megatron_tp8_pp1_mbs1_A100.txt")
    assert (lt.shape.hidden, lt.shape.seq, lt.shape.tp) == (12288, 2048, 8)
    assert lt.forward_ns == 2571000 + 1584000
    assert read_aicb_layers(base / "L7B-D1-C02_Llama7B_deepspeed_zero3_A100.txt") is None
    l7 = read_aicb_layers(base / "L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt")
    samples, excluded = layer_samples(l7, 312e12)
    assert len(excluded) == 2 and all(s.source == "layers-excluded" for s in samples)


def test_fit_end_to_end_recovers_the_tensor_gemm_efficiency_and_keeps_the_rest():
    from dataclasses import replace

    from echo_et.models.compute import fit_end_to_end
    from echo_et.models.compute.layers import LayerShape, layer_backward, layer_forward

    prior = ComputeModel.preset("a100")
    truth = ComputeModel(replace(prior.profile, params={**prior.profile.params, "gemm_eff.tensor": 0.55}))
    samples = []
    for hidden, tp, layers in ((1024, 1, 24), (2048, 2, 12), (2048, 4, 24), (4096, 8, 16)):
        shape = LayerShape("gpt", hidden, 16, 4 * hidden, 1024, 4, tp, "fp16")
        calls = [(c, layers) for block in (*layer_forward(shape), *layer_backward(shape)) for c in block]
        rest = 5e6
        measured = rest + sum(n * truth.op_time_ns(c.op, c.shapes, c.dtypes, c.attrs) for c, n in calls)
        samples.append((calls, rest, measured))
    fitted = fit_end_to_end(samples, prior, params=("gemm_eff.tensor",))
    assert fitted.profile.params["gemm_eff.tensor"] == pytest.approx(0.55, rel=0.03)
    same = {k: v for k, v in fitted.profile.params.items() if k != "gemm_eff.tensor"}
    assert same == {k: v for k, v in prior.profile.params.items() if k != "gemm_eff.tensor"}


def test_fit_end_to_end_fits_the_host_launch_time_from_launch_nodes():
    from echo_et.ir.schema import pb
    from echo_et.models.compute import fit_end_to_end

    prior = ComputeModel.preset("a100")
    launch = pb.Node(kind=pb.KIND_LAUNCH, name="launch:aten::add")
    add = pb.ComputeInfo(op="aten::add", shapes="[[1024], [1024]]", dtypes='["float", "float"]')
    samples = [([(launch, n), (add, n)], 1e6, 1e6 + n * (38_000 + prior.op_time_ns(add.op, add.shapes, add.dtypes)))
               for n in (100, 400, 1600, 6400)]
    fitted = fit_end_to_end(samples, prior, params=("host_launch_ns",))
    assert fitted.profile.params["host_launch_ns"] == pytest.approx(38_000, rel=0.02)


# -- the sustained tensor-core ceiling ----------------------------------------------------------
def _with(profile, **params):
    from dataclasses import replace

    return replace(profile, params={**profile.params, **{k.replace("__", "."): v for k, v in params.items()}})


def test_sustained_ceiling_caps_large_gemms_and_leaves_wave_bound_ones_alone():
    from echo_et.models.compute.roofline import parts

    prior = _with(default_profile("a100"), gemm_eff__tensor=1.0, kernel_overhead_ns=0.0)
    capped = _with(prior, sustained_eff__tensor=0.75)
    gpu = prior.gpu
    big = K.gemm(16384, 16384, 16384, 1, "bf16", 3 * 16384 * 16384 * 2)
    # no GEMM runs faster than the ceiling x the data-sheet peak
    assert kernel_time_ns(big, gpu, capped.params) == pytest.approx(big.flops / (0.75 * 312e12) * 1e9, rel=1e-9)
    assert kernel_time_ns(big, gpu, prior.params) < kernel_time_ns(big, gpu, capped.params)
    # one tile row over a full wave: the tiling keeps it below the ceiling, which does not bind
    small = K.gemm(256 * 108 + 256, 128, 4096, 1, "bf16", 1e6)
    assert parts(small, gpu, prior.params).cns > parts(small, gpu, prior.params).sns / 0.75
    assert kernel_time_ns(small, gpu, capped.params) == kernel_time_ns(small, gpu, prior.params)
    # FP32 (SIMT) GEMMs and memory-bound kernels have no such side
    assert parts(K.gemm(4096, 4096, 4096, 1, "fp32", 1e6), gpu, prior.params).sp == ""
    assert parts(K.mem("elementwise", 1e6), gpu, prior.params).sp == ""


def test_each_kernel_is_bound_by_the_side_that_sets_its_time():
    """``Parts.bound`` names the side of the max; the binding side's ns and the overhead add up
    to the kernel's time (what the retime report splits the compute time by)."""
    from echo_et.models.compute.roofline import kernel_bound_ns

    prior = _with(default_profile("a100"), gemm_eff__tensor=1.0, kernel_overhead_ns=1500.0)
    capped = _with(prior, sustained_eff__tensor=0.75)
    gpu = prior.gpu
    big = K.gemm(16384, 16384, 16384, 1, "bf16", 3 * 16384 * 16384 * 2)
    small = K.gemm(256 * 108 + 256, 128, 4096, 1, "bf16", 1e6)
    thin = K.gemm(8192, 8192, 64, 1, "bf16", 2 * (8192 * 64 * 2 + 8192 * 8192))   # reads little, writes much
    cases = ((big, capped, "ceiling"), (big, prior, "compute"), (small, capped, "compute"),
             (K.mem("elementwise", 1e8), capped, "memory"), (thin, capped, "memory"),
             (K.gemm(4096, 4096, 4096, 1, "fp32", 1e6), capped, "compute"))
    for kernel, profile, side in cases:
        got, ns, overhead = kernel_bound_ns(kernel, gpu, profile.params)
        assert got == side, (kernel, side)
        assert overhead == 1500.0
        assert ns + overhead == pytest.approx(kernel_time_ns(kernel, gpu, profile.params), rel=1e-12)


def test_an_operators_bounds_add_up_to_its_price(a100):
    shapes = ("[[8192, 5120], [5120, 5120]]", f"[{BF}, {BF}]")
    ns, status = a100.op_cost("aten::mm", *shapes)
    split = a100.op_bounds("aten::mm", *shapes)
    assert status == "priced" and set(split) == {"ceiling", "overhead"}
    assert sum(split.values()) == pytest.approx(ns, abs=1)
    assert split["overhead"] == a100.profile.params["kernel_overhead_ns"]
    ln = ("aten::native_layer_norm", "[[2048, 4, 5120], [5120], [5120], [5120], []]", f"[{BF}, \"\", {BF}, {BF}, \"\"]")
    assert set(a100.op_bounds(*ln)) == {"memory", "overhead"}
    assert sum(a100.op_bounds(*ln).values()) == pytest.approx(a100.op_time_ns(*ln), abs=1)
    assert a100.op_bounds("aten::view", "[[4, 4], []]", f"[{BF}, \"\"]") == {}
    copy = a100.memcpy_bounds(1 << 30)
    assert set(copy) == {"memory", "overhead"} and sum(copy.values()) == pytest.approx(a100.memcpy_ns(1 << 30), abs=1)


def test_profile_without_the_ceiling_loads_with_none(tmp_path):
    obj = to_json(default_profile("a100"))
    del obj["params"]["sustained_eff"]
    f = tmp_path / "old.json"
    f.write_text(json.dumps(obj))
    assert load_profile(f).params["sustained_eff.tensor"] == 1.0
    obj["params"]["sustained_eff"] = {"tensor": 0.0}
    f.write_text(json.dumps(obj))
    with pytest.raises(EchoError, match="sustained_eff.tensor must be in"):
        load_profile(f)


def test_fit_finds_a_ceiling_that_binds_nowhere_at_the_start():
    """Large GEMMs capped at 0.7 of the peak, small ones wave-bound below it: starting from no
    ceiling (1.0, which binds nowhere), the fit finds 0.7 and keeps the tile efficiency."""
    from echo_et.models.compute.fit import PARAM_NAMES

    prior = _with(default_profile("a100"), gemm_eff__tensor=1.0)
    truth = _with(prior, sustained_eff__tensor=0.7)
    samples = []
    for i, (m, n, k) in enumerate(((8192, 8192, 8192), (16384, 8192, 4096), (12288, 12288, 12288),
                                   (256 * 108 + 256, 128, 4096), (300, 300, 4096))):
        s = Sample(((K.gemm(m, n, k, 1, "bf16", 2 * (m * k + k * n + m * n)), 1.0),), 0.0, group=f"g{i}",
                   source="layers")
        samples.append(Sample(s.items, predict(s, truth), group=s.group, source="layers"))
    free = ("sustained_eff.tensor",)
    r = fit(samples, prior, fixed=tuple(p for p in PARAM_NAMES if p not in free))
    assert r.profile.params["sustained_eff.tensor"] == pytest.approx(0.7, rel=1e-3)
    assert max(abs(predict(s, r.profile) / s.measured_ns - 1) for s in samples) < 1e-3


def test_calibration_fits_the_ceiling_on_the_large_gemm_layers_only():
    """The ceiling stage uses the AICB layers whose GEMMs average >= 1e11 FLOPs (GPT-175B and
    Llama-65B at TP8), with the tile efficiency at its bound; the earlier stages are as before."""
    from echo_et.models.compute.calibration import calibrate_kernels_and_layers
    from echo_et.models.compute.data import aicb_files, layer_samples, read_aicb_layers
    from echo_et.models.compute.fit import SUSTAINED_MIN_GEMM_FLOPS, mean_tensor_gemm_flops

    prior = default_profile("a100")
    big = set()
    for f in aicb_files(shared_path("workloads")):
        lt = read_aicb_layers(f)
        if lt is None:
            continue
        for s in layer_samples(lt, 312e12)[0]:
            if s.source == "layers" and mean_tensor_gemm_flops(s, prior) >= SUSTAINED_MIN_GEMM_FLOPS:
                big.add(f.name.split("_")[1])
    assert big == {"GPT175B", "Llama65B"}
    cal = calibrate_kernels_and_layers(None, [shared_path("workloads")], name="a100")
    stage = cal.profile.fit["stages"][-1]
    assert stage["free"] == ["sustained_eff.tensor"] and stage["samples"] == 4
    assert stage["pinned"] == {"gemm_eff.tensor": 1.0}
    ceiling = cal.profile.params["sustained_eff.tensor"]
    assert 0.6 < ceiling < 0.9
    # the tile efficiency stays the layers stage's (0.71 on all 8 layers), not the pinned 1.0
    assert 0.6 < cal.profile.params["gemm_eff.tensor"] < 0.8


def test_end_to_end_fit_with_a_fixed_ceiling_prices_its_samples_well():
    """The tile efficiency fitted end to end under a fixed ceiling (the iterations stage):
    the large GEMMs sit on the ceiling, the others identify the efficiency; the ceiling is
    kept and the samples are priced within their noise."""
    from echo_et.models.compute import fit_end_to_end
    from echo_et.models.compute.layers import LayerShape, layer_backward, layer_forward

    prior = ComputeModel(_with(ComputeModel.preset("a100").profile, gemm_eff__tensor=0.7,
                               sustained_eff__tensor=0.75))
    truth = ComputeModel(_with(prior.profile, gemm_eff__tensor=0.95, kernel_overhead_ns=4000.0))
    samples = []
    for hidden, tp, mb in ((1024, 8, 1), (1024, 1, 8), (2048, 2, 4), (2048, 1, 8), (4096, 8, 1), (8192, 8, 1)):
        shape = LayerShape("gpt", hidden, 16, 4 * hidden, 1024, mb, tp, "fp16")
        calls = [(c, 12) for block in (*layer_forward(shape), *layer_backward(shape)) for c in block]
        measured = 2e6 + sum(n * truth.op_time_ns(c.op, c.shapes, c.dtypes, c.attrs) for c, n in calls)
        samples.append((calls, 2e6, measured * (1.04 if hidden == 2048 else 0.97)))
    fitted = fit_end_to_end(samples, prior, params=("gemm_eff.tensor", "kernel_overhead_ns"))
    assert fitted.profile.params["sustained_eff.tensor"] == 0.75
    assert 0.8 < fitted.profile.params["gemm_eff.tensor"] <= 1.0
    for calls, rest, measured in samples:
        pred = rest + sum(n * fitted.op_time_ns(c.op, c.shapes, c.dtypes, c.attrs) for c, n in calls)
        assert abs(pred / measured - 1) < 0.08
