"""Does `echo-et export simai` keep the step? Every SimAI workload under ../shared/data, the
traced fixtures and the main job's GPT-3 13B, exported as a user runs it, then read back and
simulated; printed as a Markdown table.

    python benchmarks/simai_export.py [--only NAME]

Columns:
  rank step     the exported rank's step in echo-et's simulation (predict: the a100-ib preset,
                slowdown off, so the file's compute times are the job's own)
  expected      the step SimAI's order gives the written lines with the communication times of
                that simulation (the report's ``expected_step_ns``): the rank's step less what
                SimAI adds itself (the pipeline bubble) and the waits for slower peers
  read back     echo-et's prediction (same preset) of the written file read back by
                ``echo-et convert --from simai``; "-" for replay rows (measured times there)
  export s, MiB the export command's wall time and peak resident memory (one process)

No peer tool runs here: SimAI's own binary is not in ../shared/tools.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared/data"
PRESET = "a100-ib"
CLI = [sys.executable, "-m", "echo_et.cli.main"]
GPT13B = ["--layers", "40", "--hidden", "5120", "--heads", "40", "--seq", "2048", "--micro-batch", "2",
          "--global-batch", "128", "--tp", "4", "--pp", "2", "--dp", "8", "--recompute", "--gpu", "a100"]


def measured_run(args: list[str], cwd: Path) -> tuple[str, float, float]:
    """Like :func:`run`, with the child's own peak memory (os.wait4 on it)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(CLI + args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with p.stdout, p.stderr:
        out = p.stdout.read()
        err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"echo-et {' '.join(args)} failed: {err.strip()}")
    return out, wall, usage.ru_maxrss / 1024


def inputs(tmp: Path) -> list[tuple[str, Callable[[], Path], str, list[str]]]:
    """(name, what makes the Job or file to export, mode, convert options for the file read
    back); nothing is made until asked for, so ``--only`` skips the work of other rows."""
    rows: list[tuple[str, Callable[[], Path], str, list[str]]] = []
    for p in sorted((DATA / "workloads").rglob("*.txt")):
        lines = p.read_text().splitlines()
        if len(lines) < 2 or not lines[1].strip().isdigit():
            continue
        world = [] if "all_gpus:" in lines[0] else ["--world-size", "16"]

        def convert(p: Path = p, world: list[str] = world) -> Path:
            job = tmp / f"job-{p.stem}"
            measured_run(["convert", str(p), "--from", "simai", *world, "-o", str(job)], tmp)
            return job

        rows.append((f"SimAI {p.stem[:40]}", convert, "predict", world))
    for name in ("gpt-tp2-pp2-dp2", "gpt-tp2-pp2-dp8", "gpt-dp4-zero1", "ddp-dp4"):
        rows.append((f"fixture {name}", lambda name=name: REPO / "fixtures/jobs" / name, "predict", []))
    dlrm = DATA / "traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
    if dlrm.exists():
        def unpack() -> Path:
            with tarfile.open(dlrm) as tf:
                tf.extractall(tmp / "dlrm", filter="data")
            return tmp / "dlrm/dlrm_kineto"

        rows.append(("DLRM Kineto, 8x V100", unpack, "replay", []))

    def gpt3() -> Path:
        measured_run(["predict", *GPT13B, "-o", str(tmp / "gpt3-13b")], tmp)
        return tmp / "gpt3-13b/job"

    rows.append(("GPT-3 13B TP4 PP2 DP8 (main job)", gpt3, "predict", []))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="only inputs whose name contains this text")
    args = ap.parse_args()
    print("| input | ranks | mode | lines | rank step ms | expected ms | read back ms | "
          "kept as time / dropped | export s | MiB |")
    print("|---|---:|---|---:|---:|---:|---:|---|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name, make, mode, world in inputs(tmp):
            if args.only and args.only not in name:
                continue
            src = make()
            out = tmp / "w.txt"
            model = ["--mode", "predict", "--preset", PRESET, "--no-slowdown"] if mode == "predict" else []
            text, wall, peak = measured_run(["export", "simai", str(src), "-o", str(out), "--json", *model], tmp)
            r = json.loads(text)
            back = "-"
            if mode == "predict":
                job = tmp / "back"
                measured_run(["convert", str(out), "--from", "simai", *world, "-o", str(job)], tmp)
                sim, _, _ = measured_run(["simulate", str(job), "--mode", "predict", "--preset", PRESET,
                                          "--no-slowdown", "--json"], tmp)
                back = f"{json.loads(sim)['step_time_ns'] / 1e6:.3f}"
                subprocess.run(["rm", "-rf", str(job)], check=True)
            dropped = ", ".join(f"{k.removeprefix('simai_')}={v}" for k, v in r["dropped"].items()) or "-"
            print(f"| {name} | {r['layout']['world_size']} | {mode} | {r['lines']} | "
                  f"{r['time']['rank_step_ns'] / 1e6:.3f} | {r['expected_step_ns'] / 1e6:.3f} | {back} | "
                  f"{dropped} | {wall:.2f} | {peak:.0f} |", flush=True)


if __name__ == "__main__":
    main()
