"""Shared network interfaces (``echo_et.sim.nic_share``): the rate each cross-node transfer
gets from the transfers that leave its node with it, and the prediction that follows: neutral
when every GPU has its own share, faster where part of a node is quiet, the same to the ns
with and without symmetry and repeat blocks."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.sim.nic_share import NicSharing, NodeNetwork

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install -e '.[dev]')")

from echo_et.experiments.config_rows import ConfigSweepOptions  # noqa: E402
from echo_et.experiments.config_sweep import models_for, trace_row  # noqa: E402
from echo_et.ir.schema import pb  # noqa: E402
from echo_et.models.cluster import Cluster  # noqa: E402
from echo_et.passes import retime_compute  # noqa: E402
from echo_et.sim import Predictor, SimOptions  # noqa: E402

NODE_GBPS = 40.0
GPN = 4


def _job(tp: int, dp: int, pp: int, microbatches: int = 3):
    row = dict(layers=2 * pp, hidden=256, heads=4, seq=128, micro_batch=1,
               global_batch=microbatches * dp, tp=tp, pp=pp, dp=dp, vocab=512)
    opts = ConfigSweepOptions(cluster=Cluster.parse(gpu="a100", gpus_per_node=GPN,
                                                    inter_bw=f"{NODE_GBPS}GB/s/node"),
                              recompute=True, slowdown=False, comm_preset="a100-ib")
    compute, comm, _ = models_for(opts)
    timed, _ = retime_compute(trace_row(row, opts), compute)
    return timed, comm


def _predict(job, comm, net=None, **opts):
    return Predictor(job, SimOptions(gpus_per_node=GPN, check=False, **opts), comm_model=comm,
                     node_network=net).run()


def _group(job, role, ranks):
    return next(g for g in job.manifest.groups if g.role == role and tuple(g.ranks) == tuple(ranks))


def test_rate_is_the_node_shared_by_its_senders_up_to_one_gpus_link() -> None:
    net = NodeNetwork(8, node_gbps=100.0, gpu_gbps=25.0)
    assert [net.rate(n) for n in (0, 1, 4, 8)] == [25.0, 25.0, 25.0, 12.5]
    with pytest.raises(EchoError, match="gpu_gbps must be a positive number"):
        NodeNetwork(8, node_gbps=100.0, gpu_gbps=0)
    with pytest.raises(EchoError, match="gpus per node must be >= 1"):
        NodeNetwork(0, node_gbps=100.0, gpu_gbps=1.0)


def test_loads_follow_megatron_rank_order() -> None:
    # tp1 dp2 pp4 on nodes of 4: stages 0-1 on node 0, 2-3 on node 1; the stage 1 -> 2 sends
    # of both replicas leave node 0 together, the data-parallel groups stay inside a node.
    job, _ = _job(1, 2, 4)
    share = NicSharing(job, NodeNetwork(GPN, node_gbps=NODE_GBPS, gpu_gbps=NODE_GBPS))
    pp0 = _group(job, pb.ROLE_PP, (0, 2, 4, 6))
    assert share.p2p_gbps(pp0, 2, 4) == NODE_GBPS / 2
    assert share.p2p_gbps(pp0, 4, 2) == NODE_GBPS / 2
    assert share.p2p_gbps(pp0, 0, 2) is None
    # the receiver's group may be named: the sender's sibling holds the pair
    pp1 = _group(job, pb.ROLE_PP, (1, 3, 5, 7))
    assert share.p2p_gbps(pp1, 2, 4) == NODE_GBPS / 2
    assert share.collective_gbps(_group(job, pb.ROLE_DP, (2, 3))) is None
    # tp1 dp8: one ring with 4 GPUs on each node: the node's four senders share it
    job8, _ = _job(1, 8, 1, microbatches=1)
    share8 = NicSharing(job8, NodeNetwork(GPN, node_gbps=NODE_GBPS, gpu_gbps=NODE_GBPS))
    assert share8.collective_gbps(_group(job8, pb.ROLE_DP, range(8))) == NODE_GBPS / 4


def test_even_share_is_neutral_and_a_quiet_node_half_is_faster() -> None:
    job, comm = _job(1, 2, 4)
    plain = _predict(job, comm)
    even = _predict(job, comm, NodeNetwork(GPN, node_gbps=NODE_GBPS, gpu_gbps=NODE_GBPS / GPN))
    assert even.step_time_ns == plain.step_time_ns
    # each GPU may use the whole node link alone: the two senders of a stage get half each,
    # twice the even share
    fast = _predict(job, comm, NodeNetwork(GPN, node_gbps=NODE_GBPS, gpu_gbps=NODE_GBPS))
    assert fast.step_time_ns < plain.step_time_ns
    at_half = comm.with_overrides(inter_bw_gbps=NODE_GBPS / 2)
    assert at_half.p2p(1 << 20, 2, 4, gpus_per_node=GPN).time_ns < comm.p2p(1 << 20, 2, 4, gpus_per_node=GPN).time_ns


@pytest.mark.parametrize("layout", [(1, 3, 2), (1, 2, 3), (1, 5, 2)])
def test_shares_are_exact_with_symmetry_and_repeat_blocks(layout) -> None:
    # tp1 dp3 pp2 on nodes of 4: stage 1 is rank 3 on node 0 and ranks 4-5 on node 1, so
    # ranks of one stage get different shares. tp1 dp5 pp2: ranks 0-4 run one graph and
    # their pipeline groups have one placement pattern, but rank 4 sends from node 1, where
    # it is alone, and ranks 0-3 share node 0: symmetry must not merge them.
    job, comm = _job(*layout)
    net = NodeNetwork(GPN, node_gbps=NODE_GBPS, gpu_gbps=NODE_GBPS / 2 if layout != (1, 5, 2) else NODE_GBPS)
    ref = _predict(job, comm, net, symmetry=False, repeats=False)
    for kw in ({}, {"repeats": False}, {"symmetry": False}):
        got = _predict(job, comm, net, **kw)
        assert got.step_time_ns == ref.step_time_ns, kw
        assert {r: x.step_time_ns for r, x in got.ranks.items()} == {r: x.step_time_ns for r, x in ref.ranks.items()}
        assert {r: x.comm_ns for r, x in got.ranks.items()} == {r: x.comm_ns for r, x in ref.ranks.items()}
    plain = _predict(job, comm, symmetry=False)
    assert {r: x.comm_ns for r, x in plain.ranks.items()} != {r: x.comm_ns for r, x in ref.ranks.items()}
    if layout == (1, 5, 2):
        assert ref.ranks[4].comm_ns < ref.ranks[0].comm_ns


def test_node_network_must_match_the_placement() -> None:
    job, comm = _job(1, 2, 4)
    with pytest.raises(EchoError, match="node network of 8 GPUs per node"):
        Predictor(job, SimOptions(gpus_per_node=GPN, check=False), comm_model=comm,
                  node_network=NodeNetwork(8, node_gbps=1.0, gpu_gbps=1.0))


def test_cli_nic_bw_shares_the_node_and_refuses_what_it_cannot_use(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from echo_et.cli.main import app
    from echo_et.ir import save_job

    job, _ = _job(1, 2, 4)
    path = str(save_job(job, tmp_path / "job"))
    base = ["simulate", path, "--mode", "predict", "--preset", "a100-ib", "--no-slowdown",
            "--gpus-per-node", str(GPN), "--inter-bw", f"{NODE_GBPS}GB/s/node", "--json"]
    runner = CliRunner()

    def step(*extra: str) -> int:
        r = runner.invoke(app, base + list(extra))
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)["step_time_ns"]

    plain = step()
    assert step("--nic-bw", f"{NODE_GBPS / GPN}GB/s") == plain   # the even share: neutral
    assert step("--nic-bw", f"{NODE_GBPS}GB/s") < plain            # a quiet half of a node
    for extra, msg in ((["--nic-bw", "10GB/s/node"], "error: --nic-bw: '10GB/s/node' is per node"),
                       (["--nic-bw", "fast"], "error: --nic-bw: 'fast' is not a bandwidth")):
        r = runner.invoke(app, base + extra)
        assert r.exit_code == 2 and r.stderr.strip().splitlines()[-1].startswith(msg), r.output
    # without the node's network (here or in the Job's manifest) there is nothing to share
    from echo_et.errors import OptionError

    with pytest.raises(OptionError, match="needs the node's network bandwidth"):
        Cluster.parse(gpus_per_node=8, nic_bw="10GB/s").node_network(None)
    assert Cluster.parse(gpus_per_node=8, inter_bw="800Gb/s/node", nic_bw="200Gb/s").node_network(None) == (
        8, 100.0, 25.0)


def test_sweep_nic_bw_needs_the_node_network_before_any_row_runs(tmp_path) -> None:
    from typer.testing import CliRunner

    from echo_et.cli.main import app

    csv = tmp_path / "c.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp\n2,64,4,32,1,4,1,2,2\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sweep", "--configs", str(csv), "-o", str(out), "--nic-bw", "25GB/s"])
    assert r.exit_code == 2 and r.stderr.strip() == (
        "error: --nic-bw: needs the node's network bandwidth (inter_bw) to share"), r.output
    assert not out.exists()


def test_a_job_with_one_graph_per_rank_shares_by_role_and_size() -> None:
    # four ranks on nodes of 2, data-parallel groups {0, 2} and {1, 3} across the nodes, every
    # rank its own graph (as a job converted from one trace per rank): both rings leave each
    # node together, so each gets half the node
    from echo_et.experiments.synthetic import stage_graph
    from echo_et.ir import JobBuilder

    jb = JobBuilder("per-rank", 4, source_format="synthetic")
    dp = [jb.group([t, t + 2], name=f"dp{t}", role="dp") for t in (0, 1)]
    for r in range(4):
        g = stage_graph(0, tp=1, pp=1, dp=2, microbatches=1, layers=1, hidden_bytes=1 << 20,
                        kernel_ns=1000).build()
        g.header.id = f"rank{r}"
        jb.add_graph(g)
        jb.bind(r, f"rank{r}", {"tp": jb.group([r], name=f"tp{r}", role="tp"), "pp": jb.group([r], name=f"pp{r}",
                                                                                          role="pp"),
                                "dp": dp[r % 2]})
    job = jb.build()
    share = NicSharing(job, NodeNetwork(2, node_gbps=10.0, gpu_gbps=10.0))
    assert [share.collective_gbps(job.group(g)) for g in dp] == [5.0, 5.0]
