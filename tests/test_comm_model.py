"""The NCCL cost model on the shipped presets: each algorithm and protocol regime, placement,
what-ifs, bad input. No measurements needed."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from echo_et.errors import EchoError
from echo_et.models.comm import COLLECTIVES, CommModel, Estimate, nccl
from echo_et.models.comm.topology import contiguous, placement

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10
PRESETS = ["a100-ib", "h100-ib", "h800-ib", "v100-ib"]


@pytest.fixture(scope="module")
def a100() -> CommModel:
    return CommModel.preset("a100-ib")


def test_presets_are_shipped_and_uncalibrated():
    assert set(PRESETS) <= set(CommModel.preset_names())
    for name in PRESETS:
        m = CommModel.preset(name)
        assert m.calibrated is False
        assert m.gpus_per_node == 8
        assert m.name == name


def test_preset_for_gpu_matches_device_names():
    assert CommModel.preset_for_gpu("NVIDIA A100-SXM4-40GB").name == "a100-ib"
    assert CommModel.preset_for_gpu("NVIDIA H100 80GB HBM3").name == "h100-ib"
    with pytest.raises(EchoError):
        CommModel.preset_for_gpu("Some Future GPU")
    with pytest.raises(EchoError, match="unknown preset"):
        CommModel.preset("tpu-v9")


def test_ll_for_tiny_messages_simple_for_huge(a100):
    ranks = list(range(8))
    assert a100.estimate("all_reduce", 8, ranks).protocol == "LL"
    assert a100.estimate("all_reduce", 4 * KiB, ranks).protocol == "LL"
    assert a100.estimate("all_reduce", GiB, ranks).protocol == "Simple"
    protos = [a100.estimate("all_reduce", 1 << e, ranks).protocol for e in range(3, 31)]
    # the protocol only ever moves towards larger lines as messages grow
    order = {"LL": 0, "LL128": 1, "Simple": 2}
    assert [order[p] for p in protos] == sorted(order[p] for p in protos)
    assert "LL128" in protos  # the middle regime exists on NVLink


def test_single_node_uses_the_ring_multi_node_switches_tree_to_ring(a100):
    assert {a100.estimate("all_reduce", 1 << e, list(range(8))).algorithm for e in range(3, 31)} == {"ring"}
    ranks = list(range(32))
    assert a100.estimate("all_reduce", 4 * KiB, ranks).algorithm == "tree"
    assert a100.estimate("all_reduce", 16 * GiB, ranks).algorithm == "ring"


def test_only_all_reduce_has_a_tree(a100):
    ranks = list(range(32))
    for coll in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
        assert {a100.estimate(coll, 1 << e, ranks).algorithm for e in range(3, 31, 3)} == {"ring"}
    for coll in ("all_to_all", "gather", "scatter"):
        assert a100.estimate(coll, MiB, ranks).algorithm == "p2p"


def test_nvls_only_where_the_switch_reduces():
    h100 = CommModel.preset("h100-ib")
    assert h100.estimate("all_reduce", GiB, list(range(8))).algorithm == "nvls"
    assert h100.estimate("all_reduce", 4 * KiB, list(range(8))).algorithm != "nvls"
    a100 = CommModel.preset("a100-ib")
    assert all(a100.estimate("all_reduce", 1 << e, list(range(8))).algorithm != "nvls" for e in range(3, 31))


def test_inter_node_costs_more_than_intra_node(a100):
    one_node = list(range(8))
    one_per_node = [8 * i for i in range(8)]          # same group size, every hop crosses nodes
    for size in (4 * KiB, MiB, GiB):
        assert a100.estimate("all_reduce", size, one_per_node).time_ns > \
            a100.estimate("all_reduce", size, one_node).time_ns
    assert a100.p2p(64 * MiB, 0, 9).time_ns > a100.p2p(64 * MiB, 0, 1).time_ns
    assert a100.p2p(8, 0, 9).time_ns > a100.p2p(8, 0, 1).time_ns


def test_more_nodes_never_speed_up_a_large_all_reduce(a100):
    for name in PRESETS:
        m = CommModel.preset(name)
        times = [m.estimate("all_reduce", GiB, list(range(n))).time_ns for n in (8, 16, 32, 64, 256, 1024)]
        assert times == sorted(times), name
    # on a flat network the per-node bandwidth is the limit: 1024 GPUs stay within 2x of 16
    t16 = a100.estimate("all_reduce", GiB, list(range(16))).time_ns
    assert a100.estimate("all_reduce", GiB, list(range(1024))).time_ns < 2 * t16


def _latency_only(**changes):
    """a100-ib parameters with free bandwidth and only the named latencies."""
    P = dict(CommModel.preset("a100-ib").params)
    for name in P:
        if name.startswith(("base_us", "nvlink_hop_us", "net_hop_us")) or name == "ring_loop_extra_steps":
            P[name] = 0.0
        elif name.endswith("_gbps") or name.startswith("cap_gbps"):
            P[name] = 1e12
    P.update(changes)
    return P


@pytest.mark.parametrize("coll, n, m, net_steps", [
    ("all_reduce", 16, 2, 2 * 15 * 2 / 16),       # a cycle of 16 ranks crosses 2 of its 16 links
    ("all_reduce", 32, 4, 2 * 31 * 4 / 32),
    ("all_reduce", 24, 3, 2 * 23 * 3 / 24),
    ("all_gather", 16, 2, 15 * 2 / 16),
    ("reduce_scatter", 32, 4, 31 * 4 / 32),
    ("all_reduce", 8, 1, 0.0),
])
def test_ring_steps_cross_the_network_once_per_node_boundary(coll, n, m, net_steps):
    P = _latency_only(**{"net_hop_us.LL": 1.0})
    t = nccl.candidate_costs(P, coll, np.float64(8.0), contiguous(n, n // m))[("ring", "LL")]
    assert t == pytest.approx(net_steps, rel=1e-6)


def test_tree_network_efficiency_depends_on_the_node_count():
    P = dict(CommModel.preset("a100-ib").params)
    two, four = contiguous(16, 8), contiguous(32, 8)

    def tree(params, pl):
        return nccl.candidate_costs(params, "all_reduce", np.float64(GiB), pl)[("tree", "Simple")]

    slow_two = {**P, "tree_net_eff": 0.3}          # makes the two-node tree network-bound
    slow_many = {**P, "tree_net_eff_many": 0.3}
    assert tree(slow_two, two) > tree(P, two) and tree(slow_two, four) == tree(P, four)
    assert tree(slow_many, four) > tree(P, four) and tree(slow_many, two) == tree(P, two)
    # NCCL's tuning: a tree on 4+ nodes gets less of the network than on two (a100-ib: 0.74 vs 0.92)
    assert P["tree_net_eff_many"] < P["tree_net_eff"] <= 1.0


def test_only_rings_and_ll_pay_the_start_up_ramp():
    P = dict(CommModel.preset("a100-ib").params)
    short = {**P, **{f"ramp_bytes.{p}": P[f"ramp_bytes.{p}"] / 100 for p in ("LL", "LL128", "Simple")}}
    S, pl = np.float64(256 * KiB), contiguous(32, 8)
    before = nccl.candidate_costs(P, "all_reduce", S, pl)
    after = nccl.candidate_costs(short, "all_reduce", S, pl)
    for proto in ("LL128", "Simple"):
        assert after[("tree", proto)] == before[("tree", proto)]   # the tree pays its pipeline fill
        assert after[("ring", proto)] < before[("ring", proto)]
    assert after[("tree", "LL")] < before[("tree", "LL")]


@pytest.mark.parametrize("name", PRESETS)
def test_time_drops_with_bytes_only_where_nccl_changes_its_choice(name):
    m = CommModel.preset(name)
    sizes = np.unique(np.round(2 ** np.arange(0, 34.01, 0.25)))
    for coll in COLLECTIVES:
        if coll in ("send", "recv"):
            continue
        for n in (2, 3, 8, 9, 16, 32, 256):
            pl = contiguous(n, 8)
            fast, fast_picks = nccl.choose(m.profile.params, coll, sizes, pl, m.nccl, "fastest")
            # every candidate grows with size, except where NCCL splits a send/recv over more
            # channels (2.2x: by size), which raises the rate those channels carry
            p2p_split = [c.algorithm == "p2p" and c.channels != d.channels
                         for c, d in zip(fast_picks, fast_picks[1:], strict=False)]
            drops = np.flatnonzero(np.diff(fast) < -1e-9)
            assert all(p2p_split[i] for i in drops), (coll, n)
            t, picks = nccl.choose(m.profile.params, coll, sizes, pl, m.nccl)
            pairs = [(c.algorithm, c.protocol) if c.algorithm != "p2p" else (c.algorithm, c.protocol, c.channels)
                     for c in picks]
            for i in np.flatnonzero(np.diff(t) < -1e-9):
                assert pairs[i] != pairs[i + 1], (coll, n, sizes[i])
            assert np.all(t >= fast - 1e-9)                      # NCCL's pick is never faster


def test_ring_all_reduce_is_reduce_scatter_plus_all_gather_at_scale(a100):
    # NCCL's ring all-reduce is a reduce-scatter followed by an all-gather of the shards
    ranks = list(range(8))
    S = 4 * GiB
    ar = a100.estimate("all_reduce", S, ranks).time_ns
    rs = a100.estimate("reduce_scatter", S, ranks).time_ns
    ag = a100.estimate("all_gather", S // 8, ranks).time_ns   # IR bytes: the shard
    assert ar == pytest.approx(rs + ag, rel=0.1)


def test_all_gather_bytes_are_the_shard(a100):
    ranks = list(range(8))
    # the same output buffer: 8 shards of S/8 moved vs broadcast of S
    assert a100.estimate("all_gather", GiB // 8, ranks).time_ns < a100.estimate("all_gather", GiB, ranks).time_ns / 4


def test_one_rank_is_a_local_copy_and_zero_bytes_cost_nothing(a100):
    e = a100.estimate("all_reduce", MiB, [5])
    assert e.algorithm == "local" and e.time_ns > 0
    assert a100.estimate("all_reduce", 0, list(range(8))) == Estimate(0, "none", "none")
    assert a100.estimate("barrier", 0, list(range(8))).time_ns > 0
    assert a100.p2p(0, 0, 1).time_ns == 0


def test_send_recv_through_estimate(a100):
    assert a100.estimate("send", MiB, [0, 9]) == a100.p2p(MiB, 0, 9)
    assert a100.estimate("recv", MiB, [3, 2]).algorithm == "p2p"
    with pytest.raises(EchoError, match="src, dst"):
        a100.estimate("send", MiB, [0, 1, 2])


def test_placement_follows_gpus_per_node(a100):
    assert placement([0, 1, 8, 9], 8) == placement([16, 17, 24, 25], 8)
    p = placement([0, 1, 2, 8], 8)
    assert (p.ranks, p.nodes, p.per_node) == (4, 2, 3)
    ranks = list(range(16))
    assert a100.estimate("all_reduce", GiB, ranks, gpus_per_node=16).time_ns < \
        a100.estimate("all_reduce", GiB, ranks).time_ns


def test_what_if_overrides(a100):
    ranks16 = list(range(16))
    faster_net = a100.with_overrides(inter_bw_gbps=2 * a100.params["net_gbps"])
    assert faster_net.estimate("all_reduce", GiB, ranks16).time_ns < a100.estimate("all_reduce", GiB, ranks16).time_ns
    assert faster_net.estimate("all_reduce", GiB, list(range(8))) == a100.estimate("all_reduce", GiB, list(range(8)))
    slow_hops = a100.with_overrides(intra_latency_us=10 * a100.params["nvlink_hop_us.LL"])
    tiny = ("all_reduce", 8, list(range(8)))
    assert slow_hops.estimate(*tiny).time_ns > a100.estimate(*tiny).time_ns
    assert slow_hops.params["nvlink_hop_us.Simple"] == pytest.approx(10 * a100.params["nvlink_hop_us.Simple"])
    assert a100.with_overrides(gpus_per_node=4).gpus_per_node == 4
    assert a100.with_overrides(inter_latency_us=1.0).params["net_hop_us.LL"] == 1.0
    # the original is untouched
    assert a100.params == CommModel.preset("a100-ib").params
    for bad in ({"gpus_per_node": 0}, {"intra_bw_gbps": -1.0}, {"inter_latency_us": 0.0}):
        with pytest.raises(EchoError):
            a100.with_overrides(**bad)


def test_estimates_are_pure(a100):
    other = CommModel.preset("a100-ib")
    args = ("all_reduce", 3 * MiB + 7, [3, 4, 11, 12])
    first = a100.estimate(*args)
    a100.estimate("all_gather", MiB, list(range(64)))
    assert a100.estimate(*args) == first == other.estimate(*args)
    assert isinstance(first.time_ns, int)


@pytest.mark.parametrize("call, match", [
    (lambda m: m.estimate("allreduce", 8, [0, 1]), "unknown collective"),
    (lambda m: m.estimate("all_reduce", -1, [0, 1]), "bytes must be >= 0"),
    (lambda m: m.estimate("all_reduce", 1.5, [0, 1]), "integer"),
    (lambda m: m.estimate("all_reduce", 8, []), "at least one rank"),
    (lambda m: m.estimate("all_reduce", 8, [0, 0]), "twice"),
    (lambda m: m.estimate("all_reduce", 8, [-1, 2]), ">= 0"),
    (lambda m: m.estimate("all_reduce", 8, [0, 1], gpus_per_node=0), "gpus_per_node"),
    (lambda m: m.p2p(-5, 0, 1), "bytes must be >= 0"),
])
def test_bad_input_raises_echo_error(a100, call, match):
    with pytest.raises(EchoError, match=match):
        call(a100)


def test_a_profiles_per_collective_rates_reach_every_estimate(tmp_path):
    """What the simulator and `estimate` call (CommModel.estimate) times each collective at its
    own fitted rate; a profile keeps those rates through JSON and writes only those moved."""
    import dataclasses

    from echo_et.models.comm.profile import load_profile, write_profile

    base = CommModel.preset("h100-ib").profile
    slow = dataclasses.replace(base, params={**base.params, "coll_nvlink_eff.all_gather": 0.5})
    write_profile(slow, tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    assert '"coll_nvlink_eff": {\n      "all_gather": 0.5\n    }' in text
    assert "reduce_scatter" not in json.dumps(json.loads(text)["params"])
    a, b = CommModel(base), CommModel.from_profile(tmp_path / "p.json")
    ranks = list(range(8))
    ag = [m.estimate("all_gather", 128 << 20, ranks).time_ns for m in (a, b)]
    assert ag[1] > 1.6 * ag[0]                                   # bandwidth-bound: about twice
    assert a.estimate("all_reduce", 1 << 30, ranks) == b.estimate("all_reduce", 1 << 30, ranks)
    assert load_profile(tmp_path / "p.json").params["coll_net_eff.all_gather"] == 1.0


def test_the_h100_preset_emulates_the_newest_modelled_release():
    """H100 clusters run NCCL 2.2x (the shared H100 logs state 2.29.2): the preset emulates the
    newest release whose sources were read, so NVLS-tree runs across Hopper NVSwitch nodes
    without naming a release."""
    from echo_et.models.comm.nccl_releases import VERSIONS

    h100 = CommModel.preset("h100-ib")
    assert h100.nccl_version == VERSIONS[-1] == "2.28.3"
    assert h100.estimate("all_reduce", GiB, list(range(80))).algorithm == "nvls_tree"
    assert h100.with_nccl_version("2.20.3").estimate("all_reduce", GiB, list(range(80))).algorithm != "nvls_tree"



# NVLinks per GPU (spec sheets) and NCCL's rate of one link per GPU generation (NCCL 2.28.3
# src/graph/topo.h SM70/SM80/SM90_NVLINK_BW; topo.cc rates a GPU's links to the NVSwitch as
# count x that rate): what each preset's node facts must say NCCL sees inside a node
NVLINKS = {"v100-ib": (6, 20.0), "a100-ib": (12, 20.0), "h100-ib": (18, 20.6), "h800-ib": (8, 20.6)}


@pytest.mark.parametrize("name", PRESETS)
def test_each_presets_node_is_its_links_as_nccl_rates_them(name):
    node = CommModel.preset(name).nccl.node
    links, per_link = NVLINKS[name]
    assert node.intra_bw == pytest.approx(links * per_link)
    # NVLink SHARP: Hopper behind an NVSwitch (NCCL enables it from the driver's multicast
    # support, whatever the link count)
    assert node.nvls == (node.compute_capability >= 90 and node.intra == "nvswitch")


def test_the_h800_preset_is_an_h100_node_with_8_nvlinks_on_the_same_release():
    """The H800 differs from the H100 only in its NVLinks (8 instead of 18): same NVSwitch with
    NVLink SHARP, NICs, hosts and release (2.28.3), so the same algorithms are open to NCCL;
    its narrower NVLink makes NVLS-tree NVLink-bound, and the ring (NVLink-bound too) never
    overtakes it across nodes, where on the H100 it does from 4 GiB."""
    import dataclasses

    h100, h800 = CommModel.preset("h100-ib"), CommModel.preset("h800-ib")
    assert h800.nccl_version == h100.nccl_version == "2.28.3"
    assert dataclasses.replace(h800.nccl.node, intra_bw=h100.nccl.node.intra_bw) == h100.nccl.node
    one_node, nodes10 = list(range(8)), list(range(80))
    assert h800.estimate("all_reduce", GiB, one_node).algorithm == "nvls"
    assert [h800.estimate("all_reduce", s, nodes10).algorithm for s in (MiB, 4 * MiB, GiB, 16 * GiB)] == \
        ["tree", "nvls_tree", "nvls_tree", "nvls_tree"]
    assert h100.estimate("all_reduce", 16 * GiB, nodes10).algorithm == "ring"
    assert h800.with_nccl_version("2.20.3").estimate("all_reduce", GiB, nodes10).algorithm == "ring"
    assert h800.estimate("all_gather", 4 * KiB, [8 * i for i in range(16)]).algorithm == "pat"
    # fewer links, never faster
    for coll, size, ranks in (("all_reduce", GiB, one_node), ("all_reduce", GiB, nodes10),
                              ("all_gather", 64 * MiB, one_node)):
        assert h800.estimate(coll, size, ranks).time_ns > h100.estimate(coll, size, ranks).time_ns


def test_the_ring_reduction_is_fused_into_its_transfers():
    """NCCL reduces inside each ring step (recvReduceSend): on a node whose memory outruns its
    NVLink, a reduce-scatter takes as long as the all-gather moving the same bytes; only a
    reduction slower than the links sets the time."""
    import dataclasses

    base = CommModel.preset("h100-ib")
    ranks = list(range(8))
    S = GiB
    rs = base.estimate("reduce_scatter", S, ranks)
    ag = base.estimate("all_gather", S // 8, ranks)          # the same buffer gathered
    assert (rs.algorithm, ag.algorithm) == ("ring", "ring")
    assert rs.time_ns == pytest.approx(ag.time_ns, rel=0.02)
    slow = CommModel(dataclasses.replace(base.profile, params={**base.profile.params, "reduce_gbps": 50.0}))
    t = slow.estimate("reduce_scatter", S, ranks).time_ns
    assert t == pytest.approx(7 / 8 * S / 50.0, rel=0.05)   # reduction-bound: 7/8 of S at 50 GB/s


def test_a_send_recv_channel_pays_one_step_of_pipeline_fill():
    """NCCL moves each channel's part of a send/recv in 512 KiB steps through the connection's
    FIFO (written by the sender, read by the receiver): a part takes one step more than its
    bytes. An 8-GPU all-to-all of 32 MiB gives each of its 28 channels 1 MiB (two steps), so it
    runs at 2/3 of the NVLink rate it reaches at 16 GiB (64 MiB per channel); with its ~25 us of
    latency, 1.69x the time per byte (1.2x without the fill)."""
    h100 = CommModel.preset("h100-ib")
    ranks = list(range(8))
    small, large = 32 * MiB, 16 * GiB
    per_byte = [h100.estimate("all_to_all", s, ranks).time_ns / s for s in (small, large)]
    assert 1.45 < per_byte[0] / per_byte[1] < 1.8
    # LL carries no FIFO steps of that size: the fill is Simple's only
    assert h100.estimate("all_to_all", 64 * KiB, ranks).protocol == "LL"


def test_nvls_tree_hops_have_their_own_latency_and_old_profiles_keep_theirs(tmp_path):
    """NVLS-tree's network hops (``nvls_tree_hop_us``) are priced apart from a ring's network
    steps; a profile written before the parameter existed takes its ``net_hop_us.Simple``, so
    it times NVLS-tree as it did, and a profile writes the parameter only when it differs."""
    from echo_et.models.comm.params import flatten, nest
    from echo_et.models.comm.profile import load_profile, write_profile

    base = CommModel.preset("h100-ib").profile
    old = {k: v for k, v in nest(base.params).items()}
    old.pop("nvls_tree_hop_us", None)
    flat = flatten(old, "old")
    assert flat["nvls_tree_hop_us"] == flat["net_hop_us.Simple"]
    assert "nvls_tree_hop_us" not in nest(flat)
    ranks = list(range(80))
    slow = {**base.params, "nvls_tree_hop_us": base.params["nvls_tree_hop_us"] + 100.0}
    a, b = CommModel(base), CommModel(dataclasses.replace(base, params=slow))
    ea, eb = a.estimate("all_reduce", 256 * MiB, ranks), b.estimate("all_reduce", 256 * MiB, ranks)
    assert ea.algorithm == eb.algorithm == "nvls_tree"
    assert eb.time_ns - ea.time_ns == pytest.approx(2 * 4 * 100.0 * 1e3, rel=1e-6)   # 2 ceil(log2 10) hops
    ring = [m.estimate("all_gather", 16 * MiB, ranks) for m in (a, b)]
    assert ring[0].algorithm == "ring" and ring[0].time_ns == ring[1].time_ns
    write_profile(dataclasses.replace(base, params=slow), tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json").params["nvls_tree_hop_us"]
    assert again == pytest.approx(slow["nvls_tree_hop_us"], rel=1e-5)


def test_a_one_node_broadcast_pays_its_own_chain_fill_not_the_network_trees(tmp_path):
    """The broadcast/reduce chain's pipeline fill is priced with ``chain_chunk_bytes`` (a
    parameter a one-node fit of broadcast or reduce logs sets), not with ``tree_chunk_bytes``
    (the network tree's, which only multi-node logs fit); a profile written before the
    parameter existed takes its ``tree_chunk_bytes``, so it prices broadcasts as it did."""
    from echo_et.models.comm.params import flatten, nest
    from echo_et.models.comm.profile import load_profile, write_profile

    base = CommModel.preset("a100-ib").profile
    old = nest(base.params)
    assert "chain_chunk_bytes" not in old            # the presets keep their bytes
    flat = flatten(old, "old")
    assert flat["chain_chunk_bytes"] == flat["tree_chunk_bytes"]
    ranks = list(range(8))

    def bcast(params, coll="broadcast"):
        return CommModel(dataclasses.replace(base, params=params)).estimate(coll, 64 * MiB, ranks)

    ref = bcast(base.params)
    assert ref.algorithm == "ring" and ref.protocol in ("LL128", "Simple")
    tree_moved = bcast({**base.params, "tree_chunk_bytes": 4 * base.params["tree_chunk_bytes"]})
    assert tree_moved.time_ns == ref.time_ns
    bigger = {**base.params, "chain_chunk_bytes": 4 * base.params["chain_chunk_bytes"]}
    chain_moved = bcast(bigger)
    assert chain_moved.protocol == ref.protocol
    assert chain_moved.time_ns > ref.time_ns
    assert bcast(bigger, "reduce").time_ns > bcast(base.params, "reduce").time_ns
    assert bcast(bigger, "all_reduce").time_ns == bcast(base.params, "all_reduce").time_ns
    write_profile(dataclasses.replace(base, params=bigger), tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json").params
    assert again["chain_chunk_bytes"] == pytest.approx(bigger["chain_chunk_bytes"], rel=1e-5)
    assert again["tree_chunk_bytes"] == pytest.approx(base.params["tree_chunk_bytes"], rel=1e-5)


@pytest.mark.parametrize("coll", ["all_to_all", "gather", "scatter"])
def test_a_grouped_send_recv_with_one_gpu_per_node_is_priced(a100, coll):
    # SimAI's expert-parallel groups stride across nodes: 16 ranks, one on each node. There is
    # no intra-node peer, and the time once came out NaN (0 bytes over a rate of 0).
    spread = [24 * i for i in range(16)]
    t = a100.estimate(coll, 96 * MiB, spread).time_ns
    assert np.isfinite(t) and t > 0
    packed = a100.estimate(coll, 96 * MiB, list(range(16))).time_ns   # 2 nodes of 8
    assert t > packed
