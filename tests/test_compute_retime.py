"""Retiming a Job's compute for a GPU (passes.retime_compute) and the CLI around it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import shared_path
from echo_et.errors import EchoError
from echo_et.ir import assert_valid
from echo_et.ir.builder import GraphBuilder, JobBuilder
from echo_et.ir.io import save_job
from echo_et.ir.schema import pb
from echo_et.models.compute import ComputeModel
from echo_et.passes import retime_compute
from echo_et.sim import simulate

BF = '"c10::BFloat16"'
MM = ("aten::mm", "[[4096, 4096], [4096, 4096]]", f"[{BF}, {BF}]")


def meta_job(timed: bool = False, gpu: str = "") -> tuple:
    """Two ranks like the meta-device tracer writes them: one compute node per operator on a
    GPU compute stream, an all-reduce that waits for the last one (DEP_SYNC)."""
    jb = JobBuilder("meta", 2, source_format="ex-situ")
    world = jb.group([0, 1], name="world", role="dp")
    for r in range(2):
        gb = GraphBuilder(f"g{r}")
        comp = gb.stream(pb.STREAM_GPU_COMPUTE, "gpu0-compute", device=0)
        comm = gb.stream(pb.STREAM_GPU_COMM, "gpu0-comm:dp", device=0)
        gb.declare_group("dp", 2)
        t = 0
        nodes = []
        for op, shapes, dtypes in (MM, ("aten::view", "[[4096, 4096], []]", f"[{BF}, \"ScalarList\"]"),
                                   ("aten::add", "[[4096, 4096], [4096, 4096]]", f"[{BF}, {BF}]")):
            n = gb.compute(op, comp, op=op, shapes=shapes, dtypes=dtypes, start_ns=t if timed else 0,
                           duration_ns=1000 if timed else 0, deps=[nodes[-1].id] if nodes else [])
            n.attrs["timing"] = "measured" if timed else "untimed"
            t += 1000
            nodes.append(n)
        gb.collective("all_reduce", comm, coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=1 << 20,
                      deps=[(nodes[-1].id, pb.DEP_SYNC)], start_ns=t if timed else 0,
                      duration_ns=500 if timed else 0)
        jb.add_graph(gb.build())
        jb.bind(r, f"g{r}", {"dp": world})
    job = jb.build()
    if gpu:
        job.manifest.hardware.gpu_name = gpu
    if not timed:
        job.manifest.attrs["trace.device"] = "meta"
    return job


def test_retime_prices_every_compute_node_and_leaves_the_input_alone():
    job = meta_job()
    before = [job.graph(g).content_hash() for g in job.graph_ids()]
    model = ComputeModel.preset("a100")
    out, rep = retime_compute(job, model)
    assert [job.graph(g).content_hash() for g in job.graph_ids()] == before
    assert job.manifest.hardware.gpu_name == ""
    g = out.graph("g0")
    durs = {n.name: n.duration_ns for n in g.nodes if n.kind == pb.KIND_COMPUTE}
    assert durs["aten::mm"] == model.op_time_ns(*MM) > 100_000
    assert durs["aten::view"] == 0 and durs["aten::add"] > 0
    assert all(n.attrs["timing"] == "model:a100" for n in g.nodes if n.kind == pb.KIND_COMPUTE)
    assert rep.nodes == 6 and rep.by_status["priced"] == 4 and rep.by_status["no_work"] == 2
    assert out.manifest.hardware.gpu_name == "A100-SXM4-40GB" and out.manifest.attrs["compute.gpu"] == "a100"
    assert_valid(out)
    res = simulate(out, "replay")
    assert res.step_time_ns >= durs["aten::mm"] + durs["aten::add"]


def test_h100_is_faster_than_a100_on_the_same_graph():
    job = meta_job()
    a = retime_compute(job, ComputeModel.preset("a100"))[1].compute_ns_after
    h = retime_compute(job, ComputeModel.preset("h100"))[1].compute_ns_after
    assert 0 < h < a


def test_the_report_splits_the_compute_time_by_what_bounds_it():
    """Every retimed ns lands in one bound: the model's split of the node's price, or
    not_modelled for kernels kept or scaled from the trace."""
    model = ComputeModel.preset("a100")
    _, rep = retime_compute(meta_job(), model)
    got = rep.to_json()["compute_ns_by_bound"]
    assert set(got) == {"ceiling", "memory", "overhead"}      # the 4096^3 mm at the ceiling, the add on memory
    assert sum(got.values()) == pytest.approx(rep.compute_ns_after, abs=3)
    mm = model.op_bounds(*MM, {})
    assert got["ceiling"] == pytest.approx(2 * mm["ceiling"], abs=2)    # two ranks
    assert sum(rep.bound_shares().values()) == pytest.approx(1.0)
    # kernels priced from their launching operator carry the operator's split
    _, rep = retime_compute(gpu_trace_job("NVIDIA A100-SXM4-40GB", with_shapes=True), model)
    got = rep.to_json()["compute_ns_by_bound"]
    assert "not_modelled" not in got and got["ceiling"] > 0
    assert sum(got.values()) == pytest.approx(rep.compute_ns_after, abs=3)
    # kernels without shapes, scaled or kept: not the model's bounds
    for gpu in ("NVIDIA A100-SXM4-40GB", ""):
        _, rep = retime_compute(gpu_trace_job(gpu, with_shapes=False), ComputeModel.preset("h100"))
        assert rep.to_json()["compute_ns_by_bound"] == {"not_modelled": rep.compute_ns_after}


def test_timed_graph_is_relaid_out_without_breaking_dependencies():
    job = meta_job(timed=True)
    out, _ = retime_compute(job, ComputeModel.preset("a100"))
    g = out.graph("g0")
    by_id = {n.id: n for n in g.nodes}
    for n in g.nodes:
        for d in n.deps:
            p = by_id[d.id]
            assert p.start_ns + p.duration_ns <= n.start_ns, (p.name, n.name)
    mm = next(n for n in g.nodes if n.name == "aten::mm")
    coll = next(n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE)
    assert coll.start_ns >= mm.duration_ns and coll.duration_ns == 500
    simulate(out, "replay")   # no acausal dependency, no error


def gpu_trace_job(gpu: str, with_shapes: bool) -> tuple:
    """A profiler-style graph: a CPU operator launching two kernels (names, no shapes)."""
    jb = JobBuilder("gpu", 1, source_format="kineto")
    gb = GraphBuilder("g0")
    cpu = gb.stream(pb.STREAM_CPU_THREAD, "thread 1")
    dev = gb.stream(pb.STREAM_GPU_COMPUTE, "stream 7", device=0)
    op = gb.cpu_op("aten::linear", cpu, start_ns=0, duration_ns=50_000)
    if with_shapes:
        op.cpu.shapes = "[[4096, 4096], [4096, 4096], []]"
        op.cpu.dtypes = f"[{BF}, {BF}, \"\"]"
    l1 = gb.cpu_op("cudaLaunchKernel", cpu, kind=pb.KIND_LAUNCH, start_ns=1000, duration_ns=3000,
                   deps=[(op.id, pb.DEP_CONTROL)])
    l2 = gb.cpu_op("cudaLaunchKernel", cpu, kind=pb.KIND_LAUNCH, start_ns=5000, duration_ns=3000,
                   deps=[(op.id, pb.DEP_CONTROL)])
    gb.compute("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_tn", dev, kernel_class=pb.KC_GEMM, start_ns=10_000,
               duration_ns=300_000, deps=[(l1.id, pb.DEP_LAUNCH)])
    gb.compute("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<c10::BFloat16>>", dev,
               kernel_class=pb.KC_ELEMENTWISE, start_ns=310_000, duration_ns=100_000, deps=[(l2.id, pb.DEP_LAUNCH)])
    sync = gb.node(pb.KIND_SYNC, "cudaDeviceSynchronize", cpu, start_ns=60_000, duration_ns=350_000,
                   deps=[(5, pb.DEP_SYNC)])
    assert sync.id == 6
    jb.add_graph(gb.build())
    jb.bind(0, "g0")
    job = jb.build()
    job.manifest.hardware.gpu_name = gpu
    return job


def test_profiler_kernels_take_the_launching_operators_shapes():
    job = gpu_trace_job("NVIDIA A100-SXM4-40GB", with_shapes=True)
    model = ComputeModel.preset("h100")
    out, rep = retime_compute(job, model)
    assert rep.by_status["from_launching_op"] == 2
    total = model.op_time_ns("aten::linear", "[[4096, 4096], [4096, 4096], []]", f"[{BF}, {BF}, \"\"]")
    k = [n for n in out.graph("g0").nodes if n.kind == pb.KIND_COMPUTE]
    assert sum(n.duration_ns for n in k) == pytest.approx(total, abs=2)
    assert k[0].duration_ns == pytest.approx(3 * k[1].duration_ns, rel=0.01)   # shared by measured share
    sync = next(n for n in out.graph("g0").nodes if n.kind == pb.KIND_SYNC)
    assert sync.start_ns + sync.duration_ns >= k[1].start_ns + k[1].duration_ns   # still waits for the kernel
    simulate(out, "replay")


def test_kernels_without_shapes_scale_by_the_gpu_ratio_or_keep_their_time():
    job = gpu_trace_job("NVIDIA A100-SXM4-40GB", with_shapes=False)
    out, rep = retime_compute(job, ComputeModel.preset("h100"))
    k = [n for n in out.graph("g0").nodes if n.kind == pb.KIND_COMPUTE]
    assert rep.by_status["scaled"] == 2
    assert k[0].duration_ns == round(300_000 * 312 / 989.4)
    assert k[1].duration_ns == round(100_000 * 1555 / 3350)
    out, rep = retime_compute(gpu_trace_job("", with_shapes=False), ComputeModel.preset("h100"))
    assert rep.by_status["kept"] == 2


def test_cpu_only_job_is_refused():
    jb = JobBuilder("cpu", 1)
    gb = GraphBuilder("g0")
    gb.cpu_op("aten::mm", gb.stream(pb.STREAM_CPU_THREAD, "t"), duration_ns=10)
    jb.add_graph(gb.build())
    jb.bind(0, "g0")
    with pytest.raises(EchoError, match="no GPU compute nodes"):
        retime_compute(jb.build(), ComputeModel.preset("a100"))


# -- CLI --------------------------------------------------------------------------------------
def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "echo_et.cli.main", *args], capture_output=True, text=True)


def test_simulate_retimes_an_untimed_job_for_its_gpu_and_with_a_profile(tmp_path):
    from echo_et.cli.compute_cmds import retime_for_gpu

    job = meta_job(gpu="NVIDIA H100 80GB HBM3")
    out, rep = retime_for_gpu(job, None, None)
    assert rep["gpu"] == "h100"
    out, rep = retime_for_gpu(job, "a100", None)
    assert rep["gpu"] == "a100"
    with pytest.raises(EchoError, match="give --gpu NAME"):
        retime_for_gpu(meta_job(), None, None)
    timed = meta_job(timed=True)
    assert retime_for_gpu(timed, None, None) == (timed, None)   # measured times stay the default

    d = tmp_path / "job"
    save_job(meta_job(gpu="a100"), d)
    prof = tmp_path / "c.json"
    ComputeModel.preset("a100").for_gpu("v100").save(prof)
    r = run("simulate", str(d), "--mode", "predict", "--compute-profile", str(prof), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["compute_retime"]["gpu"] == "v100" and res["compute_retime"]["nodes"] == 6
    r = run("simulate", str(d), "--compute-profile", str(prof))
    assert r.returncode == 2 and "only apply with --mode predict" in r.stderr


def test_cli_errors_are_one_line_exit_2(tmp_path):
    d = tmp_path / "job"
    save_job(meta_job(), d)
    r = run("simulate", str(d), "--mode", "predict")
    assert r.returncode == 2 and "give --gpu NAME (presets: a100" in r.stderr and r.stderr.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    r = run("simulate", str(d), "--mode", "predict", "--compute-profile", str(bad))
    assert r.returncode == 2 and "must be a JSON object" in r.stderr
    out = tmp_path / "c.json"
    r = run("calibrate", "compute", "-o", str(out))
    assert r.returncode == 2 and "give at least one input" in r.stderr and not out.exists()
    r = run("calibrate", "compute", "--layers", str(tmp_path), "-o", str(out))
    assert r.returncode == 2 and "no SimAI/AICB" in r.stderr and not out.exists()
    csv = tmp_path / "k.csv"
    csv.write_text("a,b\n1,2\n")
    r = run("calibrate", "compute", "--kernels", str(csv), "-o", str(out))
    assert r.returncode == 2 and "expected columns" in r.stderr and not out.exists()
    r = run("calibrate", "compute", "--kernels", str(csv), "--gpu", "tpu", "-o", str(out))
    assert r.returncode == 2 and "unknown GPU 'tpu' (presets: a100, a100-80gb, a100-pcie, a100-pcie-80gb" in r.stderr


def test_calibrate_compute_reproduces_the_shipped_a100_preset(tmp_path):
    """The shipped a100 preset is what the documented command fits: its kernels/layers stages
    re-run here byte for byte; its iterations stage (1,440 simulated configurations, too long
    for a test) is checked by what it records: the vTrain file by hash, the settings, and
    that it started from exactly these stages."""
    from importlib import resources

    from echo_et.models.compute.data import sha256
    from echo_et.models.compute.fit import END_TO_END_PARAMS

    kernels = shared_path("slowdown/echo-a100-gpt2/merged_features.csv")
    layers = shared_path("workloads")
    iterations = shared_path("measurements/vtrain-a100/data/ground_truth_single.csv")
    out = tmp_path / "a100.json"
    r = run("calibrate", "compute", "--kernels", str(kernels), "--layers", str(layers), "--name", "a100",
            "-o", str(out))
    assert r.returncode == 0, r.stderr
    # the layers stage fits the sustained tensor-core ceiling on the large-GEMM layers, and says so
    assert "sustained tensor-core ceiling: 0.751 of the peak (234 TFLOP/s fp16 on a100), " \
        "from 4 layer samples of >= 1e+11 FLOPs per GEMM" in r.stdout
    stages = json.loads(out.read_text("utf-8"))
    shipped = json.loads((resources.files("echo_et.models.compute") / "presets" / "a100.json").read_text("utf-8"))
    *first, it_source = shipped["sources"]
    assert first == stages["sources"]
    assert (it_source["kind"], it_source["file"], it_source["sha256"]) == (
        "iterations", "ground_truth_single.csv", sha256(iterations))
    it = shipped["fit"].pop("iterations")
    assert it["settings"]["recompute"] is True and it["settings"]["dtype"] == "float16"
    assert it["settings"]["recompute_granularity"] == "selective"   # the reading docs/accuracy.md chose
    # the measured runs' collectives: the collective model calibrated on vTrain's all-reduce tables
    # (the documented `calibrate nccl-tests` command), its NVLink rate not overridden
    assert it["settings"]["cluster"]["intra_bw_gbps_per_gpu"] is None
    luts = sorted(shared_path("measurements/vtrain-a100/trace/a100").glob("AR_GPU*_LUT"))
    comm = tmp_path / "vtrain-a100-allreduce.json"
    r = run("calibrate", "nccl-tests", *map(str, luts), "--gpus-per-node", "8", "-o", str(comm))
    assert r.returncode == 0, r.stderr
    assert it["settings"]["comm_profile"] == {"file": comm.name, "sha256": sha256(comm)}
    assert shipped["fit"]["stages"] == stages["fit"]["stages"]

    def flat(d, prefix=""):
        return {k2: v2 for k, v in d.items()
                for k2, v2 in (flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(prefix + k, v)])}

    before, now = flat(stages["params"]), flat(shipped["params"])
    assert {k: v for k, v in now.items() if k not in END_TO_END_PARAMS} == \
        {k: v for k, v in before.items() if k not in END_TO_END_PARAMS}
    assert it["before"] == pytest.approx({k: before[k] for k in END_TO_END_PARAMS}, rel=1e-5)
    assert it["configurations"] == it_source["samples"] > 1400


def test_simulate_gpu_option_retimes_and_unknown_gpu_lists_the_presets(tmp_path):
    d = tmp_path / "job"
    save_job(meta_job(), d)
    r = run("simulate", str(d), "--mode", "predict", "--gpu", "h100", "--json")
    assert r.returncode == 0, r.stderr
    h = json.loads(r.stdout)
    r = run("simulate", str(d), "--mode", "predict", "--gpu", "v100", "--json")
    v = json.loads(r.stdout)
    assert h["compute_retime"]["gpu"] == "h100" and v["compute_retime"]["gpu"] == "v100"
    assert h["step_time_ns"] < v["step_time_ns"]
    r = run("simulate", str(d), "--mode", "predict", "--gpu", "b300")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "unknown GPU 'b300' (presets: a100, a100-80gb, a100-pcie, a100-pcie-80gb, h100" in r.stderr
    timed = tmp_path / "timed"
    save_job(meta_job(timed=True, gpu="NVIDIA A100-SXM4-40GB"), timed)
    r = run("simulate", str(timed), "--mode", "predict", "--json")
    assert r.returncode == 0 and "compute_retime" not in json.loads(r.stdout)   # measured times by default


def test_untimed_host_launches_get_the_host_launch_time():
    job = meta_job()
    g = job.graph("g0")
    gb = GraphBuilder.extend(g)
    host = gb.stream(pb.STREAM_CPU_THREAD, "host:0")
    for n in [n for n in g.nodes if n.kind == pb.KIND_COMPUTE]:
        launch = gb.cpu_op(f"launch:{n.name}", host, kind=pb.KIND_LAUNCH, op=n.name)
        n.deps.add(id=launch.id, kind=pb.DEP_LAUNCH)
    model = ComputeModel.preset("a100")
    out, rep = retime_compute(job, model)
    launches = [n for n in out.graph("g0").nodes if n.kind == pb.KIND_LAUNCH]
    assert len(launches) == 3 and rep.by_status["host_launch"] == 3
    assert all(n.duration_ns == model.host_launch_ns > 0 for n in launches)
    assert all(n.attrs["timing"] == "model:a100" for n in launches)


def test_untimed_collective_calls_get_the_collective_host_time():
    from dataclasses import replace

    job = meta_job()
    g = job.graph("g0")
    gb = GraphBuilder.extend(g)
    host = gb.stream(pb.STREAM_CPU_THREAD, "host:0")
    gb.cpu_op("launch:all_reduce", host, kind=pb.KIND_LAUNCH, op="c10d::all_reduce")
    for n in [n for n in g.nodes if n.kind == pb.KIND_COMPUTE]:
        launch = gb.cpu_op(f"launch:{n.name}", host, kind=pb.KIND_LAUNCH, op=n.name)
        n.deps.add(id=launch.id, kind=pb.DEP_LAUNCH)
    base = ComputeModel.preset("a100")
    model = ComputeModel(replace(base.profile, params={**base.profile.params, "host_launch_ns": 30_000.0,
                                                       "host_collective_ns": 7_000.0}))
    out, _ = retime_compute(job, model)
    by_op = {n.cpu.op: n.duration_ns for n in out.graph("g0").nodes if n.kind == pb.KIND_LAUNCH}
    assert by_op.pop("c10d::all_reduce") == 7_000
    assert set(by_op.values()) == {30_000}
