"""`calibrate evaluate` without a profile (in-sample and leave-one-log-out errors next to the
3-parameter baseline), its plots, and the vTrain all-reduce lookup tables as a source."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import shared_path
from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.models.comm import lut, nccl_tests, tuning
from echo_et.models.comm.calibrate import read_measurements, samples_from_runs
from echo_et.models.comm.profile import load_preset
from echo_et.models.comm.topology import contiguous

runner = CliRunner()


def log(n: int):
    return shared_path(f"nccl-tests/echo-a100/nccl_{n}.log")


def table(n: int):
    return shared_path(f"measurements/vtrain-a100/trace/a100/AR_GPU{n}_1M_1024M_LUT")


def test_cross_validation_reports_in_sample_and_held_out_errors(tmp_path):
    res = runner.invoke(app, ["calibrate", "evaluate", str(log(2)), str(log(16)), "--gpus-per-node", "8",
                              "--nccl-version", "2.7.5", "--plot", str(tmp_path / "plots"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [r["log"] for r in out["in_sample"]] == ["nccl_2.log", "nccl_16.log"]
    (held,) = out["leave_one_out"]                     # the multi-node log, fitted on the other one only
    assert held["log"] == "nccl_16.log" and held["fitted_on"] == ["nccl_2.log"] and held["nccl"] == "2.7.5"
    for row in out["in_sample"] + out["leave_one_out"]:
        for who in ("model", "baseline"):
            assert row[who]["mape_ge_1mib_percent"] is not None and row[who]["median_4kib_1mib_percent"] is not None
    sixteen = out["in_sample"][1]
    assert sixteen["model"]["mape_ge_1mib_percent"] < 5 < sixteen["baseline"]["mape_ge_1mib_percent"]
    pngs = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert pngs == ["choice_regions.png", "measured_vs_predicted.png"]
    assert all((tmp_path / "plots" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_plots_are_deterministic(tmp_path):
    pytest.importorskip("matplotlib", reason="plots need matplotlib (pip install 'echo-et[plot]')")
    from echo_et.models.comm.plots import write_plots

    prof = load_preset("a100-ib")
    sets = {"preset": [(run, prof) for n in (8, 16) for run in nccl_tests.read_log(log(n))]}
    a = write_plots(tmp_path / "a", sets, 8)
    b = write_plots(tmp_path / "b", sets, 8)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    (tmp_path / "file").write_text("x")
    with pytest.raises(EchoError, match="not a directory"):
        write_plots(tmp_path / "file", sets, 8)


def test_lookup_tables_read_like_single_node_runs():
    (run,) = read_measurements(table(4))
    assert (run.ranks, run.collective, run.source) == (4, "all_reduce", "AR_GPU4_1M_1024M_LUT")
    samples, sources = samples_from_runs([run], 8)
    # two sizes per octave from 1 MiB to 1 GiB: k MiB for k = 2^i and 3 x 2^(i-1)
    assert [s.nbytes >> 20 for s in samples][:8] == [1, 2, 3, 4, 6, 8, 12, 16] and len(samples) == 20
    assert sources[0]["kind"] == "lut" and not samples[0].placement.multi_node
    first = table(4).read_text().splitlines()[1].split(",")   # 1048576,262144,float,time(ns),busbw,time(ns),busbw
    assert samples[0].time_us == pytest.approx(min(float(first[3]), float(first[5])) / 1000)
    assert len(lut.read_lut(table(4), octaves=False)[0].rows) == 1024


def test_calibrate_accepts_lookup_tables(tmp_path):
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["calibrate", "nccl-tests", str(table(2)), str(table(8)), "--gpus-per-node", "8",
                              "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert set(report["by_source"]) == {"AR_GPU2_1M_1024M_LUT", "AR_GPU8_1M_1024M_LUT"}
    assert report["mape_percent"] < 6
    assert [s["kind"] for s in json.loads(out.read_text())["sources"]] == ["lut", "lut"]


def test_bad_lookup_tables(tmp_path):
    bad = tmp_path / "AR_GPU4_x_LUT"
    bad.write_text("size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n1048576,262144,float,abc,1,2,3\n")
    with pytest.raises(EchoError, match="not a number"):
        lut.read_lut(bad)
    bad.write_text("size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)\n")
    with pytest.raises(EchoError, match="no rows"):
        lut.read_lut(bad)
    nameless = tmp_path / "table.csv"
    nameless.write_text("size(B),count,type,time(ns)\n1048576,262144,float,5000\n")
    with pytest.raises(EchoError, match="GPU<N>"):
        lut.read_lut(nameless)
    assert lut.read_lut(nameless, ranks=2)[0].ranks == 2
    assert not lut.is_lut(log(2)) and lut.is_lut(nameless)
    res = runner.invoke(app, ["calibrate", "evaluate", str(nameless), "--preset", "a100-ib"])
    assert res.exit_code == 2 and "GPU<N>" in res.stderr


def test_a100_leave_one_out_at_32_gpus_is_back_to_its_earlier_level():
    """Fitted on the 1-16 GPU logs, the 32-GPU log is predicted within 3.6 % (>= 1 MiB), the
    level before NCCL's choice was emulated (5.4 % after, without the tree correction): the
    4-node tree/LL128 that NCCL runs at 1-4 MiB reaches NCCL's own correction factor of its
    bandwidth."""
    from echo_et.models.comm.calibrate import fit_runs
    from echo_et.models.comm.evaluate import evaluate_runs

    train = [r for n in (1, 2, 4, 8, 16) for r in read_measurements(log(n))]
    prof, _ = fit_runs(train, 8)
    assert prof.nccl.version == "2.7.5"
    (rep,) = evaluate_runs(prof.params, read_measurements(log(32)), 8, prof.nccl)
    assert rep["mape_ge_1mib_percent"] <= 3.6
    rows = {r["bytes"]: r for r in rep["rows"]}
    assert (rows[4 << 20]["algorithm"], rows[4 << 20]["protocol"]) == ("tree", "LL128")
    assert abs(rows[4 << 20]["error_percent"]) < 5                # was -15 %


def test_the_baseline_is_fitted_per_collective_and_tier():
    from echo_et.models.comm.baseline import AlphaBeta, TieredBaseline, tier
    from echo_et.models.comm.evaluate import evaluate_samples

    samples = [s for n in (1, 2, 8, 16, 32) for s in samples_from_runs(read_measurements(log(n)), 8)[0]]
    tiered, line = TieredBaseline.fit(samples), AlphaBeta.fit(samples)
    assert set(tiered.lines) == {("all_reduce", "one_gpu"), ("all_reduce", "one_node"), ("all_reduce", "nodes")}
    one_gpu = [s for s in samples if tier(s) == "one_gpu"]
    assert tiered.lines[("all_reduce", "one_gpu")].beta_us == 0.0      # one group size: no log2(N) term
    a = evaluate_samples(one_gpu, tiered.predict)["mape_ge_1mib_percent"]
    b = evaluate_samples(one_gpu, line.predict)["mape_ge_1mib_percent"]
    assert a < 10 < 100 < b                                      # one line cannot serve a local copy
    # a collective the fit never saw takes its tier's line
    other = [type(s)("all_gather", s.nbytes, s.placement, s.time_us) for s in samples[:3]]
    assert list(tiered.predict(other)) == [float(tiered.tiers[tier(s)].predict([s])[0]) for s in other]


def h100(name: str):
    return shared_path(f"nccl-tests/h100-c01/{name}.log")


def test_one_fit_explains_every_collective_of_the_h100_node():
    from echo_et.models.comm.calibrate import fit_runs

    names = ("1n8g-all_gather", "1n8g-alltoall", "1n8g-reduce_scatter", "1n8g-sendrecv", "10n80g-all_reduce")
    runs = [r for n in names for r in read_measurements(h100(n))]
    prof, result = fit_runs(runs, 8)
    assert prof.nccl.version == "2.28.3"                  # the newest modelled release up to the stated 2.29.2
    for n in names:
        assert result.by_source[f"{n}.log"]["mape_percent"] < 6, n
    # 80 GPUs: NCCL 2.28.3 runs NVLS-tree up to 2 GiB and the ring from 4 GiB (the measured step in
    # bandwidth); 2.20.3's choices (no NVLS-tree) leave that log 16 % off
    picks = [tuning.choose(prof.nccl, contiguous(80, 8), "all_reduce", 1 << e).algorithm for e in (25, 31, 32, 34)]
    assert picks == ["nvls_tree", "nvls_tree", "ring", "ring"]
    assert result.by_source["10n80g-all_reduce.log"]["mape_percent"] < 3
    # send/recv runs on 4, 8, 16, then 32 channels of ~20 GB/s as NCCL splits it by size
    assert 17 < prof.params["p2p_chan_gbps"] < 24


def test_reduce_scatter_held_out_of_the_h100_fit():
    """Fitted on the H100 cluster's other four logs (no reduce-scatter), the one-node
    reduce-scatter is predicted within 8 % (31 % while the model added the reduction after the
    transfers instead of fusing it into them)."""
    from echo_et.models.comm.calibrate import fit_runs
    from echo_et.models.comm.evaluate import evaluate_runs

    names = ("1n8g-all_gather", "1n8g-alltoall", "1n8g-sendrecv", "10n80g-all_reduce")
    prof, _ = fit_runs([r for n in names for r in read_measurements(h100(n))], 8)
    (rep,) = evaluate_runs(prof.params, read_measurements(h100("1n8g-reduce_scatter")), 8, prof.nccl)
    assert rep["mape_ge_1mib_percent"] < 8


def test_all_to_all_held_out_of_the_h100_fit():
    """Fitted on the H100 cluster's other four logs, the one-node all-to-all is predicted within
    8 % (11.4 % without the send/recv pipeline fill: it ran 23 % fast at 32 MiB, 1 MiB per
    channel)."""
    from echo_et.models.comm.calibrate import fit_runs
    from echo_et.models.comm.evaluate import evaluate_runs

    names = ("1n8g-all_gather", "1n8g-reduce_scatter", "1n8g-sendrecv", "10n80g-all_reduce")
    prof, _ = fit_runs([r for n in names for r in read_measurements(h100(n))], 8)
    (rep,) = evaluate_runs(prof.params, read_measurements(h100("1n8g-alltoall")), 8, prof.nccl)
    assert rep["mape_ge_1mib_percent"] < 8
    rows = {r["bytes"]: r for r in rep["rows"]}
    assert abs(rows[32 << 20]["error_percent"]) < 12
