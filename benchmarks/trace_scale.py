"""Ex-situ tracing cost against world size: it grows with distinct ranks, not with ranks.

    python benchmarks/trace_scale.py [--dp 2 16 128] [--tp 2] [--pp 4] [--layers 8]

Traces the built-in GPT on CPU at TP x PP x DP for each DP given (default TP2 x PP4 and
DP 2, 16, 128: 16, 128 and 1,024 ranks) and prints one row per world size: ranks traced,
distinct graphs, wall time (tracing, job assembly and check, writing the Job), the process's
peak resident memory so far, the largest per-rank tensor peak the tracer measured, and the
size of the Job directory written.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

from echo_et.ir import save_job
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.tracer import TraceOptions, trace
from echo_et.workloads import GPTConfig, Workload


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dp", type=int, nargs="+", default=[2, 16, 128])
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--verify", default="sample", choices=["sample", "all"])
    args = ap.parse_args(argv)
    cfg = GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq,
                    micro_batch=args.micro_batch)
    wl = Workload(gpt=cfg)
    print(f"GPT layers={cfg.layers} hidden={cfg.hidden} heads={cfg.heads} seq={cfg.seq} "
          f"micro-batch={cfg.micro_batch} microbatches={args.microbatches}, tp={args.tp} "
          f"pp={args.pp}, CPU, verify={args.verify}")
    header = ("| ranks | layout | traced ranks | graphs | trace s | s per traced rank | "
              "assemble+check s | write s | peak RSS MiB | max rank tensor peak KiB | job KiB |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    tmp = Path(tempfile.mkdtemp(prefix="trace-scale-"))
    try:
        for dp in args.dp:
            layout = ParallelLayout(dp=dp, tp=args.tp, pp=args.pp, microbatches=args.microbatches)
            wl.validate(layout)
            t0 = time.perf_counter()
            res = trace(wl.build_fn(), layout, TraceOptions(verify=args.verify))
            t1 = time.perf_counter()
            rank_s = sum(res.rank_wall_s.values())
            out = save_job(res.job, tmp / f"dp{dp}")
            t2 = time.perf_counter()
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"| {layout.world_size} | dp{dp} tp{args.tp} pp{args.pp} | "
                  f"{len(res.traced_ranks)} | {res.graphs} | {t1 - t0:.1f} | "
                  f"{rank_s / len(res.traced_ranks):.1f} | {t1 - t0 - rank_s:.1f} | "
                  f"{t2 - t1:.1f} | {rss:.0f} | {max(res.peak_memory_bytes.values()) / 1024:.0f} | "
                  f"{_dir_size(out) / 1024:.0f} |", flush=True)
            shutil.rmtree(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
