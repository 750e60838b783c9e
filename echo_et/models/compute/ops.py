"""From an operator's name, input shapes and dtypes to the kernels it launches on a GPU.

Inputs are what the IR's compute/cpu payloads carry (the PyTorch profiler's "Input Dims" and
"Input type", as compact JSON): one entry per argument; a tensor is a list of ints with a
dtype such as ``"float"`` / ``"c10::BFloat16"``; a scalar or None is ``[]`` with ``"Scalar"`` /
``""``; a TensorList is a list of shapes with ``"TensorList"``. Optional node attributes:
``out_shapes`` (JSON list of output shapes, written by the meta-device tracer) and
``is_causal`` ("1"/"0") for attention.

Each operator family lists the kernels a CUDA build of PyTorch launches for it:

- GEMMs (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ...): 2*M*N*K FLOPs,
  the operands' and result's bytes;
- fused attention (``_scaled_dot_product_{flash,efficient,cudnn}_attention`` and their
  backward, ``_flash_attention_*``, ``_efficient_attention_*``, ``flash_attn::*``): 4*B*H*Sq*Sk*D
  FLOPs forward (half when causal), 2.5 times that backward (it recomputes the scores);
  the efficient-attention backward also launches the ``delta = sum(dO * O)`` kernels;
- memory-bound families (elementwise, reductions, norms, softmax, copies, fills, indexing,
  embedding backward, foreach / fused optimizer ops): bytes read and written;
- operators that launch nothing (views, reshapes, ``empty``, ``detach``...) cost nothing.

An operator not in the tables but with tensor inputs is priced as one elementwise kernel
and reported as *guessed* (see :class:`OpCost`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from echo_et.ir.collectives import C10D_PREFIXES, normalize_comm
from echo_et.models.compute import kernels as K
from echo_et.models.compute._dtypes import element_size, is_known, math_class

# How an operator was priced.
PRICED = "priced"          # a known operator with the shapes it needs
NO_WORK = "no_work"        # launches no GPU work
GUESSED = "guessed"        # unknown operator: one generic memory-bound kernel
NO_SHAPES = "no_shapes"    # known operator, shapes missing: one kernel's overhead only


@dataclass(frozen=True)
class OpCost:
    kernels: tuple[K.Kernel, ...]
    status: str


_NON_TENSOR = frozenset({"scalar", "scalarlist", "", "none", "genericlist", "device", "layout", "memoryformat",
                         "string", "bool?", "int[]", "symint", "symintlist", "scalartype"})


class Args:
    """An operator's recorded arguments."""

    __slots__ = ("shapes", "dtypes", "out_shapes")

    def __init__(self, shapes: list, dtypes: list, out_shapes: list | None = None):
        self.shapes = shapes
        self.dtypes = dtypes
        self.out_shapes = out_shapes or []

    def dtype(self, i: int) -> str:
        return str(self.dtypes[i]) if i < len(self.dtypes) and self.dtypes[i] is not None else ""

    def tensor(self, i: int) -> tuple[list[int], str] | None:
        """Argument ``i`` when it is a tensor: (shape, dtype)."""
        if i >= len(self.shapes):
            return None
        s, d = self.shapes[i], self.dtype(i)
        if not isinstance(s, list) or any(not isinstance(x, int) for x in s):
            return None
        if d.strip().lower() in _NON_TENSOR or d == "TensorList":
            return None
        if not is_known(d) and not s:
            return None
        return s, d

    def tensor_list(self, i: int) -> list[list[int]] | None:
        if i >= len(self.shapes):
            return None
        s = self.shapes[i]
        if isinstance(s, list) and s and all(isinstance(x, list) for x in s):
            return [x for x in s if all(isinstance(v, int) for v in x)]
        if isinstance(s, list) and not s and self.dtype(i) == "TensorList":
            return []
        return None

    def tensors(self) -> list[tuple[list[int], str]]:
        return [t for i in range(len(self.shapes)) if (t := self.tensor(i)) is not None]

    def first_dtype(self) -> str:
        for _, d in self.tensors():
            if is_known(d):
                return d
        return "float"


def numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def nbytes(t: tuple[list[int], str] | None) -> int:
    return 0 if t is None else numel(t[0]) * element_size(t[1])


def broadcast(shapes: list[list[int]]) -> list[int]:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        for i, v in enumerate(s, start=nd - len(s)):
            if v != 1:
                out[i] = v
    return out


# -- families -----------------------------------------------------------------------------------
def _gemm_bytes(a, b, out_elems: int, out_size: int, extra: int = 0) -> int:
    return nbytes(a) + nbytes(b) + out_elems * out_size + extra


def _mm(a: Args, ia: int = 0, ib: int = 1, bias: int | None = None) -> list[K.Kernel] | None:
    x, y = a.tensor(ia), a.tensor(ib)
    if x is None or y is None or len(x[0]) != 2 or len(y[0]) != 2:
        return None
    (m, k), (_, n) = x[0], y[0]
    c = a.tensor(bias) if bias is not None else None
    s = element_size(x[1])
    return [K.gemm(m, n, k, 1, math_class(x[1]), _gemm_bytes(x, y, m * n, s, nbytes(c)),
                   extra_flops=m * n if c is not None else 0)]


def _bmm(a: Args, ia: int = 0, ib: int = 1, bias: int | None = None) -> list[K.Kernel] | None:
    x, y = a.tensor(ia), a.tensor(ib)
    if x is None or y is None or len(x[0]) != 3 or len(y[0]) != 3:
        return None
    (bt, m, k), (_, _, n) = x[0], y[0]
    c = a.tensor(bias) if bias is not None else None
    s = element_size(x[1])
    return [K.gemm(m, n, k, bt, math_class(x[1]), _gemm_bytes(x, y, bt * m * n, s, nbytes(c)),
                   extra_flops=bt * m * n if c is not None else 0)]


def _matmul(a: Args) -> list[K.Kernel] | None:
    """torch.matmul's dispatch: folds leading dims of a 2-D right operand into M, else batches."""
    x, y = a.tensor(0), a.tensor(1)
    if x is None or y is None or not x[0] or not y[0]:
        return None
    xs, ys = list(x[0]), list(y[0])
    if len(xs) == 1:
        xs = [1, xs[0]]
    if len(ys) == 1:
        ys = [ys[0], 1]
    m, k, n = xs[-2], xs[-1], ys[-1]
    s = element_size(x[1])
    if len(ys) == 2:
        rows = numel(xs[:-1])
        return [K.gemm(rows, n, k, 1, math_class(x[1]), (rows * k + k * n + rows * n) * s)]
    batch = numel(broadcast([xs[:-2], ys[:-2]]))
    return [K.gemm(m, n, k, batch, math_class(x[1]), batch * (m * k + k * n + m * n) * s)]


def _linear(a: Args) -> list[K.Kernel] | None:
    x, w = a.tensor(0), a.tensor(1)
    if x is None or w is None or len(w[0]) != 2 or not x[0]:
        return None
    n, k = w[0]
    rows = numel(x[0][:-1])
    b = a.tensor(2)
    s = element_size(x[1])
    return [K.gemm(rows, n, k, 1, math_class(x[1]), nbytes(x) + nbytes(w) + nbytes(b) + rows * n * s,
                   extra_flops=rows * n if b is not None else 0)]


def _mv(a: Args) -> list[K.Kernel] | None:
    x, v = a.tensor(0), a.tensor(1)
    if x is None or v is None or len(x[0]) != 2:
        return None
    m, k = x[0]
    return [K.gemm(m, 1, k, 1, math_class(x[1]), nbytes(x) + nbytes(v) + m * element_size(x[1]))]


# Attention: (q index, layout) per operator; layout "bhsd" (SDPA) or "bshd" (flash / xformers).
_ATTN_FWD = {
    "aten::_scaled_dot_product_flash_attention": (0, "bhsd"),
    "aten::_scaled_dot_product_efficient_attention": (0, "bhsd"),
    "aten::_scaled_dot_product_cudnn_attention": (0, "bhsd"),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (0, "bhsd"),
    "aten::_scaled_dot_product_fused_attention_overrideable": (0, "bhsd"),
    "aten::scaled_dot_product_attention": (0, "bhsd"),
    "aten::_flash_attention_forward": (0, "bshd"),
    "aten::_efficient_attention_forward": (0, "bshd"),
    "flash_attn::_flash_attn_forward": (0, "bshd"),
    "flash_attn::_flash_attn_varlen_forward": (0, "bshd"),
}
# Backward: the query is the second argument (the first is the output gradient).
_ATTN_BWD = {
    "aten::_scaled_dot_product_flash_attention_backward": (1, "bhsd"),
    "aten::_scaled_dot_product_efficient_attention_backward": (1, "bhsd"),
    "aten::_scaled_dot_product_cudnn_attention_backward": (1, "bhsd"),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (1, "bhsd"),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": (1, "bhsd"),
    "aten::_flash_attention_backward": (1, "bshd"),
    "aten::_efficient_attention_backward": (1, "bshd"),
    "flash_attn::_flash_attn_backward": (1, "bshd"),
    "flash_attn::_flash_attn_varlen_backward": (1, "bshd"),
}
# Efficient-attention backward precomputes delta = sum(dO * O, -1) with aten kernels.
_DELTA_KERNELS = frozenset({"aten::_scaled_dot_product_efficient_attention_backward",
                            "aten::_efficient_attention_backward"})
BWD_FLOP_RATIO = 2.5   # backward = 5 matmuls (incl. recomputing S) vs 2 forward


def _attention(op: str, a: Args, causal: bool, backward: bool) -> list[K.Kernel] | None:
    qi, layout = (_ATTN_BWD if backward else _ATTN_FWD)[op]
    q, kt = a.tensor(qi), a.tensor(qi + 1)
    if q is None or kt is None or len(q[0]) != 4 or len(kt[0]) != 4:
        return None
    if layout == "bhsd":
        b, h, sq, d = q[0]
        sk = kt[0][2]
    else:
        b, sq, h, d = q[0]
        sk = kt[0][1]
    vt = a.tensor(qi + 2)
    dv = vt[0][-1] if vt is not None and len(vt[0]) == 4 else d
    frac = 1.0
    if causal:  # keys at or before each query: about half the score matrix when sq == sk
        frac = max(0.0, 1.0 - sq / (2.0 * sk)) if sk >= sq else 0.5 * sk / sq
    flops = 2.0 * b * h * sq * sk * (d + dv) * frac
    s = element_size(q[1])
    io = nbytes(q) + nbytes(kt) + nbytes(vt) + b * h * sq * dv * s + b * h * sq * 4  # q, k, v, out, logsumexp
    mc = math_class(q[1])
    if not backward:
        return [K.Kernel(K.ATTN_FWD, "attention_io", flops=flops, bytes=io, math=mc, m=sq, n=sk, k=d, batch=b * h)]
    # reads dO too, writes dq, dk, dv
    bwd_io = io + b * h * sq * dv * s + nbytes(q) + nbytes(kt) + nbytes(vt)
    out = [K.Kernel(K.ATTN_BWD, "attention_io", flops=flops * BWD_FLOP_RATIO, bytes=bwd_io, math=mc,
                    m=sq, n=sk, k=d, batch=b * h)]
    if op in _DELTA_KERNELS:
        od = b * h * sq * dv
        out = [K.mem("elementwise", od * (2 * s + 4)), K.mem("reduction", od * 4 + b * h * sq * 4),
               K.mem("copy", b * h * sq * 8)] + out
    return out


def _elementwise(a: Args, cls: str = "elementwise", inplace: bool = False, out_size: int | None = None
                 ) -> list[K.Kernel] | None:
    ts = a.tensors()
    if not ts:
        return None
    shapes = [t[0] for t in ts]
    out = a.out_shapes[0] if a.out_shapes and isinstance(a.out_shapes[0], list) \
        and all(isinstance(v, int) for v in a.out_shapes[0]) else broadcast(shapes)
    osz = out_size if out_size is not None else element_size(ts[0][1])
    read = sum(nbytes(t) for t in ts)
    write = numel(out) * osz
    return [K.mem(cls, read + write, flops=numel(out))]


def _reduction(a: Args) -> list[K.Kernel] | None:
    t = a.tensor(0)
    if t is None:
        return None
    write = 0
    if a.out_shapes and isinstance(a.out_shapes[0], list) and all(isinstance(v, int) for v in a.out_shapes[0]):
        write = numel(a.out_shapes[0]) * element_size(t[1])
    return [K.mem("reduction", nbytes(t) + write, flops=numel(t[0]))]


def _fill(a: Args) -> list[K.Kernel] | None:
    t = a.tensor(0)
    if t is None:
        return _created(a)
    return [K.mem("fill", nbytes(t))]


def _created(a: Args) -> list[K.Kernel] | None:
    """A creation op (zeros, ones, full, arange, rand...): writes its output."""
    if a.out_shapes and isinstance(a.out_shapes[0], list) and all(isinstance(v, int) for v in a.out_shapes[0]):
        return [K.mem("fill", numel(a.out_shapes[0]) * element_size(a.first_dtype()))]
    t = a.tensor(0)
    if t is not None:  # *_like ops
        return [K.mem("fill", nbytes(t))]
    return None


def _copy(a: Args, src: int = 0, dst: int | None = None) -> list[K.Kernel] | None:
    s = a.tensor(src)
    if s is None:
        return None
    d = a.tensor(dst) if dst is not None else None
    return [K.mem("copy", nbytes(s) + (nbytes(d) if d is not None else nbytes(s)))]


def _cat(a: Args) -> list[K.Kernel] | None:
    parts = a.tensor_list(0)
    if not parts:
        return None
    size = element_size(a.dtype(1) if is_known(a.dtype(1)) else "float")
    total = sum(numel(p) for p in parts) * size
    return [K.mem("copy", 2 * total)]


def _softmax(a: Args, backward: bool) -> list[K.Kernel] | None:
    t = a.tensor(0)
    if t is None:
        return None
    n = nbytes(t)
    return [K.mem("softmax", 3 * n if backward else 2 * n, flops=5 * numel(t[0]))]


def _causal_softmax(a: Args, backward: bool) -> list[K.Kernel] | None:
    """Megatron's ``scaled_upper_triang_masked_softmax`` kernels: a query row ``i`` of an
    ``[.., s, s]`` score tensor loads only its ``i + 1`` unmasked keys (the forward its scores,
    the backward the gradient and the probabilities) and stores the whole row (zeros above the
    diagonal); so ``(s + 1) / 2s`` of each input is read, all of the output written."""
    t = a.tensor(0)
    if t is None:
        return None
    n = nbytes(t)
    s = t[0][-1] if t[0] else 1
    read = n * (s + 1) / (2 * s)
    inputs = 2 if backward else 1
    return [K.mem("softmax", inputs * read + n, flops=5 * numel(t[0]) * (s + 1) / (2 * s))]


def _layer_norm(a: Args, backward: bool, rms: bool = False) -> list[K.Kernel] | None:
    x = a.tensor(1 if backward else 0)
    if x is None:
        return None
    n = nbytes(x)
    w = a.tensor(5 if backward and not rms else (4 if backward else 2))
    stats = (numel(x[0]) // max(1, x[0][-1])) * 4 * (1 if rms else 2) if x[0] else 0
    if not backward:
        return [K.mem("norm", 2 * n + stats + nbytes(w), flops=8 * numel(x[0]))]
    dx = K.mem("norm", 3 * n + stats + nbytes(w), flops=10 * numel(x[0]))
    wgrad = K.mem("norm_param_grad", 2 * n + 2 * nbytes(w), flops=4 * numel(x[0]))
    return [dx, wgrad]


def _dropout(a: Args, backward: bool) -> list[K.Kernel] | None:
    t = a.tensor(0)
    if t is None:
        return None
    n, s = numel(t[0]), element_size(t[1])
    return [K.mem("elementwise", n * (2 * s + 1), flops=n)]


def _index_rows(a: Args, table: int, index: int) -> list[K.Kernel] | None:
    w, idx = a.tensor(table), a.tensor(index)
    if w is None or idx is None or not w[0]:
        return None
    rows = numel(idx[0])
    row = numel(w[0][1:]) * element_size(w[1])
    return [K.mem("index", 2 * rows * row + nbytes(idx))]


def _gather(a: Args, index: int = 2) -> list[K.Kernel] | None:
    t, idx = a.tensor(0), a.tensor(index)
    if t is None or idx is None:
        return None
    n = numel(idx[0])
    return [K.mem("index", n * (2 * element_size(t[1]) + 8))]


# Radix sort of 64-bit keys plus segment bookkeeping: the fixed kernels of the sort path.
EMBEDDING_BWD_SMALL_KERNELS = 18
EMBEDDING_FEATURE_MAX_INDICES = 3072   # PyTorch uses the one-kernel path up to this many indices


def _embedding_bwd(a: Args) -> list[K.Kernel] | None:
    g, idx = a.tensor(0), a.tensor(1)
    if g is None or idx is None or not g[0]:
        return None
    n, hidden, s = numel(idx[0]), g[0][-1], element_size(g[1])
    table = 0
    if a.out_shapes and isinstance(a.out_shapes[0], list) and all(isinstance(v, int) for v in a.out_shapes[0]):
        table = numel(a.out_shapes[0]) * s
    out = [K.mem("fill", table)] if table else []
    if n <= EMBEDDING_FEATURE_MAX_INDICES:
        return out + [K.mem("embedding_bwd", n * hidden * s * 2 + n * 8)]
    small = [K.mem("index", n * 8 * 4) for _ in range(EMBEDDING_BWD_SMALL_KERNELS)]
    return small + out + [K.mem("embedding_bwd", n * hidden * s * 2 + n * 8),
                          K.mem("embedding_bwd", n * hidden * s + n * 8)]


def _nll_loss(a: Args, backward: bool) -> list[K.Kernel] | None:
    x = a.tensor(1 if backward else 0)
    if x is None:
        return None
    rows = numel(x[0][:-1]) if len(x[0]) > 1 else 1
    if backward:
        return [K.mem("fill", nbytes(x)), K.mem("index", rows * (element_size(x[1]) + 8))]
    return [K.mem("index", rows * (element_size(x[1]) + 8))]


# multi_tensor_apply: at most 110 tensors and 320 blocks of 65536 elements per launch
FOREACH_TENSORS_PER_LAUNCH = 110
FOREACH_ELEMS_PER_LAUNCH = 320 * 65536


def _foreach(op: str, a: Args) -> list[K.Kernel] | None:
    lists = [ls for i in range(len(a.shapes)) if (ls := a.tensor_list(i)) is not None]
    if not lists or not lists[0]:
        return None if not lists else []
    n_tensors = len(lists[0])
    elems = sum(numel(s) for s in lists[0])
    size = 4
    for i in range(len(a.dtypes)):
        if is_known(a.dtype(i)):
            size = element_size(a.dtype(i))
            break
    read = sum(sum(numel(s) for s in ls) for ls in lists) * size
    if op.startswith(("aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad")):
        write = sum(sum(numel(s) for s in ls) for ls in lists[:4 if "adam" in op else 2]) * size
        write -= elems * size if "adam" in op else 0  # grads are read, not written
    elif op in ("aten::_foreach_norm",):
        write = n_tensors * 4
    else:
        write = elems * size
    launches = max(1, math.ceil(n_tensors / FOREACH_TENSORS_PER_LAUNCH), math.ceil(elems / FOREACH_ELEMS_PER_LAUNCH))
    per = (read + write) / launches
    cls = "reduction" if op == "aten::_foreach_norm" else "optimizer"
    return [K.mem(cls, per, flops=elems / launches) for _ in range(launches)]


# -- tables -------------------------------------------------------------------------------------
NO_WORK_OPS = frozenset(f"aten::{n}" for n in (
    "view", "reshape", "_reshape_alias", "_unsafe_view", "view_as", "as_strided", "transpose", "transpose_", "t",
    "t_", "permute", "expand", "expand_as", "squeeze", "squeeze_", "unsqueeze", "unsqueeze_", "slice", "select",
    "split", "split_with_sizes", "chunk", "narrow", "detach", "detach_", "alias", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "resize_", "unbind", "lift_fresh", "numel", "size",
    "stride", "is_same_size", "_has_compatible_shallow_copy_type", "set_", "result_type", "broadcast_tensors",
    "unflatten", "flatten", "movedim", "diagonal", "view_as_real", "view_as_complex", "real", "imag",
    "contiguous", "to", "type_as", "_unsafe_split", "unsafe_split", "unsafe_chunk", "tensor_split",
    "record_stream", "is_nonzero", "dim", "retain_grad", "requires_grad_", "_version", "clone_",
    "lift", "lift_fresh_copy_", "_conj", "conj", "_neg_view", "resolve_conj", "resolve_neg", "unfold",
    "align_as", "rename", "refine_names", "output_nr", "is_contiguous", "storage_offset",
))
GEMM_OPS = {
    "aten::mm": lambda a: _mm(a),
    "aten::addmm": lambda a: _mm(a, 1, 2, bias=0),
    "aten::_addmm_activation": lambda a: _mm(a, 1, 2, bias=0),
    "aten::bmm": lambda a: _bmm(a),
    "aten::baddbmm": lambda a: _bmm(a, 1, 2, bias=0),
    "aten::matmul": _matmul,
    "aten::linear": _linear,
    "aten::mv": _mv,
    "aten::addmv": lambda a: _mv(Args(a.shapes[1:], a.dtypes[1:])),
    # Megatron's gradient-accumulation fusion (echo_et.workloads.fused)
    "echo::wgrad_gemm_accum_fp32": lambda a: _wgrad_accum(a),
}
MEMORY_OPS = {
    "aten::_softmax": lambda a: _softmax(a, False),
    "aten::softmax": lambda a: _softmax(a, False),
    "aten::_log_softmax": lambda a: _softmax(a, False),
    "aten::log_softmax": lambda a: _softmax(a, False),
    "aten::_safe_softmax": lambda a: _softmax(a, False),
    "aten::_masked_softmax": lambda a: _softmax(a, False),
    "aten::_softmax_backward_data": lambda a: _softmax(a, True),
    "aten::_log_softmax_backward_data": lambda a: _softmax(a, True),
    "aten::_masked_softmax_backward": lambda a: _softmax(a, True),
    "aten::native_layer_norm": lambda a: _layer_norm(a, False),
    "aten::layer_norm": lambda a: _layer_norm(a, False),
    "aten::native_layer_norm_backward": lambda a: _layer_norm(a, True),
    "aten::_fused_rms_norm": lambda a: _layer_norm(a, False, rms=True),
    "aten::rms_norm": lambda a: _layer_norm(a, False, rms=True),
    "aten::_fused_rms_norm_backward": lambda a: _layer_norm(a, True, rms=True),
    "aten::native_dropout": lambda a: _dropout(a, False),
    "aten::native_dropout_backward": lambda a: _dropout(a, True),
    "aten::dropout": lambda a: _dropout(a, False),
    "aten::embedding": lambda a: _index_rows(a, 0, 1),
    "aten::index_select": lambda a: _index_rows(a, 0, 2),
    "aten::embedding_dense_backward": _embedding_bwd,
    "aten::embedding_backward": _embedding_bwd,
    "aten::gather": lambda a: _gather(a),
    "aten::scatter": lambda a: _gather(a),
    "aten::scatter_": lambda a: _gather(a),
    "aten::scatter_add": lambda a: _gather(a),
    "aten::scatter_add_": lambda a: _gather(a),
    "aten::nll_loss_forward": lambda a: _nll_loss(a, False),
    "aten::nll_loss2d_forward": lambda a: _nll_loss(a, False),
    "aten::nll_loss": lambda a: _nll_loss(a, False),
    "aten::nll_loss_nd": lambda a: _nll_loss(a, False),
    "aten::nll_loss_backward": lambda a: _nll_loss(a, True),
    "aten::nll_loss2d_backward": lambda a: _nll_loss(a, True),
    "aten::copy_": lambda a: _copy(a, 1, 0),
    "aten::_to_copy": lambda a: _copy(a),
    "aten::clone": lambda a: _copy(a),
    "aten::_copy_from": lambda a: _copy(a),
    "aten::_copy_from_and_resize": lambda a: _copy(a),
    "aten::cat": _cat,
    "aten::_cat": _cat,
    "aten::stack": _cat,
    "aten::fill_": _fill,
    "aten::zero_": _fill,
    "aten::normal_": _fill,
    "aten::uniform_": _fill,
    "aten::bernoulli_": _fill,
    "aten::random_": _fill,
    "aten::zeros": _created,
    "aten::ones": _created,
    "aten::full": _created,
    "aten::zeros_like": _created,
    "aten::ones_like": _created,
    "aten::full_like": _created,
    "aten::new_zeros": _created,
    "aten::new_ones": _created,
    "aten::new_full": _created,
    "aten::arange": _created,
    "aten::rand": _created,
    "aten::randn": _created,
    "aten::rand_like": _created,
    "aten::randn_like": _created,
    "aten::randperm": _created,
    "aten::scalar_tensor": _created,
}
# Megatron's fused kernels as the meta-device tracer records them (echo_et.workloads.fused):
# one memory-bound kernel each, reading the inputs and writing the outputs once.
MEMORY_OPS.update({
    "echo::scaled_upper_triang_masked_softmax": lambda a: _causal_softmax(a, False),
    "echo::scaled_upper_triang_masked_softmax_backward": lambda a: _causal_softmax(a, True),
    "echo::bias_gelu": lambda a: _elementwise(a),
    "echo::bias_gelu_backward": lambda a: _elementwise(a),
    "echo::bias_dropout_add": lambda a: _with_mask(_elementwise(a)),
    "echo::bias_dropout_add_backward": lambda a: _elementwise(a),
    # the llama architecture's (Megatron's fused RMSNorm, SwiGLU and rotary embedding)
    "echo::rms_norm": lambda a: _rms_norm(a, False),
    "echo::rms_norm_backward": lambda a: _rms_norm(a, True),
    "echo::swiglu": lambda a: _swiglu(a, False),
    "echo::swiglu_backward": lambda a: _swiglu(a, True),
    "echo::rotary_pos_emb": lambda a: _elementwise(a),
    "echo::rotary_pos_emb_backward": lambda a: _elementwise(a),
})


def _wgrad_accum(a: Args) -> list[K.Kernel] | None:
    """``echo::wgrad_gemm_accum_fp32(x [rows, in], grad [rows, out], main_grad [out, in])``:
    the weight-gradient GEMM reading and writing its fp32 accumulator (C = C + grad^T x)."""
    x, g, c = a.tensor(0), a.tensor(1), a.tensor(2)
    if x is None or g is None or c is None or len(x[0]) != 2 or len(g[0]) != 2:
        return None
    (rows, n), (_, m) = x[0], g[0]
    return [K.gemm(m, n, rows, 1, math_class(x[1]), nbytes(x) + nbytes(g) + 2 * nbytes(c), extra_flops=m * n)]


def _rms_norm(a: Args, backward: bool) -> list[K.Kernel] | None:
    """``echo::rms_norm(x, weight, eps)`` and its backward ``(grad, x, weight, eps)``: as
    ``aten::_fused_rms_norm`` (one fp32 statistic per row)."""
    x, w = (a.tensor(1), a.tensor(2)) if backward else (a.tensor(0), a.tensor(1))
    if x is None or w is None:
        return None
    n = nbytes(x)
    stats = (numel(x[0]) // max(1, x[0][-1])) * 4 if x[0] else 0
    if not backward:
        return [K.mem("norm", 2 * n + stats + nbytes(w), flops=8 * numel(x[0]))]
    return [K.mem("norm", 3 * n + stats + nbytes(w), flops=10 * numel(x[0])),
            K.mem("norm_param_grad", 2 * n + 2 * nbytes(w), flops=4 * numel(x[0]))]


def _swiglu(a: Args, backward: bool) -> list[K.Kernel] | None:
    """``echo::swiglu(x)``: reads the projection ``x`` (both halves), writes half of it;
    the backward reads the output gradient and ``x`` and writes the gradient of ``x``."""
    x = a.tensor(1 if backward else 0)
    if x is None:
        return None
    n, half = nbytes(x), nbytes(x) // 2
    if not backward:
        return [K.mem("elementwise", n + half, flops=4 * numel(x[0]) // 2)]
    return [K.mem("elementwise", half + 2 * n, flops=8 * numel(x[0]) // 2)]


def _with_mask(ks: list[K.Kernel] | None) -> list[K.Kernel] | None:
    """Also writes a one-byte keep mask per output element (dropout)."""
    if not ks:
        return ks
    k = ks[0]
    return [K.mem(k.cls, k.bytes + k.flops, flops=k.flops)]


REDUCTION_OPS = frozenset(f"aten::{n}" for n in (
    "sum", "mean", "amax", "amin", "max", "min", "norm", "linalg_vector_norm", "std", "var", "var_mean", "std_mean",
    "prod", "all", "any", "argmax", "argmin", "logsumexp", "nansum", "count_nonzero", "cumsum", "cumprod",
    "aminmax", "_local_scalar_dense", "item", "sum_to_size", "topk", "sort", "nonzero", "unique", "_unique2",
))
ELEMENTWISE_INPLACE_LIKE = frozenset(f"aten::{n}" for n in ("masked_fill_", "index_put_", "index_add_", "index_copy_",
                                                             "masked_scatter_", "_index_put_impl_"))


def normalise(op: str) -> str:
    """``aten::add.Tensor`` -> ``aten::add``; other names unchanged."""
    if op.startswith("aten::"):
        return op.split(".", 1)[0]
    return op


def is_communication(op: str) -> bool:
    return op.startswith(("c10d::", "nccl:", "record_param_comms", "_c10d_functional::", "c10d_functional::"))


@lru_cache(maxsize=200_000)
def op_cost(op: str, shapes: str, dtypes: str, out_shapes: str = "", causal: bool = True) -> OpCost:
    """The kernels of one operator (cached: graphs repeat the same operators)."""
    name = normalise(op)
    if name in NO_WORK_OPS or is_communication(name):
        return OpCost((), NO_WORK)
    try:
        sh = json.loads(shapes) if shapes else []
        dt = json.loads(dtypes) if dtypes else []
        osh = json.loads(out_shapes) if out_shapes else []
    except (json.JSONDecodeError, TypeError):
        sh, dt, osh = [], [], []
    if not isinstance(sh, list):
        sh = []
    if not isinstance(dt, list):
        dt = []
    a = Args(sh, dt, osh if isinstance(osh, list) else [])
    ks: list[K.Kernel] | None
    known = True
    if name in GEMM_OPS:
        ks = GEMM_OPS[name](a)
    elif name in _ATTN_FWD:
        ks = _attention(name, a, causal, backward=False)
    elif name in _ATTN_BWD:
        ks = _attention(name, a, causal, backward=True)
    elif name in MEMORY_OPS:
        ks = MEMORY_OPS[name](a)
    elif name in REDUCTION_OPS:
        ks = _reduction(a)
    elif name.startswith(("aten::_foreach_", "aten::_fused_adam", "aten::_fused_sgd", "aten::_fused_adagrad",
                          "aten::_amp_foreach")):
        ks = _foreach(name, a)
        if ks == []:
            return OpCost((), NO_WORK)
    elif name in ELEMENTWISE_INPLACE_LIKE:
        ks = _elementwise(a)
    elif name.startswith("aten::") and _base(name[6:]) in _ELEMENTWISE_NAMES:
        ks = _elementwise(a, out_size=1 if _base(name[6:]) in _PREDICATES else None)
    else:
        known = False
        ks = _elementwise(a, cls="other")
        if ks is None:
            ks = [K.mem("other", 0.0)]
        return OpCost(tuple(ks), GUESSED)
    if ks is None:
        return OpCost((K.mem("other", 0.0),), NO_SHAPES if known else GUESSED)
    return OpCost(tuple(ks), PRICED)


def _base(name: str) -> str:
    """``mul_`` -> ``mul`` (in-place variants cost as much); ``__or__`` stays."""
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


_PREDICATES = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
                         "logical_xor", "isnan", "isinf", "isfinite", "isneginf", "isposinf", "isclose"})
_ELEMENTWISE_NAMES = _PREDICATES | frozenset({
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "neg", "abs", "exp",
    "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "pow", "reciprocal", "square", "sign", "sgn",
    "sin", "cos", "tan", "tanh", "sigmoid", "erf", "erfc", "erfinv", "relu", "relu6", "gelu", "silu", "mish", "elu",
    "selu", "celu", "leaky_relu", "hardtanh", "hardswish", "hardsigmoid", "softplus", "logsigmoid", "threshold",
    "threshold_backward", "gelu_backward", "silu_backward", "tanh_backward", "sigmoid_backward", "elu_backward",
    "leaky_relu_backward", "hardtanh_backward", "hardswish_backward", "hardsigmoid_backward", "softplus_backward",
    "mish_backward", "where", "masked_fill", "clamp", "clamp_min", "clamp_max", "clip", "minimum", "maximum",
    "fmin", "fmax", "lerp", "addcmul", "addcdiv", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
    "__and__", "__or__", "__xor__", "__iand__", "__ior__", "floor", "ceil", "round", "trunc", "frac",
    "nan_to_num", "masked_select", "tril", "triu", "flip", "roll", "repeat", "repeat_interleave",
    "constant_pad_nd", "pad", "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "atan2", "hypot",
    "xlogy", "polar", "mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward",
    "binary_cross_entropy", "binary_cross_entropy_with_logits", "binary_cross_entropy_backward", "glu",
    "glu_backward", "masked_scale", "_masked_scale", "fused_dropout", "_fused_dropout", "bucketize", "one_hot",
    "index", "index_put", "index_add", "index_copy", "masked_scatter", "_index_put_impl", "narrow_copy",
    "slice_backward", "select_backward", "index_select_backward", "expand_copy", "permute_copy", "transpose_copy",
    "view_copy", "t_copy", "unsqueeze_copy", "squeeze_copy", "split_with_sizes_copy", "slice_copy", "alias_copy",
    "_unsafe_index", "_unsafe_index_put", "heaviside", "logit", "special_erfcx", "sinh", "cosh", "asin",
    "acos", "atan", "asinh", "acosh", "atanh", "deg2rad", "rad2deg", "sigmoid_", "_softmax_backward",
    "_weight_norm", "complex", "angle", "conj_physical", "positive", "fill", "copy",
})


def is_comm_op(op: str) -> bool:
    """A host op that issues communication (``c10d::all_reduce``, ``c10d::send``): its launch
    costs the host ``host_collective_ns``, not an operator's ``host_launch_ns``."""
    return op.startswith(C10D_PREFIXES) and normalize_comm(op) is not None
