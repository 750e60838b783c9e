"""Graph files and Job directories: streaming, gzip, round trips, determinism, atomicity,
and one-line errors for files that are not what they claim."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, check_job, iter_graph, load_job, pb, read_graph, save_job, write_graph
from echo_et.ir import io as ir_io
from echo_et.ir.io import MANIFEST_NAME, encode_varint


def small_graph(gid: str = "g", n: int = 20):
    b = GraphBuilder(gid, "a graph")
    s = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0, native_id=7)
    c = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    prev = []
    for i in range(n):
        node = b.compute(f"k{i}", s, duration_ns=1000 + i, start_ns=10 * i, deps=prev, flops=1e6 * i)
        node.attrs["i"] = str(i)
        prev = [node.id]
    b.collective("ar", c, coll_type=pb.COLL_ALL_REDUCE, group="0", in_bytes=4096, deps=prev)
    b.declare_group("0", 2)
    return b.build()


def small_job():
    jb = JobBuilder("io", 2, source_format="test")
    gid = jb.group([0, 1], name="0", role="world")
    g = small_graph("shared")
    jb.add_graph(g)
    jb.bind(0, "shared", {"0": gid}, measured_step_ns=123)
    jb.bind(1, "shared", {"0": gid})
    jb.drop("test reason", 3)
    return jb.build()


def serialized(graph) -> list[bytes]:
    return [graph.header.SerializeToString(deterministic=True)] + [
        n.SerializeToString(deterministic=True) for n in graph.nodes]


# -- graph files ----------------------------------------------------------------------------
def test_graph_round_trip(tmp_path):
    g = small_graph()
    write_graph(g, tmp_path / "g.graph")
    back = read_graph(tmp_path / "g.graph")
    assert serialized(back) == serialized(g)
    assert back.content_hash() == g.content_hash()


def test_graph_file_streams_node_by_node(tmp_path):
    g = small_graph(n=50)
    path = tmp_path / "g.graph"
    write_graph(g, path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])   # cut in the middle of the nodes
    it = iter_graph(path)
    header = next(it)
    assert isinstance(header, pb.GraphHeader) and header.id == "g"
    got = []
    with pytest.raises(EchoError, match=r"g\.graph: truncated"):
        for n in it:
            got.append(n)
    # The nodes before the cut arrived before the error: the reader did not load it whole.
    assert 0 < len(got) < len(g.nodes)
    assert [n.name for n in got] == [n.name for n in g.nodes[: len(got)]]


def test_gzip_accepted_on_read(tmp_path):
    g = small_graph()
    write_graph(g, tmp_path / "g.graph")
    (tmp_path / "g.graph.gz").write_bytes(gzip.compress((tmp_path / "g.graph").read_bytes()))
    assert serialized(read_graph(tmp_path / "g.graph.gz")) == serialized(g)


def test_graph_file_is_length_delimited_protobuf(tmp_path):
    g = small_graph(n=3)
    write_graph(g, tmp_path / "g.graph")
    data = (tmp_path / "g.graph").read_bytes()
    expected = b"".join(encode_varint(len(m)) + m for m in serialized(g))
    assert data == expected


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"", "empty graph file"),
        (b"\x05abc", "truncated message"),
        (b"\xff" * 11, "length prefix longer than 10 bytes"),
        (encode_varint(3) + b"\x0a\x01x", "not an echo-et graph file"),
        (b"\x80", "truncated length prefix"),
    ],
)
def test_bad_graph_files(tmp_path, content, match):
    p = tmp_path / "bad.graph"
    p.write_bytes(content)
    with pytest.raises(EchoError, match=match) as e:
        read_graph(p)
    assert str(e.value).startswith(str(p)) and "\n" not in str(e.value)


def test_huge_declared_length_fails_fast(tmp_path):
    p = tmp_path / "huge.graph"
    p.write_bytes(encode_varint((1 << 31) - 1) + b"tiny")
    with pytest.raises(EchoError, match=r"truncated message: expected 2147483647 bytes, found 4"):
        read_graph(p)


def test_bad_gzip(tmp_path):
    p = tmp_path / "bad.graph.gz"
    p.write_bytes(b"\x1f\x8b" + b"not really gzip")
    with pytest.raises(EchoError, match=r"bad\.graph\.gz: cannot read"):
        read_graph(p)


# -- job directories --------------------------------------------------------------------------
def test_job_round_trip(tmp_path):
    job = small_job()
    save_job(job, tmp_path / "job")
    back = load_job(tmp_path / "job")
    assert check_job(back) == []
    assert back.world_size == 2 and back.ranks() == [0, 1]
    assert dict(back.manifest.dropped) == {"test reason": 3}
    assert back.binding(0).measured_step_ns == 123
    assert serialized(back.graph("shared")) == serialized(job.graph("shared"))
    ref = back.manifest.graphs[0]
    assert (ref.id, ref.nodes) == ("shared", len(job.graph("shared")))
    assert hashlib.sha256((tmp_path / "job" / ref.path).read_bytes()).hexdigest() == ref.sha256


def test_graphs_load_lazily(tmp_path):
    save_job(small_job(), tmp_path / "job")
    (tmp_path / "job" / "graphs" / "shared.graph").write_bytes(b"\x05abc")
    job = load_job(tmp_path / "job")           # the manifest alone
    assert job.world_size == 2
    with pytest.raises(EchoError, match="shared.graph: content does not match the manifest's sha256"):
        job.graph("shared")
    rehash(tmp_path / "job")                   # damaged consistently: the framing error shows
    with pytest.raises(EchoError, match="shared.graph: truncated"):
        load_job(tmp_path / "job").graph("shared")


def rehash(job_dir) -> None:
    """Record the graph files' current SHA-256 in the manifest (a consistent edit)."""
    m = pb.JobManifest()
    m.ParseFromString((job_dir / "manifest.pb").read_bytes())
    for ref in m.graphs:
        ref.sha256 = hashlib.sha256((job_dir / ref.path).read_bytes()).hexdigest()
    (job_dir / "manifest.pb").write_bytes(m.SerializeToString())


def test_save_is_deterministic(tmp_path):
    save_job(small_job(), tmp_path / "a")
    save_job(small_job(), tmp_path / "b")
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b and files_a
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_failed_save_leaves_no_output(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ir_io, "write_stored_graph", boom)
    with pytest.raises(OSError):
        save_job(small_job(), tmp_path / "job")
    assert os.listdir(tmp_path) == []


def test_failed_overwrite_keeps_the_old_job(tmp_path, monkeypatch):
    save_job(small_job(), tmp_path / "job")
    before = (tmp_path / "job" / MANIFEST_NAME).read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ir_io, "write_stored_graph", boom)
    with pytest.raises(OSError):
        save_job(small_job(), tmp_path / "job")
    assert (tmp_path / "job" / MANIFEST_NAME).read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["job"]


def test_save_refuses_to_replace_other_things(tmp_path):
    other = tmp_path / "notajob"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    with pytest.raises(EchoError, match="not an echo-et job directory"):
        save_job(small_job(), other)
    assert (other / "precious.txt").read_text() == "keep me"
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(EchoError, match="not a directory"):
        save_job(small_job(), f)
    save_job(small_job(), tmp_path / "j")
    with pytest.raises(EchoError, match="already exists"):
        save_job(small_job(), tmp_path / "j", overwrite=False)


def test_bad_job_directories(tmp_path):
    with pytest.raises(EchoError, match="not an echo-et job directory"):
        load_job(tmp_path)
    (tmp_path / MANIFEST_NAME).write_bytes(b"\xff\xff\xff")
    with pytest.raises(EchoError, match="manifest does not decode"):
        load_job(tmp_path)
    (tmp_path / MANIFEST_NAME).write_bytes(pb.JobManifest(name="x").SerializeToString())
    with pytest.raises(EchoError, match="not an echo-et manifest"):
        load_job(tmp_path)


def test_graph_id_must_match_manifest(tmp_path):
    save_job(small_job(), tmp_path / "job")
    other = small_graph("other")
    write_graph(other, tmp_path / "job" / "graphs" / "shared.graph")
    rehash(tmp_path / "job")
    job = load_job(tmp_path / "job")
    with pytest.raises(EchoError, match="header id 'other' differs from manifest 'shared'"):
        job.graph("shared")


def test_graph_file_names_are_safe(tmp_path):
    jb = JobBuilder("x", 1)
    g = small_graph("../../evil id")
    jb.add_graph(g)
    jb.bind(0, g.id)
    save_job(jb.build(), tmp_path / "job")
    files = [p for p in (tmp_path / "job").rglob("*") if p.is_file()]
    assert all(Path(os.path.commonpath([tmp_path / "job", p])) == tmp_path / "job" for p in files)
    assert load_job(tmp_path / "job").graph("../../evil id").id == "../../evil id"


def test_graph_ids_that_sanitise_alike_keep_separate_files(tmp_path):
    jb = JobBuilder("x", 2)
    for rank, gid in enumerate(["a/b", "a_b"]):
        g = small_graph(gid, n=rank + 1)
        jb.add_graph(g)
        jb.bind(rank, gid)
    save_job(jb.build(), tmp_path / "job")
    back = load_job(tmp_path / "job")
    assert len({g.path for g in back.manifest.graphs}) == 2
    assert [len(back.graph(g)) for g in ("a/b", "a_b")] == [2, 3]


def test_outputs_get_ordinary_permissions(tmp_path) -> None:
    """Temporary files are 0600 and temporary dirs 0700; published outputs must not be."""
    import os
    import stat

    from echo_et.ir import GraphBuilder, JobBuilder, save_job, write_graph

    gb = GraphBuilder("g0")
    gb.compute("k", gb.stream(1, "s"), duration_ns=5)
    jb = JobBuilder("perm", 1)
    jb.add_graph(gb.build())
    jb.bind(0, "g0")
    mask = os.umask(0o022)
    try:
        out = save_job(jb.build(), tmp_path / "job")
        write_graph(gb.build(), tmp_path / "g.graph")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "g.graph").stat().st_mode) == 0o644
    assert stat.S_IMODE((out / "manifest.pb").stat().st_mode) == 0o644


def test_a_job_pickles_with_its_graphs(tmp_path):
    """A sweep ships a Job to worker processes: a lazily loaded Job pickles whole, and the
    copy has the same graphs (content hashes) and manifest."""
    import pickle

    jb = JobBuilder("p", 2)
    jb.add_graph(small_graph("g"))
    jb.bind(0, "g")
    jb.bind(1, "g")
    save_job(jb.build(), tmp_path / "job")
    lazy = load_job(tmp_path / "job")
    back = pickle.loads(pickle.dumps(lazy))
    assert back.manifest == lazy.manifest and back.source == lazy.source
    assert back.graph("g").content_hash() == lazy.graph("g").content_hash()
    g = back.graph("g")
    g.new_node(id=10_000, name="added")  # the nodes view is still the graph's own store
    assert len(pickle.loads(pickle.dumps(g)).nodes) == len(lazy.graph("g").nodes) + 1



def test_stored_graph_bytes_match_node_by_node_framing(tmp_path):
    """write_stored_graph (one serialisation, re-framed) writes the bytes of
    write_graph_stream (one call per node) for sizes of one-, two- and three-byte varints."""
    import io

    from echo_et.ir.graph import Graph

    g = Graph()
    g.header.id = "g"
    for i, size in enumerate((0, 1, 100, 126, 127, 128, 300, 16_380, 16_384, 70_000, 5)):
        n = g.new_node(id=i + 1)
        if size:
            n.name = "x" * size
    old, new = io.BytesIO(), io.BytesIO()
    ir_io.write_graph_stream(old, g.header, g.stored_nodes)
    assert ir_io.write_stored_graph(new, g) == 11
    assert new.getvalue() == old.getvalue()
    write_graph(g, tmp_path / "g.pb")
    assert (tmp_path / "g.pb").read_bytes() == old.getvalue()
    assert [n.name for n in read_graph(tmp_path / "g.pb").stored_nodes] == [n.name for n in g.stored_nodes]


def test_stored_graph_bytes_match_across_chunks():
    """More nodes than one chunk of stored_framed: the chunks join to the node-by-node bytes."""
    import io

    from echo_et.ir.graph import Graph

    g = Graph()
    for i in range(20_000):
        g.new_node(id=i + 1, name=f"n{i}", start_ns=i)
    old, new = io.BytesIO(), io.BytesIO()
    ir_io.write_graph_stream(old, g.header, g.stored_nodes)
    ir_io.write_stored_graph(new, g)
    assert len(list(g.stored_framed())) == 3
    assert new.getvalue() == old.getvalue()
