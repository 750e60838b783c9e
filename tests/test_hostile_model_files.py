"""The model files users pass (campaign seed 1205, `benchmarks/hostile_campaign.py --kinds
compute_profile,comm_profile,slowdown_model,configs_csv`; docs/robustness.md): a compute
profile (`--compute-profile`), a collective-model profile (`--profile`), an overlap-slowdown
model (`--slowdown`) and a configuration CSV (`sweep --configs`, `calibrate compute
--iterations`), damaged one class at a time. Every case asserts the promise: exit 2 with one
line naming the file and the field, or, for what the loaders tolerate, the command runs.

Commands run in-process (typer's CliRunner), but a special file (a pipe, a device), which a
broken reader would block on, runs as a process with a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_hostile_input import cli, refused

from conftest import FIXTURES

MODELS = Path(__file__).resolve().parents[1] / "echo_et" / "models"
COMPUTE = MODELS / "compute" / "presets" / "a100.json"
COMM = MODELS / "comm" / "presets" / "a100-ib.json"
DDP = FIXTURES / "jobs" / "ddp-dp4"
PREDICT = ("predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--global-batch", "2")
SLOWDOWN = {"format": "echo-et-slowdown/1", "global": 0.19, "classes": {"gemm": 0.01, "norm": 3.3},
            "kernels": {}, "max_factor": 8.0, "source": "test", "fit": {}}


def edited(doc: dict, path: list, value) -> dict:
    node = doc
    for k in path[:-1]:
        node = node[k]
    if value is DROP:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


DROP = object()


def predict_with(tmp_path: Path, text: str | bytes, **match) -> str:
    f = tmp_path / "compute.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    out = tmp_path / "out"
    line = refused(*PREDICT, "-o", out, "--compute-profile", f, **match)
    assert not out.exists()
    return line


def estimate_with(tmp_path: Path, text: str | bytes, **match) -> str:
    f = tmp_path / "cc.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return refused("estimate", "all_reduce", "--bytes", "1MB", "--ranks", "8", "--profile", f, **match)


def validate_with(tmp_path: Path, text: str | bytes, **match) -> str:
    f = tmp_path / "slowdown.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    return refused("validate", DDP, "--preset", "a100-ib", "--slowdown", f, **match)


# -- 1. compute profile: a block of the wrong type was a TypeError (seed 1205 before the fixes) --------------
@pytest.mark.parametrize("path,value,shown", [
    (["fit"], 1e-320, "fit must be an object, got 1e-320"),
    (["sources"], -5, "sources must be a list, got -5"),
    (["sources", 0], None, "sources[0] must be an object, got null"),
    (["settings"], [1, 2], "settings must be an object, got [1, 2]"),
    (["settings", "fp32_matmul"], [[[]]], "settings.fp32_matmul must be one of fp32, tf32, got [[[]]]"),
    (["name"], {"a": 1}, 'name must be a string, got {"a": 1}'),
    (["calibrated"], "1e30", 'calibrated must be true or false, got "1e30"'),
    (["description"], 5, "description must be a string, got 5"),
    (["params_from"], [], "params_from must be a string, got []"),
])
def test_a_compute_profile_block_of_the_wrong_type_is_one_line(tmp_path, path, value, shown):
    doc = edited(json.loads(COMPUTE.read_text()), path, value)
    predict_with(tmp_path, json.dumps(doc), match=["compute.json: ", shown])


# -- 2. the GPU data sheet of a compute profile: NaN, infinite, negative or absurd numbers passed -------------
@pytest.mark.parametrize("key,value,shown", [
    ("clock_mhz", "1410", "gpu.clock_mhz = 1410 is not a number"),
    ("clock_mhz", 0, "gpu.clock_mhz = 0 is out of range"),
    ("hbm_gbps", -1, "gpu.hbm_gbps = -1 is out of range"),
    ("hbm_gbps", 1e300, "gpu.hbm_gbps = 1e+300 is out of range"),
    ("memory_gb", True, "gpu.memory_gb = True is not a number"),
    ("l2_mb", None, "gpu.l2_mb = None is not a number"),
    ("sm_count", 1.5, "gpu.sm_count must be an integer in 1..100000, got 1.5"),
    ("sm_count", 10 ** 18, "gpu.sm_count must be an integer in 1..100000"),
    ("peak_tflops", [19.5], "gpu.peak_tflops must be an object"),
    ("tensor", "fp16", 'gpu.tensor must be a list of math class names, got "fp16"'),
    ("tensor", [None], "gpu.tensor must be a list of math class names"),
    ("key", 5, "gpu.key must be a non-empty string, got 5"),
    ("name", "", 'gpu.name must be a non-empty string, got ""'),
])
def test_a_gpu_data_sheet_field_out_of_type_or_range_is_one_line(tmp_path, key, value, shown):
    doc = edited(json.loads(COMPUTE.read_text()), ["gpu", key], value)
    predict_with(tmp_path, json.dumps(doc), match=["compute.json: ", shown])


@pytest.mark.parametrize("math_class,value,shown", [
    ("fp16", -312.0, "gpu.peak_tflops.fp16 = -312.0 is out of range"),
    ("fp32", "19.5", "gpu.peak_tflops.fp32 = 19.5 is not a number"),
    ("bf16", 1e30, "gpu.peak_tflops.bf16 = 1e+30 is out of range"),
    ("fp32", 0, "'gpu' needs peak_tflops.fp32 > 0"),
])
def test_a_peak_rate_out_of_type_or_range_is_one_line(tmp_path, math_class, value, shown):
    doc = edited(json.loads(COMPUTE.read_text()), ["gpu", "peak_tflops", math_class], value)
    predict_with(tmp_path, json.dumps(doc), match=["compute.json: ", shown])


# -- 3. compute parameters: an infinite time or a denormal efficiency passed ---------------------------------
@pytest.mark.parametrize("path,value,shown", [
    (["params", "kernel_overhead_ns"], 1e300, "params.kernel_overhead_ns = 1e+300 is out of range"),
    (["params", "host_launch_ns"], -1, "params.host_launch_ns = -1.0 is out of range"),
    (["params", "gemm_k_half"], 1e30, "params.gemm_k_half = 1e+30 is out of range"),
    (["params", "gemm_eff", "tensor"], 5e-324, "gemm_eff.tensor must be in [0.0001, 1], got 5e-324"),
    (["params", "mem_eff", "l2"], 0, "mem_eff.l2 must be in (0, 4], got 0"),
    (["params", "attn_eff", "fwd"], "0.5", 'parameter attn_eff.fwd must be a number, got "0.5"'),
])
def test_a_compute_parameter_out_of_range_is_one_line(tmp_path, path, value, shown):
    doc = edited(json.loads(COMPUTE.read_text()), path, value)
    predict_with(tmp_path, json.dumps(doc), match=["compute.json: ", shown])


# -- 4. slowdown model: a field of the wrong type was Python's own words, naming no field ---------------------
@pytest.mark.parametrize("path,value,shown", [
    (["max_factor"], "", "max_factor =  is not a number"),
    (["max_factor"], {"a": 1}, "max_factor = {'a': 1} is not a number"),
    (["max_factor"], False, "max_factor = False is not a number"),
    (["max_factor"], 0.5, "max_factor = 0.5 is out of range (must be >= 1 and <= 1e+06)"),
    (["global"], [], "global = [] is not a number"),
    (["global"], 1e300, "global = 1e+300 is out of range"),
    (["classes"], [["gemm", 1]], 'classes must be an object of slowdowns by name, got [["gemm", 1]]'),
    (["classes", "gemm"], "0.1", "classes.gemm = 0.1 is not a number"),
    (["kernels"], "x", 'kernels must be an object of slowdowns by name, got "x"'),
    (["source"], [None], "source must be a string, got [null]"),
    (["fit"], [1, 2], "fit must be an object, got [1, 2]"),
])
def test_a_slowdown_model_field_of_the_wrong_type_or_range_names_it(tmp_path, path, value, shown):
    doc = edited(json.loads(json.dumps(SLOWDOWN)), path, value)
    line = validate_with(tmp_path, json.dumps(doc), match=["slowdown.json: ", shown])
    assert "could not convert" not in line and "float()" not in line


def test_a_slowdown_model_of_the_right_types_still_runs(tmp_path):
    f = tmp_path / "slowdown.json"
    f.write_text(json.dumps(edited(json.loads(json.dumps(SLOWDOWN)), ["fit"], DROP)))
    code, out, err = cli("validate", DDP, "--preset", "a100-ib", "--slowdown", f)
    assert code == 0, err


# -- 5. what every model file's reader refuses before a loader looks at a value -------------------------------
VERBS = {"compute": predict_with, "comm": estimate_with, "slowdown": validate_with}
DOCS = {"compute": lambda: json.loads(COMPUTE.read_text()), "comm": lambda: json.loads(COMM.read_text()),
        "slowdown": lambda: json.loads(json.dumps(SLOWDOWN))}
FIELD = {"compute": ("params", "gemm_k_half"), "comm": ("gpus_per_node",), "slowdown": ("global",)}


def _with_text(doc: dict, field: tuple, text: str) -> str:
    """``doc`` as JSON with ``field`` written as the raw text ``text``."""
    marker = "@@HERE@@"
    edited(doc, list(field), marker)
    return json.dumps(doc).replace(json.dumps(marker), text)


@pytest.mark.parametrize("kind", sorted(VERBS))
@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_naming_the_field(tmp_path, kind, raw):
    field = ".".join(FIELD[kind])
    VERBS[kind](tmp_path, _with_text(DOCS[kind](), FIELD[kind], raw),
                match=[f"{field} = {raw}: not a JSON number"])


@pytest.mark.parametrize("kind", sorted(VERBS))
@pytest.mark.parametrize("raw,shown", [("1e999", "is beyond a float64"),
                                       ("1" + "0" * 400, "is beyond a 64-bit integer"),
                                       ("9" * 5000, "Exceeds the limit")])
def test_numbers_no_float_or_int64_holds_are_refused(tmp_path, kind, raw, shown):
    VERBS[kind](tmp_path, _with_text(DOCS[kind](), FIELD[kind], raw), match=[shown])


@pytest.mark.parametrize("kind", sorted(VERBS))
def test_a_key_twice_in_one_object_is_refused(tmp_path, kind):
    text = json.dumps(DOCS[kind]())
    first = next(iter(DOCS[kind]()))
    VERBS[kind](tmp_path, text[:-1] + f', "{first}": 1}}', match=[f"key '{first}' appears twice in one object"])


@pytest.mark.parametrize("kind", sorted(VERBS))
def test_nesting_past_32_levels_names_the_field_and_100000_levels_is_one_line(tmp_path, kind):
    deep = "[" * 40 + "]" * 40
    VERBS[kind](tmp_path, _with_text(DOCS[kind](), FIELD[kind], deep),
                match=[f"{'.'.join(FIELD[kind])}[0][0]", "is nested more than 32 levels deep"])
    VERBS[kind](tmp_path, "[" * 100_000 + "]" * 100_000, match=["nested too deeply to read (thousands of levels)"])


@pytest.mark.parametrize("kind", sorted(VERBS))
@pytest.mark.parametrize("data,shown", [(b"", "Expecting value at line 1 column 1"),
                                        (b'{"schema": "x"', "Expecting ',' delimiter at line 1 column 15"),
                                        (b'{"a": "\xff"}', "not UTF-8 text: byte 7")])
def test_a_cut_or_undecodable_file_is_one_line(tmp_path, kind, data, shown):
    VERBS[kind](tmp_path, data, match=[shown])


@pytest.mark.parametrize("kind", sorted(VERBS))
def test_a_byte_order_mark_is_tolerated_and_utf16_is_one_line(tmp_path, kind):
    text = json.dumps(DOCS[kind]())
    f = tmp_path / "m.json"
    f.write_bytes(b"\xef\xbb\xbf" + text.encode())
    args = {"compute": [*PREDICT, "-o", tmp_path / "ok", "--compute-profile", f],
            "comm": ["estimate", "all_reduce", "--bytes", "1MB", "--ranks", "8", "--profile", f],
            "slowdown": ["validate", DDP, "--preset", "a100-ib", "--slowdown", f]}[kind]
    code, _, err = cli(*args)
    assert code == 0, err
    VERBS[kind](tmp_path, text.encode("utf-16"), match=["not UTF-8 text"])


@pytest.mark.parametrize("flag", ["--compute-profile", "--profile", "--slowdown"])
@pytest.mark.parametrize("special", ["fifo", "dir", "dev_zero"])
def test_a_pipe_a_device_or_a_folder_is_refused_without_reading_it(tmp_path, flag, special):
    """A FIFO no one writes blocked the reader for ever; /dev/zero grew its memory without end."""
    f = tmp_path / "model.json"
    if special == "fifo":
        os.mkfifo(f)
    elif special == "dir":
        f.mkdir()
    else:
        os.symlink("/dev/zero", f)
    job = DDP
    argv = {"--compute-profile": [*PREDICT, "-o", str(tmp_path / "out")],
            "--profile": ["simulate", str(job), "--mode", "predict"],
            "--slowdown": ["simulate", str(job), "--mode", "predict", "--preset", "a100-ib"]}[flag]
    p = subprocess.run([sys.executable, "-c", "from echo_et.cli.main import main; main()", *argv, flag, str(f)],
                       capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert "model.json" in lines[0] and ("not a regular file" in lines[0] or "is a folder" in lines[0]), lines[0]


# -- 6. CC profile: a container where the node's description has strings, a huge node --------------------------
@pytest.mark.parametrize("path,value,shown", [
    (["hardware", "intra"], {"a": 1}, 'hardware.intra must be a string or a number, got {"a": 1}'),
    (["hardware", "gpu"], None, "hardware.gpu must be a string or a number, got null"),
    (["gpu_match"], [None], "gpu_match[0] must be a string, got null"),
    (["gpus_per_node"], 2 ** 40, f"gpus_per_node must be an integer in 1..1024, got {2 ** 40}"),
    (["schema"], "x" * 100, 'schema is "xxxxxxxxxx'),
])
def test_a_comm_profile_field_of_the_wrong_type_names_it(tmp_path, path, value, shown):
    doc = edited(json.loads(COMM.read_text()), path, value)
    estimate_with(tmp_path, json.dumps(doc), match=["cc.json: ", shown])


# -- 7. configuration CSVs: digits of other scripts, and "1_000", were read as numbers ---
@pytest.mark.parametrize("value", ["\u0664", "\uff14", "4\u0664", "1_000", "0_4"])
def test_a_configuration_value_in_non_ascii_digits_is_refused(tmp_path, value):
    f = tmp_path / "c.csv"
    f.write_text(f"layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n2,64,4,32,1,{value},1,1,2\n")
    refused("sweep", "--configs", f, "--workers", "1", "--no-plot", "-o", tmp_path / "out",
            match=["c.csv, line 2: global_batch", "is not a number written in ASCII digits"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag", ["--configs", "--iterations"])
def test_a_folder_given_as_a_configuration_csv_is_not_a_missing_file(tmp_path, flag):
    (tmp_path / "c.csv").mkdir()
    argv = (["sweep", "--configs", tmp_path / "c.csv", "--no-plot", "-o", tmp_path / "out"] if flag == "--configs"
            else ["calibrate", "compute", "--iterations", tmp_path / "c.csv", "-o", tmp_path / "p.json"])
    refused(*argv, match=["c.csv", "not a regular file"])


def test_every_shipped_preset_passes_the_strict_reader():
    """The presets load through json.loads; the same files handed back as --profile or
    --compute-profile go through the strict reader, which must accept them as they are."""
    from echo_et.models.profile_file import read_model_json

    presets = sorted((MODELS / "comm" / "presets").glob("*.json")) + [COMPUTE]
    assert len(presets) >= 5
    for p in presets:
        assert read_model_json(p, p.name, "profile") == json.loads(p.read_text())


def test_the_campaigns_nan_detector_tells_a_name_from_a_number(tmp_path):
    """A profile renamed "NaN" (a string field given a string) prints its name: not a
    non-finite number (campaign seed 1217, case 61). A NaN printed anywhere else still is."""
    from conftest import load_benchmark

    campaign = load_benchmark("hostile_campaign")
    setup = f'cc.json: [\'name\'] = "NaN" {campaign.ECHOED}'
    out = tmp_path / "none"
    assert not campaign._nonfinite("model NaN (calibrated), choices of NCCL 2.7.5\n 1000000 117.09", out, setup)
    assert campaign._nonfinite("model NaN (calibrated)\n 1000000 nan", out, setup)
    assert campaign._nonfinite("model NaN (calibrated)", out, "cc.json: ['params', 'x'] = \"NaN\"")
