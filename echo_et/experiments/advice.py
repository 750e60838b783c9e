"""What a prediction does not price, said beside it with the measurements that show it.

A planner picks the shape and the layout; a few choices are measured to run far slower than
echo-et predicts, for reasons its models have no input for. Rather than price them with a
guessed factor, a prediction of such a configuration says so, with the measured evidence and
where it is written up (docs/accuracy.md); ``predict`` prints it and writes it in
summary.json, ``sweep --configs`` gives it per row and once in table.txt.

- **A head size that is not a multiple of 16 bytes** (8 elements at 16 bits). Megatron's
  attention multiplies per-head slices of the fused QKV output (batch stride 3 x head size)
  and writes the context per head: with such a head size the slices are off the 16-byte
  alignment cuBLAS's fastest GEMM kernels load from; the compute model sees an operator's
  shapes, not its operands' alignment. BigScience's layout search (Megatron-DeepSpeed on 80 GB
  A100s, 2022) measured the 78-layer model of hidden 13,824 with 128 heads (head size 108)
  33-44 % slower than the same model with 64 or 96 heads (216, 144), at TP4 and TP8,
  micro-batch 2 and 4, on the same days; echo-et prices those runs 1-2 % apart.
- **Tensor parallelism 8**: against every public Megatron-DeepSpeed measurement checked
  (vTrain's node, 80 rows; BigScience's 384 A100s, 53 rows, and three runs on one of their
  nodes; Megatron-Turing NLG on 2,240-3,360 A100s, 3 rows) echo-et predicts 8-way
  tensor-parallel steps 13-17 % fast on average, up to a quarter at micro-batch 1-2, where
  the Megatron-LM paper's TP8 runs are within 5 %. What the framework adds per
  tensor-parallel call is not in any data here (docs/accuracy.md, the vTrain TP8 analysis).
- **A mixture of experts**: routing is modelled as balanced (every expert the same rows),
  which a real router only approaches, and no MoE step is measured here: the line says what
  the step is (what balanced routing reaches) rather than a measured miss.
"""

from __future__ import annotations

from echo_et.ir.dtypes import dtype_size

ALIGN_BYTES = 16


def prediction_advice(hidden: int, heads: int, dtype: str, tp: int, experts: int = 0) -> tuple[str, ...]:
    """One line per known cost of the configuration that the prediction leaves out (none for
    most). Head sizes are judged for 16-bit types only: the measurements are of float16 and
    bfloat16 runs. ``experts``: a mixture of experts' (0: dense)."""
    out = []
    size = dtype_size(dtype)
    if heads >= 1 and hidden % heads == 0 and size == 2 and (hidden // heads * size) % ALIGN_BYTES:
        head = hidden // heads
        out.append(f"head size {head} (hidden {hidden} / {heads} heads) is not a multiple of {ALIGN_BYTES // size}: "
                   f"the heads' slices in the attention's GEMMs are off the {ALIGN_BYTES}-byte alignment cuBLAS's "
                   f"fastest kernels need; Megatron-DeepSpeed runs on A100 with head size 108 measured 33-44 % slower "
                   f"than the same model with aligned heads, which this prediction does not price (docs/accuracy.md, "
                   f"BigScience's layout search)")
    if tp == 8:
        out.append("tensor parallelism 8: against every public Megatron-DeepSpeed measurement checked (vTrain's node, "
                   "BigScience's 384 A100s and one of their nodes, Megatron-Turing NLG) echo-et predicted 8-way "
                   "tensor-parallel steps 13-17 % fast on average, up to a quarter at micro-batch 1-2, and "
                   "Megatron-LM's within 5 %: read a Megatron-DeepSpeed TP8 prediction as a lower bound "
                   "(docs/accuracy.md)")
    if experts:
        out.append(f"mixture of experts ({experts} experts): routing is modelled as balanced, every expert the same "
                   "rows; a real router's busiest expert sets each MoE layer's time, and no MoE step is measured "
                   "here: read the step as what balanced routing reaches (docs/predict.md, mixture of experts)")
    return tuple(out)
