"""Peak memory of the per-rank exports as the repeat count grows (issue 22: exports stream a
graph with repeat blocks node by node), printed as a markdown table.

    python benchmarks/export_memory.py [--batches 16,64,192] [--formats astra-sim,chakra,chrome,check]
        [--ranks 0,127] [--sim-ranks 0,8,...,120] [--jobs DIR] [--before PYTHON]

``sim-timeline`` is ``echo-et simulate JOB --mode predict --timeline OUT --timeline-rank R ...``
(the simulated step of the ranks of ``--sim-ranks``, one per pipeline stage by default, written
by ``write_timeline`` as a folder of rank files), ``sim-timeline-json`` the same into one
``t.json``, ``sim-timeline-bounded`` the folder with ``--timeline-events 100000`` (the step's
first 100,000 boxes), ``sim`` the simulation alone (no timeline: what the simulator holds).
``chrome`` is ``echo-et export chrome JOB -o OUT --rank R ...`` (a folder of rank files; the
ranks of ``--ranks``: a first and a last pipeline stage by default, the whole 128-rank
timeline is tens of GB at 192 micro-batches), ``check`` is ``echo-et check JOB`` (every
rank's graph checked, no output), ``check-chained`` the same on the Job with each repeat
block body's kernels chained on their stream (each waits for the one before it on its
stream, as graphs from Kineto traces have it: still valid, but outside the compact proofs,
so the stream-order rule reads the expansion). ``--jobs DIR`` keeps the traced Jobs there and reuses them
on the next run; ``--before PYTHON`` also runs each command with another interpreter (one
whose ``echo_et`` is an older checkout), on the same Jobs, for a before/after table.

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


def run(cmd: list[str], cwd: Path) -> tuple[float, float, float]:
    """Wall s, CPU s and peak RSS MiB of one child process (its own, not its parent's), run
    in ``cwd``: never in a checkout, whose ``echo_et`` folder ``python -m`` would import
    before the one ``--before``'s Python has installed."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=cwd)
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


def command(echo: list[str], fmt: str, job: Path, out: Path, ranks: list[int], sim_ranks: list[int]) -> list[str]:
    if fmt == "sim":   # the same simulation, no timeline: what the simulator itself holds
        return [*echo, "simulate", str(job), "--mode", "predict"]
    if fmt.startswith("sim-timeline"):
        dest = out
        if fmt == "sim-timeline-json":
            out.mkdir()
            dest = out / "t.json"
        bound = ["--timeline-events", "100000"] if fmt == "sim-timeline-bounded" else []
        return [*echo, "simulate", str(job), "--mode", "predict", "--timeline", str(dest), *bound,
                *(a for r in sim_ranks for a in ("--timeline-rank", str(r)))]
    if fmt == "astra-sim":
        return [*echo, "export", "astra-sim", str(job), "-o", str(out), "--no-expected"]
    if fmt == "chakra":
        out.mkdir()
        return [*echo, "export", "chakra", str(job), "-o", str(out / "t")]
    if fmt == "chrome":
        return [*echo, "export", "chrome", str(job), "-o", str(out), *(a for r in ranks for a in ("--rank", str(r)))]
    if fmt == "check":
        return [*echo, "check", str(job)]
    if fmt == "check-chained":
        return [*echo, "check", str(chained(job))]
    raise SystemExit(f"unknown format {fmt!r} (astra-sim, chakra, chrome, check, check-chained, sim, sim-timeline, "
                     "sim-timeline-json, sim-timeline-bounded)")


def chained(job_dir: Path) -> Path:
    """The Job at ``job_dir`` with each body's kernels chained on their stream (made once,
    beside it)."""
    out = job_dir.with_name(job_dir.name + "-chained")
    if (out / "manifest.pb").exists():
        return out
    from echo_et.ir import load_job, pb, save_job

    job = load_job(job_dir)
    for g in job.graphs():
        for body in g.bodies():
            prev: dict[int, int] = {}
            for n in body.nodes:
                if n.kind == pb.KIND_COMPUTE:
                    if n.stream in prev:
                        n.deps.add(id=prev[n.stream], kind=pb.DEP_DATA)
                    prev[n.stream] = n.id
    save_job(job, out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64,192", help="global batches (= micro-batches per pipeline)")
    ap.add_argument("--formats", default="astra-sim,chakra")
    ap.add_argument("--ranks", default="0,127", help="ranks of the chrome export")
    ap.add_argument("--sim-ranks", default=",".join(str(8 * s) for s in range(16)),
                    help="ranks of the sim-timeline rows (default: one per pipeline stage)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the Jobs and exports (default: a temp dir)")
    ap.add_argument("--jobs", type=Path, default=None, help="keep the traced Jobs here and reuse them")
    ap.add_argument("--before", default=None, help="another Python whose echo_et is the code to compare with")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    formats = args.formats.split(",")
    ranks = [int(r) for r in args.ranks.split(",")]
    sim_ranks = [int(r) for r in args.sim_ranks.split(",")]
    sides = [("after", ECHO)] + ([("before", [args.before, "-m", "echo_et.cli.main"])] if args.before else [])
    rows = []
    with tempfile.TemporaryDirectory(dir=args.work) as d:
        work = Path(d).resolve()
        jobs = args.jobs.resolve() if args.jobs else work
        for gb in batches:
            job = jobs / f"gpt175-mb{gb}"
            if not (args.jobs and (job / "manifest.pb").exists()):
                subprocess.run([*ECHO, "trace", *MODEL, "--global-batch", str(gb), "-o", str(job)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for fmt in formats:
                for side, echo in sides:
                    out = work / f"out-{fmt}-{gb}-{side}"
                    wall, cpu, rss = run(command(echo, fmt, job, out, ranks, sim_ranks), work)
                    size = du(out) if out.exists() else 0
                    if out.exists():
                        shutil.rmtree(out)
                    rows.append((fmt, gb, side, wall, cpu, rss, size / 2**20))
                    print(f"{fmt} mb={gb} {side}: {wall:.1f} s wall, {cpu:.1f} s CPU, {rss:.0f} MiB peak, "
                          f"{size / 2**20:.0f} MiB written", file=sys.stderr, flush=True)
    print("| command | micro-batches per pipeline | code | wall s | CPU s | peak RSS MiB | written MiB |")
    print("|---|---|---|---|---|---|---|")
    for fmt, gb, side, wall, cpu, rss, size in rows:
        what = f"chrome --rank {','.join(map(str, ranks))}" if fmt == "chrome" else \
            f"{fmt} ({len(sim_ranks)} ranks)" if fmt.startswith("sim-timeline") else fmt
        print(f"| {what} | {gb} | {side} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {size:.0f} |")


if __name__ == "__main__":
    main()
