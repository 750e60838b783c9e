"""The Chakra reader reads a file in two passes (ids, deps and kinds into flat arrays, then
each node decoded again when it is emitted) instead of holding every decoded message.

These tests hold it to a straightforward reference written here: decode every message of
the file (with the test helpers' own framing), order the nodes the way docs/chakra.md
says, and compare node ids, names, dependencies and the counts in ``dropped``, on random
files, plain and gzip. They also check the framing against ``echo_et.ir.io``, fetching
nodes back in any order, and which error a file with several faults reports.
"""

from __future__ import annotations

import gzip
import io
import random
from pathlib import Path

import numpy as np
import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from chakra_et import decode, encode, frame, node, write_et
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_et.converters import ReadOptions
from echo_et.converters import chakra as chakra_conv
from echo_et.converters.chakra import order, wire
from echo_et.errors import EchoError
from echo_et.ir import check_job, pb
from echo_et.ir.io import iter_delimited

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

DANGLING = 10**6  # ids from here on name no node


def random_rank(rng: random.Random) -> list[et.Node]:
    """Nodes whose data deps follow a hidden order (so there is no cycle), with ids that may
    be sparse, deps that point forward, repeated deps, ctrl deps that contradict the data
    order or name no node, and the file in id order or shuffled."""
    count = rng.randint(0, 30)
    ids = rng.sample(range(1, 4 * count + 3), count) if rng.random() < 0.5 else list(range(1, count + 1))
    hidden = sorted(ids)
    if rng.random() < 0.6:
        rng.shuffle(hidden)
    nodes = []
    for pos, i in enumerate(hidden):
        data = [hidden[rng.randrange(pos)] for _ in range(rng.randint(0, 3))] if pos else []
        ctrl = []
        for _ in range(rng.randint(0, 3)):
            r = rng.random()
            if r < 0.4 and pos:
                ctrl.append(hidden[rng.randrange(pos)])
            elif r < 0.7:
                ctrl.append(rng.choice(ids))           # may contradict the data order
            elif r < 0.85:
                ctrl.append(DANGLING + rng.randrange(5))
        nodes.append(node(i, f"n{i}", et.COMP_NODE, data=data, ctrl=ctrl, dur=rng.randint(0, 9),
                          is_cpu_op=("bool_val", rng.random() < 0.5)))
    if rng.random() < 0.5:
        nodes.sort(key=lambda n: n.id)
    return nodes


def reference(nodes: list[et.Node]) -> tuple[list[tuple], dict[str, int]]:
    """What the reader must produce, computed the plain way: per emitted node (id, name,
    deps, chakra_id attr), and the ordering's counts in ``dropped``."""
    ids = {n.id for n in nodes}
    data = {n.id: list(dict.fromkeys(n.data_deps)) for n in nodes}
    ctrl = {n.id: [d for d in dict.fromkeys(n.ctrl_deps) if d in ids] for n in nodes}
    dropped = {"chakra: ctrl_deps naming no node dropped":
               sum(d not in ids for n in nodes for d in n.ctrl_deps)}
    given_up: dict[int, set[int]] = {}
    if all(d < i for i in ids for d in data[i] + ctrl[i]):
        seq = sorted(ids)
        new = {i: i for i in ids}
    else:
        # Ascending id among the nodes whose deps are all placed; when only ctrl deps stand
        # in the way, the smallest node whose data deps are placed, giving up the rest.
        placed: set[int] = set()
        seq = []
        while len(seq) < len(ids):
            ready = [i for i in sorted(ids) if i not in placed and set(data[i]) <= placed]
            free = [i for i in ready if set(ctrl[i]) <= placed]
            i = (free or ready)[0]
            if not free:
                given_up[i] = set(ctrl[i]) - placed
            placed.add(i)
            seq.append(i)
        new = {old: k + 1 for k, old in enumerate(seq)}
        dropped["chakra: ctrl_deps contradicting data_deps dropped"] = sum(map(len, given_up.values()))
        dropped["chakra: node ids not in dependency order, renumbered"] = len(ids)
    changed = any(new[i] != i for i in ids)
    name = {n.id: n.name for n in nodes}
    rows = []
    for old in seq:
        deps = [(new[d], pb.DEP_DATA) for d in data[old]]
        deps += [(new[d], pb.DEP_CONTROL) for d in ctrl[old] if d not in given_up.get(old, ())]
        rows.append((new[old], name[old], deps, str(old) if changed else None))
    return rows, {k: v for k, v in dropped.items() if v}


ORDER_REASONS = ("chakra: ctrl_deps naming no node dropped",
                 "chakra: ctrl_deps contradicting data_deps dropped",
                 "chakra: node ids not in dependency order, renumbered")


@FAST
@given(seed=st.integers(0, 2**32 - 1), zipped=st.booleans())
def test_reader_matches_the_plain_reference(tmp_path, seed, zipped):
    rng = random.Random(seed)
    raw = encode(random_rank(rng))
    f = tmp_path / "r.et"
    f.write_bytes(gzip.compress(raw) if zipped else raw)
    _, nodes = decode(f)
    want_rows, want_dropped = reference(nodes)
    job = chakra_conv.read([f], ReadOptions())
    got = [(n.id, n.name, [(d.id, d.kind) for d in n.deps], n.attrs.get("chakra_id"))
           for n in job.graph_of(0).nodes]
    assert got == want_rows
    dropped = {k: v for k, v in job.manifest.dropped.items() if k in ORDER_REASONS}
    assert dropped == want_dropped
    assert check_job(job) == []


def test_reference_sees_the_documented_cases(tmp_path):
    """The reference itself, on the cases docs/chakra.md spells out."""
    nodes = [node(10, "n10", et.COMP_NODE, data=[30], ctrl=[20, 99]),
             node(20, "n20", et.COMP_NODE, ctrl=[30]),       # contradicts 30's data dep on 20
             node(30, "n30", et.COMP_NODE, data=[20])]
    rows, dropped = reference(nodes)
    assert [r[0:2] for r in rows] == [(1, "n20"), (2, "n30"), (3, "n10")]
    assert rows[0][2] == [] and rows[2][2] == [(2, pb.DEP_DATA), (1, pb.DEP_CONTROL)]
    assert dropped == {ORDER_REASONS[0]: 1, ORDER_REASONS[1]: 1, ORDER_REASONS[2]: 3}
    f = write_et(tmp_path / "d.et", nodes)
    job = chakra_conv.read([f], ReadOptions())
    assert [(n.id, n.name, [(d.id, d.kind) for d in n.deps], n.attrs.get("chakra_id"))
            for n in job.graph_of(0).nodes] == rows


# -- framing -------------------------------------------------------------------------------
def _delimited(data: bytes):
    """Payloads (or the error) of ``data`` by echo_et.ir.io, the framing every reader shares."""
    out = []
    try:
        out.extend(iter_delimited(io.BytesIO(data)))
    except EchoError as e:
        return out, str(e)
    return out, None


def _frames(data: bytes):
    out = []
    try:
        for offset, payload in wire.iter_frames(io.BytesIO(data)):
            assert data[offset:offset + len(payload)] == payload
            out.append(payload)
    except EchoError as e:
        return out, str(e)
    return out, None


@FAST
@given(payloads=st.lists(st.binary(max_size=300), max_size=8), tail=st.binary(max_size=12),
       cut=st.integers(0, 64), chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 20]))
def test_framing_matches_ir_io(monkeypatch, payloads, tail, cut, chunk):
    """Same messages and the same error as echo_et.ir.io on any stream: whole, cut short,
    or followed by garbage, whatever the read size."""
    monkeypatch.setattr(wire, "_CHUNK", chunk)
    data = frame(*payloads) + tail
    data = data[:max(len(data) - cut, 0)]
    assert _frames(data) == _delimited(data)


def test_framing_refuses_what_ir_io_refuses(monkeypatch):
    monkeypatch.setattr(wire, "_CHUNK", 4)
    for data in (b"\xff" * 12, b"\x80\x80", b"\xff\xff\xff\xff\x7f", frame(b"abc")[:-1]):
        got = _frames(data)
        assert got == _delimited(data) and got[1] is not None


# -- fetching nodes back -------------------------------------------------------------------
def _scanned(path: Path):
    it = wire.scan_nodes(path)
    next(it)
    found = list(it)
    return [o for o, _, _ in found], [s for _, s, _ in found], [n.id for _, _, n in found]


@pytest.mark.parametrize("zipped", [False, True])
def test_nodes_come_back_in_any_order(tmp_path, zipped):
    nodes = [node(i, "x" * (i % 200), et.COMP_NODE, data=[i - 1] if i > 1 else []) for i in range(1, 400)]
    raw = encode(nodes)
    f = tmp_path / "n.et"
    f.write_bytes(gzip.compress(raw) if zipped else raw)
    offsets, sizes, ids = _scanned(f)
    want = random.Random(3).sample(range(len(nodes)), len(nodes)) + [0, 5, 5]
    with wire.NodeFrames(f, offsets, sizes) as frames:
        for i in want:
            assert frames.node(i, ids[i]) == nodes[i]


def test_a_file_changed_between_the_passes_is_refused(tmp_path):
    f = write_et(tmp_path / "c.et", [node(1, "a", et.COMP_NODE), node(2, "b", et.COMP_NODE)])
    offsets, sizes, ids = _scanned(f)
    write_et(f, [node(7, "a", et.COMP_NODE), node(8, "b", et.COMP_NODE)])
    with wire.NodeFrames(f, offsets, sizes) as frames, pytest.raises(EchoError, match="changed while being read"):
        frames.node(1, ids[1])
    f.write_bytes(b"")
    with wire.NodeFrames(f, offsets, sizes) as frames, pytest.raises(EchoError, match="changed while being read"):
        frames.node(0, ids[0])
    f.unlink()
    with pytest.raises(EchoError, match="c.et: cannot read it again"), wire.NodeFrames(f, offsets, sizes):
        pass


# -- which error a file with several faults reports ---------------------------------------
def _error(path: Path) -> str:
    with pytest.raises(EchoError) as e:
        chakra_conv.read([path], ReadOptions())
    return str(e.value)


def test_a_duplicate_id_before_a_broken_message_is_reported_first(tmp_path):
    f = write_et(tmp_path / "d.et", [node(1, "a", et.COMP_NODE), node(2, "b", et.COMP_NODE),
                                     node(1, "c", et.COMP_NODE), node(3, "d" * 60, et.COMP_NODE)])
    f.write_bytes(f.read_bytes()[:-20])
    assert "node 1 (c): node id 1 is used twice (nodes #0 and #2)" in _error(f)


def test_a_node_kind_that_does_not_read_is_reported_before_emitting(tmp_path):
    """Every node's kind is read before any node is converted: node 5's bad echo.kind is
    reported although node 1, first in program order, has a fault of its own."""
    f = write_et(tmp_path / "k.et", [
        node(5, "late", et.COMP_NODE, data=[1], **{"echo.kind": ("string_val", "bogus")}),
        node(1, "early", et.COMP_NODE, is_cpu_op=("bool_val", False), num_ops=("string_val", "x")),
    ])
    assert "node 5 (late): unknown echo.kind 'bogus'" in _error(f)
    f = write_et(tmp_path / "k.et", [
        node(1, "early", et.COMP_NODE, num_ops=("string_val", "x")),
        node(5, "late", et.COMP_NODE, data=[1], stream=("string_val", "s")),
    ])
    assert "node 5 (late): attribute stream holds string_val" in _error(f)


def test_kind_faults_come_after_ordering_faults_and_in_program_order(tmp_path):
    # Program order is a (2), b (9), c (3): c waits for b. Both b and c have an unreadable
    # is_cpu_op; b, first in program order (not in the file, not by id), is reported.
    f = write_et(tmp_path / "o.et", [
        node(3, "c", et.COMP_NODE, data=[9], is_cpu_op=("string_val", "no")),
        node(9, "b", et.COMP_NODE, is_cpu_op=("string_val", "yes")),
        node(2, "a", et.COMP_NODE),
    ])
    assert "node 9 (b): attribute is_cpu_op holds string_val" in _error(f)
    f = write_et(tmp_path / "o.et", [node(1, "a", et.COMP_NODE, is_cpu_op=("string_val", "no")),
                                     node(2, "b", et.COMP_NODE, data=[77])])
    assert "node 2 (b): data_dep on node 77" in _error(f)


# -- the ordering on arrays ----------------------------------------------------------------
@FAST
@given(ids=st.lists(st.integers(0, 12), max_size=30))
def test_first_duplicate(ids):
    seen: dict[int, int] = {}
    want = None
    for k, i in enumerate(ids):
        if i in seen:
            want = (k, seen[i])
            break
        seen[i] = k
    assert order.first_duplicate(np.array(ids, dtype=np.uint64)) == want
