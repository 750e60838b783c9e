"""Peak memory of the per-rank exports as the repeat count grows (issue 22: exports stream a
graph with repeat blocks node by node), printed as a markdown table.

    python benchmarks/export_memory.py [--batches 16,64,192] [--formats astra-sim,chakra]

For each global batch, GPT-175B (96 layers, hidden 12288, recomputation, A100) is traced on
the meta device at TP8 x PP16 x DP1: 128 ranks whose graphs are those of the issue's
TP8 x PP16 x DP8 Job at the same micro-batches per pipeline (global batch 1536 at DP8 is 192
per pipeline), so the per-rank files are the same size, with an eighth of the files (the
1,024-rank export is 8x the disk and time and no different per rank). Each export is a
whole ``echo-et`` process, as a user runs it; its wall time, CPU time (user + system) and
peak RSS are the child's own (``os.wait4``). The output is deleted after each row. What
should not grow with the batch is the peak RSS; the bytes written do.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = ["--workload", "megatron-gpt", "--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048",
         "--micro-batch", "1", "--tp", "8", "--pp", "16", "--dp", "1", "--recompute", "--device", "meta",
         "--verify", "stage", "--warmup", "0", "--gpu", "a100", "--gpus-per-node", "8", "--intra-bw", "150GB/s",
         "--inter-bw", "800Gb/s/node"]
ECHO = [sys.executable, "-m", "echo_et.cli.main"]


def run(cmd: list[str]) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MiB of one child process (its own, not its parent's)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64,192", help="global batches (= micro-batches per pipeline)")
    ap.add_argument("--formats", default="astra-sim,chakra")
    ap.add_argument("--work", type=Path, default=None, help="folder for the Jobs and exports (default: a temp dir)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    formats = args.formats.split(",")
    rows = []
    with tempfile.TemporaryDirectory(dir=args.work) as d:
        work = Path(d)
        for gb in batches:
            job = work / f"gpt175-mb{gb}"
            subprocess.run([*ECHO, "trace", *MODEL, "--global-batch", str(gb), "-o", str(job)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for fmt in formats:
                out = work / f"out-{fmt}-{gb}"
                if fmt == "astra-sim":
                    cmd = [*ECHO, "export", "astra-sim", str(job), "-o", str(out), "--no-expected"]
                    target = out
                else:
                    out.mkdir()
                    cmd = [*ECHO, "export", "chakra", str(job), "-o", str(out / "t")]
                    target = out
                wall, cpu, rss = run(cmd)
                size = du(target)
                shutil.rmtree(out)
                rows.append((fmt, gb, wall, cpu, rss, size / 2**20))
                print(f"{fmt} mb={gb}: {wall:.1f} s wall, {cpu:.1f} s CPU, {rss:.0f} MiB peak, "
                      f"{size / 2**20:.0f} MiB written", file=sys.stderr, flush=True)
    print("| export | micro-batches per pipeline | wall s | CPU s | peak RSS MiB | written MiB (128 ranks) |")
    print("|---|---|---|---|---|---|")
    for fmt, gb, wall, cpu, rss, size in rows:
        print(f"| {fmt} | {gb} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {size:.0f} |")


if __name__ == "__main__":
    main()
