"""Run a workload for real: one process per rank on this machine, gloo, under the profiler.

This is the reference the ex-situ tracer is checked against (same build function, same
profiler settings, real communication). Each rank runs a warm-up step and a profiled step
and writes ``rank<r>.json`` (Kineto/Chrome trace) into the output folder. CPU only: gloo
moves the data between local processes.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.trace.context import RankContext
from echo_et.trace.layout import ParallelLayout

_PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.optim", "torch.profiler",
            "echo_et.workloads", "echo_et.trace.insitu"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, workload, layout: ParallelLayout, out_dir: str, port: int,
               timeout_s: float, threads: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(threads)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=layout.world_size,
                            timeout=timedelta(seconds=timeout_s))
    try:
        step = workload.build_fn()(RankContext(rank, layout, "cpu", all_groups=True))
        step()
        dist.barrier()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            step()
        dist.barrier()
        path = Path(out_dir) / f"rank{rank}.json"
        tmp = path.with_suffix(".json.tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
    finally:
        dist.destroy_process_group()


def run_in_situ(workload, layout: ParallelLayout, out_dir: str | os.PathLike[str], *,
                timeout_s: float = 300.0, threads: int = 1) -> list[Path]:
    """Run ``workload`` on ``layout.world_size`` local gloo processes; returns the per-rank
    trace paths (rank order)."""
    import multiprocessing

    import torch.multiprocessing as mp

    workload.validate(layout, "cpu")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    # A fork server that imported torch (and the lazily imported torch._dynamo, which the
    # optimizers pull in) once starts the ranks in well under a second each.
    multiprocessing.set_forkserver_preload(_PRELOAD)
    try:
        mp.start_processes(_rank_main, args=(workload, layout, str(out), port, timeout_s, threads),
                           nprocs=layout.world_size, join=True, start_method="forkserver")
    except mp.ProcessRaisedException as e:
        first = str(e).strip().splitlines()[-1]
        raise EchoError(f"in-situ run of layout {layout.describe()} failed: {first}") from None
    paths = [out / f"rank{r}.json" for r in range(layout.world_size)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise EchoError(f"in-situ run of layout {layout.describe()} wrote no trace for "
                        f"{', '.join(missing)}")
    return paths
