"""How much of a predicted step the GPU spends in GEMMs (the "duty cycle" a power limit would
act on), for vTrain's single-node rows and the Megatron-LM paper's rows.

    python benchmarks/gemm_duty.py

A lead for the paper rows' error (docs/accuracy.md, "Tested and not adopted"): an A100 at its
power limit lowers its clock under sustained tensor-core work, so a throttle that grows with
the share of the step spent in GEMMs could slow the paper's large models without slowing
vTrain's. That needs the two to differ in that share. Each row is traced on the meta device
with one data-parallel replica (the share does not depend on dp), predicted with the shipped
``a100`` compute preset (``a100-80gb`` for the paper's rows) and the ``a100-ib`` collective
preset, and printed with its step, the share of it the GPU is busy, and the share in GEMMs.
"""

from __future__ import annotations

from collections import Counter

from echo_et.ir.schema import pb
from echo_et.models.comm import CommModel
from echo_et.models.compute import ComputeModel
from echo_et.passes import retime_compute
from echo_et.sim import simulate
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.tracer import TraceOptions, trace
from echo_et.workloads import GPTConfig, build_gpt

VTRAIN = dict(layers=24, seq=1024, heads=16, vocab=50257)
PAPER = dict(seq=2048, vocab=51200)
# (label, shape, tp, micro-batches, gpu, recomputation: the reading each table uses)
ROWS = [
    ("vTrain hidden 2048, micro-batch 8, TP1", dict(VTRAIN, hidden=2048, micro_batch=8), 1, 4, "a100", "selective"),
    ("vTrain hidden 2048, micro-batch 2, TP4", dict(VTRAIN, hidden=2048, micro_batch=2), 4, 4, "a100", "selective"),
    ("vTrain hidden 1024, micro-batch 1, TP8", dict(VTRAIN, hidden=1024, micro_batch=1), 8, 4, "a100", "selective"),
    ("paper 1.7B, micro-batch 16, TP1", dict(PAPER, layers=24, hidden=2304, heads=24, micro_batch=16), 1, 1,
     "a100-80gb", "full"),
    ("paper 18.4B, micro-batch 8, TP8", dict(PAPER, layers=40, hidden=6144, heads=48, micro_batch=8), 8, 4,
     "a100-80gb", "full"),
]


def main() -> None:
    print("| row | predicted step ms | GPU busy | in GEMMs |")
    print("|---|---:|---:|---:|")
    for label, shape, tp, micro, gpu, granularity in ROWS:
        cfg = GPTConfig.megatron(**shape, dtype="float16", recompute=True, recompute_granularity=granularity)
        job = trace(build_gpt(cfg), ParallelLayout(tp=tp, microbatches=micro),
                    TraceOptions(device="meta", warmup_steps=0), workload_attrs=cfg.to_json()).job
        timed = retime_compute(job, ComputeModel.preset(gpu))[0]
        step = simulate(timed, "predict", comm_model=CommModel.preset("a100-ib")).step_time_ns
        by_class: Counter = Counter()
        for n in timed.graph_of(0).nodes:
            if n.kind == pb.KIND_COMPUTE:
                by_class[n.compute.kernel_class] += n.duration_ns
        busy = sum(by_class.values())
        print(f"| {label} | {step / 1e6:.1f} | {busy / step:.2f} | {by_class[pb.KC_GEMM] / step:.2f} |")


if __name__ == "__main__":
    main()
