"""Re-staging a meta-device Job (``scale --pp``) agrees with tracing it at the target depth.

    python benchmarks/restage_vs_trace.py [--workload megatron-gpt|gpt] [--layers 16] [--hidden 1024]
        [--heads 16] [--seq 1024] [--micro-batch 2] [--microbatches 8] [--tp 2] [--dp 2]
        [--pp-from 2] [--pp-to 1,4,8]
        [--gpu a100] [--preset a100-ib] [--gpus-per-node 8]

Traces the workload (Megatron's GPT by default) on the meta device at ``--pp-from`` and at
each ``--pp-to``, re-stages the first Job to each target depth, and predicts both on
``--gpu`` with the ``--preset``
collective model. Prints per target: on how many ranks the collectives and transfers (type,
group members, bytes, peer) are those of the traced Job in the same order, and on how many
in the same order group by group (what matching calls across ranks needs: a gradient bucket
issued while a layer's backward still runs, in the traced Job, comes after that layer's
calls in the re-staged one, whose buckets follow each backward piece); both predicted steps
and their ratio; and the time the re-staging took against tracing the target.
Deterministic (the meta device has no measured times), so one round is the answer.
"""

from __future__ import annotations

import argparse
import resource
import time

from echo_et.models.comm import CommModel
from echo_et.models.compute import ComputeModel
from echo_et.passes import retime_compute, scale
from echo_et.sim import SimOptions, simulate
from echo_et.trace.compare import comm_sequence
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.tracer import TraceOptions, trace
from echo_et.workloads import GPTConfig, build_gpt


def by_group(calls: list[tuple]) -> dict[str, list[tuple]]:
    """A rank's calls, in order, group by group (the third field is the group key)."""
    out: dict[str, list[tuple]] = {}
    for c in calls:
        out.setdefault(c[2], []).append(c)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=("megatron-gpt", "gpt"), default="megatron-gpt")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--pp-from", type=int, default=2)
    ap.add_argument("--pp-to", default="1,4,8")
    ap.add_argument("--gpu", default="a100")
    ap.add_argument("--preset", default="a100-ib")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    a = ap.parse_args(argv)

    make = GPTConfig.megatron if a.workload == "megatron-gpt" else GPTConfig
    cfg = make(layers=a.layers, hidden=a.hidden, heads=a.heads, seq=a.seq, micro_batch=a.micro_batch,
               dtype="float16")
    opts = TraceOptions(device="meta", warmup_steps=0)
    compute = ComputeModel.preset(a.gpu)
    comm = CommModel.preset(a.preset)
    sim_opts = SimOptions(gpus_per_node=a.gpus_per_node)

    def traced(pp: int):
        t0 = time.perf_counter()
        job = trace(build_gpt(cfg), ParallelLayout(tp=a.tp, pp=pp, dp=a.dp, microbatches=a.microbatches), opts,
                    workload_attrs=cfg.to_json()).job
        return job, time.perf_counter() - t0

    def predict(job) -> float:
        res = simulate(retime_compute(job, compute)[0], "predict", options=sim_opts, comm_model=comm)
        return res.step_time_ns / 1e6

    base, _ = traced(a.pp_from)
    print(f"{a.workload} layers={a.layers} hidden={a.hidden} heads={a.heads} seq={a.seq} micro-batch={a.micro_batch} "
          f"fp16, {a.microbatches} micro-batches, tp={a.tp} dp={a.dp}; traced at pp={a.pp_from} on the meta device, "
          f"re-staged; predicted on {a.gpu} with {a.preset}, {a.gpus_per_node} GPUs per node")
    print("| pp | ranks: same calls in order | per group | re-staged ms | traced ms | re-staged / traced "
          "| re-stage s | trace s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for pp in (int(x) for x in a.pp_to.split(",")):
        t0 = time.perf_counter()
        restaged, _ = scale(base, pp=pp)
        t_restage = time.perf_counter() - t0
        direct, t_trace = traced(pp)
        seqs = [(comm_sequence(restaged, r), comm_sequence(direct, r)) for r in range(direct.world_size)]
        same = sum(a == b for a, b in seqs)
        per_group = sum(by_group(a) == by_group(b) for a, b in seqs)
        ms_r, ms_d = predict(restaged), predict(direct)
        n = direct.world_size
        print(f"| {pp} | {same}/{n} | {per_group}/{n} | {ms_r:.2f} | {ms_d:.2f} | {ms_r / ms_d:.4f} | "
              f"{t_restage:.2f} | {t_trace:.2f} |")
    print(f"peak resident memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
