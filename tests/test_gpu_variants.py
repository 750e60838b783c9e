"""GPU names matched exactly against the table of variants: each variant's data sheet and
collective preset, PCIe boards never given the SXM ones, unknown names refused with the known
ones (issue 25), and every GPU name found in the shared traces and logs."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from test_compute_retime import meta_job
from test_passes_cli import one_line_error, run

from conftest import FIXTURES, shared_path
from echo_et.errors import EchoError
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.ir import save_job
from echo_et.models import gpu_variants
from echo_et.models.comm import CommModel
from echo_et.models.compute import DATASHEETS, resolve_gpu


@pytest.mark.parametrize("name, sheet, preset", [
    ("NVIDIA A100-SXM4-40GB", "a100", "a100-ib"), ("A100-SXM4-40GB", "a100", "a100-ib"), ("a100", "a100", "a100-ib"),
    ("A100", "a100", "a100-ib"), ("NVIDIA A100-SXM4-80GB", "a100-80gb", "a100-ib"),
    ("NVIDIA A100-PCIE-40GB", "a100-pcie", None), ("A100-PCIE-40GB", "a100-pcie", None),
    ("NVIDIA A100 80GB PCIe", "a100-pcie-80gb", None),
    ("NVIDIA H100 80GB HBM3", "h100", "h100-ib"), ("H100-SXM5-80GB", "h100", "h100-ib"),
    ("NVIDIA H100 PCIe", "h100-pcie", None), ("h100_pcie", "h100-pcie", None),
    ("NVIDIA H800", "h800", "h800-ib"),
    ("Tesla V100-SXM2-32GB", "v100", "v100-ib"), ("Tesla V100-SXM2-16GB", "v100-16gb", "v100-ib"),
    ("Tesla V100-PCIE-16GB", "v100-pcie", None), ("Tesla V100-PCIE-32GB", "v100-pcie-32gb", None),
])
def test_each_variant_has_its_own_data_sheet_and_preset(name: str, sheet: str, preset: str | None) -> None:
    assert resolve_gpu(name) == sheet
    if preset is None:
        with pytest.raises(EchoError) as e:
            CommModel.preset_for_gpu(name)
        assert "PCIe board" in str(e.value) and "give a calibrated profile or name a preset" in str(e.value)
    else:
        assert CommModel.preset_for_gpu(name).name == preset


def test_pcie_boards_do_not_get_the_sxm_data_sheet() -> None:
    """The cases of issue 25: each was silently the SXM data sheet."""
    assert DATASHEETS[resolve_gpu("NVIDIA H100 PCIe")].hbm_gbps == 2000.0            # not 3,350
    assert DATASHEETS[resolve_gpu("NVIDIA H100 PCIe")].sm_count == 114
    assert DATASHEETS[resolve_gpu("A100-PCIE-40GB")].name == "A100-PCIE-40GB"
    assert DATASHEETS[resolve_gpu("Tesla V100-PCIE-16GB")].peak_flops("fp16") == 112e12   # not 125
    assert DATASHEETS[resolve_gpu("Tesla V100-PCIE-16GB")].memory_gb == 16.0              # not 32
    with pytest.raises(EchoError) as e:
        resolve_gpu("H100 NVL")
    assert "H100 NVL 94GB" in str(e.value) and "no data sheet" in str(e.value) and "presets: a100" in str(e.value)


@pytest.mark.parametrize("name", ["tpu-v5", "H100 PCIe custom", "xa100", "a100-sxm4", "H200", "NVIDIA B200",
                                  "Tesla V100S-PCIE-32GB", "", "NVIDIA GeForce RTX 2080 Ti"])
def test_unknown_variants_are_refused_with_the_known_names(name: str) -> None:
    with pytest.raises(EchoError) as e:
        resolve_gpu(name)
    msg = str(e.value)
    assert "\n" not in msg and f"unknown GPU {name!r}" in msg
    for known in gpu_variants.known_names():
        assert known in msg


def test_the_table_agrees_with_the_data_sheets_and_presets() -> None:
    spellings = [s for v in gpu_variants.VARIANTS for s in v.spellings]
    assert len(spellings) == len(set(spellings))
    assert all(gpu_variants.normalize(s) == s for s in spellings)
    assert gpu_variants.known_names() == sorted(DATASHEETS)
    for v in gpu_variants.VARIANTS:
        assert v.datasheet is None or v.datasheet in DATASHEETS
        assert v.comm_preset is None or v.comm_preset in CommModel.preset_names()
        assert v.datasheet or v.why_no_datasheet
    for key, spec in DATASHEETS.items():      # a data sheet's key and product name are its own
        assert resolve_gpu(key) == key and resolve_gpu(spec.name) == key


@pytest.mark.parametrize("key, flops_per_clock", [
    ("v100", 1024), ("v100-16gb", 1024), ("v100-pcie", 1024), ("v100-pcie-32gb", 1024), ("a100", 2048),
    ("a100-80gb", 2048), ("a100-pcie", 2048), ("a100-pcie-80gb", 2048), ("h100", 4096), ("h100-pcie", 4096),
    ("h800", 4096)])
def test_each_data_sheet_clock_is_the_one_its_tensor_peak_implies(key: str, flops_per_clock: int) -> None:
    g = DATASHEETS[key]
    implied = g.sm_count * flops_per_clock * g.clock_mhz * 1e6
    assert implied == pytest.approx(g.peak_flops("fp16"), rel=0.011)


# -- the names in the shared data -----------------------------------------------------------------
TRACES = ["traces/HolisticTraceAnalysis/tests/data/nccl_parser_config/nccl_data.json.gz",
          "traces/HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz",
          "traces/HolisticTraceAnalysis/tests/data/negative_queue_length_values_check/rank0.json.gz",
          "traces/HolisticTraceAnalysis/tests/data/execution_trace/benchmark_simple_add_trace.json.gz",
          "traces/param/et_replay/tests/inputs/linear_kineto.json.gz",
          "traces/HolisticTraceAnalysis/tests/data/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"]


@pytest.mark.parametrize("rel", TRACES)
def test_gpu_names_of_the_shared_traces(rel: str) -> None:
    """A name the table knows is the device the trace says (SM count and memory); a name it
    does not know (a GeForce, an AMD GPU) is refused, never given a data-center data sheet."""
    with gzip.open(shared_path(rel), "rt") as f:
        props = json.load(f)["deviceProperties"][0]
    name = props["name"]
    if name in ("NVIDIA GeForce RTX 2080 Ti", "AMD Radeon Graphics"):
        with pytest.raises(EchoError, match="unknown GPU"):
            resolve_gpu(name)
        return
    sheet = DATASHEETS[resolve_gpu(name)]
    assert sheet.sm_count == props["numSms"], name
    assert sheet.memory_gb == pytest.approx(props["totalGlobalMem"] / 2**30, rel=0.1), name


def test_gpu_names_of_the_shared_nccl_tests_logs() -> None:
    names = {}
    for rel, expect in (("nccl-tests/echo-a100/nccl_8.log", ("a100", "a100-ib")),
                        ("nccl-tests/h100-c01", ("h100", "h100-ib"))):
        p = shared_path(rel)
        files = [p] if p.is_file() else sorted(x for x in p.rglob("*") if x.is_file())
        for f in files:
            for m in re.finditer(r"device\s+\d+ \[[^\]]*\] (.+)", f.read_text(errors="replace")):
                names[m.group(1).strip()] = expect
    assert {"A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"} <= set(names)
    for name, (sheet, preset) in names.items():
        assert (resolve_gpu(name), CommModel.preset_for_gpu(name).name) == (sheet, preset)


def test_the_dlrm_v100_trace_is_the_sxm2_32gb() -> None:
    import tarfile

    with tarfile.open(shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")) as tf:
        member = next(m for m in tf.getmembers() if m.isfile() and ".json" in m.name)
        raw = tf.extractfile(member).read()
    text = (gzip.decompress(raw) if member.name.endswith(".gz") else raw).decode()
    assert re.search(r'"name": "Tesla V100-SXM2-32GB"', text)
    assert resolve_gpu("Tesla V100-SXM2-32GB") == "v100"
    assert CommModel.preset_for_gpu("Tesla V100-SXM2-32GB").name == "v100-ib"


# -- --gpu on the command line ----------------------------------------------------------------------
def test_gpu_option_picks_both_presets_and_refuses_pcie_without_a_collective_model(tmp_path) -> None:
    job = save_job(gpt_3d_job(1, 2, 2, microbatches=2, layers=1, gpu_name=""), tmp_path / "job")
    line = one_line_error(run("simulate", str(job), "--mode", "predict"))
    assert "names no GPU: give --gpu NAME (a100" in line and "--preset NAME (a100-ib" in line
    def step(*args: str) -> int:
        res = run("simulate", str(job), "--mode", "predict", *args, "--json")
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["step_time_ns"]

    # --gpu alone: the GPU's data sheet for compute and its node's collective preset
    assert step("--gpu", "a100") == step("--gpu", "a100", "--preset", "a100-ib")
    assert step("--gpu", "h100") == step("--gpu", "h100", "--preset", "h100-ib")
    assert step("--gpu", "h100") != step("--gpu", "h100", "--preset", "a100-ib")
    for verb in (["simulate", str(job), "--mode", "predict"], ["validate", str(job)]):
        line = one_line_error(run(*verb, "--gpu", "NVIDIA H100 PCIe"))
        assert line.startswith("error: --gpu: no collective preset for GPU 'h100-pcie'") and "PCIe board" in line
        line = one_line_error(run(*verb, "--gpu", "H100 NVL"))
        assert line.startswith("error: --gpu: GPU 'H100 NVL' is the H100 NVL 94GB") and "no data sheet" in line
    ok = run("simulate", str(job), "--mode", "predict", "--gpu", "NVIDIA H100 PCIe", "--preset",
                             "a100-ib", "--json")
    assert ok.exit_code == 0, ok.output
    retime = json.loads(ok.stdout)["compute_retime"]
    assert (retime["gpu"], retime["calibrated"], retime["efficiencies_from"]) == ("h100-pcie", False, "a100")
    text = run("simulate", str(job), "--mode", "predict", "--gpu", "NVIDIA H100 PCIe", "--preset", "a100-ib").stdout
    assert "note: no calibrated compute preset for h100-pcie: its data sheet with the efficiencies of a100" in text
    text = run("simulate", str(job), "--mode", "predict", "--gpu", "a100").stdout
    assert "compute retimed for a100" in text and "no calibrated compute preset" not in text
    # the synthetic job's kernels have no shapes and its manifest names no GPU: the model
    # prices none of them, and the line says so
    assert "compute time by what bounds it: kept or scaled from the trace 100.0 %" in text
    meta = save_job(meta_job(), tmp_path / "meta")
    text = run("simulate", str(meta), "--mode", "predict", "--gpu", "a100").stdout
    bounds = next(x for x in text.splitlines() if x.startswith("compute time by what bounds it: "))
    assert "sustained tensor-core ceiling" in bounds and "memory bandwidth" in bounds   # the 4096^3 mm; the add


def test_a_job_naming_a_pcie_gpu_is_not_priced_as_sxm(tmp_path) -> None:
    job = meta_job(timed=True, gpu="NVIDIA A100-PCIE-40GB")
    save_job(job, tmp_path / "job")
    line = one_line_error(run("validate", str(tmp_path / "job")))
    assert "no collective preset for GPU 'NVIDIA A100-PCIE-40GB'" in line
    assert line.endswith("or give --gpu NAME, --preset NAME or --profile FILE")
    save_job(meta_job(timed=True, gpu="NVIDIA GeForce RTX 2080 Ti"), tmp_path / "geforce")
    line = one_line_error(run("validate", str(tmp_path / "geforce")))
    assert "unknown GPU 'NVIDIA GeForce RTX 2080 Ti' (presets: a100" in line and "--preset NAME" in line
    assert run("validate", str(tmp_path / "geforce"), "--preset", "a100-ib").exit_code == 0


def test_gpu_option_on_a_cpu_trace_says_what_is_wrong() -> None:
    job = FIXTURES / "jobs" / "gpt-tp2-pp2-dp2"
    line = one_line_error(run("simulate", str(job), "--mode", "predict", "--gpu", "a100"))
    assert "ran its compute on the CPU (no GPU stream), so --gpu a100 has no GPU kernels to retime" in line
    line = one_line_error(run("simulate", str(job), "--mode", "predict"))
    assert "names no GPU (its compute ran on the CPU): give the collective model with --preset NAME" in line
    ok = run("simulate", str(job), "--mode", "predict", "--preset", "a100-ib", "--json")
    assert ok.exit_code == 0, ok.output


def test_sweep_and_export_take_gpu_for_both_presets(tmp_path) -> None:
    job = save_job(gpt_3d_job(1, 2, 2, microbatches=2, layers=1, gpu_name=""), tmp_path / "job")

    def sweep(name: str, *args: str) -> list:
        res = run("sweep", str(job), "--dp", "2", "-o", str(tmp_path / name), "--workers", "1",
                                  "--no-plot", *args, "--json")
        assert res.exit_code == 0, res.output
        return [r["step_time_ns"] for r in json.loads(res.stdout)["points"]]

    h100 = sweep("a", "--gpu", "h100")
    assert h100 == sweep("b", "--gpu", "h100", "--preset", "h100-ib")   # the GPU's own collective preset
    assert h100 != sweep("c", "--gpu", "a100")                          # not another GPU's
    line = one_line_error(run("sweep", str(job), "--dp", "2", "-o", str(tmp_path / "d"),
                                               "--mode", "replay", "--gpu", "h100"))
    assert "--gpu only applies with --mode predict" in line
    line = one_line_error(run("sweep", str(job), "--dp", "2", "-o", str(tmp_path / "d")))
    assert "names no GPU: give --gpu NAME (a100" in line and not (tmp_path / "d").exists()

    def export(name: str, *args: str) -> dict:
        res = run("export", "astra-sim", str(job), "-o", str(tmp_path / name), "--no-expected",
                                  *args, "--json")
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["network"]

    assert export("e", "--gpu", "h100") == export("f", "--preset", "h100-ib")
    assert export("e2", "--gpu", "h100") != export("g", "--preset", "a100-ib")
    line = one_line_error(run("export", "astra-sim", str(job), "-o", str(tmp_path / "h"),
                                               "--gpu", "NVIDIA A100-PCIE-40GB"))
    assert "no collective preset for GPU 'a100-pcie'" in line and not (tmp_path / "h").exists()
