"""The shared streaming JSON reader that the Kineto and host-ET converters both use."""

from __future__ import annotations

import gzip
import json

import pytest

from echo_et.converters import jsonstream
from echo_et.errors import EchoError


def _write(tmp_path, text: str, name: str = "d.json"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_fields_and_items_in_file_order(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonstream, "_CHUNK", 5)
    doc = {"a": 1, "rows": [{"x": 1.5}, 2, "s", [3]], "b": {"c": [1, 2]}}
    p = _write(tmp_path, json.dumps(doc))
    got = list(jsonstream.iter_document(p, "rows"))
    assert got == [("field", "a", 1), ("item", "rows", {"x": 1.5}), ("item", "rows", 2),
                   ("item", "rows", "s"), ("item", "rows", [3]), ("field", "b", {"c": [1, 2]})]


def test_float_parsing_is_the_callers_choice(tmp_path):
    p = _write(tmp_path, '{"rows": [{"ts": 4458676522690.655}]}')
    assert list(jsonstream.iter_document(p, "rows"))[0][2] == {"ts": 4458676522690.655}
    as_text = list(jsonstream.iter_document(p, "rows", parse_float=str))[0][2]
    assert as_text == {"ts": "4458676522690.655"}


def test_read_document_counts_the_array_even_when_empty(tmp_path):
    got: list = []
    p = _write(tmp_path, '{"rows": [], "k": "v"}')
    assert jsonstream.read_document(p, got.append, "rows") == {"rows": 0, "k": "v"} and got == []
    q = _write(tmp_path, '{"k": "v"}', "q.json")
    assert jsonstream.read_document(q, got.append, "rows") == {"k": "v"}
    r = _write(tmp_path, '{"rows": [{"a": 1}, 7, null, {"b": 2}]}', "r.json")
    assert jsonstream.read_document(r, got.append, "rows", objects_only=True) == {"rows": 4}
    assert got == [{"a": 1}, {"b": 2}]


def test_top_level_array_only_when_accepted(tmp_path):
    p = _write(tmp_path, "[1, 2]")
    assert [v for _, _, v in jsonstream.iter_document(p, "rows", accept_array=True)] == [1, 2]
    with pytest.raises(EchoError, match=r"expected a JSON object, found an array; not a thing"):
        list(jsonstream.iter_document(p, "rows", kind="thing"))


def test_a_value_much_longer_than_the_chunk(tmp_path, monkeypatch):
    # Each refill reads at least what is buffered, so a long value costs a few retries only.
    monkeypatch.setattr(jsonstream, "_CHUNK", 7)
    big = "y" * 300_000
    p = _write(tmp_path, json.dumps({"rows": [big, {"k": big}]}))
    assert [v for _, _, v in jsonstream.iter_document(p, "rows")] == [big, {"k": big}]


def test_missing_and_unreadable_files_are_echo_errors(tmp_path):
    with pytest.raises(EchoError, match="cannot read"):
        list(jsonstream.iter_document(tmp_path / "nope.json", "rows"))
    with pytest.raises(EchoError, match="cannot read"):
        list(jsonstream.iter_document(tmp_path, "rows"))
    corrupt = tmp_path / "c.json.gz"
    corrupt.write_bytes(b"\x1f\x8b\x08\x00garbage-not-deflate")
    with pytest.raises(EchoError, match="corrupt gzip data") as e:
        list(jsonstream.iter_document(corrupt, "rows"))
    assert str(e.value).startswith(str(corrupt))


def test_read_head_sees_through_gzip(tmp_path):
    p = tmp_path / "h.json.gz"
    p.write_bytes(gzip.compress(b'{"schema": "1", "nodes": []}'))
    assert jsonstream.read_head(p, 12) == '{"schema": "'
    assert jsonstream.read_head(tmp_path / "missing.json") == ""


@pytest.mark.parametrize("chunk", range(1, 14))
def test_numbers_cut_by_the_buffer_end(tmp_path, monkeypatch, chunk):
    # "0." of "0.0" or "1e" of "1e-3" at the end of a chunk is not a whole number yet.
    monkeypatch.setattr(jsonstream, "_CHUNK", chunk)
    text = '{"a":0.5,"rows":[0.0,12.5e-3,-1,3],"t":1234.5,"u":-2E+2}'
    p = _write(tmp_path, text)
    fields, items = {}, []
    for ev, key, value in jsonstream.iter_document(p, "rows"):
        (items.append(value) if ev == "item" else fields.__setitem__(key, value))
    want = json.loads(text)
    assert items == want.pop("rows") and fields == want
