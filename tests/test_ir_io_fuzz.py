"""Property tests for the graph reader: whatever bytes a file holds (random, truncated,
mutated, gzipped), reading it gives a graph or one EchoError, never another exception."""

from __future__ import annotations

import gzip

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, check_job, load_job, pb, read_graph, save_job, write_graph
from echo_et.ir.io import MANIFEST_NAME

FAST = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def valid_graph_bytes(tmp) -> bytes:
    b = GraphBuilder("g")
    s = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    prev = []
    for i in range(6):
        n = b.collective(f"c{i}", s, coll_type=pb.COLL_ALL_REDUCE, group="0", in_bytes=64 << i, deps=prev)
        n.attrs["k"] = "v" * i
        prev = [n.id]
    b.declare_group("0", 1)
    write_graph(b.build(), tmp / "valid.graph")
    return (tmp / "valid.graph").read_bytes()


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> bytes:
    return valid_graph_bytes(tmp_path_factory.mktemp("v"))


def read_or_echo_error(path):
    try:
        return read_graph(path)
    except EchoError as e:
        assert "\n" not in str(e) and str(e).startswith(str(path))
        return None


@FAST
@given(data=st.binary(max_size=600), zipped=st.booleans())
def test_random_bytes(tmp_path, data, zipped):
    p = tmp_path / "r.graph"
    p.write_bytes(gzip.compress(data) if zipped else data)
    read_or_echo_error(p)


@FAST
@given(data=st.data())
def test_truncated_and_mutated(tmp_path, valid, data):
    raw = bytearray(valid)
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=6))
    for pos, val in flips:
        raw[pos] = val
    mutated = bytes(raw[:cut]) + data.draw(st.binary(max_size=20))
    p = tmp_path / "m.graph"
    p.write_bytes(mutated)
    g = read_or_echo_error(p)
    if g is not None:
        # Whatever decoded is a graph the checker can judge without crashing.
        from echo_et.ir import check_graph

        check_graph(g)


@FAST
@given(data=st.data())
def test_mutated_job_directory(tmp_path, data):
    jb = JobBuilder("j", 1)
    gid = jb.group([0], name="0")
    b = GraphBuilder("g")
    s = b.stream(pb.STREAM_GPU_COMPUTE, "gpu")
    b.compute("k", s, duration_ns=5)
    b.declare_group("0", 1)
    jb.add_graph(b.build())
    jb.bind(0, "g", {"0": gid})
    root = tmp_path / "job"
    save_job(jb.build(), root)
    target = root / (MANIFEST_NAME if data.draw(st.booleans()) else "graphs/g.graph")
    raw = bytearray(target.read_bytes())
    for pos, val in data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)),
                                       min_size=1, max_size=4)):
        raw[pos] = val
    target.write_bytes(bytes(raw[: data.draw(st.integers(0, len(raw)))]))
    try:
        check_job(load_job(root))
    except EchoError as e:
        assert "\n" not in str(e)
