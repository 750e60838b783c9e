"""The layout / scale / inject verbs: JSON output, written Jobs, bad input -> one line, exit 2."""

from __future__ import annotations

import json

from test_passes_inject import make_single_gpu_job
from test_passes_scale import make_3d_job
from typer.testing import CliRunner

from conftest import REPO
from echo_et.cli.main import app
from echo_et.ir import check_job, load_job, save_job

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def test_layout_verb_reports_how(tmp_path) -> None:
    job, _ = make_3d_job(2, 2, 2)
    save_job(job, tmp_path / "job")
    res = run("layout", tmp_path / "job", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert (out["dp"], out["tp"], out["pp"], out["order"]) == (2, 2, 2, "tp-dp-pp")
    assert out["source"] == "inferred:groups" and out["reasons"]
    res = run("layout", tmp_path / "job", "--layout", "dp=2,tp=2,pp=2", "--json")
    assert json.loads(res.stdout)["source"] == "declared"
    assert "impossible" not in one_line_error(run("layout", tmp_path / "job", "--layout", "dp=3,tp=2"))


def test_scale_verb_writes_a_checked_job(tmp_path) -> None:
    job, _ = make_3d_job(2, 2, 2)
    save_job(job, tmp_path / "job")
    res = run("scale", tmp_path / "job", "--dp", "128", "--gpus-per-node", "8", "-o", tmp_path / "big", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["world_size"] == 512 and out["graphs"] == 4
    assert out["input_layout"]["source"] == "inferred:groups"
    big = load_job(tmp_path / "big")
    assert check_job(big) == []
    assert big.manifest.hardware.gpus_per_node == 8
    # Deterministic: a second run writes the same bytes.
    run("scale", tmp_path / "job", "--dp", "128", "--gpus-per-node", "8", "-o", tmp_path / "big2")
    assert (tmp_path / "big" / "manifest.pb").read_bytes() == (tmp_path / "big2" / "manifest.pb").read_bytes()


def test_scale_verb_bad_input(tmp_path) -> None:
    job, _ = make_3d_job(2, 2, 2)
    save_job(job, tmp_path / "job")
    cases = [
        (["--dp", "3", "--gpus-per-node", "8"], "gpus-per-node"),
        (["--dp", "4", "--tp", "4"], "echo-et trace"),
        (["--dp", "4", "--layout", "dp=4,tp=1,pp=1"], "8 ranks"),
        (["--pp", "4"], "annotation"),
    ]
    for args, needle in cases:
        res = run("scale", tmp_path / "job", *args, "-o", tmp_path / "out")
        assert needle in one_line_error(res), (args, res.stderr)
        assert not (tmp_path / "out").exists()
    res = run("scale", tmp_path / "missing", "--dp", "4", "-o", tmp_path / "out")
    one_line_error(res)


def test_inject_verb(tmp_path) -> None:
    save_job(make_single_gpu_job(), tmp_path / "one")
    res = run("inject", tmp_path / "one", "--dp", "1024", "-o", tmp_path / "dp", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["world_size"] == 1024 and out["buckets"] >= 1
    assert check_job(load_job(tmp_path / "dp")) == []
    res = run("inject", tmp_path / "dp", "--dp", "4", "-o", tmp_path / "again")
    assert "already data-parallel" in one_line_error(res)
    assert not (tmp_path / "again").exists()


def test_scale_output_is_byte_identical_across_processes(tmp_path) -> None:
    """Group ids and order may not depend on hash seeds or protobuf map order: the same
    scale, run in separate processes with different PYTHONHASHSEED, writes the same bytes."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    src = REPO / "fixtures" / "jobs" / "gpt-tp2-pp2-dp2"
    outs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"out{seed}"
        proc = subprocess.run(
            [sys.executable, "-m", "echo_et.cli.main", "scale", str(src), "--dp", "4", "--pp", "4",
             "--microbatches", "8", "-o", str(out)],
            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr[-1000:]
        outs.append({p.relative_to(out).as_posix(): p.read_bytes()
                     for p in sorted(out.rglob("*")) if p.is_file()})
    assert outs[0] == outs[1] == outs[2]


def test_library_option_errors_come_out_with_the_flag(tmp_path) -> None:
    """The passes raise OptionError naming a value; the CLI names the flag that held it."""
    job, _ = make_3d_job(2, 2, 2)
    save_job(job, tmp_path / "job")
    line = one_line_error(run("scale", tmp_path / "job", "--dp", "3", "--gpus-per-node", "8",
                              "-o", tmp_path / "out"))
    assert line == ("error: --gpus-per-node: world size 12 is not a multiple of 8 GPUs per node "
                    "(nodes would be partly filled: 1 full and one of 4); give a G that divides 12, or one >= 12")
    assert one_line_error(run("scale", tmp_path / "job", "--dp", "4", "--a2a", "x", "-o", tmp_path / "out")
                          ).startswith("error: --a2a: unknown all-to-all policy 'x'")
    assert one_line_error(run("layout", tmp_path / "job", "--layout", "dp=x")
                          ).startswith("error: --layout: 'dp=x'")


# -- the nodes a Job records, through the passes (the checker's node-fill rule) --------------------------
def test_scale_keeps_the_recorded_nodes_only_for_a_world_that_fills_them(tmp_path) -> None:
    """A Job recording nodes of 8: scaled to 12 ranks it would keep them partly filled, so
    scale refuses, naming the recorded value and the option that replaces it; --gpus-per-node
    wins; re-staged to 32 ranks the output records 8 again."""
    job, _ = make_3d_job(2, 2, 2)
    job.manifest.hardware.gpus_per_node = 8
    save_job(job, tmp_path / "job")
    assert one_line_error(run("scale", tmp_path / "job", "--dp", "3", "-o", tmp_path / "o12")) == (
        "error: --gpus-per-node: the job records 8 GPUs per node, which its output would keep: world size 12 "
        "is not a multiple of 8 GPUs per node (nodes would be partly filled: 1 full and one of 4); give a G "
        "that divides 12, or one >= 12")
    assert not (tmp_path / "o12").exists()
    res = run("scale", tmp_path / "job", "--dp", "3", "--gpus-per-node", "4", "-o", tmp_path / "o12")
    assert res.exit_code == 0, res.output
    assert load_job(tmp_path / "o12").manifest.hardware.gpus_per_node == 4
    traced = load_job(REPO / "fixtures" / "jobs" / "gpt-tp2-pp2-dp2")       # annotated layers: re-stageable
    traced.manifest.hardware.gpus_per_node = 8
    save_job(traced, tmp_path / "traced")
    res = run("scale", tmp_path / "traced", "--dp", "4", "--pp", "4", "--microbatches", "8", "-o", tmp_path / "o32")
    assert res.exit_code == 0, res.output
    out = load_job(tmp_path / "o32")
    assert (out.world_size, out.manifest.hardware.gpus_per_node) == (32, 8) and check_job(out) == []


def test_select_forgets_recorded_nodes_its_ranks_would_leave_partly_filled() -> None:
    """select renumbers the ranks it keeps: 4 of a 16-rank Job on nodes of 8 are part of one
    node (kept); 12 would leave a node partly filled, so the output records its nodes as
    unknown and stays valid."""
    from echo_et.ir import GraphBuilder, JobBuilder, pb
    from echo_et.passes.select import select_ranks

    jb = JobBuilder("solo", 16)
    b = GraphBuilder("g")
    b.compute("k", b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0), duration_ns=1000)
    jb.add_graph(b.build())
    for r in range(16):
        jb.bind(r, "g", {})
    job = jb.build()
    job.manifest.hardware.gpus_per_node = 8
    assert check_job(job) == []
    four = select_ranks(job, [0, 1, 2, 3])
    assert four.manifest.hardware.gpus_per_node == 8 and check_job(four) == []
    twelve = select_ranks(job, list(range(12)))
    assert twelve.manifest.hardware.gpus_per_node == 0 and check_job(twelve) == []
