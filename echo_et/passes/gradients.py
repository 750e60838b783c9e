"""Gradients as DDP sees them: which host op makes each one ready, its size, and DDP's buckets.

Shared by :mod:`echo_et.passes.inject` (data parallelism for a single-GPU trace) and
:mod:`echo_et.passes.pipeline` (re-staged pipelines rebuild their gradient buckets).
"""

from __future__ import annotations

import ast
import bisect
import json
import math
from dataclasses import dataclass

from echo_et.ir.dtypes import dtype_size
from echo_et.ir.schema import pb

ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
OPTIMIZER_PREFIX = "Optimizer.step"     # PyTorch's record_function around an optimizer's step
EVALUATE_PREFIX = "autograd::engine::evaluate_function: "
PROFILER_STEP_PREFIX = "ProfilerStep#"   # torch.profiler's step marker, on the training loop's thread


@dataclass
class Gradient:
    node: pb.Node          # the host op at which the gradient is ready
    nbytes: int
    dtype: str


# -- reading the trace ----------------------------------------------------------------------
def _parse_list(text: str) -> list:
    if not text:
        return []
    try:
        v = json.loads(text)
    except ValueError:
        try:
            v = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return [s.strip() for s in text.split(",")] if "[" not in text else []
    return v if isinstance(v, list) else [v]


def grad_bytes(node: pb.Node) -> tuple[int, str] | None:
    """Bytes and dtype of the gradient an AccumulateGrad op receives, from its first input."""
    shapes = _parse_list(node.cpu.shapes) if node.HasField("cpu") else []
    dtypes = _parse_list(node.cpu.dtypes) if node.HasField("cpu") else []
    if not shapes or not isinstance(shapes[0], list):
        return None
    dims = shapes[0]
    if not all(isinstance(d, int) for d in dims):
        return None
    dtype = _dtype_name(str(dtypes[0])) if dtypes else ""
    size = dtype_size(dtype)
    if size is None:
        return None
    return math.prod(dims) * size, dtype


def undefined_input(node: pb.Node) -> bool:
    """Whether an op's first input is recorded as no dense tensor: no dims and no element
    type (Kineto's record of a sparse or undefined tensor: dtype ""; the host ET's:
    ``Tensor(nullptr (uninitialized))``). A dense scalar has no dims but a dtype."""
    shapes = _parse_list(node.cpu.shapes) if node.HasField("cpu") else []
    dtypes = _parse_list(node.cpu.dtypes) if node.HasField("cpu") else []
    if not shapes or shapes[0] != []:
        return False
    return not dtypes or dtype_size(_dtype_name(str(dtypes[0]))) is None


INPLACE_ADD = "aten::add_"
FUSED_WGRAD_ACCUMULATE = "echo::wgrad_gemm_accum_fp32"   # (x, grad, main_grad): writes main_grad


def accumulated_bytes(node: pb.Node) -> int:
    """Bytes of the buffer an in-place accumulation writes, else 0: an ``aten::add_`` of a
    same-shaped tensor, or the weight-gradient GEMM that accumulates into ``main_grad``
    (gradient-accumulation fusion). Autograd accumulates a gradient into a parameter's
    preset ``grad`` this way, and Megatron's hook adds it into the fp32 ``main_grad``; other
    in-place adds count too, so this weighs pieces of a backward against each other rather
    than sizing gradients."""
    payload = node.cpu if node.HasField("cpu") else node.compute if node.HasField("compute") else None
    if payload is None:
        return 0
    name = payload.op or node.name
    shapes, dtypes = _parse_list(payload.shapes), _parse_list(payload.dtypes)
    if name == FUSED_WGRAD_ACCUMULATE:
        target, dtype = (shapes[2], dtypes[2]) if len(shapes) > 2 and len(dtypes) > 2 else (None, None)
    elif name == INPLACE_ADD and len(shapes) >= 2 and dtypes and shapes[0] == shapes[1]:
        target, dtype = shapes[0], dtypes[0]
    else:
        return 0
    if not isinstance(target, list) or not all(isinstance(d, int) for d in target):
        return 0
    return math.prod(target) * (dtype_size(_dtype_name(str(dtype))) or 0)


def _dtype_name(text: str) -> str:
    """'Tensor(float)' (host ET) -> 'float' (Kineto's spelling)."""
    text = text.strip()
    if text.startswith("Tensor(") and text.endswith(")"):
        text = text[len("Tensor("):-1]
    return text


def bucket_gradients(grads: list[Gradient], first_cap: int, cap: int) -> list[list[Gradient]]:
    """DDP's bucket assignment over gradients in ready order (one open bucket per dtype)."""
    buckets: list[list[Gradient]] = []
    open_: dict[str, tuple[list[Gradient], int]] = {}
    closed: dict[str, int] = {}
    for g in grads:
        members, size = open_.get(g.dtype, ([], 0))
        members.append(g)
        size += g.nbytes
        limit = cap if closed.get(g.dtype) else first_cap
        if size >= limit:
            buckets.append(members)
            closed[g.dtype] = closed.get(g.dtype, 0) + 1
            open_.pop(g.dtype, None)
        else:
            open_[g.dtype] = (members, size)
    # Buckets still open at the end are reduced when their last gradient is ready.
    buckets.extend(m for m, _ in open_.values())
    buckets.sort(key=lambda b: (b[-1].node.start_ns + b[-1].node.duration_ns, b[-1].node.id))
    return buckets


def last_backward(accs: list[pb.Node], host: list[pb.Node]) -> list[pb.Node]:
    """The AccumulateGrad ops (in ready order) of the step's last backward pass.

    With gradient accumulation every micro-batch's backward accumulates each parameter once,
    and DDP (under ``no_sync`` until then) reduces during the last one. A traced micro-batch
    annotation tells the passes apart. Without it, a backward pass ends where a forward op
    starts before the next AccumulateGrad: a host op outside autograd's engine (neither one
    of its ops nor inside one), on the thread that marks the profiler's steps when one does.
    The passes are kept apart only when each accumulates the same gradients, in the same
    order (two backward calls over different parameters are one step's gradients, all of
    them kept)."""
    tagged = [a for a in accs if a.annotations.HasField("microbatch")]
    if tagged:
        last = max(a.annotations.microbatch for a in tagged)
        return [a for a in tagged if a.annotations.microbatch == last]
    if len(accs) < 2:
        return accs
    # the forward runs on the training loop's thread (the one that marks the profiler's
    # steps); another thread's ops (a data loader's) say nothing about the backward
    main = {n.stream for n in host if op_name(n).startswith(PROFILER_STEP_PREFIX)}
    by_id = {n.id: n for n in host}
    parent = {n.id: next((d.id for d in n.deps if d.kind == pb.DEP_CONTROL), None) for n in host}
    autograd: dict[int, bool] = {}

    def in_autograd(i: int | None) -> bool:
        chain = []
        while i is not None and i in by_id and i not in autograd:
            chain.append(i)
            i = parent[i]
        known = autograd.get(i, False) if i is not None else False
        for j in reversed(chain):
            known = known or _autograd_op(by_id[j])
            autograd[j] = known
        return known

    forward = sorted(n.start_ns for n in host if (not main or n.stream in main) and not in_autograd(n.id))
    passes: list[list[pb.Node]] = [[accs[0]]]
    for prev, a in zip(accs, accs[1:], strict=False):
        lo = prev.start_ns + prev.duration_ns
        i = bisect.bisect_right(forward, lo)
        if i < len(forward) and forward[i] < a.start_ns:
            passes.append([])
        passes[-1].append(a)
    shapes = [[(a.cpu.shapes, a.cpu.dtypes) for a in p] for p in passes]
    if len(passes) > 1 and all(s == shapes[0] for s in shapes):
        return passes[-1]
    return accs


def _autograd_op(n: pb.Node) -> bool:
    return op_name(n).startswith((EVALUATE_PREFIX, "autograd::engine", ACCUMULATE_GRAD))


def op_name(n: pb.Node) -> str:
    """A host op's operator name (the node's name when it records none)."""
    return n.cpu.op if n.HasField("cpu") and n.cpu.op else n.name
