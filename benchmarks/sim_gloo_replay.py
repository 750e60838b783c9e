"""Replay of a job made here: N gloo processes on CPU train a small DDP MLP under
``torch.profiler``; the Kineto traces are read into a Job and replayed, and each rank's
simulated step is compared with its measured ``ProfilerStep``. The last rank does extra
work each step, so the others wait for it in the gradient all-reduce.

    python benchmarks/sim_gloo_replay.py [--ranks 2] [--keep DIR] [--json]

Needs torch (CPU). Takes about a minute on a busy 2-core machine (process start-up).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
from pathlib import Path


def _worker(rank: int, world: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        if rank == world - 1:
            torch.mm(torch.randn(512, 512), torch.randn(512, 512))

    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=1),
                 on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/rank{rank}.json")) as prof:
        for _ in range(4):
            step()
            prof.step()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="keep the traces in this folder")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        import torch.multiprocessing as mp
    except ImportError:
        print("needs torch", file=sys.stderr)
        return 2
    from echo_et.converters import ReadOptions, read
    from echo_et.ir import check_job
    from echo_et.sim import simulate

    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        mp.spawn(_worker, args=(args.ranks, str(out), _free_port()), nprocs=args.ranks)
        job = read([out], "kineto", ReadOptions())
    issues = check_job(job)
    if issues:
        print(f"converted job fails check: {issues[0]}", file=sys.stderr)
        return 1
    res = simulate(job)
    rows = []
    for r in job.ranks():
        m = job.binding(r).measured_step_ns
        s = res.ranks[r].step_time_ns
        rows.append({"rank": r, "measured_step_ns": m, "replay_step_ns": s,
                     "replay_error_pct": round(100 * (s - m) / m, 3) if m else None,
                     "sync_wait_ns": res.ranks[r].sync_wait_ns})
    if args.json:
        print(json.dumps({"ranks": rows, "diagnostics": res.diagnostics}, indent=1, sort_keys=True))
        return 0
    print("| rank | measured ms | replay ms | error % | waited for the all-reduce ms |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['rank']} | {row['measured_step_ns'] / 1e6:.3f} | {row['replay_step_ns'] / 1e6:.3f} | "
              f"{row['replay_error_pct']:+.3f} | {row['sync_wait_ns'] / 1e6:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
