"""The ASTRA-sim contract check: a clean export passes, and every rule fires on an export
broken by hand in the way that rule describes."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from test_astra_sim_support import drop_attr, read_et, set_attr, uniform_job, write_et

from echo_et.converters.astra_sim import check_export, export
from echo_et.converters.astra_sim.check import __doc__ as CHECK_DOC
from echo_et.ir.schema import pb


def _build(gb, r, s):
    k = gb.compute("k0", s["compute"], duration_ns=5_000)
    gb.collective("ar", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=1 << 20,
                  deps=[k.id])
    gb.collective("ag", s["comm"], coll_type=pb.COLL_ALL_GATHER, group="dp", in_bytes=4096)
    gb.collective("rs", s["comm"], coll_type=pb.COLL_REDUCE_SCATTER, group="dp", in_bytes=8192)
    gb.p2p(r < 2, "act", s["comm"], group="pp", peer=1 if r < 2 else 0, nbytes=2048)
    gb.compute("k1", s["compute"], duration_ns=3_000)


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:
    job = uniform_job(4, _build, groups={"world": [[0, 1, 2, 3]], "dp": [[0, 1], [2, 3]],
                                         "pp": [[0, 2], [1, 3]]})
    out = tmp_path_factory.mktemp("clean") / "out"
    export(job, out)
    return out


@pytest.fixture
def broken(clean, tmp_path) -> Path:
    dest = tmp_path / "broken"
    shutil.copytree(clean, dest)
    return dest


def _edit(folder: Path, rank: int, fn) -> None:
    path = folder / f"workload.{rank}.et"
    meta, nodes = read_et(path)
    fn(meta, nodes)
    write_et(path, meta, nodes)


def _node(nodes, name):
    return next(n for n in nodes if n.name == name)


def _rules(folder: Path) -> set[str]:
    return {i.rule for i in check_export(folder)}


def test_clean_export_passes(clean):
    assert check_export(clean) == []


def test_every_rule_is_documented_and_tested():
    documented = {line.split()[0] for line in CHECK_DOC.splitlines()
                  if line.startswith("  ") and not line.startswith("   ")}
    tested = {name[len("test_rule_"):].replace("_", "-") for name in globals()
              if name.startswith("test_rule_")}
    assert documented == tested


def test_rule_files_present(broken):
    (broken / "workload.3.et").unlink()
    issues = check_export(broken)
    assert [i.rule for i in issues] == ["files-present"]
    assert "rank 3" in issues[0].message


def test_rule_network_config(broken):
    (broken / "network.yml").write_text("topology: [ Ring ]\nnpus_count: [ 4, 2 ]\n"
                                        "bandwidth: [ 50 ]\nlatency: [ 5 ]\n")
    assert _rules(broken) == {"network-config"}
    (broken / "network.yml").write_text("topology: [ Mesh ]\nnpus_count: [ 4 ]\n"
                                        "bandwidth: [ 0 ]\nlatency: [ 5 ]\n")
    assert [i.message for i in check_export(broken)] == [
        "unknown topology 'Mesh'", "bandwidth [0.0]: must be positive"]


def test_rule_system_config(broken):
    cfg = json.loads((broken / "system.json").read_text())
    del cfg["preferred-dataset-splits"]
    (broken / "system.json").write_text(json.dumps(cfg))
    assert _rules(broken) == {"system-config"}


def test_rule_remote_memory(broken):
    (broken / "remote_memory.json").write_text("{}")
    assert _rules(broken) == {"remote-memory"}


def test_rule_comm_group(broken):
    groups = json.loads((broken / "comm_group.json").read_text())
    groups["0"] = [0, 1]
    (broken / "comm_group.json").write_text(json.dumps(groups))
    assert _rules(broken) == {"comm-group"}


def test_rule_framing(broken):
    path = broken / "workload.1.et"
    data = path.read_bytes()
    path.write_bytes(data[:-3])   # truncated last message
    assert _rules(broken) == {"framing"}
    path.write_bytes(gzip.compress(data))
    assert "gzip" in check_export(broken)[0].message


def test_rule_metadata_first(broken):
    _edit(broken, 0, lambda meta, nodes: meta.ClearField("version"))
    assert _rules(broken) == {"metadata-first"}


def test_rule_node_decode(broken):
    path = broken / "workload.2.et"
    path.write_bytes(path.read_bytes() + b"\x00")   # a zero-length message
    assert _rules(broken) == {"node-decode"}


def test_rule_has_nodes(broken):
    path = broken / "workload.2.et"
    meta, _ = read_et(path)
    write_et(path, meta, [])
    assert "has-nodes" in _rules(broken)


def test_rule_unique_ids(broken):
    _edit(broken, 0, lambda meta, nodes: setattr(_node(nodes, "k1"), "id", _node(nodes, "k0").id))
    assert "unique-ids" in _rules(broken)


def test_rule_ctrl_deps_empty(broken):
    _edit(broken, 0, lambda meta, nodes: _node(nodes, "k1").ctrl_deps.append(_node(nodes, "k0").id))
    assert _rules(broken) == {"ctrl-deps-empty"}


def test_rule_dep_exists(broken):
    _edit(broken, 1, lambda meta, nodes: _node(nodes, "k1").data_deps.append(999))
    assert _rules(broken) == {"dep-exists"}


def test_rule_acyclic(broken):
    def cycle(meta, nodes):
        _node(nodes, "k0").data_deps.append(_node(nodes, "k1").id)
    _edit(broken, 1, cycle)
    assert _rules(broken) == {"acyclic"}


def test_rule_node_type(broken):
    _edit(broken, 3, lambda meta, nodes: setattr(_node(nodes, "k1"), "type", et.METADATA_NODE))
    assert _rules(broken) == {"node-type"}


def test_rule_is_cpu_op(broken):
    _edit(broken, 0, lambda meta, nodes: drop_attr(_node(nodes, "k1"), "is_cpu_op"))
    assert _rules(broken) == {"is-cpu-op"}
    # A CPU compute node is fine (host time); a communication node on the CPU is not.
    _edit(broken, 0, lambda meta, nodes: set_attr(_node(nodes, "k1"), "is_cpu_op", bool_val=True))
    assert check_export(broken) == []
    _edit(broken, 0, lambda meta, nodes: set_attr(_node(nodes, "ar"), "is_cpu_op", bool_val=True))
    assert _rules(broken) == {"is-cpu-op"}
    assert "Comm node should not be on CPU" in check_export(broken)[0].message


def test_rule_attr_type(broken):
    # comm_size as uint64: the legacy reader reads int64_val and sees 0 (ASTRA-sim #224).
    for r in range(4):
        _edit(broken, r, lambda meta, nodes: set_attr(_node(nodes, "ar"), "comm_size",
                                                       uint64_val=1 << 20))
    assert _rules(broken) == {"attr-type"}


def test_rule_comp_duration(broken):
    # duration_micros 0 runs as 1 ns; with roofline on, a GPU node needs num_ops/tensor_size.
    _edit(broken, 2, lambda meta, nodes: _node(nodes, "k1").ClearField("duration_micros"))
    assert check_export(broken) == []
    system = json.loads((broken / "system.json").read_text())
    (broken / "system.json").write_text(json.dumps({**system, "roofline-enabled": 1, "peak-perf": 900}))
    assert _rules(broken) == {"comp-duration"}


def test_rule_collective_deadlock(tmp_path):
    def build(gb, r, s):
        if r == 2:
            gb.compute("idle", s["compute"], duration_ns=1000)
            return
        first, second = ("x", "y") if r == 0 else ("y", "x")
        a = gb.collective(first, s["comm"], coll_type=pb.COLL_ALL_REDUCE, group=first, in_bytes=4096)
        gb.collective(second, s["comm"], coll_type=pb.COLL_ALL_REDUCE, group=second, in_bytes=4096,
                      deps=[a.id])

    # Two groups of the same two ranks, used in opposite orders by the two.
    job = uniform_job(3, build, groups={"x": [[0, 1]], "y": [[0, 1]]})
    with pytest.raises(Exception, match="collective-deadlock"):
        export(job, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_rule_start_offsets(broken):
    (broken / "start_offsets.json").write_text(json.dumps({"start_offset_us": [0, -3, 0, 0]}))
    assert _rules(broken) == {"start-offsets"}
    (broken / "start_offsets.json").write_text(json.dumps({"start_offset_us": [0, 0]}))
    assert _rules(broken) == {"start-offsets"}


def test_rule_coll_type(broken):
    for r in range(4):
        _edit(broken, r, lambda meta, nodes: set_attr(_node(nodes, "ar"), "comm_type",
                                                       int64_val=et.BROADCAST))
    assert _rules(broken) == {"coll-type"}


def test_rule_comm_size(broken):
    for r in range(4):
        _edit(broken, r, lambda meta, nodes: set_attr(_node(nodes, "ar"), "comm_size", int64_val=2))
    issues = check_export(broken)
    assert {i.rule for i in issues} == {"comm-size"}
    assert "below preferred-dataset-splits 4" in issues[0].message


def test_rule_pg_name(broken):
    _edit(broken, 0, lambda meta, nodes: set_attr(_node(nodes, "ag"), "pg_name", string_val="77"))
    assert "pg-name" in _rules(broken)
    groups = json.loads((broken / "comm_group.json").read_text())
    other = next(k for k, v in groups.items() if 3 not in v and len(v) == 2 and v != [1, 3])
    broken2 = broken.parent / "b2"
    shutil.copytree(broken, broken2)
    _edit(broken2, 0, lambda meta, nodes: None)
    _edit(broken2, 3, lambda meta, nodes: set_attr(_node(nodes, "ag"), "pg_name", string_val=other))
    assert any(i.rule == "pg-name" and "rank 3 is not a member" in i.message
               for i in check_export(broken2))


def test_rule_collective_order(broken):
    def unchain(meta, nodes):
        rs, ag = _node(nodes, "rs"), _node(nodes, "ag")
        keep = [d for d in rs.data_deps if d != ag.id]
        del rs.data_deps[:]
        rs.data_deps.extend(keep)
    _edit(broken, 0, unchain)
    assert _rules(broken) == {"collective-order"}


def test_rule_collective_sequence(broken):
    _edit(broken, 3, lambda meta, nodes: set_attr(_node(nodes, "rs"), "comm_size", int64_val=4096))
    issues = check_export(broken)
    assert {i.rule for i in issues} == {"collective-sequence"}
    assert "REDUCE_SCATTER of 4096 B, rank 2 issues REDUCE_SCATTER of 8192 B" in issues[0].message


def test_rule_p2p_attrs(broken):
    _edit(broken, 0, lambda meta, nodes: drop_attr(_node(nodes, "act"), "comm_tag"))
    rules = _rules(broken)
    assert "p2p-attrs" in rules


def test_rule_p2p_match(broken):
    _edit(broken, 2, lambda meta, nodes: set_attr(_node(nodes, "act"), "comm_size", int64_val=1024))
    issues = check_export(broken)
    assert {i.rule for i in issues} == {"p2p-match"}
    assert any("from rank 0 to rank 2" in i.message for i in issues)


def test_rule_world_numbering(tmp_path):
    # Ranks 0 and 1 run a collective on their pair, then one on the world (no pg_name);
    # rank 2 only the world one: ASTRA-sim's world counter differs, every rank hangs.
    def build(gb, r, s):
        prev = []
        if r < 2:
            prev = [gb.collective("pair", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="pair",
                                  in_bytes=4096).id]
        gb.collective("all", s["comm"], coll_type=pb.COLL_ALL_REDUCE, group="world", in_bytes=4096, deps=prev)

    job = uniform_job(3, build, groups={"world": [[0, 1, 2]], "pair": [[0, 1], [2]]})
    out = tmp_path / "out"
    export(job, out)
    # The export gives the world an explicit group, so it passes ...
    assert check_export(out) == []
    assert json.loads((out / "comm_group.json").read_text()).keys() >= {"1"}
    # ... and written as the implicit world, the same nodes break the rule.
    for r in range(3):
        _edit(out, r, lambda meta, nodes: drop_attr(_node(nodes, "all"), "pg_name"))
    assert _rules(out) == {"world-numbering"}
