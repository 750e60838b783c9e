"""Whether an attention call was causal, read from what the trace recorded of its arguments
(Kineto's ``Concrete Inputs``, a host ET's ``inputs.values``) and priced by the compute model:
a bidirectional call does twice the work of a causal one of the same shapes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import FIXTURES
from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.ir import check_job, load_job, pb
from echo_et.ir.attention import CAUSAL_ATTR, CAUSAL_POSITIONS, causal_text
from echo_et.models.compute import ComputeModel, ops
from echo_et.passes import retime_compute

TRACE = FIXTURES / "traces" / "attention_cpu"
SDPA = "aten::scaled_dot_product_attention"
CPU_FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"


# -- the argument lists ------------------------------------------------------------------------
def test_kineto_concrete_inputs_and_host_values_give_the_flag():
    assert causal_text(SDPA, ["", "", "", "", "0.", "False", "", "False"]) == "0"
    assert causal_text(SDPA, ["", "", "", "", "0.", "True", "", "False"]) == "1"
    assert causal_text(SDPA, [[1, 2], [3, 4], [5, 6], "<None>", 0.0, False, "<None>", False]) == "0"
    assert causal_text(CPU_FLASH, [[1], [2], [3], 0.0, True, "<None>", "<None>"]) == "1"
    # an older release's shorter list (no enable_gqa) keeps the flag where it was
    assert causal_text(SDPA, ["", "", "", "", "0.", "False", ""]) == "0"


def test_the_efficient_kernels_mask_type_is_an_int():
    op = "aten::_efficient_attention_forward"
    vals = [""] * 14
    for mask, want in (("0", "0"), ("1", "1"), ("2", "1"), ("7", "")):
        vals[9] = mask
        assert causal_text(op, vals) == want
    assert causal_text(op, [None] * 9 + [2] + [None] * 4) == "1"


def test_the_quantized_overload_moves_the_flag():
    op = "aten::_scaled_dot_product_flash_attention"
    assert causal_text(op, ["", "", "", "0.", "True", "False", ""]) == "1"
    assert causal_text(op, ["", "", "", "", "", "", "0.", "False", "True", ""]) == "0"


def test_nothing_is_said_where_the_values_do_not_say():
    assert causal_text("aten::mm", ["", "", "True"]) == ""
    assert causal_text(SDPA, ["", "", "", "", "0.", "", "", ""]) == ""   # not a flag
    assert causal_text(SDPA, ["", ""]) == ""                              # too short
    assert causal_text(SDPA, "False") == "" and causal_text(SDPA, []) == ""


def test_a_host_traces_schema_names_the_argument():
    schema = ("aten::my_attention(Tensor query, Tensor key, Tensor value, *, bool causal=False, "
              "float? scale=None) -> (Tensor out, Tensor lse)")
    assert causal_text(SDPA, [[1], [2], [3], True, None], schema) == "1"
    assert causal_text(SDPA, [[1], [2], [3], None, None], "garbled") == ""


def test_the_positions_are_those_of_torchs_schemas():
    """Every aten operator listed is registered with its causal argument at a listed
    position, and every registered schema of it that has one has it at a listed position."""
    torch = pytest.importorskip("torch", reason="torch (the tracer's dependency) is not installed")
    for op, positions in CAUSAL_POSITIONS.items():
        if not op.startswith("aten::"):
            continue
        found = []
        for s in torch._C._jit_get_schemas_for_operator(op):
            names = [a.name for a in s.arguments]
            for name in ("is_causal", "custom_mask_type"):
                if name in names:
                    found.append(names.index(name))
        assert found, op
        assert set(found) <= set(positions), (op, found, positions)


# -- real traces ------------------------------------------------------------------------------
def _recorded_flags() -> dict[str, list[str]]:
    """Each attention operator's recorded is_causal values, in trace order, read from the
    Kineto file itself (not through the converter)."""
    with gzip.open(TRACE / "rank0.kineto.json.gz", "rt") as f:
        doc = json.load(f)
    out: dict[str, list[str]] = {}
    for e in sorted(doc["traceEvents"], key=lambda e: (e.get("ts", 0), -e.get("dur", 0))):
        if e.get("cat") == "cpu_op" and e["name"] in CAUSAL_POSITIONS:
            vals = e["args"]["Concrete Inputs"]
            flag = vals[CAUSAL_POSITIONS[e["name"]][0]]
            out.setdefault(e["name"], []).append({"True": "1", "False": "0"}[flag])
    return out


def _converted_flags(job) -> dict[str, list[str]]:
    (g,) = list(job.graphs())
    out: dict[str, list[str]] = {}
    for n in sorted(g.nodes, key=lambda n: (n.start_ns, -n.duration_ns)):
        if n.name in CAUSAL_POSITIONS:
            out.setdefault(n.name, []).append(n.attrs.get(CAUSAL_ATTR, ""))
    return out


def _convert(tmp_path: Path, name: str, *args: str):
    out = tmp_path / name
    res = CliRunner().invoke(app, ["convert", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    assert check_job(job) == []
    return job


def test_real_kineto_trace_marks_every_attention_call(tmp_path):
    run = json.loads((TRACE / "run.json").read_text())
    want = _recorded_flags()
    assert want[SDPA] == ["1" if c else "0" for c in run["forward_is_causal"]] * len(run["profiled_steps"])
    # the backward runs in reverse: the decoder's (causal) first
    assert want["aten::_scaled_dot_product_flash_attention_for_cpu_backward"] == ["1", "0"]
    assert _converted_flags(_convert(tmp_path, "k", str(TRACE / "rank0.kineto.json.gz"))) == want


def test_real_host_et_and_the_linked_pair_mark_them_too(tmp_path):
    want = _recorded_flags()
    et = str(TRACE / "rank0.et.json.gz")
    assert _converted_flags(_convert(tmp_path, "e", et)) == want
    linked = _convert(tmp_path, "l", str(TRACE / "rank0.kineto.json.gz"), "--host-et", et)
    assert _converted_flags(linked) == want


def test_the_compute_model_prices_the_encoders_call_at_twice_the_work(tmp_path):
    job = _convert(tmp_path, "k", str(TRACE / "rank0.kineto.json.gz"))
    (g,) = list(job.graphs())
    flops = {}
    for n in g.nodes:
        if n.name == CPU_FLASH:
            cost = ops.op_cost(n.name, n.cpu.shapes, n.cpu.dtypes, "", n.attrs[CAUSAL_ATTR] != "0")
            flops[n.attrs[CAUSAL_ATTR]] = sum(k.flops for k in cost.kernels)
    assert flops["0"] == pytest.approx(2 * flops["1"])   # sq == sk: the causal half


# -- a GPU trace, retimed ---------------------------------------------------------------------
def _gpu_trace(tmp_path: Path) -> Path:
    """Two flash-attention calls of the same bf16 shapes, one bidirectional and one causal,
    each launching its kernel, as the profiler writes them on a GPU."""
    q = [8, 16, 2048, 128]
    dims = [q, q, q, [], [], [], []]
    types = ["c10::BFloat16"] * 3 + ["Scalar", "Scalar", "Scalar", "Scalar"]
    evs = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
            "ts": 0, "dur": 10_000, "args": {"Ev Idx": 0}}]
    for i, flag in enumerate(("False", "True")):
        t = 100 + 4000 * i
        evs += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::_scaled_dot_product_flash_attention", "pid": 1,
             "tid": 1, "ts": t, "dur": 50, "args": {"Ev Idx": 1 + i, "Input Dims": dims, "Input type": types,
                                                    "Concrete Inputs": ["", "", "", "0.", flag, "False", ""]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 10,
             "dur": 5, "args": {"correlation": 10 + i, "cbid": 1}},
            {"ph": "X", "cat": "kernel", "name": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>()",
             "pid": 0, "tid": 7, "ts": t + 20, "dur": 3000,
             "args": {"device": 0, "stream": 7, "correlation": 10 + i}},
        ]
    p = tmp_path / "gpu.json"
    p.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
                             "traceEvents": evs}))
    return p


def test_a_retimed_gpu_trace_gives_the_bidirectional_kernel_twice_the_time(tmp_path):
    job = read([_gpu_trace(tmp_path)], "kineto", ReadOptions())
    out, rep = retime_compute(job, ComputeModel.preset("a100"))
    assert rep.by_status["from_launching_op"] == 2
    (g,) = list(out.graphs())
    fwd = sorted((n for n in g.nodes if n.kind == pb.KIND_COMPUTE), key=lambda n: n.id)
    assert len(fwd) == 2
    ratio = fwd[0].duration_ns / fwd[1].duration_ns
    assert 1.8 < ratio <= 2.0, ratio
