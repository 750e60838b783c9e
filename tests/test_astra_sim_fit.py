"""Fitting the exported network: the fit recovers a network ASTRA-sim's cost formula was
given, keeps the values the user fixed, and the export's replay keeps the measured step."""

from __future__ import annotations

import pytest
from test_astra_sim_support import uniform_job

from conftest import shared_path, unpack
from echo_et.converters import ReadOptions, read
from echo_et.converters.astra_sim.configs import Network
from echo_et.converters.astra_sim.costs import Dim, collective_ns
from echo_et.converters.astra_sim.mapping import CHAKRA_ALL_GATHER, CHAKRA_ALL_REDUCE
from echo_et.errors import EchoError
from echo_et.experiments.astra_sim import Sample, export_with_report, fit_network
from echo_et.ir.schema import pb
from echo_et.sim.validate import measured_step


def _samples(dims: list[Dim], groups: list[tuple[int, ...]]) -> list[Sample]:
    out = []
    for members in groups:
        for ctype, what in ((CHAKRA_ALL_REDUCE, "all_reduce"), (CHAKRA_ALL_GATHER, "all_gather")):
            for size in (4096, 1 << 20, 64 << 20):
                out.append(Sample(what, ctype, size, members, collective_ns(ctype, size, list(members), dims)))
    return out


def test_fit_recovers_a_one_dimensional_network():
    truth = [Dim("Switch", 8, 123.0, 777.0)]
    base = Network(["Switch"], [8], [400.0], [936.25])
    fit = fit_network(_samples(truth, [tuple(range(8)), (0, 1, 2, 3)]), base, "test")
    assert fit.network.bandwidth[0] == pytest.approx(123.0, rel=0.01)
    assert fit.network.latency[0] == pytest.approx(777.0, rel=0.01)
    assert all(abs(r["error_pct"]) < 0.5 for r in fit.residuals())


def test_fit_recovers_both_dimensions_from_intra_and_inter_node_groups():
    truth = [Dim("Switch", 4, 300.0, 200.0), Dim("Switch", 2, 40.0, 3000.0)]
    base = Network(["Switch", "Switch"], [4, 2], [400.0, 50.0], [936.25, 936.25])
    fit = fit_network(_samples(truth, [(0, 1, 2, 3), (4, 5, 6, 7), (0, 4), (1, 5)]), base, "test")
    assert fit.network.bandwidth == pytest.approx([300.0, 40.0], rel=0.02)
    assert fit.network.latency == pytest.approx([200.0, 3000.0], rel=0.02)


def test_fit_keeps_fixed_values_and_refuses_no_samples():
    truth = [Dim("Switch", 8, 123.0, 777.0)]
    base = Network(["Switch"], [8], [400.0], [936.25])
    fit = fit_network(_samples(truth, [tuple(range(8))]), base, "test", fixed_bw={0: 200.0})
    assert fit.network.bandwidth == [200.0] and fit.fixed == ("bandwidth[0]",)
    with pytest.raises(EchoError, match="no communication with a known time"):
        fit_network([], base, "test")


def test_measured_network_needs_measured_collectives(tmp_path):
    def build(gb, r, s):
        n = gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=4096,
                          start_ns=0, duration_ns=0)
        n.attrs["timing"] = "placeholder"

    with pytest.raises(EchoError, match="no communication with a known time"):
        export_with_report(uniform_job(2, build), tmp_path / "out", measured_network=True)
    assert not (tmp_path / "out").exists()


def test_dlrm_export_replays_to_the_measured_step(tmp_path):
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    folder = unpack(archive, tmp_path / "in")
    job = read(sorted(p for p in folder.rglob("*.json") if p.is_file()), "kineto", ReadOptions())
    res = export_with_report(job, tmp_path / "out")
    measured = max(measured_step(job, r)[0] for r in job.ranks())
    assert res["replay_step_ns"] == measured
    assert abs(res["expected_step_ns"] - measured) <= 0.005 * measured
    assert res["time"]["ranks_losing_over_1pct"] == []
    # Every rank keeps its measured start offset (rank 7 started 7.5 ms after rank 1).
    assert res["start_offsets_us"]["7"] > 7000
