"""Fuzzing the promise: whatever a user gives, echo-et exits 2 with one line, or makes a Job that
`check` accepts and `simulate` runs.

Each reader (Kineto, host ET, Chakra ET, SimAI, a Job directory) gets valid inputs broken by
file mutators (a field set to a hostile value, a truncation, a flipped byte), and the CLI's
option parsers get hostile values. Everything runs in-process with a bounded number of
examples so that the suite stays fast in CI.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_hostile_input import small_job
from test_kineto_graph import base_events
from typer.testing import CliRunner

from conftest import FIXTURES
from echo_et.cli.main import app
from echo_et.ir import GraphBuilder, JobBuilder, pb, save_job

runner = CliRunner()
FUZZ = settings(max_examples=15, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HOSTILE_NUMBERS = st.sampled_from([
    math.nan, math.inf, -math.inf, 1e300, -1e300, -1, -100, 0, 2 ** 31, 2 ** 53 + 1, 2 ** 63, 2 ** 64,
    10 ** 30, 1e20, 0.5, -0.0, 4294967295,
])
HOSTILE_VALUES = st.one_of(HOSTILE_NUMBERS, st.sampled_from(["", "x", "1e999999", "9" * 40, None, [], {}, [[-1, 1e20]],
                                                             True]))
HOSTILE_OPTION_TEXT = st.sampled_from(["nan", "inf", "-inf", "-8", "0", "1e300", "99999999999999999999",
                                       "4294967296", "-1", "1.5", "3", "0.000001"])


def run(*args) -> tuple[int, str, str]:
    r = runner.invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback for {args}: {r.exception!r}") from r.exception
    return r.exit_code, r.stdout, r.stderr


def assert_one_line(code: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)


def promise_convert(src: Path, out: Path, *extra) -> None:
    """convert gives exit 2 with one line, or a Job that check accepts and simulate runs."""
    code, _, err = run("convert", src, "-o", out, *extra)
    if code != 0:
        assert_one_line(code, err)
        assert not out.exists()
        assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        return
    code, outp, err = run("check", out)
    assert code == 0 and outp.strip() == "ok", (outp, err)
    code, _, err = run("simulate", out)
    assert code == 0, err


def mutate_bytes(data: bytes, how: str, at: float) -> bytes:
    i = min(len(data) - 1, int(at * len(data)))
    if how == "truncate":
        return data[:i]
    if how == "flip":
        return data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
    return data[:i] + data[i + 1:]  # drop one byte


byte_mutation = st.tuples(st.sampled_from(["truncate", "flip", "drop"]), st.floats(0, 1))


def fresh(tmp_path: Path, label: str) -> Path:
    d = tmp_path / label
    d.mkdir(parents=True, exist_ok=True)
    for p in d.iterdir():
        if p.is_dir():
            import shutil
            shutil.rmtree(p)
        else:
            p.unlink()
    return d


# -- Kineto -----------------------------------------------------------------------------------------
KINETO_FIELDS = ["ts", "dur", "pid", "tid", "name", "cat", "args.bytes", "args.correlation", "args.In msg nelems",
                 "args.Group size", "args.Input Dims", "args.stream", "args.device", "args.Out msg nelems"]


def _kineto_doc(evs, dist=None) -> dict:
    info = {"backend": "nccl", "rank": 0, "world_size": 2,
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]}
    info.update(dist or {})
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": evs}


@FUZZ
@given(data=st.data())
def test_kineto_field_mutations(tmp_path, data):
    evs = copy.deepcopy(base_events())
    for _ in range(data.draw(st.integers(1, 3))):
        ev = evs[data.draw(st.integers(0, len(evs) - 1))]
        field = data.draw(st.sampled_from(KINETO_FIELDS))
        value = data.draw(HOSTILE_VALUES)
        if field.startswith("args."):
            ev.setdefault("args", {})[field[5:]] = value
        else:
            ev[field] = value
    dist = data.draw(st.sampled_from([{}, {"world_size": data.draw(HOSTILE_VALUES)},
                                      {"rank": data.draw(HOSTILE_VALUES)}]))
    d = fresh(tmp_path, "k")
    src = d / "rank0.json"
    src.write_text(json.dumps(_kineto_doc(evs, dist)))  # NaN/Infinity written as JSON's extensions
    promise_convert(src, d / "job")


@FUZZ
@given(mutation=byte_mutation, gz=st.booleans())
def test_kineto_byte_mutations(tmp_path, mutation, gz):
    raw = json.dumps(_kineto_doc(base_events()), indent=1).encode()
    if gz:
        raw = gzip.compress(raw, mtime=0)
    d = fresh(tmp_path, "kb")
    src = d / ("rank0.json.gz" if gz else "rank0.json")
    src.write_bytes(mutate_bytes(raw, *mutation))
    promise_convert(src, d / "job", "--from", "kineto")


# -- host execution trace -----------------------------------------------------------------------------
HOST_ET = FIXTURES / "traces" / "cpu_single" / "rank0.et.json.gz"


@FUZZ
@given(data=st.data())
def test_host_et_field_mutations(tmp_path, data):
    doc = json.loads(gzip.decompress(HOST_ET.read_bytes()))
    nodes = doc["nodes"]
    for _ in range(data.draw(st.integers(1, 3))):
        node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        where = data.draw(st.sampled_from(["id", "ctrl_deps", "name", "inputs.values", "inputs.shapes",
                                           "attrs.rf_id", "attrs.tid", "ts", "dur", "inputs"]))
        value = data.draw(HOSTILE_VALUES)
        if where.startswith("inputs.") and isinstance(node.get("inputs"), dict):
            node["inputs"][where[7:]] = value
        elif where.startswith("attrs.") and isinstance(node.get("attrs"), list):
            node["attrs"].append({"name": where[6:], "type": "uint64", "value": value})
        else:
            node[where] = value
    d = fresh(tmp_path, "h")
    src = d / "rank0.et.json"
    src.write_text(json.dumps(doc))
    promise_convert(src, d / "job", "--from", "pytorch_et")


@FUZZ
@given(mutation=byte_mutation)
def test_host_et_byte_mutations(tmp_path, mutation):
    d = fresh(tmp_path, "hb")
    src = d / "rank0.et.json"
    src.write_bytes(mutate_bytes(gzip.decompress(HOST_ET.read_bytes()), *mutation))
    promise_convert(src, d / "job", "--from", "pytorch_et")


# -- Chakra ET ---------------------------------------------------------------------------------------
def _chakra_file(tmp: Path) -> Path:
    src = tmp / "src"
    save_job(small_job(1), src)
    code, _, err = run("export", "chakra", src, "-o", tmp / "ch" / "t")
    assert code == 0, err
    return tmp / "ch" / "t.0.et"


@FUZZ
@given(mutation=byte_mutation)
def test_chakra_byte_mutations(tmp_path, mutation):
    d = fresh(tmp_path, "c")
    et = _chakra_file(d)
    et.write_bytes(mutate_bytes(et.read_bytes(), *mutation))
    promise_convert(et, d / "job", "--from", "chakra")


# -- SimAI -------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.data())
def test_simai_token_mutations(tmp_path, data):
    head = ["HYBRID_TRANSFORMER_FWD_IN_BCKWD", "model_parallel_NPU_group:", "2", "ep:", "1", "pp:", "1",
            "ga:", "2", "all_gpus:", "4", "checkpoints:", "0", "checkpoint_initiates:", "0"]
    layers = [["l0", "-1", "1000", "ALLREDUCE", "4096", "1000", "NONE", "0", "1000", "ALLREDUCE", "8192", "100"],
              ["l1", "-1", "2000", "ALLGATHER", "4096", "1000", "REDUCESCATTER", "4096", "1000", "NONE", "0", "100"]]
    rows = [head, ["2"], *layers]
    for _ in range(data.draw(st.integers(1, 3))):
        row = rows[data.draw(st.integers(0, len(rows) - 1))]
        row[data.draw(st.integers(0, len(row) - 1))] = str(data.draw(HOSTILE_VALUES))
    d = fresh(tmp_path, "s")
    src = d / "w.txt"
    src.write_text("\n".join(" ".join(r) for r in rows) + "\n")
    promise_convert(src, d / "job", "--from", "simai")


# -- Job directories ---------------------------------------------------------------------------------
MANIFEST_EDITS = ["world_size", "group_rank", "group_id", "layout_dp", "gpus_per_node", "intra_bw", "root",
                  "binding_rank", "schema"]


def _edit(m: pb.JobManifest, what: str, value) -> None:
    def num(v, default=0):
        if isinstance(v, bool) or not isinstance(v, int | float) or isinstance(v, float) and not math.isfinite(v):
            return default
        return int(v) % (1 << 32) if isinstance(v, int) else int(v) % (1 << 32) if abs(v) < 1e18 else default
    if what == "world_size":
        m.world_size = num(value)
    elif what == "group_rank":
        m.groups[0].ranks.append(num(value))
    elif what == "group_id":
        m.groups[0].id = num(value)
    elif what == "layout_dp":
        m.layout.CopyFrom(pb.Layout(dp=num(value), tp=1, pp=1))
    elif what == "gpus_per_node":
        m.hardware.gpus_per_node = num(value)
    elif what == "intra_bw":
        m.hardware.intra_node_bw_gbps = float(value) if isinstance(value, int | float) and abs(value) < 1e308 \
            else math.nan
    elif what == "binding_rank":
        m.bindings[0].rank = num(value)
    elif what == "schema":
        m.schema_version = str(value)


def _two_rank_job():
    jb = JobBuilder("f", 2)
    gid = jb.group([0, 1], name="0")
    b = GraphBuilder("g")
    comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    b.declare_group("w", 2)
    b.collective("bc", comm, coll_type=pb.COLL_BROADCAST, group="w", in_bytes=64, root=1, duration_ns=10)
    jb.add_graph(b.build())
    jb.bind(0, "g", {"w": gid})
    jb.bind(1, "g", {"w": gid})
    return jb.build()


@settings(FUZZ, max_examples=10)
@given(what=st.sampled_from(MANIFEST_EDITS), value=HOSTILE_VALUES, cmd=st.sampled_from(
    [["simulate"], ["export", "astra-sim"], ["export", "chakra"], ["scale", "--dp", "4"], ["inspect"]]))
def test_job_manifest_mutations(tmp_path, what, value, cmd):
    d = fresh(tmp_path, "j")
    save_job(_two_rank_job(), d / "job")
    m = pb.JobManifest()
    m.ParseFromString((d / "job" / "manifest.pb").read_bytes())
    _edit(m, what, value)
    (d / "job" / "manifest.pb").write_bytes(m.SerializeToString())
    check_code, _, _ = run("check", d / "job")
    out = d / ("o" if cmd[0] != "export" or cmd[1] != "chakra" else "o/t")
    code, _, err = run(*cmd[:2 if cmd[0] == "export" else 1], d / "job",
                       *(cmd[1:] if cmd[0] == "scale" else []), *(["-o", out] if cmd[0] != "inspect" and
                                                                   cmd[0] != "simulate" else []))
    if check_code == 0 and cmd[0] != "scale":
        # check accepted it: simulate, every export and inspect accept it too (scale may still
        # refuse, with one line, a Job whose groups form no parallel layout it can rebuild)
        assert code == 0, (what, value, cmd, err)
    else:
        assert code in (0, 2), (code, err)  # inspect may still describe a Job check refuses
        if code == 2:
            assert_one_line(code, err)


@FUZZ
@given(mutation=byte_mutation, target=st.sampled_from(["manifest.pb", "graphs/g.graph"]))
def test_job_byte_mutations(tmp_path, mutation, target):
    d = fresh(tmp_path, "jb")
    save_job(_two_rank_job(), d / "job")
    p = d / "job" / target
    p.write_bytes(mutate_bytes(p.read_bytes(), *mutation))
    code, out, err = run("check", d / "job")
    if code == 0:
        assert out.strip() == "ok"
        code, _, err = run("simulate", d / "job")
        assert code == 0, err
    elif code == 2:
        assert_one_line(code, err)
    else:
        assert code == 1 and err.strip(), err  # check's list of issues


# -- CLI option parsers -------------------------------------------------------------------------------
JOB = FIXTURES / "jobs" / "ddp-dp4"


@FUZZ
@given(text=HOSTILE_OPTION_TEXT, option=st.sampled_from(
    [("simulate", "--compute-scale"), ("simulate", "--gpus-per-node"), ("simulate", "--straggler"),
     ("estimate", "--ranks"), ("estimate", "--gpus-per-node"), ("export", "--latency"), ("export", "--splits"),
     ("scale", "--dp"), ("scale", "--microbatches"), ("simulate", "--intra-bw")]))
def test_option_parsers(tmp_path, text, option):
    cmd, flag = option
    d = fresh(tmp_path, "o")
    if cmd == "simulate":
        value = f"0:{text}" if flag == "--straggler" else text
        extra = ["--mode", "predict", "--preset", "a100-ib"] if flag == "--intra-bw" else []
        args = ["simulate", JOB, flag, value, *extra]
    elif cmd == "estimate":
        args = ["estimate", "all_reduce", "--bytes", "1MiB", "--ranks", "8", flag, text]
    elif cmd == "export":
        args = ["export", "astra-sim", JOB, flag, text, "-o", d / "a"]
    else:
        args = ["scale", JOB, flag, text, "-o", d / "s"]
    code, _, err = run(*args)
    if code != 0:
        assert_one_line(code, err)
