"""echo-et predict: a model configuration to a predicted GPU step in one folder (summary,
timeline per class of equivalent ranks, chart, Job), the same bytes on every run, bad input
one line with nothing written."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app

pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")

runner = CliRunner()
TINY = ["--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--micro-batch", "1",
        "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--vocab", "256", "--gpu", "a100"]


def _files(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_predict_writes_one_folder_the_same_bytes_each_run(tmp_path) -> None:
    a = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "a")])
    assert a.exit_code == 0, a.output
    lines = a.stdout.splitlines()
    assert lines[0].startswith("GPT 2 layers, hidden 64") and "= 8 a100 GPUs" in lines[0]
    assert lines[1].startswith("predict: step time ")
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["world_size"] == 8 and summary["config"]["tp"] == 2 and summary["prediction"]["cluster"]["gpu"]
    classes = summary["rank_classes"]
    assert sorted(r for c in classes for r in c) == list(range(8))
    timeline = sorted(p.name for p in (tmp_path / "a" / "timeline").iterdir())
    assert timeline == sorted(f"rank-{c[0]}.json" for c in classes)   # one file per class
    assert (tmp_path / "a" / "job" / "manifest.pb").is_file()
    rates = summary["throughput"]   # 8 sequences of 32 tokens per step; TINY runs fp16 without recomputation
    assert rates["tokens_per_s"] == pytest.approx(8 * 32 / (summary["step_time_ns"] / 1e9), abs=0.1)
    assert rates["model_tflops_per_gpu"] == rates["hardware_tflops_per_gpu"] > 0
    assert rates["mfu_pct"] == pytest.approx(100 * rates["model_tflops_per_gpu"] / 312, rel=1e-3)
    line = next(x for x in lines if x.startswith("throughput: "))
    assert f"(MFU {rates['mfu_pct']:.1f} % of the a100's 312 TFLOP/s fp16 peak)" in line and "HFU" not in line
    window = summary["timeline"]    # the whole step fits the default bound
    assert window["until_ns"] is None and window["events"] == window["of"] > 0
    b = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "b")])
    assert b.exit_code == 0, b.output
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    again = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "a")])   # an earlier output: replaced
    assert again.exit_code == 0, again.output
    # a user's file put beside (or inside) an earlier output makes the folder the user's
    for where in ("notes.txt", "job/graphs/notes.txt", "timeline/notes.txt"):
        (tmp_path / "a" / where).write_text("keep")
        res = runner.invoke(app, ["predict", *TINY, "-o", str(tmp_path / "a")])
        assert res.exit_code == 2 and "not an echo-et predict folder" in res.stderr, (where, res.output)
        assert (tmp_path / "a" / where).read_text() == "keep"
        (tmp_path / "a" / where).unlink()


def test_predict_bad_input_is_one_line_and_writes_nothing(tmp_path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    cases = [
        (["predict", *TINY, "-o", str(mine)], "not an echo-et predict folder"),
        (["predict", *[("3" if a == "4" and i == 5 else a) for i, a in enumerate(TINY)], "-o", str(tmp_path / "x")],
         "must divide"),
        (["predict", *TINY[:-1], "tpu", "-o", str(tmp_path / "x")], "--gpu"),
        (["predict", *TINY, "--dtype", "int8", "-o", str(tmp_path / "x")], "--dtype"),
        (["predict", *TINY, "--timeline-events", "0", "-o", str(tmp_path / "x")], "--timeline-events"),
        (["predict", *TINY, "--timeline-events", "9", "--timeline-all", "-o", str(tmp_path / "x")],
         "not both"),
        (["predict", *TINY, "--max-output", "lots", "-o", str(tmp_path / "x")], "--max-output"),
        # past --max-output: refused after the simulation, before a byte is written
        (["predict", *TINY, "--max-output", "1KB", "-o", str(tmp_path / "x")],
         "the predicted timeline would write at least"),
        # fits a 40 GB A100 only with recomputation (vTrain's largest row)
        (["predict", "--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "1024", "--micro-batch", "8",
          "--global-batch", "8", "-o", str(tmp_path / "x")], "activations with no recomputation"),
    ]
    for args, words in cases:
        res = runner.invoke(app, args)
        assert res.exit_code == 2, (args, res.output)
        err = res.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err
    assert _files(mine) == {"notes.txt": b"keep"}
    assert not (tmp_path / "x").exists()


def _boxes(folder) -> Counter:
    """(rank, category, name, ts, dur) of every box of a timeline folder, counted (the
    ProfilerStep span aside)."""
    out: Counter = Counter()
    for p in (folder / "timeline").iterdir():
        trace = json.loads(p.read_text())
        rank = trace["distributedInfo"]["rank"]
        out.update((rank, e["cat"], e["name"], e["ts"], e["dur"]) for e in trace["traceEvents"]
                   if e["ph"] == "X" and not e["name"].startswith("ProfilerStep#"))
    return out


def test_a_bounded_timeline_is_the_start_of_the_whole_step(tmp_path) -> None:
    """``--timeline-events N``: the boxes of the whole step (``--timeline-all``) that start
    before ``until_ns``, at most N of them; the prediction itself is the same."""
    whole = runner.invoke(app, ["predict", *TINY, "--timeline-all", "-o", str(tmp_path / "all")])
    assert whole.exit_code == 0, whole.output
    part = runner.invoke(app, ["predict", *TINY, "--timeline-events", "50", "-o", str(tmp_path / "part")])
    assert part.exit_code == 0, part.output
    again = runner.invoke(app, ["predict", *TINY, "--timeline-events", "50", "-o", str(tmp_path / "again")])
    assert again.exit_code == 0, again.output
    assert _files(tmp_path / "part") == _files(tmp_path / "again")   # the cut is the same on every run
    assert "boxes (--timeline-events N for more" in part.stdout.splitlines()[-1]
    a = json.loads((tmp_path / "all" / "summary.json").read_text())
    b = json.loads((tmp_path / "part" / "summary.json").read_text())
    wa, wb = a.pop("timeline"), b.pop("timeline")
    assert a == b
    assert wa["until_ns"] is None and wa["events"] == wa["of"] == wb["of"]
    assert wb["until_ns"] is not None and 0 < wb["events"] <= 50 < wb["of"]
    until_us = (wb["until_ns"] - wb["from_ns"]) / 1000.0
    full, kept = _boxes(tmp_path / "all"), _boxes(tmp_path / "part")
    assert full.total() == wa["of"] and kept.total() == wb["events"]
    assert kept == Counter({e: n for e, n in full.items() if e[3] < until_us})
    # fewer than the boxes at the step's first instant: those are written (never an empty folder)
    one = runner.invoke(app, ["predict", *TINY, "--timeline-events", "1", "-o", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    first = _boxes(tmp_path / "one")
    assert first and {e[3] for e in first} == {0.0}
    assert first == Counter({e: n for e, n in full.items() if e[3] == 0.0})


def test_predicts_default_nodes_are_recorded_only_where_the_layout_fills_them(tmp_path) -> None:
    """Without --gpus-per-node predict runs on nodes of 8; its Job records them for 8 ranks, but
    not for 12 (a node would be partly filled: the checker's node-fill rule), and stays valid."""
    from echo_et.ir import check_job, load_job

    for dp, gpn in (("2", 8), ("3", 0)):
        args = list(TINY)
        args[args.index("--dp") + 1] = dp
        args[args.index("--global-batch") + 1] = str(4 * int(dp))
        res = runner.invoke(app, ["predict", *args, "-o", str(tmp_path / dp)])
        assert res.exit_code == 0, res.output
        job = load_job(tmp_path / dp / "job")
        assert (job.world_size, job.manifest.hardware.gpus_per_node) == (4 * int(dp), gpn)
        assert check_job(job) == []


def test_sync_timers_wait_for_the_gpu_at_every_phase_and_are_recorded(tmp_path) -> None:
    """``--sync-timers`` (Megatron's timers before 2022) adds host waits at the edges of every
    micro-batch's forward, backward and pipeline exchange: the step is never faster, and the
    summary records the setting (absent when off, as before the flag existed). The layers are
    large enough that the GPU, not the host, binds between the waits: on a host-bound step
    (TINY) a wait for an idle GPU costs nothing and the two steps are equal."""
    gpu_bound = ["--layers", "2", "--hidden", "1024", "--heads", "8", "--seq", "512", "--micro-batch", "2",
                 "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--vocab", "1024", "--gpu", "a100"]
    runs = {}
    for name, extra in (("off", []), ("on", ["--sync-timers"])):
        r = runner.invoke(app, ["predict", *gpu_bound, *extra, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["on"]["prediction"]["sync_timers"] is True
    assert "sync_timers" not in runs["off"]["prediction"]
    assert runs["on"]["step_time_ns"] > runs["off"]["step_time_ns"]


def test_sync_timers_are_megatron_only(tmp_path) -> None:
    r = runner.invoke(app, ["trace", "--workload", "gpt", "--sync-timers", "-o", str(tmp_path / "j")])
    assert r.exit_code == 2 and "synchronising timers are Megatron's" in r.output
    assert not (tmp_path / "j").exists()


def test_grad_sync_overlap_hides_the_gradient_all_reduce_and_is_recorded(tmp_path) -> None:
    """``--grad-sync overlap`` (PyTorch DDP, Megatron's ``--DDP-impl torch``) all-reduces the
    gradients in buckets during the last micro-batch's backward, where the default (Megatron's
    local DDP) reduces the whole buffer after it: on a data-parallel layout less of the
    all-reduce is exposed. The summary records the setting; a mode it does not know is one line."""
    # hidden 1024: 50M parameters, four 25 MB buckets. At hidden 512 the all-reduce is small
    # enough that the buckets' per-call host time outweighs what overlapping hides.
    dp8 = ["--layers", "4", "--hidden", "1024", "--heads", "8", "--seq", "512", "--micro-batch", "2",
           "--global-batch", "32", "--tp", "1", "--pp", "1", "--dp", "8", "--vocab", "1024", "--gpu", "a100"]
    runs = {}
    for name, extra in (("local", []), ("overlap", ["--grad-sync", "overlap"])):
        r = runner.invoke(app, ["predict", *dp8, *extra, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["local"]["prediction"]["grad_sync"] == "after-backward"
    assert runs["overlap"]["prediction"]["grad_sync"] == "overlap"
    exposed = {k: v["ranks"]["0"]["exposed_comm_ns"] for k, v in runs.items()}
    comm = {k: v["ranks"]["0"]["comm_ns"] for k, v in runs.items()}
    assert exposed["overlap"] < exposed["local"] <= comm["local"]
    r = runner.invoke(app, ["predict", *dp8, "--grad-sync", "sometimes", "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2
    assert r.stderr.strip() == "error: --grad-sync: 'sometimes' is not one of overlap, after-backward"
    assert not (tmp_path / "bad").exists()


def test_predict_says_what_bounds_the_compute_time(tmp_path) -> None:
    """summary.json's ``compute_retime`` splits the compute time by what sets it, and the
    output says so in one line: hidden 4096's GEMMs at the sustained tensor-core ceiling, the
    larger share of its step; TINY's kernels (hidden 64) far below it, on memory and per-kernel
    overhead."""
    gpu_bound = ["--layers", "2", "--hidden", "4096", "--heads", "32", "--seq", "1024", "--micro-batch", "2",
                 "--global-batch", "16", "--tp", "2", "--pp", "1", "--dp", "2", "--vocab", "1024", "--gpu", "a100",
                 "--recompute"]
    shares, hfu = {}, {}
    for name, args in (("large", gpu_bound), ("tiny", TINY)):
        r = runner.invoke(app, ["predict", *args, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        line = next(x for x in r.stdout.splitlines() if x.startswith("compute time by what bounds it: "))
        hfu[name] = "(HFU " in next(x for x in r.stdout.splitlines() if x.startswith("throughput: "))
        retime = json.loads((tmp_path / name / "summary.json").read_text())["compute_retime"]
        by_bound = retime["compute_ns_by_bound"]
        assert sum(by_bound.values()) == pytest.approx(retime["compute_ns_after"], abs=len(by_bound))
        assert retime["gpu"] == "a100" and "not_modelled" not in by_bound
        shares[name] = {k: v / retime["compute_ns_after"] for k, v in by_bound.items()}
        top = max(by_bound, key=lambda k: by_bound[k])
        label = {"ceiling": "sustained tensor-core ceiling", "memory": "memory bandwidth",
                 "overhead": "per-kernel overhead"}[top]
        assert line.split(": ", 1)[1].startswith(f"{label} {100 * shares[name][top]:.1f} %"), line
    assert shares["large"]["ceiling"] > 0.5
    # recomputation adds FLOPs the model does not count: the throughput line gives both
    rates = json.loads((tmp_path / "large" / "summary.json").read_text())["throughput"]
    assert rates["hardware_flops"] > rates["model_flops"] and rates["hfu_pct"] > rates["mfu_pct"]
    assert hfu == {"large": True, "tiny": False}
    assert shares["tiny"].get("ceiling", 0.0) < 0.05
