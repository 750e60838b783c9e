"""What a model's shape costs on the GPU that echo-et's models do not price, said beside the
prediction with the measurements that show it.

A planner picks the hidden size and the head count; a few choices are measured to run far
slower than their FLOPs say, for reasons the compute model has no input for (it sees an
operator's shapes, not the alignment of its operands in memory). Rather than price them with a
guessed factor, a prediction of such a shape says so, with the measured evidence and where it
is written up (docs/accuracy.md).

- **A head size that is not a multiple of 16 bytes** (8 elements at 16 bits). Megatron's
  attention multiplies per-head slices of the fused QKV output (batch stride 3 x head size)
  and writes the context per head: with such a head size each head's matrix starts off the
  16-byte boundary that cuBLAS's fastest GEMM kernels load from. BigScience's layout search
  (Megatron-DeepSpeed on 80 GB A100s, 2022) measured the 78-layer model of hidden 13,824 with
  128 heads (head size 108) 33-44 % slower than the same model with 64 or 96 heads (sizes 216
  and 144), at TP4 and TP8, micro-batch 2 and 4, on the same days; echo-et prices those runs
  1-2 % apart. Every head count of that search whose head size is a multiple of 8 ran within
  the spread of the rest.
"""

from __future__ import annotations

from echo_et.ir.dtypes import dtype_size

ALIGN_BYTES = 16


def shape_advice(hidden: int, heads: int, dtype: str) -> tuple[str, ...]:
    """One line per unpriced cost of the shape (none for most shapes). Only 16-bit types
    are judged: the measurements are of float16 and bfloat16 runs."""
    size = dtype_size(dtype)
    if heads < 1 or hidden % heads or size != 2:
        return ()
    head = hidden // heads
    if (head * size) % ALIGN_BYTES == 0:
        return ()
    return (f"head size {head} (hidden {hidden} / {heads} heads) is not a multiple of {ALIGN_BYTES // size}: the "
            f"heads' slices in the attention's GEMMs are off the {ALIGN_BYTES}-byte alignment cuBLAS's fastest kernels "
            f"need; "
            f"Megatron-DeepSpeed runs on A100 with head size 108 measured 33-44 % slower than the same model with "
            f"aligned heads, which this prediction does not price (docs/accuracy.md, BigScience's layout search)",)
