"""Linking host execution traces to Kineto Jobs, on real pairs; facts read from both files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import FIXTURES, shared_path, unpack
from echo_et.converters import ReadOptions, read
from echo_et.converters import pytorch_et as et
from echo_et.errors import EchoError
from echo_et.ir import check_job, pb

PARAM = "traces/param/et_replay/tests/inputs"
HTA_ET = "traces/HolisticTraceAnalysis/tests/data/execution_trace"
ROOT = "[pytorch|profiler|execution_"


def raw(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def et_ops(path: Path) -> dict[int, dict]:
    return {n["id"]: n for n in raw(path)["nodes"] if not n["name"].startswith(ROOT)}


def rf_of(n: dict) -> int:
    if isinstance(n.get("attrs"), list):
        return next(a["value"] for a in n["attrs"] if a["name"] == "rf_id")
    return n["rf_id"]


def kineto_cpu_events(path: Path) -> list[dict]:
    return [e for e in raw(path)["traceEvents"] if e.get("ph") == "X"
            and e.get("cat") in ("cpu_op", "user_annotation")]


def linked(graph) -> list[pb.Node]:
    return [n for n in graph.nodes if n.kind == pb.KIND_CPU_OP and "et_id" in n.attrs]


def convert(kineto_files: list[Path], host_et: list[Path]):
    return read(kineto_files, "kineto", ReadOptions(host_et=host_et))


def test_simple_add_links_by_ev_idx_plus_one():
    kin = shared_path(f"{HTA_ET}/benchmark_simple_add_trace.json.gz")
    host = shared_path(f"{HTA_ET}/benchmark_simple_add_et.json.gz")
    ops = et_ops(host)
    by_rf = {rf_of(n): n for n in ops.values()}
    events = kineto_cpu_events(kin)
    # The files' own relation: ET rf_id == Kineto "Ev Idx" + 1 for every host op.
    assert all(by_rf[e["args"]["Ev Idx"] + 1]["name"] == e["name"] for e in events)
    job = convert([kin], [host])
    assert check_job(job) == []
    m = job.manifest
    assert m.attrs["host_et_link_method"] == "0:ev_idx+1"
    assert int(m.attrs["host_et_linked"]) == len(ops) == len(events)
    assert "host_et_unlinked_et_ops" not in m.dropped
    for n in linked(job.graph_of(0)):
        assert ops[int(n.attrs["et_id"])]["name"] == n.name
        assert rf_of(ops[int(n.attrs["et_id"])]) == n.cpu.rf_id + 1


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> tuple[list[Path], list[Path]]:
    d = tmp_path_factory.mktemp("dlrm")
    unpack(shared_path(f"{PARAM}/dlrm_kineto.tar.gz"), d)
    unpack(shared_path(f"{PARAM}/dlrm_pytorch_et.tar.gz"), d)
    kin = sorted((d / "dlrm_kineto").glob("worker*.json"),
                 key=lambda p: int(p.name.split("_")[0].removeprefix("worker")))
    return kin, sorted((d / "dlrm_pytorch_et").glob("dlrm_eg_*.json"))


def test_dlrm_links_by_sequence_and_sizes_agree(dlrm):
    kin, hosts = dlrm
    job = convert(kin, [hosts[0].parent])
    assert check_job(job) == []
    m = job.manifest
    assert set(m.attrs["host_et_link_method"].split(",")) == {f"{r}:sequence" for r in range(8)}
    total = 0
    for rank, host in enumerate(hosts):
        ops = et_ops(host)
        g = job.graph_of(rank)
        nodes = linked(g)
        total += len(nodes)
        assert len(nodes) >= 0.99 * len(ops)          # nearly every host op found its twin
        seen = set()
        for n in nodes:
            op = ops[int(n.attrs["et_id"])]
            assert op["name"] == n.name and op["id"] not in seen
            seen.add(op["id"])
            want = [str(v[0]) for v, t in zip(op["inputs"], op["input_types"], strict=False)
                    if t.startswith("Tensor(")]
            if want:
                assert set(want) <= set(n.attrs["et_in_tensors"].split(","))
        # Two independent records of each collective agree: Kineto's bytes and the host
        # trace's record_param_comms input tensor bytes.
        colls = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
        assert len(colls) == 8
        for c in colls:
            rpc = ops[int(c.attrs["et_id"])]
            assert rpc["name"] == "record_param_comms"
            t = rpc["inputs"][0]
            t = t[0] if isinstance(t[0], list) else t
            assert c.collective.in_bytes == t[3] * t[4]
    assert int(m.attrs["host_et_linked"]) == total
    assert m.dropped["host_et_linked_by_sequence"] == total


def test_linear_sequence_links_every_host_op():
    kin = shared_path(f"{PARAM}/linear_kineto.json.gz")
    host = shared_path(f"{PARAM}/linear_et.json.gz")
    ops = et_ops(host)
    job = convert([kin], [host])
    nodes = linked(job.graph_of(0))
    assert len(nodes) == len(ops)
    assert all(ops[int(n.attrs["et_id"])]["name"] == n.name for n in nodes)
    assert job.manifest.dropped["host_et_unlinked_cpu_ops"] == \
        sum(1 for n in job.graph_of(0).nodes if n.kind == pb.KIND_CPU_OP) - len(ops)


def test_fixture_links_by_record_function_id():
    d = FIXTURES / "traces" / "cpu_single"
    kin, host = d / "rank0.kineto.json.gz", d / "rank0.et.json.gz"
    ops = et_ops(host)
    job = convert([kin], [d])
    assert job.manifest.attrs["host_et_link_method"] == "0:record_function_id"
    cpu = [n for n in job.graph_of(0).nodes if n.kind == pb.KIND_CPU_OP]
    assert cpu and all("et_id" in n.attrs for n in cpu)
    by_rf = {e["args"]["Record function id"]: e for e in kineto_cpu_events(kin)}
    for n in cpu:
        op = ops[int(n.attrs["et_id"])]
        assert op["name"] == n.name == by_rf[rf_of(op)]["name"]
    assert "host_et_unlinked_cpu_ops" not in job.manifest.dropped


def test_ddp_fixture_pairs_ranks_by_file_name_and_fills_groups():
    d = FIXTURES / "traces" / "ddp_gloo4"
    kin = sorted(d.glob("rank*.kineto.json.gz"))
    hosts = sorted(d.glob("rank*.et.json.gz"))
    plain = read(kin, "kineto", ReadOptions())
    job = convert(kin, hosts[::-1])              # order of --host-et does not matter
    assert check_job(job) == check_job(plain)     # linking adds no problem of its own
    for rank, host in enumerate(hosts):
        ops = et_ops(host)
        cpu = linked(job.graph_of(rank))
        # Every host op but the group-definition record, which Kineto does not show.
        assert len(cpu) == sum(1 for op in ops.values() if op["name"] != "## process_group:init ##")
        for n in cpu:
            assert ops[int(n.attrs["et_id"])]["name"] == n.name
        comm = {n.kind: ops[int(n.attrs["et_id"])]["name"] for n in job.graph_of(rank).nodes
                if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND)}
        assert comm == {pb.KIND_COLLECTIVE: "c10d::allreduce_", pb.KIND_SEND: "c10d::send"}
    init = next(n for n in raw(hosts[0])["nodes"] if n["name"] == "## process_group:init ##")
    pg = json.loads(init["inputs"]["values"][0])[0]
    g = next(g for g in job.manifest.groups if g.name == pg["pg_name"])
    assert g.desc == pg["pg_desc"] and len(g.ranks) == pg["group_size"]


def test_link_returns_a_new_job():
    d = FIXTURES / "traces" / "cpu_single"
    job = read([d / "rank0.kineto.json.gz"], "kineto", ReadOptions())
    before = [n.SerializeToString(deterministic=True) for n in job.graph_of(0).nodes]
    m_before = job.manifest.SerializeToString(deterministic=True)
    out = et.link(job, [d / "rank0.et.json.gz"])
    assert out is not job and linked(out.graph_of(0))
    assert [n.SerializeToString(deterministic=True) for n in job.graph_of(0).nodes] == before
    assert job.manifest.SerializeToString(deterministic=True) == m_before


def test_pairing_errors(tmp_path):
    d = FIXTURES / "traces" / "ddp_gloo4"
    job = read(sorted(d.glob("rank*.kineto.json.gz")), "kineto", ReadOptions())
    anon = tmp_path / "host.json.gz"
    anon.write_bytes((d / "rank2.et.json.gz").read_bytes())
    # gloo traces record no record_param_comms: nothing in the file tells its rank.
    with pytest.raises(EchoError, match="cannot tell which of ranks"):
        et.link(job, [anon])
    bad = tmp_path / "rank1.json"
    bad.write_text('{"schema": "1.1.1-chakra.0.0.4", "nodes": [')
    with pytest.raises(EchoError, match=str(bad)):
        et.link(job, [bad])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(EchoError, match="no host execution trace"):
        et.link(job, [empty])


def test_cli_convert_with_host_et(tmp_path):
    from typer.testing import CliRunner

    from echo_et.cli.main import app

    d = FIXTURES / "traces" / "fake_pg64"
    out = tmp_path / "job"
    r = CliRunner().invoke(app, ["convert", str(d / "rank0.kineto.json.gz"),
                                 "--host-et", str(d), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["source_format"] == "kineto" and s["collectives"]
    assert "host_et_unlinked_cpu_ops" not in s["dropped"]
    r = CliRunner().invoke(app, ["convert", str(d / "rank0.kineto.json.gz"), "--host-et",
                                 str(tmp_path / "missing"), "-o", str(tmp_path / "j2")])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "j2").exists()


def test_link_fills_what_kineto_lacks():
    """Blank a Kineto collective's size and dtype: linking restores them from the host trace."""
    d = FIXTURES / "traces" / "fake_pg64"
    job = read([d / "rank0.kineto.json.gz"], "kineto", ReadOptions())
    stripped = job.copy()
    for n in stripped.graph_of(0).nodes:
        if n.kind == pb.KIND_COLLECTIVE:
            n.collective.in_bytes = n.collective.out_bytes = 0
            n.collective.dtype = ""
    out = et.link(stripped, [d / "rank0.et.json.gz"])
    ops = et_ops(d / "rank0.et.json.gz")
    got = [n for n in out.graph_of(0).nodes if n.kind == pb.KIND_COLLECTIVE]
    assert got and out.manifest.dropped["host_et_comm_filled"] == len(got)
    for n in got:
        op = ops[int(n.attrs["et_id"])]
        vals, types = op["inputs"]["values"], op["inputs"]["types"]
        names = op["attrs"]
        schema = next(a["value"] for a in names if a["name"] == "op_schema")
        # The c10d op's own schema says which argument is the input buffer.
        args = [a.strip().split(" ")[-1] for a in schema.split("(", 1)[1].split(")")[0].split(",")]
        k = next(i for i, a in enumerate(args)
                 if a in ("input", "tensors", "input_tensor", "input_tensors"))
        t = vals[k][0] if isinstance(vals[k][0], list) else vals[k]
        assert n.collective.in_bytes == t[3] * t[4]
        assert n.collective.dtype == "Float" and types[k].endswith("(float)") or \
            types[k].endswith("(float)]")
