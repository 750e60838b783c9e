"""The estimate and calibrate verbs: JSON output, written profiles, bad input -> one line,
exit 2, nothing left behind."""

from __future__ import annotations

import json
import re

import pytest
from test_comm_calibrate import _traced_job
from typer.testing import CliRunner

from conftest import shared_path
from echo_et.cli.main import app
from echo_et.ir import save_job

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


def log(n: int):
    return shared_path(f"nccl-tests/echo-a100/nccl_{n}.log")


def test_estimate_json_per_size():
    res = run("estimate", "all_reduce", "--bytes", "4KiB,64MiB,1GB,512", "--ranks", "16",
              "--gpus-per-node", "8", "--preset", "a100-ib", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [e["bytes"] for e in out["estimates"]] == [4096, 64 << 20, 10**9, 512]
    assert (out["nodes"], out["ranks"], out["calibrated"], out["model"]) == (2, 16, False, "a100-ib")
    assert out["nccl_version"] == "2.7.5" and out["choice"] == "nccl"
    for e in out["estimates"]:
        assert e["time_us"] > 0 and e["time_us"] == e["time_ns"] / 1000
        assert e["protocol"] in ("LL", "LL128", "Simple")
        assert e["algorithm"] in ("ring", "tree")
        assert 1 <= e["channels"] <= 32
    assert out["estimates"][0]["protocol"] == "LL"
    assert out["estimates"][0]["channels"] == 1            # 4 KiB: one channel (NCCL's thread threshold)


def test_estimate_compares_nccl_with_the_fastest_choice():
    res = run("estimate", "all_reduce", "--bytes", "16KiB,128KiB,32MiB,1GiB", "--ranks", "32", "--gpus-per-node", "8",
              "--choice", "both", "--nccl-version", "2.7.5", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["nccl_version"] == "2.7.5" and out["choice"] == "both"
    for e in out["estimates"]:
        f = e["fastest"]
        assert e["nccl_over_fastest"] == pytest.approx(e["time_ns"] / f["time_ns"]) and e["nccl_over_fastest"] >= 1
        assert f["algorithm"] in ("ring", "tree") and 1 <= f["channels"] <= 16
    fast = run("estimate", "all_reduce", "--bytes", "32MiB", "--ranks", "32", "--choice", "fastest", "--json",
               "--nccl-version", "2.7.5")
    assert json.loads(fast.stdout)["estimates"][0]["time_ns"] == out["estimates"][2]["fastest"]["time_ns"]
    table = run("estimate", "all_reduce", "--bytes", "1MiB", "--ranks", "32", "--choice", "both")
    assert table.exit_code == 0 and "fastest" in table.stdout and "tree/LL128/16" in table.stdout


def test_estimate_table_and_send(tmp_path):
    res = run("estimate", "send", "--bytes", "1MiB", "--ranks", "9")
    assert res.exit_code == 0, res.output
    assert "p2p" in res.stdout and "2 node(s)" in res.stdout


@pytest.mark.parametrize("args, match", [
    (["allreduce", "--bytes", "8", "--ranks", "2"], "unknown collective"),
    (["all_reduce", "--bytes", "8", "--ranks", "0"], "--ranks"),
    (["all_reduce", "--bytes", "-1", "--ranks", "2"], "--bytes: '-1' is out of range (1B"),
    (["all_reduce", "--bytes", "0", "--ranks", "2"], "out of range (1B"),
    (["all_reduce", "--bytes", "4KiB,0", "--ranks", "2"], "out of range (1B"),
    (["all_reduce", "--bytes", "8", "--ranks", "16", "--world", "8"], "larger than the world"),
    (["all_reduce", "--bytes", "8", "--ranks", "2", "--world", "0"], "--world"),
    (["all_reduce", "--bytes", "8", "--ranks", "2", "--choice", "best"], "--choice"),
    (["all_reduce", "--bytes", "8", "--ranks", "2", "--nccl-version", "2.99.9"], "unknown NCCL version"),
    (["all_reduce", "--bytes", "12XB", "--ranks", "2"], "is not a size"),
    (["all_reduce", "--bytes", "8", "--ranks", "2", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["all_reduce", "--bytes", "8", "--ranks", "2", "--preset", "nope"], "unknown preset"),
    (["send", "--bytes", "8", "--ranks", "1"], "--ranks >= 2"),
])
def test_estimate_bad_input(args, match):
    assert match in one_line_error(run("estimate", *args))


def test_calibrate_writes_a_deterministic_profile(tmp_path):
    out1, out2 = tmp_path / "a.json", tmp_path / "b.json"
    res = run("calibrate", "nccl-tests", log(2), log(16), "--gpus-per-node", "8", "-o", out1, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["samples"] == sum(len(re.findall(r"^\S*\s+\d+\s+\d+\s+float", log(n).read_text(), re.M))
                                    for n in (2, 16))
    assert report["base_preset"] == "a100-ib"          # from the GPU the logs name
    assert set(report["by_source"]) == {"nccl_2.log", "nccl_16.log"}
    assert run("calibrate", "nccl-tests", log(2), log(16), "--gpus-per-node", "8", "-o", out2).exit_code == 0
    assert out1.read_bytes() == out2.read_bytes()
    prof = json.loads(out1.read_text())
    assert prof["calibrated"] is True and prof["name"] == "a100-ib-calibrated"
    assert [s["file"] for s in prof["sources"]] == ["nccl_2.log", "nccl_16.log"]

    res = run("estimate", "all_reduce", "--bytes", "1MiB", "--ranks", "16", "--profile", out1, "--json")
    assert json.loads(res.stdout)["calibrated"] is True

    res = run("calibrate", "evaluate", "--profile", out1, log(2), log(32), "--json")
    assert res.exit_code == 0, res.output
    logs = json.loads(res.stdout)["logs"]
    assert [r["log"] for r in logs] == ["nccl_2.log", "nccl_32.log"]
    rows32 = re.findall(r"^\S*\s+(\d+)\s+\d+\s+float", log(32).read_text(), re.M)
    assert [r["bytes"] for r in logs[1]["rows"]] == [int(s) for s in rows32]
    for r in logs:
        assert r["mape_percent"] is not None and r["mape_ge_1mib_percent"] is not None
        assert r["median_4kib_1mib_percent"] is not None
    res = run("calibrate", "evaluate", "--profile", out1, log(8))
    assert res.exit_code == 0 and "nccl_8.log" in res.stdout and "MAPE >=1MiB" in res.stdout


def test_calibrate_bad_input_leaves_nothing(tmp_path):
    out = tmp_path / "p.json"
    readme = shared_path("nccl-tests/echo-a100/README.md")
    assert "not nccl-tests output" in one_line_error(
        run("calibrate", "nccl-tests", readme, "--gpus-per-node", "8", "-o", out))
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert "--gpus-per-node" in one_line_error(
        run("calibrate", "nccl-tests", log(16), "--gpus-per-node", "0", "-o", out))
    line = one_line_error(run("calibrate", "nccl-tests", log(8), "--gpus-per-node", "4", "-o", out))
    assert line.startswith("error: --gpus-per-node: ") and "more than 4 GPUs per node" in line, line
    assert "unknown preset" in one_line_error(
        run("calibrate", "nccl-tests", log(2), "--gpus-per-node", "8", "--preset", "x", "-o", out))
    assert "No such file" in one_line_error(
        run("calibrate", "nccl-tests", tmp_path / "missing.log", "--gpus-per-node", "8", "-o", out))
    assert "overwrite an input" in one_line_error(
        run("calibrate", "nccl-tests", log(2), "--gpus-per-node", "8", "-o", log(2)))
    assert list(tmp_path.iterdir()) == []
    assert "--hold-out" in one_line_error(run("calibrate", "evaluate", log(2), "--hold-out", "some"))
    assert "--nccl-version" in one_line_error(run("calibrate", "nccl-tests", log(2), "--gpus-per-node", "8",
                                                  "-o", out, "--nccl-version", "2.99"))
    no_table = tmp_path / "header_only.log"
    no_table.write_text("\n".join(log(2).read_text().splitlines()[:5]) + "\n")
    assert "no table header" in one_line_error(run("calibrate", "evaluate", no_table))
    assert "no table header" in one_line_error(run("calibrate", "nccl-tests", no_table, "--gpus-per-node", "8",
                                                   "-o", out))
    no_table.unlink()
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert "JSON object" in one_line_error(run("calibrate", "evaluate", "--profile", bad, log(2)))


def test_calibrate_from_a_traced_job(tmp_path):
    job = _traced_job({r: [400_000 + 10_000 * r] for r in range(16)}, 256 << 20)
    save_job(job, tmp_path / "job")
    out = tmp_path / "p.json"
    res = run("calibrate", "trace", tmp_path / "job", "--gpus-per-node", "8", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["samples"] == 1
    prof = json.loads(out.read_text())
    assert prof["sources"] == [{"file": "job", "kind": "trace", "ranks": 16, "samples": 1}]


def h100(name: str):
    return shared_path(f"nccl-tests/h100-c01/{name}.log")


H100_LOGS = ("1n8g-all_gather", "1n8g-alltoall", "1n8g-reduce_scatter", "1n8g-sendrecv", "10n80g-all_reduce")


def _measured_us(path, size: int) -> float:
    for ln in path.read_text().splitlines():
        f = ln.split()
        if f and f[0] == str(size):
            return min(float(f[5]), float(f[9]))
    raise AssertionError(size)


def test_one_profile_for_every_collective_of_a_cluster(tmp_path):
    out = tmp_path / "h100.json"
    res = run("calibrate", "nccl-tests", *[h100(n) for n in H100_LOGS], "--gpus-per-node", "8", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert set(report["by_source"]) == {f"{n}.log" for n in H100_LOGS}
    assert report["nccl_version"] == "2.28.3"       # the newest modelled release up to the stated 2.29.2
    prof = json.loads(out.read_text())
    assert [s["collective"] for s in prof["sources"]] == ["all_gather", "all_to_all", "reduce_scatter",
                                                          "sendrecv", "all_reduce"]
    assert {s["nccl_stated"] for s in prof["sources"]} == {"2.29.2"}
    assert set(prof["params"]["coll_nvlink_eff"]) == {"all_gather", "all_to_all", "reduce_scatter", "sendrecv"}
    # estimate uses the collective's own fitted rate: 1 GiB all-gather output on the 8 GPUs measured
    got = json.loads(run("estimate", "all_gather", "--bytes", str((1 << 30) // 8), "--ranks", "8",
                         "--profile", out, "--json").stdout)["estimates"][0]["time_us"]
    assert got == pytest.approx(_measured_us(h100("1n8g-all_gather"), 1 << 30), rel=0.1)
    # the sendrecv log is evaluated as send/recv (it was read as a reduce)
    res = run("calibrate", "evaluate", "--profile", out, h100("1n8g-sendrecv"), "--json")
    assert res.exit_code == 0, res.output
    (rep,) = json.loads(res.stdout)["logs"]
    assert rep["collective"] == "sendrecv" and {r["algorithm"] for r in rep["rows"]} == {"p2p"}


def test_a_truncated_log_is_fitted_with_a_warning(tmp_path):
    lines = h100("1n8g-all_gather").read_text().splitlines()
    cut = next(i for i, ln in enumerate(lines) if ln.strip().startswith("8589934592"))
    p = tmp_path / "ag.log"
    p.write_text("\n".join(lines[:cut]) + "\n")
    out = tmp_path / "p.json"
    res = run("calibrate", "nccl-tests", p, "--gpus-per-node", "8", "-o", out)
    assert res.exit_code == 0, res.output
    warning = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "8589934592, 17179869184" in warning[0] and f"ag.log:{cut}" in warning[0]
    assert json.loads(out.read_text())["sources"][0]["missing_sizes"] == [8589934592, 17179869184]


def test_mixed_collectives_without_headers_leave_nothing(tmp_path):
    bare = ["\n".join(ln for ln in h100(n).read_text().splitlines() if "Collective test" not in ln) + "\n"
            for n in ("1n8g-sendrecv", "1n8g-reduce_scatter")]
    p = tmp_path / "mixed.log"
    p.write_text("".join(bare))
    out = tmp_path / "p.json"
    assert re.search(r"mixed\.log:\d+: runs of different collectives", one_line_error(
        run("calibrate", "nccl-tests", p, "--gpus-per-node", "8", "-o", out)))
    assert "runs of different collectives" in one_line_error(run("calibrate", "evaluate", p))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["mixed.log"]


def test_evaluate_holds_out_every_log_of_several_collectives():
    res = run("calibrate", "evaluate", h100("1n8g-all_gather"), h100("1n8g-sendrecv"), "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [(r["log"], r["collective"]) for r in out["leave_one_out"]] == [
        ("1n8g-all_gather.log", "all_gather"), ("1n8g-sendrecv.log", "sendrecv")]
    assert out["nccl_version"] == "2.28.3"                       # the logs state 2.29.2
    for r in out["in_sample"]:
        assert {"model", "baseline", "baseline_one_line"} <= set(r)
    assert "auto, multi-node or all" in one_line_error(run("calibrate", "evaluate", log(2), "--hold-out", "x"))


def test_calibrate_picks_its_preset_by_exact_gpu_variant(tmp_path):
    from echo_et.errors import EchoError
    from echo_et.models.comm.calibrate import default_preset

    assert default_preset(["A100-SXM4-40GB"]) == "a100-ib"
    assert default_preset(["NVIDIA H100 80GB HBM3", "H100-SXM5-80GB"]) == "h100-ib"
    assert default_preset([]) == "a100-ib"          # no GPU named (a lookup table): the default
    with pytest.raises(EchoError, match="unknown GPU 'H100 Future'.*presets: a100,"):
        default_preset(["H100 Future"])              # "h100" is in the name, but no variant is
    with pytest.raises(EchoError, match="different node types"):
        default_preset(["A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"])
    out = tmp_path / "p.json"
    for gpu, why in (("NVIDIA H100 PCIe", "PCIe board"), ("Tesla H100X-SXM9", "unknown GPU")):
        p = tmp_path / "renamed.log"
        p.write_text(log(2).read_text().replace("A100-SXM4-40GB", gpu))
        assert why in one_line_error(run("calibrate", "nccl-tests", p, "--gpus-per-node", "8", "-o", out))
        assert why in one_line_error(run("calibrate", "evaluate", p))
        # naming the preset fits the log whatever GPU it names
        assert not out.exists()
    res = run("calibrate", "nccl-tests", p, "--gpus-per-node", "8", "--preset", "a100-ib", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["base_preset"] == "a100-ib"


# -- --gpus-per-node that leaves a node partly filled (the rule of every verb) ---------------------------
PARTLY = "is not a multiple of 3 GPUs per node (nodes would be partly filled: 2 full and one of 2)"


def _without_hosts(tmp_path, n: int):
    """nccl_<n>.log without its `Rank r ... on HOST` lines: its ranks are packed on --gpus-per-node."""
    p = tmp_path / f"bare{n}.log"
    p.write_text("\n".join(ln for ln in log(n).read_text().splitlines() if " on node-" not in ln) + "\n")
    return p


def test_calibrate_refuses_a_log_whose_ranks_leave_a_node_partly_filled(tmp_path):
    """A log that does not name its hosts is packed on --gpus-per-node: its 8 ranks on nodes of
    3 are refused naming the log, by the fit and the evaluation alike; nodes of 4 or 8 are not."""
    bare = _without_hosts(tmp_path, 8)
    out = tmp_path / "p.json"
    assert one_line_error(run("calibrate", "nccl-tests", bare, "--gpus-per-node", "3", "-o", out)) == \
        f"error: --gpus-per-node: bare8.log: world size 8 {PARTLY}; give a G that divides 8, or one >= 8"
    for args in (["--gpus-per-node", "3"], ["--gpus-per-node", "3", "--preset", "a100-ib"]):
        assert f"bare8.log: world size 8 {PARTLY}" in one_line_error(run("calibrate", "evaluate", bare, *args))
    assert sorted(x.name for x in tmp_path.iterdir()) == ["bare8.log"]
    res = run("calibrate", "nccl-tests", bare, "--gpus-per-node", "4", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["sources"][0]["nodes"] == 2
    assert run("calibrate", "evaluate", bare, "--gpus-per-node", "8", "--preset", "a100-ib").exit_code == 0


def test_calibrate_takes_the_hosts_a_log_names_when_they_are_equal(tmp_path):
    """A log naming every rank's host says where they ran: 16 ranks on 4 hosts of 4 are 4 nodes
    of 4 even with --gpus-per-node 6 (at least the most on one host); hosts of unequal size
    (8, 4, 4) are refused, the collective model assuming equal nodes."""
    text = log(16).read_text()
    four = tmp_path / "four.log"
    four.write_text(re.sub(r"Rank +(\d+) Pid +(\d+) on node-\d+",
                           lambda m: f"Rank {m.group(1):>2} Pid {m.group(2)} on host{int(m.group(1)) // 4}", text))
    out = tmp_path / "p.json"
    res = run("calibrate", "nccl-tests", four, "--gpus-per-node", "6", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    src = json.loads(out.read_text())["sources"][0]
    assert (src["ranks"], src["nodes"]) == (16, 4)
    uneven = tmp_path / "uneven.log"
    uneven.write_text(re.sub(r"Rank +(1[2-5]) Pid +(\d+) on node-000002",
                             lambda m: f"Rank {m.group(1)} Pid {m.group(2)} on node-000003", text))
    out2 = tmp_path / "p2.json"
    line = one_line_error(run("calibrate", "nccl-tests", uneven, "--gpus-per-node", "8", "-o", out2))
    assert line == ("error: uneven.log: its 16 ranks ran on hosts of unequal size (8 on node-000000, 4 on "
                    "node-000002); the collective model assumes equal nodes")
    assert "hosts of unequal size" in one_line_error(run("calibrate", "evaluate", uneven, "--preset", "a100-ib"))
    assert not out2.exists()


def test_calibrate_trace_refuses_a_job_whose_world_leaves_a_node_partly_filled(tmp_path):
    """The world of a traced job (16 ranks) against --gpus-per-node, naming the job; a second
    job refused leaves nothing written after the first was read."""
    save_job(_traced_job({r: [400_000] for r in range(16)}, 256 << 20), tmp_path / "job")
    out = tmp_path / "p.json"
    for jobs in ([tmp_path / "job"], [tmp_path / "job", tmp_path / "job"]):
        assert one_line_error(run("calibrate", "trace", *jobs, "--gpus-per-node", "6", "-o", out)) == (
            "error: --gpus-per-node: job: world size 16 is not a multiple of 6 GPUs per node (nodes would be "
            "partly filled: 2 full and one of 4); give a G that divides 16, or one >= 16")
    assert not out.exists()
    for gpn in ("16", "32"):                               # one node, or part of one
        res = run("calibrate", "trace", tmp_path / "job", "--gpus-per-node", gpn, "-o", tmp_path / f"{gpn}.json")
        assert res.exit_code == 0, res.output


def test_calibrate_choices_refuses_a_world_that_leaves_a_node_partly_filled(tmp_path):
    src = shared_path("traces/HolisticTraceAnalysis/tests/data/trace_diff/control/control.json.gz")
    out = tmp_path / "p.json"
    assert one_line_error(run("calibrate", "choices", src, "--gpus-per-node", "3", "-o", out)) == (
        f"error: --gpus-per-node: control.json.gz: world size 8 {PARTLY}; give a G that divides 8, or one >= 8")
    assert not out.exists()
    res = run("calibrate", "choices", src, "--gpus-per-node", "4", "-o", out, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["jobs"][0]["gpus_per_node"] == 4 and out.exists()


@pytest.mark.parametrize("args, ok", [
    (["--ranks", "8", "--gpus-per-node", "3"], False),             # the world is the group: 8 ranks
    (["--ranks", "2", "--world", "8", "--gpus-per-node", "3"], False),   # a group inside a world of 8
    (["--ranks", "8", "--world", "8", "--gpus-per-node", "3"], False),
    (["--ranks", "6", "--world", "8", "--gpus-per-node", "4"], True),    # the group spans 4 + 2 of 2 full nodes
    (["--ranks", "3", "--gpus-per-node", "4"], True),              # part of one node
    (["--ranks", "9"], True),                                       # no --gpus-per-node: the model's, not checked
])
def test_estimate_applies_the_rule_to_its_world_else_its_ranks(args, ok):
    res = run("estimate", "all_reduce", "--bytes", "1MiB", *args)
    if ok:
        assert res.exit_code == 0, res.output
    else:
        assert f"error: --gpus-per-node: world size 8 {PARTLY}" in one_line_error(res)
