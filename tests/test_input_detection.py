"""Reading what a user points at (issue 25): a trace folder's run.json is not a trace, Kineto
traces beside their host ETs are linked, an unrecognised file says what it holds, and an
error names only flags the verb has."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest
from test_passes_cli import one_line_error, run

from conftest import FIXTURES
from echo_et.cli.common import error_line
from echo_et.converters import ReadOptions, read
from echo_et.converters.describe import describe, is_metadata
from echo_et.errors import EchoError, OptionError

TRACES = FIXTURES / "traces"




def test_inject_reads_a_trace_folder_with_its_run_json(tmp_path) -> None:
    assert (TRACES / "cpu_single" / "run.json").is_file()
    res = run("inject", TRACES / "cpu_single", "--dp", "4", "-o", tmp_path / "dp", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["world_size"] == 4 and out["param_source"] == "AccumulateGrad input shapes"


def test_a_folder_of_kineto_traces_and_host_ets_is_read_as_the_linked_pair(tmp_path) -> None:
    folder = TRACES / "ddp_gloo4"
    kineto = sorted(folder.glob("*.kineto.json.gz"))
    host = sorted(folder.glob("*.et.json.gz"))
    res = run("convert", folder, "-o", tmp_path / "a", "--json")
    assert res.exit_code == 0, res.output
    res_b = run("convert", *kineto, *[x for h in host for x in ("--host-et", h)], "-o", tmp_path / "b", "--json")
    assert res_b.exit_code == 0, res_b.output
    a, b = json.loads(res.stdout), json.loads(res_b.stdout)
    a.pop("output", None), b.pop("output", None)
    assert a == b and a["graphs"] == 4


def test_host_ets_given_twice_are_refused(tmp_path) -> None:
    folder = TRACES / "ddp_gloo4"
    with pytest.raises(OptionError, match="given twice") as e:
        read([folder], None, ReadOptions(host_et=sorted(folder.glob("*.et.json.gz"))))
    assert e.value.option == "host_et"


def test_a_folder_of_metadata_only_says_so(tmp_path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(TRACES / "cpu_single" / "run.json", d)
    line = one_line_error(run("inspect", d))
    assert line == f"error: {d}: folder has no traces (only metadata: run.json)"


@pytest.mark.parametrize("content, found", [
    (b"garbage\n", "text starting with 'garbage'"),
    (b"", "an empty file"),
    (b"\x00\x01\x02\x03binary", "binary data starting with 00 01 02 03"),
    (b'{"command": "python x.py", "layers": [1]}', "a JSON object with keys command, layers, none a trace's"),
    (b'[1, 2, 3]', "a JSON array of 3 items, not trace events"),
    (b'{"traceEvents": [', "text starting like JSON"),
    (gzip.compress(b"hello world", mtime=0), "gzip of text starting with 'hello world'"),
    (b"\x1f\x8bnot really gzip", "gzip data that does not decompress"),
])
def test_describe_says_what_a_file_holds(tmp_path, content: bytes, found: str) -> None:
    p = tmp_path / "x.dat"
    p.write_bytes(content)
    assert found in describe(p)


def test_metadata_is_a_small_json_object_without_trace_keys(tmp_path) -> None:
    assert is_metadata(TRACES / "cpu_single" / "run.json")
    (tmp_path / "t.json").write_text('{"traceEvents": []}')
    (tmp_path / "n.txt").write_text('{"a": 1}')
    assert not is_metadata(tmp_path / "t.json") and not is_metadata(tmp_path / "n.txt")
    assert not any(is_metadata(p) for p in (TRACES / "ddp_gloo4").glob("*.gz"))


def test_an_unrecognised_file_says_what_it_found_and_names_only_the_verbs_flags(tmp_path) -> None:
    p = tmp_path / "rank0.json"
    p.write_text("garbage\n")
    found = "cannot tell the format: found text starting with 'garbage' (formats read: echo-et, chakra, kineto"
    for verb in (["simulate", p], ["inspect", p], ["validate", p], ["export", "chrome", p, "-o", tmp_path / "t"]):
        line = one_line_error(run(*verb))
        assert line.startswith(f"error: {p}: {found}") and "--from" not in line, (verb, line)
    line = one_line_error(run("convert", p, "-o", tmp_path / "j"))
    assert line.startswith(f"error: --from: {p}: {found}")


def test_error_line_names_a_flag_only_when_the_verb_has_it() -> None:
    e = OptionError("format", "x: cannot tell the format")
    assert error_line(e, {"--from", "--output"}) == "--from: x: cannot tell the format"
    assert error_line(e, {"--mode"}) == "x: cannot tell the format"
    assert error_line(e) == "--from: x: cannot tell the format"
    assert error_line(EchoError("plain"), {"--mode"}) == "plain"


def test_inputs_of_two_unrelated_formats_are_refused(tmp_path) -> None:
    simai = tmp_path / "w.txt"
    simai.write_text("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 1 ep: 1 pp: 1 vpp: 1 ga: 1 "
                     "all_gpus: 1 checkpoints: 0 checkpoint_initiates: 0\n0\n")
    with pytest.raises(EchoError, match=r"inputs mix formats \(kineto, simai\)"):
        read([TRACES / "ddp_gloo4" / "rank0.kineto.json.gz", simai])
