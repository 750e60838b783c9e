"""NCCL's own choice (echo_et.models.comm.tuning, with the releases' constants of
echo_et.models.comm.nccl_releases): the constants of each modelled release, the channel/thread
rule, what is enabled where, every collective's estimate path, and the non-monotone step of the
shared 32-GPU log coming out of the choice."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import shared_path
from echo_et.cli.main import app
from echo_et.errors import EchoError
from echo_et.models.comm import CommModel, nccl, nccl_graphs, nccl_releases, nccl_tests, tuning
from echo_et.models.comm.calibrate import fit_profile, samples_from_runs
from echo_et.models.comm.nccl_graphs import NcclSystem, NodeFacts
from echo_et.models.comm.profile import from_json, load_preset, to_json
from echo_et.models.comm.topology import contiguous

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
A100 = NodeFacts()            # Azure ND A100 v4 / DGX A100: NVSwitch, 8 HDR NICs, AMD hosts


def system(version: str, **facts) -> NcclSystem:
    return NcclSystem(version, NodeFacts(**facts) if facts else A100)


def test_graphs_and_channels_of_an_a100_node():
    # across nodes: one channel per NIC at 24 GB/s (the GPU-NIC PCIe Gen4 path), none duplicated
    for version in nccl_releases.VERSIONS:
        t = tuning.table_for(system(version), contiguous(32, 8))
        assert (t.graphs["ring"].channels, t.graphs["ring"].bw_inter) == (8, 24.0)
        assert t.channels == 16                       # the communicator runs twice the searched channels
    # one node: 2.7.5 keeps 10 x 24 GB/s of the 240 GB/s NVLinks; 2.17.1 8 x 30 duplicated to 16 x 15
    assert tuning.table_for(system("2.7.5"), contiguous(8, 8)).graphs["ring"].channels == 10
    g = tuning.table_for(system("2.17.1"), contiguous(8, 8)).graphs["ring"]
    assert (g.channels, g.bw_intra) == (16, 15.0)
    assert tuning.table_for(system("2.20.3"), contiguous(8, 8)).graphs["ring"].channels == 12


def test_release_constants_reach_the_cost_table():
    pl = contiguous(32, 8)
    # 2.7.5 tree/LL latency on 4 nodes of 8: base 4.4 + 2 x (7 NVLink hops x 0.52 x 1.8 + 2 levels x 5.0)
    t275 = tuning.table_for(system("2.7.5"), pl)
    assert t275.latency[("all_reduce", "tree", "LL")] == pytest.approx(4.4 + 2 * (7 * 0.52 * 1.8 + 2 * 5.0))
    # 2.7.5 tree bandwidth on > 2 nodes: min(8 ch x 24 GB/s x 0.9, 80) / 3.8 for LL, x 0.5 for algbw
    assert t275.bandwidth[("all_reduce", "tree", "LL")] == pytest.approx(80 / 3.8 * 0.5)
    # 2.20.3: the AMD host's 2 us network overhead lower-bounds every ring step across nodes
    t2203 = tuning.table_for(system("2.20.3"), pl)
    assert t2203.latency[("all_reduce", "ring", "LL")] == pytest.approx(6.6 + (62 - 8) * 2.0 + 8 * 2.7)
    assert t2203.latency[("all_reduce", "ring", "LL")] < tuning.table_for(
        system("2.20.3", cpu_vendor="Intel"), pl).latency[("all_reduce", "ring", "LL")] + 55
    # LL on AMD hosts across 4+ nodes is capped at 19 GB/s per communicator (2.17.1 and 2.20.3)
    assert tuning.table_for(system("2.17.1"), pl).bandwidth[("all_reduce", "tree", "LL")] == pytest.approx(19 * 0.5)


@pytest.mark.parametrize("version, first_ll128", [("2.7.5", 128 * KIB), ("2.17.1", 128 * KIB), ("2.20.3", 256 * KIB)])
def test_tree_protocol_switch_on_four_nodes(version, first_ll128):
    pl = contiguous(32, 8)
    picks = {b: tuning.choose(system(version), pl, "all_reduce", b) for b in (64 * KIB, 128 * KIB, 256 * KIB)}
    assert (picks[64 * KIB].algorithm, picks[64 * KIB].protocol) == ("tree", "LL")
    assert (picks[first_ll128].algorithm, picks[first_ll128].protocol) == ("tree", "LL128")
    if first_ll128 > 128 * KIB:
        assert picks[128 * KIB].protocol == "LL"


def test_channels_follow_the_per_thread_thresholds():
    pl = contiguous(32, 8)
    # tree/LL: 512 threads x 8 B per channel = 4 KiB per channel
    got = [tuning.choose(system("2.7.5"), pl, "all_reduce", b).channels for b in (4 * KIB, 8 * KIB, 16 * KIB,
                                                                                   32 * KIB, 64 * KIB)]
    assert got == [1, 2, 4, 8, 16]
    # ring/LL: the threshold is multiplied by the ranks (8 GPUs: 32 KiB per channel)
    one = contiguous(8, 8)
    assert tuning.choose(system("2.7.5"), one, "all_reduce", 128 * KIB).channels == 4
    # below one channel's share NCCL halves the threads (512 x 8 B > 2 KiB > 256 x 8 B)
    assert tuning.choose(system("2.7.5"), pl, "all_reduce", 2 * KIB).threads == 256
    assert tuning.choose(system("2.7.5"), pl, "all_reduce", 1 * KIB).threads == 128


def test_ll128_needs_nvlink_and_a_pcie_switch_path_to_the_nic():
    pl = contiguous(32, 8)
    far_nic = system("2.17.1", gpu_nic_path="PHB")
    assert all(tuning.choose(far_nic, pl, "all_reduce", 1 << e).protocol != "LL128" for e in range(10, 32))
    pcie = system("2.17.1", intra="pcie", intra_bw=24.0)
    assert all(tuning.choose(pcie, contiguous(8, 8), "all_reduce", 1 << e).protocol != "LL128" for e in range(10, 32))
    assert "LL128" in {tuning.choose(system("2.17.1"), pl, "all_reduce", 1 << e).protocol for e in range(10, 32)}


def test_nvls_only_on_hopper_nvswitch_nodes_from_2_17():
    h100 = NodeFacts(compute_capability=90, cpu_vendor="Intel", intra_bw=370.8, nic_bw=50.0, gpu_nic_bw=48.0,
                     nvls=True)
    one = contiguous(8, 8)
    for version in ("2.17.1", "2.20.3"):
        assert tuning.choose(NcclSystem(version, h100), one, "all_reduce", GIB).algorithm == "nvls"
        assert tuning.choose(NcclSystem(version, h100), contiguous(16, 8), "all_reduce", GIB).algorithm != "nvls"
    assert tuning.choose(NcclSystem("2.7.5", h100), one, "all_reduce", GIB).algorithm == "ring"
    assert all(tuning.choose(system(v), one, "all_reduce", GIB).algorithm == "ring" for v in nccl_releases.VERSIONS)


def test_only_all_reduce_has_a_tree_and_p2p_follows_the_release():
    pl = contiguous(32, 8)
    for coll in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
        assert {tuning.choose(system("2.20.3"), pl, coll, 1 << e).algorithm for e in range(10, 31, 4)} == {"ring"}
    # grouped send/recv: Simple in 2.7.5, LL for up to 16 KiB per peer in 2.20.3
    assert tuning.choose(system("2.7.5"), pl, "all_to_all", 64 * KIB).protocol == "Simple"
    assert tuning.choose(system("2.20.3"), pl, "all_to_all", 64 * KIB).protocol == "LL"     # 2 KiB per peer
    assert tuning.choose(system("2.20.3"), pl, "all_to_all", 64 * MIB).protocol == "Simple"
    assert tuning.choose(system("2.20.3"), contiguous(2, 1), "send", 4 * KIB).protocol == "LL"


@pytest.mark.parametrize("coll, ranks", [
    ("all_reduce", list(range(32))), ("all_gather", list(range(16))), ("reduce_scatter", list(range(16))),
    ("broadcast", list(range(16))), ("reduce", list(range(8))), ("all_to_all", list(range(32))),
    ("gather", list(range(16))), ("scatter", list(range(16))), ("barrier", list(range(16))),
    ("send", [0, 1]), ("send", [0, 9]), ("recv", [9, 0]),
])
def test_every_collective_has_an_estimate(coll, ranks):
    m = CommModel.preset("a100-ib")
    prev = None
    for size in (4 * KIB, 1 * MIB, 64 * MIB):
        e = m.estimate(coll, size, ranks)
        assert e.time_ns > 0 and e.channels >= 1
        assert e.algorithm in ("ring", "tree", "p2p") and e.protocol in ("LL", "LL128", "Simple")
        if prev is not None and coll != "barrier":
            assert e.time_ns > prev
        prev = e.time_ns
    if coll == "send":
        assert m.estimate("send", 64 * MIB, [0, 9]).time_ns > m.estimate("send", 64 * MIB, [0, 1]).time_ns


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
                                  "send", "recv"])
def test_estimate_cli_for_every_collective(coll):
    res = CliRunner().invoke(app, ["estimate", coll, "--bytes", "4KiB,16MiB", "--ranks", "16", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["nccl_version"] == "2.7.5"
    for e in out["estimates"]:
        assert e["time_ns"] > 0 and e["channels"] >= 1 and e["algorithm"] in ("ring", "tree", "p2p")


def test_the_time_model_prices_every_pair_nccl_can_pick():
    for name in CommModel.preset_names():
        m = CommModel.preset(name)
        for version in nccl_releases.VERSIONS:
            sysv = m.nccl.with_version(version)
            for n in (2, 8, 16, 64):
                pl = contiguous(n, 8)
                for coll in nccl_releases.FUNCTIONS:
                    t, picks = nccl.choose(m.profile.params, coll, np.array([4.0 * KIB, 4.0 * MIB, 4.0 * GIB]),
                                           pl, sysv)
                    assert np.all(t > 0) and len(picks) == 3


def test_profiles_carry_their_nccl_release():
    prof = load_preset("a100-ib")
    obj = to_json(prof)
    assert obj["nccl"]["version"] == "2.7.5" and obj["nccl"]["node"]["cpu_vendor"] == "AMD"
    assert from_json(obj, "p").nccl == prof.nccl
    for bad, match in ((dict(obj, nccl={"version": "2.99", "node": {}}), "unknown NCCL version"),
                       (dict(obj, nccl={"version": "2.7.5", "node": {"warp": 1}}), "unknown NCCL node fact"),
                       (dict(obj, nccl={"version": "2.7.5", "node": {"cpu_vendor": "ARMish"}}), "cpu_vendor")):
        with pytest.raises(EchoError, match=match):
            from_json(bad, "p")
    old = dict(obj, calibrated=True)      # written before profiles had an nccl section
    del old["nccl"]
    assert from_json(old, "old").nccl == prof.nccl
    assert CommModel(prof).with_nccl_version("2.20.3").nccl_version == "2.20.3"
    with pytest.raises(EchoError, match="unknown NCCL version"):
        CommModel(prof).with_nccl_version("3.0")


@pytest.fixture(scope="module")
def fitted_without_32():
    runs = [r for n in (1, 2, 4, 8, 16) for r in nccl_tests.read_log(shared_path(f"nccl-tests/echo-a100/nccl_{n}.log"))]
    samples, sources = samples_from_runs(runs, 8)
    return CommModel(fit_profile(samples, sources, load_preset("a100-ib"), 8, nccl_version="2.7.5")[0])


def test_the_32_gpu_step_comes_from_nccls_choice(fitted_without_32):
    # measured on 4 nodes x 8 A100 (both columns): 64 KiB 107.2/107.1 us, 128 KiB 97.4/95.5 us.
    # NCCL runs 64 KiB as tree/LL on 16 channels and 128 KiB as tree/LL128 on 16 channels: its
    # cost table (tree correction 0.5 for LL at 128 KiB) switches protocol there, and LL128's
    # higher rate more than pays its higher latency. Fitted without the 32-GPU log.
    text = shared_path("nccl-tests/echo-a100/nccl_32.log").read_text()
    assert "65536         16384     float     sum    107.2" in text
    assert "131072         32768     float     sum    97.38" in text
    m, ranks = fitted_without_32, list(range(32))
    small, large = m.estimate("all_reduce", 64 * KIB, ranks), m.estimate("all_reduce", 128 * KIB, ranks)
    assert (small.algorithm, small.protocol, small.channels) == ("tree", "LL", 16)
    assert (large.algorithm, large.protocol, large.channels) == ("tree", "LL128", 16)
    assert large.time_ns < small.time_ns                             # the step, predicted
    # no fitted bump: with the choice held fixed, twice the bytes take longer
    pl = contiguous(32, 8)
    costs = nccl.candidate_costs(m.params, "all_reduce", np.array([64.0 * KIB, 128.0 * KIB]), pl,
                                 nccl._channels(m.nccl, pl, "all_reduce", [64 * KIB, 128 * KIB], False))
    for pair in (("tree", "LL"), ("tree", "LL128")):
        assert costs[pair][1] > costs[pair][0], pair
    # a tuned NCCL (the fastest pair) has no step
    fast = [m.estimate("all_reduce", b, ranks, choice="fastest").time_ns for b in (64 * KIB, 128 * KIB)]
    assert fast[1] > fast[0]


def test_bad_input_to_the_tuner():
    with pytest.raises(EchoError, match="unknown NCCL version"):
        NcclSystem("2.8")
    with pytest.raises(EchoError, match="two or more"):
        tuning.choose(system("2.7.5"), contiguous(1, 8), "all_reduce", 8)
    with pytest.raises(EchoError, match="does not tune"):
        tuning.choose(system("2.7.5"), contiguous(4, 8), "barrier", 8)
    with pytest.raises(EchoError, match="unknown choice"):
        CommModel.preset("a100-ib").estimate("all_reduce", 8, [0, 1], choice="best")


def test_send_recv_channels_grow_with_size_as_nccl_2_2x_splits_them():
    """addP2pToPlan (2.2x): at least nChannelsMin (channels per peer halved until each of the 8
    ranks has its own: 32 -> 4), parts of at most 32 x 512 KiB on one node, so an 8-GPU
    sendrecv runs 4 channels up to 64 MiB, then 8, 16 and 32; across nodes parts are at most
    one 128 KiB step, at most the 2 channels per network peer."""
    h100 = load_preset("h100-ib").nccl
    node = contiguous(8, 8)
    got = {s: tuning.choose(h100, node, "sendrecv", s).channels for s in (1 << 20, 32 << 20, 64 << 20,
                                                                          128 << 20, 256 << 20, 1 << 30)}
    assert got == {1 << 20: 4, 32 << 20: 4, 64 << 20: 4, 128 << 20: 8, 256 << 20: 16, 1 << 30: 32}
    assert tuning.choose(h100, node, "sendrecv", 4096).protocol == "LL"       # <= 16 KiB per channel
    assert tuning.choose(h100, contiguous(16, 8), "sendrecv", 1 << 30).channels == 2
    # 2.7.5 does not split by size: the per-operation channels of before
    assert tuning.choose(h100.with_version("2.7.5"), node, "sendrecv", 1 << 30).channels == \
        tuning.choose(h100.with_version("2.7.5"), node, "sendrecv", 1 << 20).channels


def test_tree_correction_is_nccls_table_between_powers_of_two():
    a100 = load_preset("a100-ib").nccl
    table = nccl_releases.RELEASES["2.7.5"].tree_correction["LL128"]
    for i in range(len(table)):
        assert tuning.tree_correction(a100, "LL128", 64 << i) == table[i]
    mid = tuning.tree_correction(a100, "LL128", int(64 * 2 ** 15.5))
    assert min(table[15], table[16]) <= mid <= max(table[15], table[16])
    assert tuning.tree_correction(a100, "LL128", 1 << 40) == 1.0


H100 = NodeFacts(compute_capability=90, cpu_vendor="Intel", intra_bw=370.8, nic_bw=50.0, gpu_nic_bw=48.0, nvls=True)


def test_2_28_nvls_tree_across_h100_nodes_until_the_ring_wins():
    # 2.28.3 tuning.cc: NVLS-tree bus rate per channel min(40 x .85 x 7/8 x 2, 48, 45.5) on 8
    # channels, latency 25 + 2 x log2(10) x 14 us; the ring's 8 x 48 GB/s (each GPU's NVLink
    # carries 7 of the 8 channels) beats it only past its 1.4 x 736 us latency, from 4 GiB
    s, pl = NcclSystem("2.28.3", H100), contiguous(80, 8)
    t = tuning.table_for(s, pl)
    assert t.bandwidth[("all_reduce", "nvls_tree", "Simple")] == pytest.approx(8 * 45.5 * 80 / 158)
    assert t.latency[("all_reduce", "nvls_tree", "Simple")] == pytest.approx(25 + 2 * 3 * 14)
    assert (t.graphs["ring"].channels, t.graphs["ring"].bw_inter) == (8, 48.0)
    assert t.bandwidth[("all_reduce", "tree", "Simple")] == pytest.approx(min(8 * 48 * .92, 8 * 36.0) / 2)
    assert t.latency[("all_reduce", "tree", "Simple")] == pytest.approx(8.4 + 2 * (7 * 4.0 + 3 * 14))
    picks = [tuning.choose(s, pl, "all_reduce", 1 << e) for e in (20, 25, 31, 32)]
    assert [c.algorithm for c in picks] == ["tree", "nvls_tree", "nvls_tree", "ring"]      # LL128 tree at 1 MiB
    assert picks[1].threads == 640
    # NVLS-tree needs NVLink SHARP, more than one node and 2.28.3; 2.20.3 has none of it
    assert "nvls_tree" not in {a for a, _ in tuning.candidates(NcclSystem("2.28.3", A100), pl, "all_reduce")}
    assert "nvls_tree" not in {a for a, _ in tuning.candidates(NcclSystem("2.20.3", H100), pl, "all_reduce")}
    assert tuning.choose(s, contiguous(8, 8), "all_reduce", GIB).algorithm == "nvls"



H800 = dataclasses.replace(H100, intra_bw=8 * 20.6)     # 8 NVLink 4 links at NCCL's SM90 rate


def test_2_28_nvls_tree_across_h800_nodes_is_nvlink_bound():
    # NVLS graph: the fastest 2.28.3 Hopper speed within 164.8 / 7 = 23.5 GB/s is 20; NVLS-tree
    # per channel min(20 x .85 x 7/8 x 2, 48, 45.5) = 29.75 (the NVLink, not the 45.5 cap as on
    # the H100); the ring's pass 1 keeps 4 x 45 GB/s (8 x 45 would need 8 x 45 x 7/8 > 164.8 of
    # NVLink), duplicated to 8 x 22.5: 91 GB/s against NVLS-tree's 120, so the ring never wins
    s, pl = NcclSystem("2.28.3", H800), contiguous(80, 8)
    assert nccl_graphs.nvls_graph(s, pl).bw_intra == 20.0
    t = tuning.table_for(s, pl)
    assert t.bandwidth[("all_reduce", "nvls_tree", "Simple")] == pytest.approx(8 * 20 * .85 * 7 / 8 * 2 * 80 / 158)
    assert t.latency[("all_reduce", "nvls_tree", "Simple")] == pytest.approx(25 + 2 * 3 * 14)
    assert (t.graphs["ring"].channels, t.graphs["ring"].bw_inter) == (8, 22.5)
    picks = [tuning.choose(s, pl, "all_reduce", 1 << e).algorithm for e in (20, 22, 31, 34)]
    assert picks == ["tree", "nvls_tree", "nvls_tree", "nvls_tree"]
    # one node: NVLS all-reduce on 8 channels at min(29.75, the graph's 20 GB/s) x 8/14 (bus ->
    # algorithm rate)
    one = tuning.table_for(s, contiguous(8, 8))
    assert one.bandwidth[("all_reduce", "nvls", "Simple")] == pytest.approx(8 * 20 * 8 / 14)
    assert tuning.choose(s, contiguous(8, 8), "all_reduce", GIB).algorithm == "nvls"


def test_2_28_nvls_gathers_are_rated_but_lose_to_the_ring_inside_an_h100_node():
    # one node: NVLS all-gather/reduce-scatter (25 us, 8 x 50 x .85 x 7/8 x 7/8 GB/s, no bus ->
    # algorithm conversion) against the ring (LL 10.8 us; Simple 12 x 30 GB/s x 8/7): the ring wins
    # at every size; across nodes NCCL enables NVLS only with CollNet
    s, pl = NcclSystem("2.28.3", H100), contiguous(8, 8)
    t = tuning.table_for(s, pl)
    assert t.bandwidth[("all_gather", "nvls", "Simple")] == pytest.approx(8 * 50 * .85 * 7 / 8 * 7 / 8)
    assert t.latency[("reduce_scatter", "nvls", "Simple")] == 25.0
    for coll in ("all_gather", "reduce_scatter"):
        assert ("nvls", "Simple") in tuning.candidates(s, pl, coll)
        assert {tuning.choose(s, pl, coll, 1 << e).algorithm for e in range(8, 32, 3)} == {"ring"}
        assert ("nvls", "Simple") not in tuning.candidates(s, contiguous(16, 8), coll)
    assert ("nvls", "Simple") not in tuning.candidates(NcclSystem("2.20.3", H100), pl, "all_gather")


def test_2_28_pat_only_at_one_gpu_per_node():
    # PAT: 0.75 of the tree graph's rate, 8 + log2(16) x 14 / 3.5 + 2.8 x 16 us
    s = NcclSystem("2.28.3", H100)
    one_per_node = contiguous(16, 1)
    t = tuning.table_for(s, one_per_node)
    tree = t.graphs["tree"]
    assert t.bandwidth[("all_gather", "pat", "Simple")] == pytest.approx(tree.channels * tree.bw_inter * .75)
    assert t.latency[("reduce_scatter", "pat", "Simple")] == pytest.approx(8 + 4 * 14 / 3.5 + 2.8 * 16)
    assert {tuning.choose(s, one_per_node, "all_gather", 1 << e).algorithm for e in range(6, 14)} >= {"pat"}
    assert "pat" not in {a for a, _ in tuning.candidates(s, contiguous(16, 8), "all_gather")}
    assert "pat" not in {a for a, _ in tuning.candidates(NcclSystem("2.20.3", H100), one_per_node, "all_gather")}


def test_the_time_model_prices_the_2_28_algorithms():
    P = load_preset("h100-ib").params
    s = NcclSystem("2.28.3", H100)
    sizes = np.array([64.0 * KIB, 64.0 * MIB, 4.0 * GIB])
    for coll, pl in (("all_reduce", contiguous(80, 8)), ("all_gather", contiguous(8, 8)),
                     ("reduce_scatter", contiguous(8, 8)), ("all_gather", contiguous(16, 1))):
        t, picks = nccl.choose(P, coll, sizes, pl, s)
        assert np.all(np.diff(t) > 0) and all(c.algorithm in tuning.ALGORITHMS for c in picks)
    # NVLS-tree crosses nodes: twice the nodes' share of its bytes at the ring's network rate x its efficiency
    pl = contiguous(80, 8)
    slow, P = {**P, "nvls_tree_net_eff": 0.5}, {**P, "nvls_tree_net_eff": 1.0}
    a = nccl.candidate_costs(P, "all_reduce", np.array(4.0 * GIB), pl)[("nvls_tree", "Simple")]
    b = nccl.candidate_costs(slow, "all_reduce", np.array(4.0 * GIB), pl)[("nvls_tree", "Simple")]
    net = 2 * 9 / 10 * 4 * GIB / (8 * P["net_gbps"]) * 1e-3
    assert float(b - a) == pytest.approx(net, rel=0.05)


def test_2_28_channels_per_network_peer_shrink_with_the_group():
    # 2.28.3 paths.cc: 2 per network peer, halved while 2 x ranks > 4 x the p2p channels (16
    # here), at least the NICs a GPU needs to fill its PCIe path (one 50 GB/s NIC for 48 GB/s)
    s = NcclSystem("2.28.3", H100)
    assert [tuning.p2p_channels(s, contiguous(n, 8)) for n in (16, 32, 64, 80)] == [(16, 2), (16, 2), (16, 1), (16, 1)]
    assert tuning.choose(s, contiguous(80, 8), "sendrecv", GIB).channels == 1
    assert tuning.p2p_channels(NcclSystem("2.20.3", H100), contiguous(80, 8)) == (16, 2)     # fixed 2 before
    # a GPU whose PCIe path is twice its NIC's rate drives two NICs, so keeps 2 channels per peer
    two = NodeFacts(compute_capability=90, cpu_vendor="Intel", intra_bw=370.8, nics_per_node=16, nic_bw=25.0,
                    gpu_nic_bw=48.0, nvls=True)
    assert tuning.p2p_channels(NcclSystem("2.28.3", two), contiguous(80, 8)) == (16, 2)
    # one node: every channel of the communicator per peer, as before
    assert tuning.p2p_channels(s, contiguous(8, 8))[1] == tuning.p2p_channels(NcclSystem("2.20.3", H100),
                                                                              contiguous(8, 8))[1]


def test_estimate_cli_runs_the_2_28_algorithms():
    res = CliRunner().invoke(app, ["estimate", "all_reduce", "--bytes", "64MiB,4GiB", "--ranks", "80",
                                   "--gpus-per-node", "8", "--preset", "h100-ib", "--nccl-version", "2.28.3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["nccl_version"] == "2.28.3"
    assert [e["algorithm"] for e in out["estimates"]] == ["nvls_tree", "ring"]
    assert out["estimates"][0]["time_ns"] < out["estimates"][1]["time_ns"]


def test_2_28_collnet_only_where_the_node_has_sharp():
    # 2.28.3: CollNet direct 8 x 48 GB/s / (half the GPUs-per-head excess: 1) x .85 (Hopper) x 1/2,
    # 2 (3.7 + 7 x .4) + 31 us; chain 8 x 48 x 1/2, 2 x 7 x 2.8 + 30 us; with CollNet NVLS also
    # crosses nodes (8 x min(48 x .85 x 7/8 x 2, 48) x 80/158 GB/s, 25 + 18 us) and wins here
    sharp = NodeFacts(compute_capability=90, cpu_vendor="Intel", intra_bw=370.8, nic_bw=50.0, gpu_nic_bw=48.0,
                      nvls=True, collnet=True)
    s, pl = NcclSystem("2.28.3", sharp), contiguous(80, 8)
    t = tuning.table_for(s, pl)
    assert t.bandwidth[("all_reduce", "collnet_direct", "Simple")] == pytest.approx(8 * 48 * .85 / 2)
    assert t.latency[("all_reduce", "collnet_direct", "Simple")] == pytest.approx(2 * (3.7 + 7 * .4) + 31)
    assert t.bandwidth[("all_reduce", "collnet_chain", "Simple")] == pytest.approx(8 * 48 / 2)
    assert t.latency[("all_reduce", "collnet_chain", "Simple")] == pytest.approx(2 * 7 * 2.8 + 30)
    assert t.bandwidth[("all_reduce", "nvls", "Simple")] == pytest.approx(8 * 48 * 80 / 158)
    assert t.latency[("all_reduce", "nvls", "Simple")] == pytest.approx(25 + 18)
    assert {tuning.choose(s, pl, "all_reduce", 1 << e).algorithm for e in (16, 24, 32)} == {"nvls"}
    # without NVLS (A100 with SHARP) CollNet direct takes the small messages
    a100 = NcclSystem("2.28.3", NodeFacts(collnet=True))
    assert tuning.choose(a100, contiguous(32, 8), "all_reduce", 64 * KIB).algorithm == "collnet_direct"
    t, picks = nccl.choose(load_preset("a100-ib").params, "all_reduce", np.array([64.0 * KIB, 64.0 * MIB]),
                           contiguous(32, 8), a100)
    assert np.all(np.diff(t) > 0) and picks[0].algorithm == "collnet_direct"
    # no CollNet without the node fact, or before 2.28.3; a profile writes the fact only when set
    algos = {a for a, _ in tuning.candidates(NcclSystem("2.28.3", H100), pl, "all_reduce")}
    assert not algos & {"collnet_direct", "collnet_chain", "nvls"}
    assert "collnet_direct" not in {a for a, _ in tuning.candidates(NcclSystem("2.20.3", sharp), pl, "all_reduce")}
    assert "collnet" not in NcclSystem("2.28.3", H100).to_json()["node"]
    assert NcclSystem.from_json(s.to_json(), "p") == s


def test_2_28_gathers_in_the_network_only_with_collnet_and_a_head_per_gpu():
    """2.28.3 runs all-gather and reduce-scatter across nodes in the switches only with CollNet
    (SHARP and a plugin with iallgather/ireducescatter) and when no node has more GPUs than
    CollNet heads: NVLS 8 x min(48 x .85 x 7/8 x 7/8, 48) GB/s, 25 + 18 us; CollNet direct
    8 x min(48, .9 x 48) GB/s, 2 (3.7 + 7 x .4) + 31 us; no bus -> algorithm conversion."""
    sharp = NodeFacts(compute_capability=90, cpu_vendor="Intel", intra_bw=370.8, nic_bw=50.0, gpu_nic_bw=48.0,
                      nvls=True, collnet=True)
    s, pl = NcclSystem("2.28.3", sharp), contiguous(64, 8)
    t = tuning.table_for(s, pl)
    for coll in ("all_gather", "reduce_scatter"):
        assert t.bandwidth[(coll, "nvls", "Simple")] == pytest.approx(8 * min(48 * .85 * 7 / 8 * 7 / 8, 48))
        assert t.latency[(coll, "nvls", "Simple")] == pytest.approx(25 + 18)
        assert t.bandwidth[(coll, "collnet_direct", "Simple")] == pytest.approx(8 * min(48, .9 * 48))
        assert t.latency[(coll, "collnet_direct", "Simple")] == pytest.approx(2 * (3.7 + 7 * .4) + 31)
        assert tuning.choose(s, pl, coll, (MIB if coll == "reduce_scatter" else MIB // 64)).algorithm != "ring"
        # the model times what NCCL picks: faster than the ring it replaces on 64 GPUs at 16 MiB
        sizes = np.array([16.0 * MIB / (64 if coll == "all_gather" else 1)])
        t_in, picks = nccl.choose(load_preset("h100-ib").params, coll, sizes, pl, s)
        t_ring, _ = nccl.choose(load_preset("h100-ib").params, coll, sizes, pl, NcclSystem("2.28.3", H100))
        assert picks[0].algorithm in ("nvls", "collnet_direct") and t_in[0] < t_ring[0]
    # fewer heads (NICs) than GPUs per node, no CollNet, or one node: the ring (and PAT) only
    four_nics = dataclasses.replace(sharp, nics_per_node=4)
    for sys_, p in ((NcclSystem("2.28.3", four_nics), pl), (NcclSystem("2.28.3", H100), pl),
                    (NcclSystem("2.20.3", sharp), pl)):
        algos = {a for a, _ in tuning.candidates(sys_, p, "all_gather")}
        assert not algos & {"nvls", "collnet_direct"}, (sys_, algos)
    assert {a for a, _ in tuning.candidates(s, contiguous(8, 8), "all_gather")} <= {"ring", "nvls"}
