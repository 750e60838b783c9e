"""The incremental Kineto JSON reader: same events as json.load, exact times, clear errors."""

from __future__ import annotations

import gzip
import json
from decimal import Decimal
from pathlib import Path

import pytest

from echo_et.converters import jsonstream as shared_stream
from echo_et.converters.kineto import events as kev
from echo_et.converters.kineto import jsonstream
from echo_et.errors import EchoError


def _doc(n: int = 50) -> dict:
    evs = [{"ph": "X", "cat": "cpu_op", "name": f"op{i} " + "x" * (i * 37 % 300),
            "pid": 1, "tid": 2, "ts": 1000.125 + i, "dur": 0.5 + i,
            "args": {"Ev Idx": i, "Input Dims": [[i, 3], []], "nested": {"a": [1, {"b": "}],["}]}}}
           for i in range(n)]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "GPU"}],
            "traceEvents": evs, "displayTimeUnit": "ms", "traceName": "t"}


def _collect(path: Path) -> tuple[dict, list[dict]]:
    got: list[dict] = []
    meta = jsonstream.read_document(path, got.append)
    return meta, got


@pytest.mark.parametrize("chunk", [7, 64, 1 << 20])
def test_events_match_json_load_across_chunk_sizes(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(shared_stream, "_CHUNK", chunk)
    doc = _doc()
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc, indent=1))
    meta, got = _collect(p)
    want = json.loads(p.read_text(), parse_float=str)
    assert got == want["traceEvents"]
    assert meta["displayTimeUnit"] == "ms" and meta["traceName"] == "t"   # keys after the events
    assert meta["deviceProperties"] == doc["deviceProperties"]


def test_gzip_and_top_level_array_and_trailing_comma(tmp_path):
    doc = _doc(5)
    gz = tmp_path / "t.json.gz"
    with gzip.open(gz, "wt") as f:
        json.dump(doc, f)
    assert len(_collect(gz)[1]) == 5
    arr = tmp_path / "a.json"
    arr.write_text(json.dumps(doc["traceEvents"]))
    assert len(_collect(arr)[1]) == 5
    trailing = tmp_path / "c.json"
    trailing.write_text('{"traceEvents": [{"ph": "X"}, {"ph": "M"},\n]}')
    assert len(_collect(trailing)[1]) == 2


@pytest.mark.parametrize("text, ns", [
    ("4458676522690.655", 4458676522690655),
    ("1712195495519695.8", 1712195495519695800),
    ("12", 12000), ("0.0005", 0), ("0.0015", 2), ("0.00151", 2), ("2.5e-3", 2),
    ("-1.25", -1250), ("1694128201435418", 1694128201435418000),
])
def test_microsecond_text_to_exact_nanoseconds(text, ns):
    value = json.loads(text, parse_float=str)
    assert kev.us_to_ns(value) == ns
    assert ns == int((Decimal(text) * 1000).to_integral_value())


def test_doubles_would_lose_the_nanoseconds():
    # Why floats are read as text: near wall-clock microseconds doubles are 0.25 us apart.
    text = "1712195495519695.123"
    assert kev.us_to_ns(text) == 1712195495519695123
    assert round(float(text) * 1000) != 1712195495519695123


@pytest.mark.parametrize("body, needle", [
    ('{"traceEvents": [{"ph": "X", "name": "a"}, {"ph": "X", "na', "truncated"),
    ('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "invalid JSON at character"),
    ('{"traceEvents": [{"ph": "X"}]} trailing', "extra data"),
    ("", "empty file"),
    ("hello", "not JSON"),
    ('{"traceEvents": [{"ph": "X", "name": "a"', "truncated"),
])
def test_bad_json_is_one_clear_error(tmp_path, body, needle):
    p = tmp_path / "bad.json"
    p.write_text(body)
    with pytest.raises(EchoError) as e:
        _collect(p)
    msg = str(e.value)
    assert msg.startswith(str(p)) and needle in msg and "\n" not in msg


def test_a_gz_that_is_not_gzip(tmp_path):
    p = tmp_path / "t.json.gz"
    p.write_text(json.dumps(_doc(2)))
    with pytest.raises(EchoError, match="not gzip"):
        _collect(p)


def test_truncated_gzip(tmp_path):
    p = tmp_path / "t.json.gz"
    data = gzip.compress(json.dumps(_doc(200)).encode())
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(EchoError, match="truncated|ends"):
        _collect(p)


def test_not_utf8(tmp_path):
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [{"name": "\xff\xfe"}]}')
    with pytest.raises(EchoError, match="UTF-8"):
        _collect(p)


def test_load_trace_refuses_empty_traces(tmp_path):
    p = tmp_path / "empty.json"
    p.write_text('{"traceEvents": []}')
    with pytest.raises(EchoError, match="no events"):
        kev.load_trace(p)
    q = tmp_path / "meta.json"
    q.write_text('{"traceEvents": [{"ph": "M", "name": "process_name"}]}')
    with pytest.raises(EchoError, match="no timed events"):
        kev.load_trace(q)
    r = tmp_path / "other.json"
    r.write_text('{"schema": "1.0.1", "nodes": []}')
    with pytest.raises(EchoError, match="not a Kineto trace"):
        kev.load_trace(r)


def test_time_unit_check_follows_the_bandwidth():
    # 1 MB in 10 us is 100 GB/s: durations read as microseconds agree.
    assert kev.time_unit_check([(1_000_000, 10_000, 100.0)]) == "us"
    # printed 100000 GB/s means the 10 was nanoseconds
    assert kev.time_unit_check([(1_000_000, 10_000, 100_000.0)]) == "ns"
    assert kev.time_unit_check([]) == "us"
