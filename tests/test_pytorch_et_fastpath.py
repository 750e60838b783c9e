"""The host-ET reader's fast path (typed msgspec decode of whole batches, parse_struct) gives
exactly what the reference path gives (the stdlib decoder, one dict per node, parse_node)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import FIXTURES, shared_path, unpack
from echo_et.converters import ReadOptions, jsonstream
from echo_et.converters import pytorch_et as et
from echo_et.converters.pytorch_et import schema, trace
from echo_et.errors import EchoError
from echo_et.ir import save_job

PARAM = "traces/param/et_replay/tests/inputs"


def _reference(monkeypatch: pytest.MonkeyPatch):
    """A context in which the reader decodes with the stdlib scanner into dicts only."""
    ctx = monkeypatch.context()
    m = ctx.__enter__()
    m.setattr(trace, "NodeStruct", None)
    m.setattr(jsonstream, "_orjson", None)
    return ctx


def _job_files(paths: list[Path], out: Path) -> dict[str, bytes]:
    d = save_job(et.read(paths, ReadOptions(name="t")), out)
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


SHARED = [
    "traces/chakra/tests/data/1.0.2-chakra.0.0.4.tgz",
    f"{PARAM}/1.1.0-chakra.0.0.4/resnet_2gpu_et.json.gz",
    f"{PARAM}/linear_et.json.gz",
    f"{PARAM}/dlrm_pytorch_et.tar.gz",
    "traces/HolisticTraceAnalysis/tests/data/execution_trace/benchmark_simple_add_et.json.gz",
]


def _shared_input(rel: str, tmp_path: Path) -> list[Path]:
    p = shared_path(rel)
    if rel.endswith(("tgz", "tar.gz")):
        d = unpack(p, tmp_path / "in")
        return sorted(q for q in d.rglob("*.json") if not q.name.startswith("."))
    return [p]


def _same_job(paths: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fast_ops = [trace.load(p).ops for p in paths]
    fast = _job_files(paths, tmp_path / "fast")
    ctx = _reference(monkeypatch)
    try:
        ref_ops = [trace.load(p).ops for p in paths]
        ref = _job_files(paths, tmp_path / "ref")
    finally:
        ctx.__exit__(None, None, None)
    assert fast_ops == ref_ops
    assert fast.keys() == ref.keys()
    for name in fast:
        assert fast[name] == ref[name], name


@pytest.mark.parametrize("which", ["cpu_single", "ddp_gloo4", "fake_pg64"])
def test_fast_path_same_job_as_reference_on_fixtures(which, tmp_path, monkeypatch):
    paths = sorted((FIXTURES / "traces" / which).glob("*.et.json.gz"))
    _same_job(paths, tmp_path, monkeypatch)


@pytest.mark.parametrize("rel", SHARED)
def test_fast_path_same_job_as_reference_on_real_traces(rel, tmp_path, monkeypatch):
    _same_job(_shared_input(rel, tmp_path), tmp_path, monkeypatch)


def test_fast_path_is_taken_on_current_traces():
    """Schema 1.1.x nodes decode as NodeStruct (the reference path would be silently slow)."""
    path = FIXTURES / "traces" / "cpu_single" / "rank0.et.json.gz"
    kinds = [type(v) for ev, _, v in jsonstream.iter_document(path, "nodes", element_type=schema.NodeStruct)
             if ev == "item"]
    assert kinds.count(schema.NodeStruct) >= len(kinds) - 1   # the last one is decoded alone


# One node of each kind the fixtures have, then any field replaced by any JSON value: the
# typed decode either refuses the node (it then goes through parse_node) or parse_struct
# gives what parse_node gives.
def _sample_nodes() -> list[dict]:
    nodes = et.load(FIXTURES / "traces" / "fake_pg64" / "rank0.et.json.gz").ops
    by_name = {op.name: op.id for op in nodes}
    import gzip

    with gzip.open(FIXTURES / "traces" / "fake_pg64" / "rank0.et.json.gz", "rt") as f:
        raw = json.load(f)["nodes"]
    want = set(by_name.values())
    return [n for n in raw if n["id"] in want][:400:7]


_SAMPLES = _sample_nodes()
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=8) | st.sampled_from(["Tensor(float)", "GenericList[Tensor(float)]", "Int"]),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=16,
)
_PATHS = st.sampled_from([("id",), ("name",), ("ctrl_deps",), ("parent",), ("inputs",), ("outputs",),
                          ("attrs",), ("inputs", "values"), ("inputs", "shapes"), ("inputs", "types"),
                          ("outputs", "values"), ("outputs", "types"), ("attrs", 0), ("attrs", 4),
                          ("attrs", 0, "value"), ("attrs", 4, "value"), ("attrs", 6, "name"),
                          ("ts",), ("dur",), ("inclusive_dur",), ("cat",)])
_DECODER = msgspec.json.Decoder(schema.NodeStruct)


def _outcome(fn, *args):
    try:
        return fn(*args)
    except EchoError as e:
        return ("error", str(e))
    except trace.MALFORMED as e:
        return ("malformed", type(e).__name__)


@settings(max_examples=300, deadline=None)
@given(k=st.integers(0, len(_SAMPLES) - 1), edits=st.lists(st.tuples(_PATHS, _json), max_size=3),
       drop=st.lists(_PATHS, max_size=2))
def test_parse_struct_equals_parse_node(k, edits, drop):
    node = json.loads(json.dumps(_SAMPLES[k]))
    for path, value in edits:
        _set(node, path, value)
    for path in drop:
        _set(node, path, None, delete=True)
    text = json.dumps(node)
    try:
        typed = _DECODER.decode(text)
    except msgspec.DecodeError:
        return   # not a NodeStruct: the reader gives it to parse_node only
    assert _outcome(schema.parse_struct, typed, "f") == _outcome(schema.parse_node, json.loads(text), "f")


def _set(node: dict, path: tuple, value, delete: bool = False) -> None:
    cur = node
    for p in path[:-1]:
        try:
            cur = cur[p]
        except (KeyError, IndexError, TypeError):
            return
    last = path[-1]
    if isinstance(cur, dict) or (isinstance(cur, list) and isinstance(last, int) and last < len(cur)):
        if delete:
            if isinstance(cur, dict):
                cur.pop(last, None)
            return
        cur[last] = value
