"""``echo-et trace``: JSON output, and one-line errors with exit 2 on bad input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.ir import check_job, load_job

runner = CliRunner()
TINY = ["--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8", "--micro-batch", "1",
        "--vocab", "32"]


def _run(*args: str):
    return runner.invoke(app, ["trace", *args])


def test_trace_gpt_json(tmp_path):
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    out = tmp_path / "job"
    r = _run(*TINY, "--microbatches", "2", "--tp", "2", "--pp", "2", "--dp", "2", "-o", str(out),
             "--json")
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["world_size"] == 8 and s["graphs"] == 2 and s["traced_ranks"] == 4
    assert sorted(s["peak_memory_bytes"]) == ["0", "3", "4", "7"]
    assert all(v > 0 for v in s["peak_memory_bytes"].values()) and s["wall_s"] > 0
    job = load_job(out)
    assert check_job(job) == []
    assert job.manifest.layout.microbatches == 2
    assert json.loads(job.manifest.attrs["trace.workload"])["layers"] == 2
    cmd = job.manifest.provenance.command
    assert cmd.startswith("echo-et trace --workload gpt --layers 2 --hidden 16 ")
    assert cmd.endswith("--tp 2 --pp 2 --dp 2 --zero 0 --device cpu --verify sample --warmup 1 "
                        "--steps 1 -o job")
    assert job.manifest.attrs["trace.measured_steps"] == "1"


@pytest.mark.parametrize("args, message", [
    (["--tp", "3", "--heads", "4", "--hidden", "24"], r"tp \(3\) must divide heads \(4\)"),
    (["--tp", "2", "--heads", "4", "--hidden", "6"], r"heads \(4\) must divide hidden \(6\)"),
    (["--pp", "3", "--layers", "4"], r"pp \(3\) must divide layers \(4\)"),
    (["--dp", "2", "--tp", "2", "--world-size", "8"],
     r"dp\*tp\*pp = 4 differs from the world size 8"),
    (["--zero", "2"], "ZeRO stage 2 is not supported"),
    (["--workload", "bert"], "the built-in workloads are gpt and megatron-gpt"),
    (["--script", "nowhere.py:build"], "nowhere.py does not exist"),
    (["--script", "nowhere.py:build", "--recompute"], "--recompute applies to the built-in workloads"),
    (["--script", "nowhere.py:build", "--recompute-granularity", "selective"],
     "--recompute-granularity applies to the built-in workloads"),
    (["--device", "tpu"], "device 'tpu': use cpu, meta or cuda"),
    (["--verify", "some"], "verify mode 'some' is not one of sample, all"),
    (["--steps", "0"], "measured steps must be >= 1, got 0"),
    # a Job for a GPU that cannot hold the layout (vTrain's largest row, which fits a 40 GB
    # A100 only with recomputation)
    (["--workload", "megatron-gpt", "--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "1024",
      "--micro-batch", "8", "--device", "meta", "--gpu", "a100"],
     r"does not fit the GPU's memory: .* activations with no recomputation 31\.4 GB\), A100-SXM4-40GB has 40 GB"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    import re

    out = tmp_path / "job"
    r = _run(*args, "-o", str(out))
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), r.stderr
    assert not out.exists()


def test_cuda_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = _run(*TINY, "--device", "cuda", "-o", str(tmp_path / "job"))
    assert r.exit_code == 2 and "torch sees no CUDA device" in r.stderr
    assert not (tmp_path / "job").exists()


def test_user_function_raising_exit_2(tmp_path):
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    script = tmp_path / "user.py"
    script.write_text("def build(ctx):\n    raise RuntimeError('bad config')\n")
    out = tmp_path / "job"
    r = _run("--script", f"{script}:build", "--dp", "2", "-o", str(out))
    assert r.exit_code == 2
    (line,) = [x for x in r.stderr.strip().splitlines() if x.startswith("error:")]
    assert line == ("error: layout dp=2 tp=1 pp=1 microbatches=1, rank 0: build_fn raised "
                    "RuntimeError: bad config")
    assert not out.exists()
