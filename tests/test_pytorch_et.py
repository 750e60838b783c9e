"""Host execution trace reader on real traces: facts computed here from the raw JSON."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, shared_path, unpack
from echo_et.converters import ReadOptions
from echo_et.converters import pytorch_et as et
from echo_et.errors import EchoError
from echo_et.ir import check_job, pb
from echo_et.ir.schema import collective_name

PARAM = "traces/param/et_replay/tests/inputs"
DTYPE_BYTES = {"Float": 4, "Long": 8, "Int": 4}


def raw(path: Path) -> dict:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def attrs(node: dict) -> dict:
    """A raw node's attributes whatever its schema (1.0.1 flat or the ``attrs`` list)."""
    if isinstance(node.get("attrs"), list):
        return {a["name"]: a["value"] for a in node["attrs"]}
    return node


def tensor_bytes(value) -> int:
    """Bytes of every [id, storage, offset, numel, elem_bytes, device] tensor inside value."""
    if isinstance(value, list) and len(value) == 6 and isinstance(value[5], str) \
            and all(isinstance(x, int) for x in value[:5]):
        return value[3] * value[4]
    if isinstance(value, list):
        return sum(tensor_bytes(v) for v in value)
    return 0


def roots(nodes: list[dict]) -> int:
    return sum(1 for n in nodes if n["name"].startswith("[pytorch|profiler|execution_"))


def step_numbers(nodes: list[dict]) -> list[int]:
    return sorted(int(n["name"].split("#")[1]) for n in nodes
                  if n["name"].startswith("ProfilerStep#"))


def colls(graph) -> list[pb.Node]:
    return [n for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE]


def read(*paths: Path, **kw):
    return et.read(list(paths), ReadOptions(**kw))


# -- real inputs --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> list[Path]:
    d = unpack(shared_path(f"{PARAM}/dlrm_pytorch_et.tar.gz"), tmp_path_factory.mktemp("dlrm"))
    return sorted((d / "dlrm_pytorch_et").glob("dlrm_eg_*.json"))


def test_dlrm_eight_ranks_collectives_from_the_files(dlrm):
    assert len(dlrm) == 8
    job = read(*dlrm)
    assert check_job(job) == []
    assert job.world_size == 8 and job.ranks() == list(range(8))
    for path in dlrm:
        rank = int(path.stem.rsplit("_", 1)[1])
        nodes = raw(path)["nodes"]
        # The file's own record: nccl:* ops under record_param_comms, in id order.
        want = [(n["name"].split(":")[1], tensor_bytes(n["inputs"]))
                for n in sorted(nodes, key=lambda n: n["id"]) if n["name"].startswith("nccl:")]
        got = [(collective_name(n.collective.type), n.collective.in_bytes)
               for n in colls(job.graph_of(rank))]
        assert got == want
        assert Counter(t for t, _ in got) == {"all_to_all": 5, "all_reduce": 3}
        # Every host op but the process/thread pseudo roots became a CPU op node.
        cpu = [n for n in job.graph_of(rank).nodes if n.kind == pb.KIND_CPU_OP]
        assert len(cpu) == len(nodes) - roots(nodes)
    assert job.manifest.dropped["host_et_group_guessed"] == 64  # schema 1.0.1 names no group
    assert job.manifest.dropped["host_et_untimed_ops"] == sum(
        len(n) - roots(n) for n in (raw(p)["nodes"] for p in dlrm))


def test_dlrm_nesting_and_threads(dlrm):
    job = read(dlrm[0])
    g = job.graph_of(0)
    by_et = {n.attrs["et_id"]: n for n in g.nodes if n.kind == pb.KIND_CPU_OP}
    nodes = {n["id"]: n for n in raw(dlrm[0])["nodes"]}
    threads = {s.id: s.native_id for s in g.header.streams if s.kind == pb.STREAM_CPU_THREAD}
    for eid, n in nodes.items():
        node = by_et.get(str(eid))
        if node is None:
            continue
        assert threads[node.stream] == n["tid"]
        parents = [d.id for d in node.deps if d.kind == pb.DEP_CONTROL]
        if n["parent"] in nodes and str(n["parent"]) in by_et:
            assert parents == [by_et[str(n["parent"])].id]
        else:
            assert parents == []
    # Ops run in id order on each thread: node ids ascend with ET ids.
    order = [int(n.attrs["et_id"]) for n in g.nodes if n.kind == pb.KIND_CPU_OP]
    assert order == sorted(order)


def test_chakra_102_all_gather(tmp_path):
    d = unpack(shared_path("traces/chakra/tests/data/1.0.2-chakra.0.0.4.tgz"), tmp_path)
    path = d / "1.0.2-chakra.0.0.4.json"
    doc = raw(path)
    rpc = [n for n in doc["nodes"] if n["name"] == "record_param_comms"
           and "all_gather" in n["inputs"]["values"]]
    assert len(rpc) == 10
    job = read(path)
    assert check_job(job) == []
    init = next(n for n in doc["nodes"] if n["name"] == "## process_group:init ##")
    group_size = json.loads(init["inputs"]["values"][0])[0]["group_size"]
    assert job.world_size == group_size
    g = job.graph(job.graph_ids()[0])
    got = [(n.collective.type, n.collective.in_bytes, n.collective.out_bytes) for n in colls(g)]
    want = [(pb.COLL_ALL_GATHER, tensor_bytes(n["inputs"]["values"][0]),
             tensor_bytes(n["outputs"]["values"])) for n in sorted(rpc, key=lambda n: n["id"])]
    assert got == want
    assert all(o == i * group_size for _, i, o in got)  # all-gather: input is the shard


def test_resnet_110_groups_steps_and_sizes():
    path = shared_path(f"{PARAM}/1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz")
    doc = raw(path)
    nodes = sorted(doc["nodes"], key=lambda n: n["id"])
    steps = step_numbers(nodes)
    calls = [attrs(n) for n in nodes if n["name"] == "record_param_comms"
             and attrs(n)["collective_name"] != "wait"]
    per_step = len(calls) // len(steps)
    assert per_step * len(steps) == len(calls)

    def expected(chunk):
        return [(c["collective_name"].replace("allreduce", "all_reduce"),
                 c["in_msg_nelems"] * DTYPE_BYTES[c["dtype"]], c["pg_name"]) for c in chunk]

    def got(job):
        return [(collective_name(n.collective.type), n.collective.in_bytes, n.collective.group)
                for n in colls(job.graph(job.graph_ids()[0]))]

    first = read(path, step=steps[0])
    assert check_job(first) == [] and first.manifest.step == steps[0]
    assert got(first) == expected(calls[:per_step])
    job = read(path)                       # default: the last step
    assert check_job(job) == [] and job.manifest.step == steps[-1]
    assert got(job) == expected(calls[-per_step:])
    init = next(n for n in nodes if n["name"] == "## process_group:init ##")
    pg = json.loads(init["inputs"]["values"][0])[0]
    group = next(g for g in job.manifest.groups if g.name == pg["pg_name"])
    assert group.desc == pg["pg_desc"] and len(group.ranks) == pg["group_size"] == job.world_size
    # cuda:1 in the tensors; rank 1 is what its all-reduces say, the other rank is a copy.
    assert job.ranks() == [0, 1]
    assert job.manifest.dropped["host_et_rank_from_collectives"] == 1
    assert job.manifest.dropped["host_et_untraced_ranks_copied"] == 1
    b = {x.rank: x.graph for x in job.manifest.bindings}
    assert b[0] == b[1] == "rank1"
    broadcast = next(n for n in colls(job.graph("rank1")) if n.collective.type == pb.COLL_BROADCAST)
    assert broadcast.collective.root == 0
    assert broadcast.attrs["pg_desc"] == "default_pg"


@pytest.mark.parametrize("rel", [f"{PARAM}/linear_et.json.gz",
                                 "traces/HolisticTraceAnalysis/tests/data/execution_trace/"
                                 "benchmark_simple_add_et.json.gz"])
def test_small_101_traces(rel):
    path = shared_path(rel)
    doc = raw(path)
    assert doc["schema"] == "1.0.1"
    job = read(path)
    assert check_job(job) == []
    cpu = [n for n in job.graph(job.graph_ids()[0]).nodes if n.kind == pb.KIND_CPU_OP]
    ops = [n for n in doc["nodes"] if not n["name"].startswith("[pytorch|profiler|execution_")]
    assert len(cpu) == len(ops)
    assert Counter(n.name for n in cpu) == Counter(n["name"] for n in ops)
    rf = {n.attrs["et_id"]: n.cpu.rf_id for n in cpu}
    assert all(rf[str(n["id"])] == n["rf_id"] for n in ops)


def test_shapes_and_tensor_ids_from_the_file():
    path = FIXTURES / "traces" / "cpu_single" / "rank0.et.json.gz"
    doc = raw(path)
    job = read(path)
    g = job.graph(job.graph_ids()[0])
    by_et = {int(n.attrs["et_id"]): n for n in g.nodes if n.kind == pb.KIND_CPU_OP}
    addmm = [n for n in doc["nodes"] if n["name"] == "aten::addmm"]
    assert addmm
    for n in addmm:
        node = by_et.get(n["id"])
        if node is None:
            continue                          # outside the chosen step
        assert json.loads(node.cpu.shapes) == n["inputs"]["shapes"]
        assert json.loads(node.cpu.dtypes) == n["inputs"]["types"]
        want = [v[0] for v, t in zip(n["inputs"]["values"], n["inputs"]["types"], strict=False)
                if t.startswith("Tensor")]
        assert node.attrs["et_in_tensors"] == ",".join(map(str, want))


def test_step_selection_and_errors():
    path = FIXTURES / "traces" / "cpu_single" / "rank0.et.json.gz"
    doc = raw(path)
    steps = step_numbers(doc["nodes"])
    assert len(steps) >= 2
    jobs = {s: read(path, step=s) for s in steps}
    for s, job in jobs.items():
        names = [n.name for n in job.graph(job.graph_ids()[0]).nodes]
        assert f"ProfilerStep#{s}" in names
        assert not any(f"ProfilerStep#{o}" in names for o in steps if o != s)
    assert read(path).manifest.step == steps[-1]
    total = sum(len(j.graph(j.graph_ids()[0]).nodes) for j in jobs.values())
    assert total == len(doc["nodes"]) - roots(doc["nodes"])  # the steps partition the trace
    with pytest.raises(EchoError, match=r"no ProfilerStep#99 \(has"):
        read(path, step=99)


def test_deterministic(tmp_path):
    from echo_et.ir import save_job

    path = FIXTURES / "traces" / "ddp_gloo4"
    a = save_job(read(path), tmp_path / "a")
    b = save_job(read(path), tmp_path / "b")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes()


# -- sniffing and the streaming parser ------------------------------------------------------------
def test_sniff():
    fx = FIXTURES / "traces"
    assert et.sniff(fx / "cpu_single" / "rank0.et.json.gz")
    assert not et.sniff(fx / "cpu_single" / "rank0.kineto.json.gz")
    assert not et.sniff(fx / "cpu_single" / "run.json")
    assert not et.sniff(fx / "cpu_single")


def test_stream_matches_json_load(monkeypatch):
    from echo_et.converters import jsonstream as stream

    path = FIXTURES / "traces" / "ddp_gloo4" / "rank1.et.json.gz"
    doc = raw(path)
    monkeypatch.setattr(stream, "_CHUNK", 7)   # every token straddles a buffer boundary
    fields, items = {}, []
    for ev, key, value in stream.iter_document(path, "nodes"):
        if ev == "field":
            fields[key] = value
        else:
            items.append(value)
    assert items == doc["nodes"]
    assert fields == {k: v for k, v in doc.items() if k != "nodes"}


# -- bad input -------------------------------------------------------------------------------------
def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _node(i: int, name: str, parent: int, **extra) -> dict:
    return {"id": i, "name": name, "ctrl_deps": parent,
            "inputs": {"values": [], "shapes": [], "types": []},
            "outputs": {"values": [], "shapes": [], "types": []},
            "attrs": [{"name": "rf_id", "type": "uint64", "value": i},
                      {"name": "tid", "type": "uint64", "value": 1}], **extra}


def _pg_init(i: int, size: int) -> dict:
    n = _node(i, "## process_group:init ##", 1)
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "ranks": [], "group_size": size}]
    n["inputs"] = {"values": [json.dumps(pg)], "shapes": [[]], "types": ["String"]}
    return n


def _doc(nodes) -> bytes:
    return json.dumps({"schema": "1.1.1-chakra.0.0.4", "pid": 1, "nodes": nodes}).encode()


@pytest.mark.parametrize("name,data,match", [
    ("trunc.json", _doc([_node(2, "aten::mm", 1)])[:-9], "invalid JSON|expected"),
    ("garbage.json", b'{"schema": "1.0.1", "nodes": [ {"id": 1, ]}', "invalid JSON"),
    ("empty.json", b"", "empty"),
    ("plain.json.gz", _doc([_node(2, "aten::mm", 1)]), "not gzip"),
    ("corrupt.json.gz", b"\x1f\x8b\x08\x00garbage-not-deflate", "gzip"),
    ("nonodes.json", _doc([]), "no nodes"),
    ("noschema.json", json.dumps({"nodes": [_node(2, "x", 1)]}).encode(), "no top-level 'schema'"),
    ("shape.json", json.dumps({"schema": "9.9", "nodes": [{"id": 2, "name": "x"}]}).encode(),
     "unknown host ET schema"),
    ("array.json", b"[1, 2]", "expected a JSON object"),
    ("extra.json", _doc([_node(2, "x", 1)]) + b" {}", "extra data"),
])
def test_bad_input_one_error_naming_the_file(tmp_path, name, data, match):
    p = _write(tmp_path, name, data)
    with pytest.raises(EchoError, match=match) as e:
        et.read([p], ReadOptions())
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_truncated_gzip(tmp_path):
    data = (FIXTURES / "traces" / "cpu_single" / "rank0.et.json.gz").read_bytes()
    p = _write(tmp_path, "cut.json.gz", data[: len(data) // 2])
    with pytest.raises(EchoError, match="gzip|invalid JSON") as e:
        et.read([p], ReadOptions())
    assert str(p) in str(e.value)


def test_ranks_that_disagree_or_collide(tmp_path):
    a = _write(tmp_path, "rank0.json", _doc([_pg_init(2, 2), _node(3, "aten::mm", 1)]))
    b = _write(tmp_path, "rank1.json", _doc([_pg_init(2, 4), _node(3, "aten::mm", 1)]))
    with pytest.raises(EchoError, match="disagree on world size"):
        et.read([a, b], ReadOptions())
    c = _write(tmp_path, "other_rank0.json", _doc([_pg_init(2, 2), _node(3, "aten::mm", 1)]))
    with pytest.raises(EchoError, match="rank 0 is also claimed"):
        et.read([a, c], ReadOptions())
    d = _write(tmp_path, "rank5.json", _doc([_pg_init(2, 2), _node(3, "aten::mm", 1)]))
    with pytest.raises(EchoError, match="outside the world size 2"):
        et.read([a, d], ReadOptions())


def test_cli_convert_bad_and_good(tmp_path):
    from typer.testing import CliRunner

    from echo_et.cli.main import app

    bad = _write(tmp_path, "rank0.json", _doc([_node(2, "aten::mm", 1)])[:-20])
    out = tmp_path / "job"
    r = CliRunner().invoke(app, ["convert", str(bad), "-o", str(out), "--from", "pytorch_et"])
    assert r.exit_code == 2
    assert len(r.output.strip().splitlines()) == 1 and str(bad) in r.output
    assert not out.exists() and not any(p.name.startswith(".job") for p in tmp_path.iterdir())
    good = FIXTURES / "traces" / "ddp_gloo4"
    files = sorted(good.glob("rank*.et.json.gz"))
    r = CliRunner().invoke(app, ["convert", *map(str, files), "-o", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["world_size"] == len(files) and s["source_format"] == "pytorch_et"
    assert s["dropped"]["host_et_untimed_ops"] > 0


def test_rank_from_the_trace_when_the_name_has_none(dlrm, tmp_path):
    src = dlrm[3]
    anon = tmp_path / "host.json"
    anon.write_bytes(src.read_bytes())
    doc = raw(src)
    # record_param_comms values: [tensors, seq, pg, rank, name, in_splits, out_splits]
    ranks = {n["inputs"][n["input_types"].index("String") - 1] for n in doc["nodes"]
             if n["name"] == "record_param_comms" and "allreduce" in n["inputs"]}
    assert len(ranks) == 1
    job = read(anon)
    (rank,) = ranks
    assert job.manifest.dropped["host_et_rank_from_collectives"] == 1
    traced = {b.rank for b in job.manifest.bindings if b.graph == f"rank{rank}"}
    assert rank in traced and job.world_size == 8  # all_to_allv splits name 8 members
    assert check_job(job) == []


# -- robustness: whatever the bytes, an EchoError or a valid Job ---------------------------------
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12,
)


_FIXTURE_OK = [HealthCheck.function_scoped_fixture]


@settings(max_examples=60, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(doc=st.dictionaries(st.sampled_from(["schema", "pid", "x", "finish_ts"]), _json, max_size=4),
       nodes=st.lists(_json, max_size=5), chunk=st.integers(1, 64),
       indent=st.sampled_from([None, 0, 2]))
def test_stream_agrees_with_json_loads(tmp_path, monkeypatch, doc, nodes, chunk, indent):
    from echo_et.converters import jsonstream as stream

    monkeypatch.setattr(stream, "_CHUNK", chunk)
    p = tmp_path / "t.json"
    p.write_text(json.dumps({**doc, "nodes": nodes}, indent=indent))
    fields, items = {}, []
    for ev, key, value in stream.iter_document(p, "nodes"):
        (items.append(value) if ev == "item" else fields.__setitem__(key, value))
    assert items == nodes and fields == doc
    text = p.read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(EchoError):
        list(stream.iter_document(cut, "nodes"))


_NODE_FIELDS = ["id", "name", "ctrl_deps", "parent", "inputs", "outputs", "attrs", "rf_id", "tid"]


@settings(max_examples=25, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(_NODE_FIELDS), _json),
                      min_size=1, max_size=6))
def test_mutated_real_trace_never_crashes(tmp_path, edits):
    doc = raw(FIXTURES / "traces" / "fake_pg64" / "rank0.et.json.gz")
    interesting = [i for i, n in enumerate(doc["nodes"])
                   if n["name"].startswith(("c10d::", "## process", "ProfilerStep"))]
    for k, field, value in edits:
        i = interesting[k % len(interesting)] if k % 2 else k % len(doc["nodes"])
        doc["nodes"][i][field] = value
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    try:
        job = et.read([p], ReadOptions())
    except EchoError as e:
        assert "\n" not in str(e)
        return
    assert check_job(job) == []
