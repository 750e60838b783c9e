"""Calibration: fitting the shared nccl-tests logs, the accuracy it reaches in and out of
sample, profiles (round trip, determinism, bad files) and samples from traced Jobs."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np
import pytest

from conftest import load_benchmark, shared_path
from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, pb
from echo_et.models.comm import CommModel, nccl_tests
from echo_et.models.comm.baseline import AlphaBeta
from echo_et.models.comm.calibrate import fit_profile, samples_from_runs
from echo_et.models.comm.evaluate import evaluate_samples
from echo_et.models.comm.fit import Sample, calibrate, predict_samples
from echo_et.models.comm.profile import dumps, from_json, load_preset, load_profile, to_json, write_profile
from echo_et.models.comm.topology import contiguous
from echo_et.models.comm.trace import job_records, trace_samples

LOGS = [1, 2, 4, 8, 16, 32]
MIB = 1 << 20


def samples_of(ns):
    runs = [r for n in ns for r in nccl_tests.read_log(shared_path(f"nccl-tests/echo-a100/nccl_{n}.log"))]
    return samples_from_runs(runs, 8)


# the release ``--nccl-version auto`` picks for these logs (1-16 and 1-32 GPUs)
RELEASE = "2.7.5"


@pytest.fixture(scope="module")
def fitted_all():
    samples, sources = samples_of(LOGS)
    return fit_profile(samples, sources, load_preset("a100-ib"), 8, nccl_version=RELEASE)


@pytest.fixture(scope="module")
def fitted_to_16():
    samples, sources = samples_of([1, 2, 4, 8, 16])
    return fit_profile(samples, sources, load_preset("a100-ib"), 8, nccl_version=RELEASE)[0]


def test_profile_records_its_sources(fitted_all):
    prof, result = fitted_all
    assert prof.calibrated and prof.base_preset == "a100-ib" and prof.gpus_per_node == 8
    for src, n in zip(prof.sources, LOGS, strict=True):
        path = shared_path(f"nccl-tests/echo-a100/nccl_{n}.log")
        assert src["file"] == path.name
        assert src["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert src["ranks"] == n and src["nodes"] == max(1, n // 8)
    assert result.samples == sum(s["samples"] for s in prof.sources)
    assert "net_gbps" in result.free and "nvlink_gbps" in result.free
    assert "reduce_gbps" not in result.free   # not identifiable from all-reduce timings


def test_in_sample_error_per_log(fitted_all):
    prof, _ = fitted_all
    for n in LOGS:
        r = evaluate_samples(samples_of([n])[0], lambda s: predict_samples(prof.params, s, prof.nccl))
        assert r["mape_percent"] < 6, n
        assert r["mape_ge_1mib_percent"] < 4, n
        assert r["median_4kib_1mib_percent"] < 6, n


def test_fitted_bandwidths_are_physical(fitted_all):
    P = fitted_all[0].params
    # a 200 Gb/s NIC moves at most 25 GB/s; NVLink 3 300 GB/s per direction (the fitted link
    # rate is an effective one: the reduction is costed separately, so it may exceed that a little)
    assert 8 < P["net_gbps"] <= 25
    assert 150 < P["nvlink_gbps"] < 400


def test_extrapolates_from_16_to_32_gpus(fitted_to_16):
    # the targets are < 5 % MAPE >= 1 MiB and < 10 % median on 4 KiB - 1 MiB (on 64 and
    # 128 GPUs); fitted without it, the 32-GPU log is predicted at 5.4 % and 4.2 % (docs/comm-model.md):
    # the 4-node tree's network rate is not in the 1-16 GPU logs
    held = samples_of([32])[0]
    r = evaluate_samples(held, lambda s: predict_samples(fitted_to_16.params, s, fitted_to_16.nccl))
    assert r["mape_ge_1mib_percent"] < 6
    assert r["median_4kib_1mib_percent"] < 6
    # 4 nodes: the tree for small and medium sizes, the ring for large ones (NCCL 2.7.5's choice)
    sizes = np.array([s.nbytes for s in held], dtype=float)
    _, picks = CommModel(fitted_to_16).estimate_sizes("all_reduce", [s.nbytes for s in held], held[0].placement)
    algos = [c.algorithm for c in picks]
    assert set(algos[: int(np.searchsorted(sizes, 8 * MIB))]) == {"tree"}
    assert set(algos[int(np.searchsorted(sizes, 8 * MIB)):]) == {"ring"}


def test_beats_the_alpha_beta_baseline(fitted_to_16):
    train, _ = samples_of([1, 2, 4, 8, 16])
    held = samples_of([32])[0]
    base = AlphaBeta.fit(train)
    ours = evaluate_samples(held, lambda s: predict_samples(fitted_to_16.params, s, fitted_to_16.nccl))
    theirs = evaluate_samples(held, base.predict)
    for key in ("mape_percent", "mape_ge_1mib_percent", "median_4kib_1mib_percent", "mape_lt_64kib_percent",
                "mape_64kib_1mib_percent"):
        assert ours[key] < theirs[key] / 3, key


def test_profile_round_trip_and_determinism(fitted_all, tmp_path):
    prof, _ = fitted_all
    p1, p2 = tmp_path / "a.json", tmp_path / "b.json"
    write_profile(prof, p1)
    again = load_profile(p1)
    write_profile(again, p2)
    assert p1.read_bytes() == p2.read_bytes()
    assert str(tmp_path) not in p1.read_text()
    model = CommModel.from_profile(p1)
    assert model.calibrated and model.gpus_per_node == 8
    for k, v in prof.params.items():
        assert again.params[k] == pytest.approx(v, rel=1e-5)


def test_refitting_gives_identical_profiles():
    samples, sources = samples_of([2, 16])
    a = fit_profile(samples, sources, load_preset("a100-ib"), 8)[0]
    b = fit_profile(samples, sources, load_preset("a100-ib"), 8)[0]
    assert dumps(a) == dumps(b)
    assert json.loads(dumps(a))["nccl"]["version"] == load_preset("a100-ib").nccl.version


def test_auto_picks_the_release_that_explains_the_multi_node_logs():
    samples, sources = samples_of([4, 16])
    prof, _ = fit_profile(samples, sources, load_preset("a100-ib"), 8, nccl_version="auto")
    tried = prof.fit["nccl_version_mape_percent"]
    assert set(tried) == {"2.7.5", "2.17.1", "2.20.3", "2.28.3"}
    assert prof.nccl.version == min(tried, key=tried.get)
    # (on all of 1-16 or 1-32 GPUs it is 2.7.5, RELEASE: docs/comm-model.md, `calibrate evaluate`)


def test_bad_profiles(tmp_path):
    good = to_json(load_preset("a100-ib"))
    cases = {
        "schema": {**good, "schema": "other/1"},
        "missing": {**good, "params": {k: v for k, v in good["params"].items() if k != "net_gbps"}},
        "unknown": {**good, "params": {**good["params"], "warp_speed": 9.0}},
        "negative": {**good, "params": {**good["params"], "net_gbps": -1.0}},
        "gpn": {**good, "gpus_per_node": 0},
    }
    for name, obj in cases.items():
        with pytest.raises(EchoError):
            from_json(obj, name)
    p = tmp_path / "p.json"
    p.write_text("{not json")
    with pytest.raises(EchoError, match="not a JSON"):
        load_profile(p)


def test_profiles_without_later_parameters_still_load():
    # a profile written before tree_net_eff_many existed takes it from its base preset
    old = to_json(load_preset("h100-ib"))
    del old["params"]["tree_net_eff_many"]
    old.update(calibrated=True, base_preset="h100-ib")
    assert from_json(old, "old").params["tree_net_eff_many"] == load_preset("h100-ib").params["tree_net_eff_many"]
    del old["base_preset"]
    assert from_json(old, "old").params["tree_net_eff_many"] == load_preset("a100-ib").params["tree_net_eff_many"]
    old["params"]["tree_net_eff"] = "fast"
    with pytest.raises(EchoError, match="tree_net_eff"):
        from_json(old, "old")


def test_calibrate_refuses_bad_samples():
    pl = contiguous(8, 8)
    prof = load_preset("a100-ib")
    with pytest.raises(EchoError):
        calibrate([], prof.params, prof.nccl)
    with pytest.raises(EchoError):
        calibrate([Sample("all_reduce", 1024, pl, 0.0)], prof.params, prof.nccl)


def _traced_job(durations_ns: dict[int, list[int]], size: int):
    """A 16-rank job (2 nodes): every rank runs the listed all-reduces on the world group."""
    jb = JobBuilder("t", 16, source_format="test")
    gid = jb.group(list(range(16)), name="0")
    for rank, durations in durations_ns.items():
        gb = GraphBuilder(f"r{rank}")
        gb.declare_group("world", 16)
        s = gb.stream(pb.STREAM_GPU_COMM, "nccl", device=rank)
        t = 0
        for d in durations:
            gb.collective("ncclAllReduce", s, coll_type=pb.COLL_ALL_REDUCE, group="world",
                          in_bytes=size, dtype="float32", start_ns=t, duration_ns=d)
            t += d + 1000
        jb.add_graph(gb.build())
        jb.bind(rank, f"r{rank}", {"world": gid})
    return jb.build()


def test_trace_samples_keep_the_shortest_kernel():
    durations = {r: [900_000 + 1000 * r, 500_000 + 7000 * r] for r in range(16)}
    job = _traced_job(durations, 64 << 20)
    records = list(job_records(job))
    assert len(records) == 32
    (s,) = trace_samples(records, 8, "job")
    assert s.time_us == min(min(v) for v in durations.values()) / 1000
    assert (s.coll, s.nbytes, s.placement.nodes) == ("all_reduce", 64 << 20, 2)
    with pytest.raises(EchoError, match="unknown collective"):
        trace_samples([("allreduce", 8, [0, 1], 10)], 8)


def test_a_rated_inter_bw_keeps_the_measured_network_efficiency(fitted_all):
    """``--inter-bw`` states the rate the NICs are rated for (the ND A100 v4 cluster of these
    logs: one 200 Gb/s HDR NIC per GPU, 25 GB/s). The profile calibrated on its logs keeps
    what its network reached of that rate, so overriding it with the cluster's own rated
    rate still predicts its 4-node log; running the network at the rated rate, as overrides
    did before, prices those all-reduces about 1.4-1.6x fast."""
    prof, _ = fitted_all
    m = CommModel(prof)
    assert m.rated_net_gbps == 25.0
    assert 0.55 < m.network_efficiency < 0.8            # 16.4 of 25 GB/s per GPU
    rated = m.with_overrides(inter_bw_gbps=25.0)
    assert rated.params["net_gbps"] == pytest.approx(prof.params["net_gbps"])
    big = [s for s in samples_of([32])[0] if s.nbytes >= 256 * MIB]
    assert len(big) >= 4
    measured = np.array([s.time_us for s in big])

    def error(model: CommModel) -> float:
        got = np.array([model.estimate(s.coll, s.nbytes, list(range(32)), gpus_per_node=8).time_ns / 1e3
                        for s in big])
        return float(np.mean(np.abs(got - measured) / measured))

    assert error(rated) < 0.06
    at_line_rate = CommModel(dataclasses.replace(prof, params={**prof.params, "net_gbps": 25.0}))
    assert error(at_line_rate) > 0.2
    # a what-if rate scales the achieved one, and what-ifs compose
    half = m.with_overrides(inter_bw_gbps=12.5)
    assert half.params["net_gbps"] == pytest.approx(prof.params["net_gbps"] / 2)
    assert half.rated_net_gbps == 12.5 and half.network_efficiency == pytest.approx(m.network_efficiency)
    assert half.with_overrides(inter_bw_gbps=25.0).params["net_gbps"] == pytest.approx(prof.params["net_gbps"])
    assert half.with_overrides(gpus_per_node=4).rated_net_gbps == 12.5


def test_calibrating_from_traces_moves_the_network_only():
    preset = load_preset("a100-ib")
    prior = preset.params
    truth = CommModel.preset("a100-ib").with_overrides(inter_bw_gbps=11.0)
    records = []
    for size in [1 << e for e in range(12, 31, 2)]:
        t = truth.estimate("all_reduce", size, list(range(16))).time_ns
        records.append(("all_reduce", size, list(range(16)), t))
    samples = trace_samples(records, 8, "synthetic")
    fit = calibrate(samples, prior, preset.nccl)
    assert fit.params["net_gbps"] == pytest.approx(truth.params["net_gbps"], rel=0.1)
    assert fit.params["nvlink_gbps"] == prior["nvlink_gbps"]        # no single-node samples
    assert fit.mape_percent < 3


def test_preset_files_are_valid_json_in_the_profile_schema():
    for name in CommModel.preset_names():
        prof = load_preset(name)
        assert not prof.calibrated and prof.gpu_match
        assert json.loads(dumps(prof))["params"]["nvlink_gbps"] == prof.params["nvlink_gbps"]


def test_sample_prediction_includes_the_host_bound():
    # nccl-tests with one thread driving 8 GPUs cannot iterate faster than 8 launches
    prof = load_preset("a100-ib")
    P = prof.params
    pl = contiguous(8, 8)
    host = predict_samples(P, [Sample("all_reduce", 8, pl, 1.0, host_gpus=8)], prof.nccl)[0]
    kernel = predict_samples(P, [Sample("all_reduce", 8, pl, 1.0, host_gpus=0)], prof.nccl)[0]
    assert host >= 8 * P["host_launch_us"] > kernel
    assert np.isfinite(host)


@pytest.mark.parametrize("preset", ["a100-ib", "h100-ib"])
def test_the_shipped_preset_network_is_what_the_shared_logs_measure(preset):
    """The a100-ib and h100-ib presets' network parameters are the fit on the one cluster of
    their generation in ../shared/data (``benchmarks/comm_preset_network.py --write``): the
    shipped file is byte for byte what measuring it again writes, and its network runs at the
    efficiency that cluster reached (A100: 0.65 of its 200 Gb/s NICs, not the 0.88 guessed
    before; H100: 0.82 of 400 Gb/s)."""
    bench = load_benchmark("comm_preset_network")
    folder, logs = bench.CLUSTERS[preset]
    for log in logs:
        shared_path(f"nccl-tests/{folder}/{log}")
    text, summary = bench.measured_preset(preset)
    assert text == bench.preset_text(preset)
    eff = CommModel.preset(preset).network_efficiency
    assert eff == pytest.approx(summary["network_efficiency"], rel=1e-5)
    low, high = {"a100-ib": (0.6, 0.7), "h100-ib": (0.78, 0.88)}[preset]
    assert low < eff < high


def test_a_fit_across_nodes_measures_the_network_from_the_spec_sheet():
    """A fit with multi-node logs starts from the spec-sheet network (``fit.network.prior``),
    never from the preset's own measurement, so a held-out log cannot reach a fit through the
    preset; a fit of one node's logs keeps the measured network (its logs cannot see one)."""
    from echo_et.models.comm.calibrate import spec_network

    preset = load_preset("a100-ib")
    spec = spec_network(preset)
    assert spec.params["net_gbps"] == 22.0 and preset.params["net_gbps"] < 17.0
    unmeasured = dataclasses.replace(spec, fit={})
    samples, sources = samples_of([1, 8, 16])
    a = fit_profile(samples, sources, preset, 8, nccl_version=RELEASE)[0]
    b = fit_profile(samples, sources, unmeasured, 8, nccl_version=RELEASE)[0]
    assert a.params == b.params
    one_node = samples_of([1, 2, 8])
    c = fit_profile(*one_node, preset, 8, nccl_version=RELEASE)[0]
    d = fit_profile(*one_node, unmeasured, 8, nccl_version=RELEASE)[0]
    assert c.params["net_gbps"] == preset.params["net_gbps"] and d.params["net_gbps"] == 22.0
    assert c.params["nvlink_gbps"] == d.params["nvlink_gbps"]


def test_cross_validation_never_starts_from_a_measured_network():
    """Leave-one-log-out on the logs the preset's network was measured on: the held-out
    fits of one node's logs predict across nodes from the spec-sheet network, exactly as with
    a preset that was never measured."""
    from echo_et.models.comm.calibrate import spec_network
    from echo_et.models.comm.evaluate import cross_validate

    runs = [r for n in (1, 8, 16) for r in nccl_tests.read_log(shared_path(f"nccl-tests/echo-a100/nccl_{n}.log"))]
    preset = load_preset("a100-ib")
    unmeasured = dataclasses.replace(spec_network(preset), fit={})
    a = cross_validate(runs, 8, preset, RELEASE)
    b = cross_validate(runs, 8, unmeasured, RELEASE)
    assert a["leave_one_out"] == b["leave_one_out"] and a["in_sample"] == b["in_sample"]
    assert a["profiles"]["nccl_16.log"].params["net_gbps"] == 22.0


def test_a_bad_recorded_network_prior_is_one_line(tmp_path):
    from echo_et.models.comm.calibrate import spec_network

    obj = to_json(load_preset("a100-ib"))
    obj["fit"]["network"]["prior"]["no_such_param"] = 1.0
    with pytest.raises(EchoError, match="fit.network.prior names 'no_such_param'"):
        spec_network(from_json(obj, "bad"))
    obj["fit"]["network"]["prior"] = {"net_gbps": "fast"}
    with pytest.raises(EchoError, match="not a parameter and a number"):
        spec_network(from_json(obj, "bad"))


def test_the_80_gpu_fixed_cost_is_nvls_trees_not_every_network_step():
    """The 80-GPU H100 all-reduce carries ~600 us at every size: its NVLS-tree rows (to 2 GiB)
    and its ring rows (from 4 GiB) both. The ring crosses the network 2.5x as often as the
    NVLS-tree, so one latency per network step cannot carry both; the fit puts the cost on
    NVLS-tree's hops and leaves the ring's steps near NCCL's typical latency, which is what a
    ring all-gather or reduce-scatter across the same nodes is then charged."""
    logs = ["1n8g-all_gather.log", "1n8g-alltoall.log", "1n8g-reduce_scatter.log", "1n8g-sendrecv.log",
            "10n80g-all_reduce.log"]
    runs = [r for log in logs for r in nccl_tests.read_log(shared_path(f"nccl-tests/h100-c01/{log}"))]
    samples, sources = samples_from_runs(runs, 8)
    prof, result = fit_profile(samples, sources, load_preset("h100-ib"), 8)
    P = prof.params
    assert "nvls_tree_hop_us" in result.free
    assert P["nvls_tree_hop_us"] > 40 and P["net_hop_us.Simple"] < 20
    assert result.by_source["10n80g-all_reduce.log"]["mape_percent"] < 2.5


def test_a_one_node_fit_of_broadcasts_sets_the_chain_chunk_and_leaves_the_network_alone():
    """Broadcast's pipeline fill is a one-node parameter (``chain_chunk_bytes``): a fit of one
    node's all-reduce and broadcast samples (made here by the model from a known chunk) frees
    it and finds the chunk again, and leaves ``tree_chunk_bytes`` (a network parameter) as the
    prior had it; without broadcast or reduce samples the chunk is not a free parameter."""
    prof = load_preset("a100-ib")
    truth = {**prof.params, "chain_chunk_bytes": 2.0 * MIB}
    sizes = [1 << p for p in range(16, 31, 2)]
    samples = []
    for n in (2, 4, 8):
        pl = contiguous(n, 8)
        for coll in ("all_reduce", "broadcast"):
            made = [Sample(coll, s, pl, 1.0, source=f"{coll}_{n}") for s in sizes]
            times = predict_samples(truth, made, prof.nccl)
            samples += [dataclasses.replace(s, time_us=float(t)) for s, t in zip(made, times, strict=True)]
    fit = calibrate(samples, prof.params, prof.nccl)
    assert "chain_chunk_bytes" in fit.free and "tree_chunk_bytes" not in fit.free
    assert fit.params["chain_chunk_bytes"] == pytest.approx(truth["chain_chunk_bytes"], rel=0.25)
    assert fit.params["tree_chunk_bytes"] == prof.params["tree_chunk_bytes"]
    assert fit.mape_percent < 1.0
    no_chain = calibrate([s for s in samples if s.coll == "all_reduce"], prof.params, prof.nccl)
    assert "chain_chunk_bytes" not in no_chain.free
    assert no_chain.params["chain_chunk_bytes"] == prof.params["chain_chunk_bytes"]
