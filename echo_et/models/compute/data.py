"""Measured A100 compute times the compute model is calibrated on, turned into samples.

**Kernels** (``slowdown/echo-a100-gpt2/merged_features.csv``, Echo's overlap-slowdown data):
619 backward kernels of GPT-2 (HuggingFace, FP32) under DDP on A100-SXM4-40GB, in launch
order, with their isolated time (``ground_truth``, ns) and Nsight metrics, but no shapes.
The shapes come from the model, not from the times: the file is the backward of a 12-layer
GPT-2 small (hidden 768, 12 heads, FFN 3072, vocabulary 50257) on 8 x 1024 tokens with
memory-efficient attention and dropout, and its kernel sequence is checked, row by row,
against that backward (final LayerNorm; per layer the MLP then the attention block; the
embeddings) - a file that deviates is refused. Each kernel gets the operator call it belongs
to (e.g. the ``ampere_sgemm_128x32_tn`` after a layer's MLP-out bias reduction is
``aten::mm([8192, 3072], [3072, 768])``); multi-kernel operators give one sample per kernel
(``native_layer_norm_backward``: the input-gradient and the gamma/beta kernels) or, for the
sort-based embedding backward, one sample for the operator. The 12 ``FillFunctor<unsigned
char>`` kernels inside the attention backward have no shape we can name without using their
time, so they are left out (reported as excluded). The Nsight metrics are not used.

**Layers** (SimAI/AICB ``*_A100.txt`` Megatron workloads): per-layer forward and backward
compute times (ns) of GPT-13B/175B and Llama-7B/65B at a stated TP, micro-batch 1; the
sequence length is read from the layer's TP all-reduce size (seq x micro-batch x hidden x 2
bytes). One sample per file and direction: the layer's attention plus MLP rows (their split
between the two rows is not physically consistent in these files, their sum is). A sample
faster than the data-sheet peak allows for its FLOPs is kept for evaluation but not fitted.
DeepSpeed ZeRO-3 workloads have no layer shapes and are skipped.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir.attention import is_causal
from echo_et.models.compute import ops
from echo_et.models.compute.fit import Sample
from echo_et.models.compute.layers import LayerShape, OpCall, call, layer_backward, layer_forward


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Excluded:
    label: str
    reason: str


# -- kernels: the GPT-2 backward of merged_features.csv -------------------------------------------
@dataclass(frozen=True)
class _Expect:
    short: str                  # kShortName prefix
    functor: tuple[str, ...]    # substrings of kDemangledName
    op: int                     # operator instance
    part: int | None            # which of the operator's kernels; None: summed over the operator's rows
    label: str


GPT2 = {"batch": 8, "seq": 1024, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 50257, "layers": 12}


class _Template:
    def __init__(self) -> None:
        self.expect: list[_Expect] = []
        self.calls: list[OpCall] = []

    def op(self, c: OpCall) -> int:
        self.calls.append(c)
        return len(self.calls) - 1

    def k(self, short: str, functor: tuple[str, ...], op: int, part: int | None, label: str) -> None:
        self.expect.append(_Expect(short, functor, op, part, label))


_EW = "vectorized_elementwise_kernel"
_MUL1 = ("AUnaryFunctor", "MulFunctor")
_MUL2 = ("BinaryFunctor", "MulFunctor")
_F = "float"


def _gpt2_template() -> _Template:
    b, s, h, a, f, v = (GPT2[k] for k in ("batch", "seq", "hidden", "heads", "ffn", "vocab"))
    d, t = h // a, b * s
    x = [b, s, h]
    tp = _Template()

    def one(short: str, functor: tuple[str, ...], c: OpCall, label: str) -> None:
        tp.k(short, functor, tp.op(c), 0, label)

    def scale(shape: list[int], label: str) -> None:  # gradient scaled in place
        one(_EW, _MUL1, call("aten::mul_", [(shape, _F), ([], "Scalar")]), label)

    def ln_bwd(label: str) -> None:
        i = tp.op(call("aten::native_layer_norm_backward", [(x, _F), (x, _F), ([h], "ScalarList"), ([b, s, 1], _F),
                                                           ([b, s, 1], _F), ([h], _F), ([h], _F), ([], "ScalarList")]))
        tp.k("layer_norm_grad_input_kernel", (), i, 0, f"{label}.dx")
        tp.k("GammaBetaBackwardCUDAKernel", (), i, 1, f"{label}.dgamma_dbeta")
        scale([h], f"{label}.gamma_grad")
        scale([h], f"{label}.beta_grad")

    def conv1d_bwd(nx: int, nf: int, label: str) -> None:  # HF Conv1D: addmm(bias, x[t, nx], W[nx, nf])
        one("ampere_sgemm", (), call("aten::mm", [([t, nf], _F), ([nf, nx], _F)]), f"{label}.dgrad")
        one("ampere_sgemm", (), call("aten::mm", [([nx, t], _F), ([t, nf], _F)]), f"{label}.wgrad")
        one("reduce_kernel", ("sum_functor",), call("aten::sum", [([t, nf], _F), ([], "ScalarList"), ([], "Scalar"),
                                                                  ([], "")], out_shapes=json.dumps([[nf]])),
            f"{label}.bias_grad")
        scale([nf], f"{label}.bias_grad_scale")
        scale([nx, nf], f"{label}.weight_grad_scale")

    def dropout_bwd(label: str) -> None:
        one(_EW, ("masked_scale_kernel",), call("aten::native_dropout_backward", [(x, _F), (x, "bool"),
                                                                                  ([], "Scalar")]), label)

    def add(shape: list[int], label: str) -> None:
        one(_EW, ("CUDAFunctor_add",), call("aten::add", [(shape, _F), (shape, _F), ([], "Scalar")]), label)

    ln_bwd("ln_f")
    xf = [b, s, f]
    for layer in range(GPT2["layers"] - 1, -1, -1):
        p = f"h{layer}"
        # MLP: out = dropout(c_proj(gelu_new(c_fc(ln_2(x))))); gelu_new's autograd graph (11 kernels)
        dropout_bwd(f"{p}.mlp.dropout")
        conv1d_bwd(f, h, f"{p}.mlp.c_proj")
        for fn, label in ((_MUL2, "mul"), (_MUL2, "mul"), (("tanh_backward",), "tanh_backward"), (_MUL1, "mul"),
                          (_MUL1, "mul"), (("pow_tensor_scalar",), "pow"), (_MUL1, "mul"), (_MUL2, "mul"),
                          (("CUDAFunctor_add",), "add"), (_MUL1, "mul"), (("CUDAFunctor_add",), "add")):
            binary = fn in (_MUL2, ("tanh_backward",), ("CUDAFunctor_add",))
            args = [(xf, _F), (xf, _F)] if binary else [(xf, _F), ([], "Scalar")]
            one(_EW, fn, call(f"aten::{label}", args), f"{p}.mlp.gelu_new_bwd.{label}")
        conv1d_bwd(h, f, f"{p}.mlp.c_fc")
        ln_bwd(f"{p}.ln_2")  # its gamma/beta scales come after the residual add: fixed below
        tp.expect[-2:], tail = [], tp.expect[-2:]
        add(x, f"{p}.residual")
        tp.expect += tail
        # attention: out = dropout(c_proj(sdpa(split(c_attn(ln_1(x))))))
        dropout_bwd(f"{p}.attn.resid_dropout")
        conv1d_bwd(h, h, f"{p}.attn.c_proj")
        q = [b, s, a, d]
        i = tp.op(call("aten::_efficient_attention_backward",
                       [(q, _F), (q, _F), (q, _F), (q, _F), ([], ""), (q, _F)] + [([], "Scalar")] * 4
                       + [([b, a, s], _F)] + [([], "Scalar")] * 6, is_causal="1"))
        tp.k(_EW, _MUL2, i, 0, f"{p}.attn.sdpa_bwd.delta_mul")
        tp.k("reduce_kernel", ("sum_functor",), i, 1, f"{p}.attn.sdpa_bwd.delta_sum")
        tp.k("elementwise_kernel", ("direct_copy_kernel",), i, 2, f"{p}.attn.sdpa_bwd.delta_copy")
        tp.k(_EW, ("FillFunctor<unsigned char>",), -1, None, f"{p}.attn.sdpa_bwd.fill_u8")
        tp.k("fmha_cutlassB", (), i, 3, f"{p}.attn.sdpa_bwd.fmha")
        one("CatArrayBatchedCopy", (), call("aten::cat", [([x, x, x], "TensorList"), ([], "Scalar")]),
            f"{p}.attn.split_bwd")
        conv1d_bwd(h, 3 * h, f"{p}.attn.c_attn")
        ln_bwd(f"{p}.ln_1")
        tp.expect[-2:], tail = [], tp.expect[-2:]
        add(x, f"{p}.residual")
        tp.expect += tail
    # embeddings: dropout(wte(ids) + wpe(pos))
    dropout_bwd("embed.dropout")
    one("reduce_kernel", ("sum_functor",), call("aten::sum", [(x, _F), ([], "ScalarList"), ([], "Scalar"), ([], "")],
                                                 out_shapes=json.dumps([[1, s, h]])), "wpe.broadcast_bwd")
    i = tp.op(call("aten::embedding_dense_backward", [([1, s, h], _F), ([1, s], "long int"), ([], "Scalar"),
                                                      ([], "Scalar"), ([], "Scalar")], out_shapes=json.dumps([[s, h]])))
    tp.k(_EW, ("FillFunctor<float>",), i, 0, "wpe.embedding_bwd.zero")
    tp.k("embedding_backward_feature_kernel", (), i, 1, "wpe.embedding_bwd")
    scale([s, h], "wpe.grad_scale")
    i = tp.op(call("aten::embedding_dense_backward", [(x, _F), ([b, s], "long int"), ([], "Scalar"), ([], "Scalar"),
                                                      ([], "Scalar")], out_shapes=json.dumps([[v, h]])))
    tp.k("*", ("sum_and_scatter",), i, None, "wte.embedding_bwd")   # the sort path, through sum_and_scatter
    scale([v, h], "wte.grad_scale")
    return tp


def read_kernel_samples(path: str | Path) -> tuple[list[Sample], list[Excluded]]:
    """Samples from ``merged_features.csv`` (see the module docstring)."""
    p = Path(path)
    try:
        with open(p, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.DictReader(fh))
    except FileNotFoundError:
        raise EchoError(f"{p}: no such file") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise EchoError(f"{p.name}: not a CSV file ({e.__class__.__name__})") from None
    need = ("kShortName", "kDemangledName", "ground_truth")
    if not rows or any(c not in rows[0] for c in need):
        raise EchoError(f"{p.name}: expected columns {', '.join(need)} (Echo's merged_features.csv)")
    tp = _template = _gpt2_template()
    samples: list[Sample] = []
    excluded: list[Excluded] = []
    summed: dict[int, list[dict[str, str]]] = {}
    r = 0
    for e in _template.expect:
        if r >= len(rows):
            raise EchoError(f"{p.name}: ends at row {r + 1}, expected {e.label} ({e.short})")
        if e.short == "*":  # rows through the one whose name carries the last functor
            start = r
            while r < len(rows) and e.functor[0] not in rows[r]["kDemangledName"]:
                r += 1
            if r >= len(rows) or r - start > 40:
                raise EchoError(f"{p.name}: row {start + 1}: expected {e.label} ending in {e.functor[0]}")
            summed[e.op] = rows[start:r + 1]
            r += 1
            continue
        row = rows[r]
        if not row["kShortName"].startswith(e.short) or any(fn not in row["kDemangledName"] for fn in e.functor):
            raise EchoError(f"{p.name}: row {r + 1} is {row['kShortName']}, expected {e.label} "
                            f"({e.short}{' ' + '/'.join(e.functor) if e.functor else ''}): not the GPT-2 "
                            "backward this reader knows")
        r += 1
        gt = _ns(row, p, r)
        if e.op < 0:
            excluded.append(Excluded(e.label, "kernel of unknown shape (FillFunctor<unsigned char>)"))
            continue
        c = tp.calls[e.op]
        cost = ops.op_cost(c.op, c.shapes, c.dtypes, c.attrs.get("out_shapes", ""), is_causal(c.attrs))
        assert e.part is not None and e.part < len(cost.kernels), e.label
        samples.append(Sample(((cost.kernels[e.part], 1.0),), gt, group=row["kShortName"], source="kernels",
                              label=f"{e.label} [{_functor(row)}]"))
    if r != len(rows):
        raise EchoError(f"{p.name}: {len(rows) - r} rows after the GPT-2 backward this reader knows")
    for op_i, rs in summed.items():
        c = tp.calls[op_i]
        cost = ops.op_cost(c.op, c.shapes, c.dtypes, c.attrs.get("out_shapes", ""))
        total = sum(_ns(x, p, 0) for x in rs)
        samples.append(Sample(tuple((k, 1.0) for k in cost.kernels), total, group=rs[-1]["kShortName"],
                              source="kernels",
                              label=f"wte.embedding_bwd [embedding_dense_backward: sort path, {len(rs)} kernels]"))
    return samples, excluded


def _ns(row: dict[str, str], p: Path, r: int) -> float:
    try:
        v = float(row["ground_truth"])
    except (TypeError, ValueError):
        raise EchoError(f"{p.name}: row {r}: ground_truth {row.get('ground_truth')!r} is not a number") from None
    if v <= 0:
        raise EchoError(f"{p.name}: row {r}: ground_truth must be > 0")
    return v


def _functor(row: dict[str, str]) -> str:
    """A short readable name of the kernel's functor (what a finer grouping keeps together)."""
    d = row["kDemangledName"]
    for token in ("MulFunctor", "masked_scale", "tanh_backward", "pow_tensor_scalar", "CUDAFunctor_add",
                  "FillFunctor", "direct_copy", "sum_functor"):
        if token in d:
            kind = "binary" if "BinaryFunctor" in d else ("scalar" if "AUnaryFunctor" in d else "")
            return f"{row['kShortName']}:{token}{':' + kind if kind else ''}"
    return row["kShortName"]


def functor_group(s: Sample) -> str:
    """Finer group than the short kernel name: the functor the kernel applies."""
    return s.label.rsplit("[", 1)[-1].rstrip("]")


# -- layers: SimAI/AICB Megatron workloads -------------------------------------------------------
AICB_MODELS = {
    "gpt13b": ("gpt", 5120, 40, 20480),
    "gpt175b": ("gpt", 12288, 96, 49152),
    "llama7b": ("llama", 4096, 32, 11008),
    "llama13b": ("llama", 5120, 40, 13824),
    "llama65b": ("llama", 8192, 64, 22016),
}
_LAYER_ROWS = ("attention_layer", "mlp_layer", "attention_norm", "mlp_norm", "attention_column_layer",
               "attention_row_layer", "mlp_column_layer", "mlp_row_layer")
_NAME = re.compile(r"_(?P<model>GPT\d+B|Llama\d+B)_megatron_tp(?P<tp>\d+)_pp\d+_mbs(?P<mbs>\d+)", re.IGNORECASE)


@dataclass(frozen=True)
class LayerTimes:
    file: str
    shape: LayerShape
    forward_ns: float
    backward_ns: float


def read_aicb_layers(path: str | Path) -> LayerTimes | None:
    """Per-layer times of one AICB/SimAI Megatron workload; None for a workload that is not
    a Megatron model this reader knows (ZeRO-3, collective micro-tests)."""
    p = Path(path)
    m = _NAME.search(p.name)
    if not m or m.group("model").lower() not in AICB_MODELS:
        return None
    kind, hidden, heads, ffn = AICB_MODELS[m.group("model").lower()]
    tp, mbs = int(m.group("tp")), int(m.group("mbs"))
    seen: dict[str, tuple[float, float, float]] = {}
    comm = 0
    for line in p.read_text("utf-8").splitlines()[2:]:
        f = line.split()
        if len(f) < 12 or f[0] not in _LAYER_ROWS or f[0] in seen:
            continue
        try:
            seen[f[0]] = (float(f[2]), float(f[5]), float(f[8]))
            for size, kind_ in ((f[4], f[3]), (f[7], f[6])):
                if kind_ in ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER") and int(size) > 0:
                    comm = max(comm, int(size))
        except ValueError:
            raise EchoError(f"{p.name}: layer row {f[0]!r} has a non-numeric time or size") from None
    if not seen or comm <= 0:
        raise EchoError(f"{p.name}: no Megatron layer rows with a tensor-parallel collective")
    seq = comm // (2 * mbs * hidden)
    if seq * 2 * mbs * hidden != comm:
        raise EchoError(f"{p.name}: TP collective of {comm} bytes is not seq x {mbs} x {hidden} x 2")
    shape = LayerShape(kind, hidden, heads, ffn, seq, mbs, tp, "bf16")
    fwd = sum(v[0] for v in seen.values())
    bwd = sum(v[1] + v[2] for v in seen.values())
    return LayerTimes(p.name, shape, fwd, bwd)


def layer_samples(lt: LayerTimes, peak_flops: float) -> tuple[list[Sample], list[Excluded]]:
    """A forward and a backward sample of one layer; the ones faster than ``peak_flops``
    allows are returned as excluded (and as samples with source ``layers-excluded``)."""
    from echo_et.models.compute.fit import sample_from_ops

    out, excl = [], []
    fa, fm = layer_forward(lt.shape)
    ba, bm = layer_backward(lt.shape)
    for direction, calls, ns in (("forward", fa + fm, lt.forward_ns), ("backward", ba + bm, lt.backward_ns)):
        s = sample_from_ops(((c, 1) for c in calls), ns, group=lt.file, source="layers",
                            label=f"{lt.file} {direction}")
        flops = sum(k.flops * n for k, n in s.items)
        if ns < flops / peak_flops * 1e9:
            excl.append(Excluded(s.label, f"{ns / 1e6:.3f} ms is faster than {flops:.3g} FLOPs at the data-sheet "
                                          f"peak ({flops / peak_flops * 1e3:.3f} ms)"))
            s = Sample(s.items, s.measured_ns, s.offset_ns, s.group, "layers-excluded", s.label)
        out.append(s)
    return out, excl


def aicb_files(folder: str | Path) -> list[Path]:
    base = Path(folder)
    if base.is_file():
        return [base]
    if not base.is_dir():
        raise EchoError(f"{base}: no such file or folder")
    return sorted(x for x in base.rglob("*.txt") if "_A100" in x.name and _NAME.search(x.name))
