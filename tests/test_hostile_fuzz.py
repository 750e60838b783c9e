"""Property tests of issue 26: every reader, given damaged and re-typed input, gives one
`error:` line (exit 2) or a Job that `check` accepts; and `check` is the authority: a Job it
accepts goes through every verb that reads Jobs, one it refuses is refused by them too.

Unlike tests/test_fuzz_promise.py (which names the format and edits known fields), these
let the format be sniffed (the campaign's gzip traceback was in the sniffer) and re-type any
node of the JSON tree, metadata included (``distributedInfo.pg_config = 5``). Examples are
bounded and derandomized so that the suite stays fast and repeatable in CI.
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_fuzz_promise import _kineto_doc, byte_mutation, fresh, mutate_bytes, promise_convert, run
from test_hostile_input import small_job
from test_kineto_graph import base_events

from conftest import FIXTURES
from echo_et.ir import GraphBuilder, JobBuilder, load_job, pb, save_job
from echo_et.ir import io as ir_io

FUZZ = settings(max_examples=20, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# A JSON value of every type, and the numbers that broke readers before (beyond int64, huge
# floats as text, a bool where a number goes).
RETYPED = st.sampled_from([
    {}, [], [[]], {"a": {}}, "", "x", "1.5", "1e30", None, True, False, 0, -1, 5, 1.5, 1e30, -1e300,
    2 ** 63, 2 ** 64, -(2 ** 63) - 1, 10 ** 40, [0, 1], {"rank": 0},
])


def _paths(doc: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every path to a node of the JSON tree (bounded depth: events' args, not every digit)."""
    out = [prefix]
    if depth >= 4:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k), depth + 1)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i), depth + 1)
    return out


def retype(doc: Any, data: st.DataObject, paths: list[tuple], times: int = 3) -> Any:
    """``doc`` with 1..``times`` of its nodes (any of ``paths``) replaced by a value of
    another type (or the same node dropped)."""
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, times))):
        path = data.draw(st.sampled_from(paths))
        if not path:
            continue
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            if data.draw(st.booleans()) and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = data.draw(RETYPED)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit re-typed a node on this path
    return doc


# -- Kineto -------------------------------------------------------------------------------------------
KINETO = _kineto_doc(base_events())
KINETO_PATHS = [p for p in _paths(KINETO) if p[:1] != ("traceEvents",) or len(p) <= 4]


@FUZZ
@given(data=st.data(), gz=st.booleans())
def test_kineto_reader_retyped(tmp_path, data, gz):
    doc = retype(KINETO, data, KINETO_PATHS)
    d = fresh(tmp_path, "k")
    raw = json.dumps(doc).encode()
    src = d / ("rank0.json.gz" if gz else "rank0.json")
    src.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    promise_convert(src, d / "job")  # no --from: the format is sniffed


@FUZZ
@given(mutation=byte_mutation)
def test_kineto_gzip_bytes_sniffed(tmp_path, mutation):
    d = fresh(tmp_path, "kb")
    src = d / "rank0.kineto.json.gz"
    raw = (FIXTURES / "traces" / "ddp_gloo4" / "rank0.kineto.json.gz").read_bytes()
    src.write_bytes(mutate_bytes(raw, *mutation))
    promise_convert(src, d / "job")


# -- host execution trace ---------------------------------------------------------------------------------
HOST_ET = json.loads(gzip.decompress((FIXTURES / "traces" / "cpu_single" / "rank0.et.json.gz").read_bytes()))
HOST_ET_PATHS = [p for p in _paths(HOST_ET) if len(p) <= 4]


@FUZZ
@given(data=st.data())
def test_host_et_reader_retyped(tmp_path, data):
    doc = retype(HOST_ET, data, HOST_ET_PATHS)
    d = fresh(tmp_path, "h")
    src = d / "rank0.et.json"
    src.write_text(json.dumps(doc))
    promise_convert(src, d / "job", "--from", "pytorch_et")


# -- Chakra ET -------------------------------------------------------------------------------------------
@FUZZ
@given(mutation=byte_mutation, gz=st.booleans())
def test_chakra_reader_damaged_and_sniffed(tmp_path, mutation, gz):
    d = fresh(tmp_path, "c")
    save_job(small_job(1), d / "src")
    code, _, err = run("export", "chakra", d / "src", "-o", d / "ch" / "t")
    assert code == 0, err
    et = d / "ch" / "t.0.et"
    raw = mutate_bytes(et.read_bytes(), *mutation)
    if gz:
        et.unlink()
        et = d / "ch" / "t.0.et.gz"
        raw = gzip.compress(raw, mtime=0)
    et.write_bytes(raw)
    promise_convert(et, d / "job")


# -- Job / IR: check is the authority ----------------------------------------------------------------------
def _p2p_ring_job():
    """Two ranks with a collective and a send/recv pair: every field the fuzz edits is used."""
    jb = JobBuilder("f", 2)
    gid = jb.group([0, 1], name="0")
    for r in range(2):
        b = GraphBuilder(f"g{r}")
        gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
        comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
        b.declare_group("w", 2)
        k = b.compute("k", gpu, start_ns=100, duration_ns=1000).id
        b.collective("ar", comm, coll_type=pb.COLL_ALL_REDUCE, group="w", in_bytes=4096, deps=[k],
                     start_ns=1100, duration_ns=500)
        b.p2p(r == 0, "sr", comm, group="w", peer=1 - r, nbytes=256, start_ns=1700, duration_ns=50)
        jb.add_graph(b.build())
        jb.bind(r, f"g{r}", {"w": gid}, measured_step_ns=2000, clock_offset_ns=r * 10)
    return jb.build()


NUMBERS = st.sampled_from([0, 1, -1, 2, 5, 255, 2 ** 31, 2 ** 53, 2 ** 59, 2 ** 60, 2 ** 60 + 1, 2 ** 61,
                           2 ** 62 // 3, 2 ** 62, 2 ** 63 - 1, -(2 ** 62), -(2 ** 60), -(2 ** 63)])
# "durations": every node of the rank's graph gets the value (each fits, their sum may not: the
# step-bound rule); "starts": every node starts there (the spread of the ranks' starts).
EDITS = ["clock_offset_ns", "measured_step_ns", "start_ns", "duration_ns", "peer", "p2p_bytes", "in_bytes",
         "group_rank", "seq", "root", "durations", "starts"]
JOB_VERBS = [["simulate"], ["simulate", "--mode", "predict", "--preset", "a100-ib"],
             ["export", "chrome", "-o", "{d}/c"], ["export", "graphml", "-o", "{d}/g.graphml"],
             ["export", "chakra", "-o", "{d}/ch/t"], ["export", "astra-sim", "--no-expected", "-o", "{d}/as"],
             ["simulate", "--timeline", "{d}/tl"]]


def _apply(job_dir: Path, edit: str, rank: int, value: int) -> None:
    m = pb.JobManifest()
    m.ParseFromString((job_dir / "manifest.pb").read_bytes())
    clamp = _fits(value)
    if edit in ("clock_offset_ns", "measured_step_ns"):
        setattr(m.bindings[rank], edit, clamp(63))
    elif edit == "group_rank":
        m.groups[0].ranks[rank] = clamp(32, unsigned=True)
    else:
        job = load_job(job_dir)
        g = job.graph(f"g{rank}").copy()
        if edit in ("start_ns", "duration_ns"):
            setattr(g.nodes[0 if edit == "start_ns" else 1], edit, clamp(63))
        elif edit in ("durations", "starts"):
            for n in g.nodes:
                setattr(n, "duration_ns" if edit == "durations" else "start_ns", clamp(63))
        elif edit == "peer":
            g.nodes[2].p2p.peer = clamp(32)
        elif edit == "p2p_bytes":
            g.nodes[2].p2p.bytes = clamp(63)
        elif edit == "in_bytes":
            g.nodes[1].collective.in_bytes = clamp(63)
        elif edit == "seq":
            g.nodes[1].collective.seq = clamp(32)
        elif edit == "root":
            g.nodes[1].collective.root = clamp(32)
        ref = next(r for r in m.graphs if r.id == f"g{rank}")
        ir_io.write_graph(g, job_dir / ref.path)
        ref.sha256 = hashlib.sha256((job_dir / ref.path).read_bytes()).hexdigest()
    (job_dir / "manifest.pb").write_bytes(m.SerializeToString())


def _fits(value: int):
    """``value`` cut to what a protobuf field of ``bits`` holds (the schema's own types)."""
    def clamp(bits: int, unsigned: bool = False) -> int:
        lo, hi = (0, (1 << bits) - 1) if unsigned else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        return max(lo, min(hi, value))
    return clamp


@settings(FUZZ, max_examples=16)
@given(edits=st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0, 1), NUMBERS), min_size=1, max_size=3))
def test_check_is_the_authority_for_every_verb(tmp_path, edits):
    d = fresh(tmp_path, "j")
    save_job(_p2p_ring_job(), d / "job")
    for edit, rank, value in edits:
        try:
            _apply(d / "job", edit, rank, value)
        except ValueError:
            return  # the protobuf field refuses the value itself: not a Job anyone can write
    check_code, out, _ = run("check", d / "job")
    for cmd in JOB_VERBS:
        head = cmd[:2] if cmd[0] == "export" else cmd[:1]
        rest = [a.format(d=d) for a in (cmd[2:] if cmd[0] == "export" else cmd[1:])]
        code, _, err = run(*head, d / "job", *rest)
        if check_code == 0:
            assert code == 0, (edits, cmd, err)
        else:
            assert code == 2, (edits, cmd, out, err)
            assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
