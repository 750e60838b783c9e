"""GraphML export: readable by networkx with the node and edge attributes documented."""

from __future__ import annotations

import json

import networkx as nx
import pytest
from test_astra_sim_support import uniform_job
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.converters.graphml import job_graph, write
from echo_et.errors import EchoError
from echo_et.ir import save_job
from echo_et.ir.schema import pb


def _build(gb, r, s):
    op = gb.cpu_op("aten::mm", s["cpu"], duration_ns=10)
    launch = gb.cpu_op("cudaLaunchKernel", s["cpu"], kind=pb.KIND_LAUNCH,
                       deps=[(op.id, pb.DEP_CONTROL)])
    k = gb.compute("gemm", s["compute"], duration_ns=1234, deps=[(launch.id, pb.DEP_LAUNCH)])
    gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="dp", in_bytes=4096,
                  deps=[k.id])
    gb.p2p(r % 2 == 0, "p2p", s["comm"], group="dp", peer=1 - r % 2, nbytes=77)


def _job():
    return uniform_job(4, _build, groups={"dp": [[0, 1], [2, 3]]})


def test_rank_graph_round_trips_through_networkx(tmp_path):
    res = write(_job(), tmp_path / "g.graphml", rank=3)
    g = nx.read_graphml(tmp_path / "g.graphml")
    assert res == {"output": str(tmp_path / "g.graphml"), "nodes": 5, "edges": 3, "rank": 3, "graphs": 1}
    assert g.is_directed() and g.number_of_nodes() == 5
    kinds = {d["name"]: d["kind"] for _, d in g.nodes(data=True)}
    assert kinds == {"aten::mm": "cpu_op", "cudaLaunchKernel": "launch", "gemm": "compute",
                     "ar": "collective", "p2p": "recv"}
    gemm = next(d for _, d in g.nodes(data=True) if d["name"] == "gemm")
    assert gemm["duration_ns"] == 1234 and gemm["stream"] == "stream 7"
    ar = next(d for _, d in g.nodes(data=True) if d["name"] == "ar")
    assert (ar["bytes"], ar["collective"], ar["group"]) == (4096, "all_reduce", "dp")
    recv = next(d for _, d in g.nodes(data=True) if d["name"] == "p2p")
    assert recv["peer"] == 2 and recv["bytes"] == 77          # the global rank of the peer
    deps = sorted(d["dep"] for _, _, d in g.edges(data=True))
    assert deps == ["control", "data", "launch"]
    assert g.graph["rank"] == 3


def test_without_rank_every_distinct_graph_once(tmp_path):
    job = _job()
    g = job_graph(job)
    assert g.number_of_nodes() == 5 * len(job.graph_ids())
    assert {d["graph"] for _, d in g.nodes(data=True)} == set(job.graph_ids())
    write(job, tmp_path / "a.graphml")
    write(job, tmp_path / "b.graphml")
    assert (tmp_path / "a.graphml").read_bytes() == (tmp_path / "b.graphml").read_bytes()


def test_unknown_rank_and_cli(tmp_path):
    with pytest.raises(EchoError, match="rank 7 is not in the job"):
        job_graph(_job(), 7)
    job = save_job(_job(), tmp_path / "job")
    runner = CliRunner()
    res = runner.invoke(app, ["export", "graphml", str(job), "-o", str(tmp_path / "g.graphml"),
                              "--rank", "0", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["nodes"] == 5
    bad = runner.invoke(app, ["export", "graphml", str(job), "-o", str(tmp_path / "x.graphml"),
                              "--rank", "7"])
    assert bad.exit_code == 2 and not (tmp_path / "x.graphml").exists()
