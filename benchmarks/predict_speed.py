"""Predicting a full-size model, as a user runs it: ``echo-et trace`` (meta device) then
``echo-et simulate --mode predict``, each a whole ``echo-et`` process, timed wall-clock with
its own peak RSS (``os.wait4``), and the same prediction on the *expanded* Job (its repeat
blocks written out as nodes: what every Job looked like before blocks) beside it.

    python benchmarks/predict_speed.py [--rows goal 8k vtrain] [--workdir DIR] [--json] [--skip-expanded] [--source]
    python benchmarks/predict_speed.py --sweep 109 [--workers 2]
    python benchmarks/predict_speed.py --main-job
    python benchmarks/predict_speed.py --predict [predict predict-175b] [--repeat 3] [--timeline-all]

``--main-job``: the README's main job (``echo-et predict ...``, read from README.md, its
output folder moved under the work folder), one whole process: wall, peak RSS, what it wrote.

Rows (GPT-175B: 96 layers, hidden 12288, 96 heads, sequence 2048, recomputation, A100 with
150 GB/s NVLink per GPU and 800 Gb/s per node of network):

* ``goal``: TP8 x PP16 x DP8 (1,024 GPUs), global batch 1536, micro-batch 1 (192
  micro-batches per pipeline);
* ``8k``: the same at DP64 (8,192 GPUs, 24 micro-batches per pipeline at the same batch);
* ``vtrain``: a single-node row of vTrain's size (GPT 2.7B-like: 32 layers, hidden 2560,
  TP4 x PP2 x DP1, global batch 64, micro-batch 4).

The step time printed by both simulations must be the same (the expansion means the same
Job); a difference is reported and the script exits 1.

``--predict``: ``echo-et predict`` of a configuration (one folder: summary, timeline, chart,
Job), one whole process per run, ``--repeat`` runs, the least wall, CPU (user + system, the
tracer's forked workers included) and peak RSS of each; ``--timeline-all`` writes the whole
step's timeline instead of the default bound. Rows: ``predict``, GPT 48 layers, hidden 8192,
TP4 x PP8 x DP16 (512 GPUs, 96 micro-batches per pipeline); ``predict-175b``, the
docs/predict.md GPT-175B job, TP8 x PP16 x DP4 (512 GPUs, 384 micro-batches per pipeline).

``--sweep N``: ``echo-et sweep --configs`` over the first N configurations of a fixed grid of
multi-node GPT layouts (3.6B to 175B parameters, 64 to 512 GPUs in nodes of 8, tensor
parallelism within a node, global batch 512, micro-batch 1 or 2; no measured times: this
times the sweep, it judges no accuracy), as one whole process with ``--workers``.

Children run with compiled bytecode, as an installed tool does (pip compiles at install; a
source checkout writes ``__pycache__`` on its first run): where the environment turns writing
bytecode off (``PYTHONDONTWRITEBYTECODE``, as on the project machine), it is dropped and the
bytecode goes to ``PYTHONPYCACHEPREFIX`` under the work folder, filled by one unmeasured
warm-up (a small ``trace`` + ``simulate`` that imports what the rows import), as
``ingest_host_et.py`` and ``ingest_kineto.py`` do. Otherwise every measured process would
compile echo-et's modules again (about 0.3 s of CPU per process). ``--source`` keeps the
environment as it is, with no warm-up (what this script measured before 2026-12-05).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GPT175B = ["--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048"]
CLUSTER = ["--gpu", "a100", "--gpus-per-node", "8", "--intra-bw", "150GB/s",
           "--inter-bw", "800Gb/s/node"]
ROWS = {
    "goal": GPT175B + ["--micro-batch", "1", "--global-batch", "1536", "--tp", "8", "--pp", "16",
                       "--dp", "8", "--recompute"],
    "8k": GPT175B + ["--micro-batch", "1", "--global-batch", "1536", "--tp", "8", "--pp", "16",
                     "--dp", "64", "--recompute"],
    "vtrain": ["--layers", "32", "--hidden", "2560", "--heads", "32", "--seq", "2048",
               "--micro-batch", "4", "--global-batch", "64", "--tp", "4", "--pp", "2", "--dp", "1",
               "--recompute"],
}
PREDICT_ROWS = {
    "predict": ["--layers", "48", "--hidden", "8192", "--heads", "64", "--seq", "2048", "--micro-batch", "1",
                "--global-batch", "1536", "--tp", "4", "--pp", "8", "--dp", "16", "--recompute",
                "--gpu", "a100", "--gpus-per-node", "8", "--inter-bw", "800Gb/s/node"],
    "predict-175b": GPT175B + ["--micro-batch", "1", "--global-batch", "1536", "--tp", "8", "--pp", "16",
                               "--dp", "4", "--recompute", *CLUSTER],
}
STEP = re.compile(r"step time ([0-9.]+) ms")
CHILD_ENV = dict(os.environ)
# A small row the warm-up runs: the same commands, so the same modules, on a tiny model.
WARM_UP = ["--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32", "--micro-batch", "1",
           "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--recompute"]


def use_bytecode(work: Path) -> None:
    """Children load compiled bytecode (module docstring): a cache under ``work`` where
    writing bytecode is off, filled by one unmeasured small trace + simulate."""
    if CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    echo = [sys.executable, "-m", "echo_et.cli.main"]
    job = work / "warm-up-job"
    shutil.rmtree(job, ignore_errors=True)
    run([*echo, "trace", "--workload", "megatron-gpt", *WARM_UP, "--device", "meta", "--verify", "stage",
         "--warmup", "0", *CLUSTER, "-o", str(job)])
    run([*echo, "simulate", str(job), "--mode", "predict"])
    shutil.rmtree(job, ignore_errors=True)


def run(cmd: list[str]) -> dict:
    """One whole process: wall seconds, CPU seconds (user + system, its children
    included: the steadier number on a shared machine), peak RSS (MiB), its output."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=CHILD_ENV)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-2000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "out": out}


def expand_job(src: Path, dest: Path) -> None:
    """Write ``src`` with its repeat blocks expanded, in a process of its own (a child
    forked from a large parent would report the parent's pages as its peak RSS)."""
    code = ("import sys\nfrom echo_et.ir import load_job, save_job\njob = load_job(sys.argv[1])\n"
            "for g in job.graphs():\n    g.expand()\nsave_job(job, sys.argv[2])\n")
    subprocess.run([sys.executable, "-c", code, str(src), str(dest)], check=True, env=CHILD_ENV)


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench(name: str, work: Path, expanded: bool = True) -> dict:
    echo = [sys.executable, "-m", "echo_et.cli.main"]
    job = work / f"{name}-job"
    flat = work / f"{name}-expanded"
    for p in (job, flat):
        shutil.rmtree(p, ignore_errors=True)
    trace = run([*echo, "trace", "--workload", "megatron-gpt", *ROWS[name], "--device", "meta",
                 "--verify", "stage", "--warmup", "0", *CLUSTER, "-o", str(job)])
    simulate = run([*echo, "simulate", str(job), "--mode", "predict"])
    if expanded:
        expand_job(job, flat)
        simulate_flat = run([*echo, "simulate", str(flat), "--mode", "predict"])
    else:   # --skip-expanded: the columns of the Job as traced only
        simulate_flat = {"wall_s": None, "cpu_s": None, "peak_rss_mib": None, "out": ""}
    step = STEP.search(simulate["out"])
    step_flat = STEP.search(simulate_flat["out"])
    row = {
        "row": name,
        "trace_s": trace["wall_s"], "trace_cpu_s": trace["cpu_s"], "trace_rss_mib": trace["peak_rss_mib"],
        "simulate_s": simulate["wall_s"], "simulate_cpu_s": simulate["cpu_s"],
        "simulate_rss_mib": simulate["peak_rss_mib"],
        "total_s": round(trace["wall_s"] + simulate["wall_s"], 2),
        "job_bytes": du(job), "expanded_job_bytes": du(flat) if expanded else None,
        "expanded_simulate_s": simulate_flat["wall_s"], "expanded_simulate_cpu_s": simulate_flat["cpu_s"],
        "expanded_simulate_rss_mib": simulate_flat["peak_rss_mib"],
        "step_ms": float(step.group(1)) if step else None,
        "expanded_step_ms": float(step_flat.group(1)) if step_flat else None,
    }
    row["simulate_speedup"] = (round(row["expanded_simulate_s"] / max(row["simulate_s"], 1e-9), 2)
                               if expanded else None)
    return row


# (layers, hidden, heads): GPT models of about 3.6B, 7.5B, 18B, 39B, 76B and 175B parameters.
SWEEP_MODELS = [(30, 3072, 32), (36, 4096, 32), (40, 6144, 48), (48, 8192, 64), (60, 10240, 80),
                (96, 12288, 96)]


def sweep_grid(n: int) -> list[dict[str, int]]:
    """The first ``n`` configurations of the grid, in a fixed order."""
    rows = []
    for gpus in (64, 128, 256, 512):
        for layers, hidden, heads in SWEEP_MODELS:
            for tp in (1, 2, 4, 8):
                for pp in (1, 2, 4, 8, 16):
                    if gpus % (tp * pp) or layers % pp or heads % tp:
                        continue
                    dp = gpus // (tp * pp)
                    for mb in (1, 2):
                        if 512 % (mb * dp):
                            continue
                        rows.append(dict(layers=layers, hidden=hidden, heads=heads, seq=2048, micro_batch=mb,
                                         global_batch=512, tp=tp, pp=pp, dp=dp))
    step = max(1, len(rows) // n)
    return rows[::step][:n]


def bench_sweep(n: int, workers: int, work: Path) -> dict:
    rows = sweep_grid(n)
    csv = work / "configs.csv"
    cols = list(rows[0])
    csv.write_text(",".join(cols) + "\n" + "".join(",".join(str(r[c]) for c in cols) + "\n" for r in rows))
    out = work / "sweep"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "echo_et.cli.main", "sweep", "--configs", str(csv), "--recompute",
                           *CLUSTER, "--workers", str(workers), "-o", str(out)], capture_output=True, text=True,
                          env=CHILD_ENV)
    wall = time.perf_counter() - t0
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    failed = [r for r in results.get("rows", []) if r.get("error")]
    return {"rows": len(rows), "workers": workers, "wall_s": round(wall, 1), "exit": proc.returncode,
            "failed": len(failed), "first_error": failed[0]["error"] if failed else None,
            "gpus": sorted({r["tp"] * r["pp"] * r["dp"] for r in rows})}


def bench_main_job(work: Path) -> dict:
    """The README's ``echo-et predict`` command as a user runs it (the console script)."""
    import shlex

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    args = shlex.split(next(line for line in readme.splitlines() if line.startswith("echo-et predict ")))[1:]
    out = work / "main-job"
    shutil.rmtree(out, ignore_errors=True)
    args[args.index("-o") + 1] = str(out)
    echo = shutil.which("echo-et", path=str(Path(sys.executable).parent)) or "echo-et"
    res = run([echo, *args])
    step = STEP.search(res["out"])
    return {"command": "echo-et " + shlex.join(args), "wall_s": res["wall_s"], "peak_rss_mib": res["peak_rss_mib"],
            "step_ms": float(step.group(1)) if step else None, "output_bytes": du(out),
            "timeline_bytes": du(out / "timeline")}


def bench_predict(name: str, work: Path, repeat: int, timeline_all: bool) -> dict:
    """``echo-et predict`` of row ``name``, ``repeat`` whole processes: the least of each
    measure (the machine may be shared), and what the folder holds."""
    out = work / f"{name}-predict"
    echo = shutil.which("echo-et", path=str(Path(sys.executable).parent)) or "echo-et"
    args = [*PREDICT_ROWS[name], *(["--timeline-all"] if timeline_all else []), "-o", str(out)]
    runs = [run([echo, "predict", *args]) for _ in range(repeat)]
    summary = json.loads((out / "summary.json").read_text())
    step = STEP.search(runs[-1]["out"])
    return {"row": name, "command": "echo-et predict " + " ".join(args[:-2]), "runs": repeat,
            "wall_s": min(r["wall_s"] for r in runs), "cpu_s": min(r["cpu_s"] for r in runs),
            "peak_rss_mib": min(r["peak_rss_mib"] for r in runs),
            "step_ms": float(step.group(1)) if step else None, "world_size": summary["world_size"],
            # (an echo-et before the bound wrote the whole step and no "timeline" key)
            "timeline_events": summary.get("timeline", {}).get("events"),
            "step_events": summary.get("timeline", {}).get("of"),
            "timeline_bytes": du(out / "timeline"), "output_bytes": du(out)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", nargs="+", default=["vtrain", "goal", "8k"], choices=sorted(ROWS))
    ap.add_argument("--workdir", type=Path, default=None, help="where the Jobs go (default: a temporary folder)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sweep", type=int, default=0, help="time a config sweep of this many rows instead")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--main-job", action="store_true", help="time the README's main job instead")
    ap.add_argument("--skip-expanded", action="store_true",
                    help="time trace + simulate only, not the expanded Job (minutes on a busy machine)")
    ap.add_argument("--source", action="store_true",
                    help="keep the environment's bytecode setting, no warm-up (see the module docstring)")
    ap.add_argument("--predict", nargs="*", choices=sorted(PREDICT_ROWS), default=None,
                    help="time echo-et predict of these rows instead (default: all)")
    ap.add_argument("--repeat", type=int, default=3, help="--predict: runs per row (the least is kept)")
    ap.add_argument("--timeline-all", action="store_true", help="--predict: write the whole step's timeline")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="predict-speed-"))
    work.mkdir(parents=True, exist_ok=True)
    if not args.source:
        use_bytecode(work)
    if args.main_job:
        print(json.dumps(bench_main_job(work), indent=2))
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if args.predict is not None:
        res = [bench_predict(name, work, max(1, args.repeat), args.timeline_all)
               for name in (args.predict or sorted(PREDICT_ROWS))]
        print(json.dumps(res, indent=2))
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
        return 0
    if args.sweep:
        res = bench_sweep(args.sweep, args.workers, work)
        print(json.dumps(res, indent=2))
        return 0 if res["exit"] in (0, 1) else 1
    rows = []
    for name in args.rows:
        rows.append(bench(name, work, expanded=not args.skip_expanded))
        if not args.json:
            r = rows[-1]
            print(f"{name}: trace {r['trace_s']} s ({r['trace_cpu_s']} s CPU) / {r['trace_rss_mib']} MiB, simulate "
                  f"{r['simulate_s']} s ({r['simulate_cpu_s']} s CPU) / {r['simulate_rss_mib']} MiB "
                  f"(total {r['total_s']} s), step {r['step_ms']} ms; "
                  f"Job {r['job_bytes'] / 1e6:.1f} MB vs expanded {(r['expanded_job_bytes'] or 0) / 1e6:.1f} MB, "
                  f"expanded simulate {r['expanded_simulate_s']} s ({r['expanded_simulate_cpu_s']} s CPU) / "
                  f"{r['expanded_simulate_rss_mib']} MiB, "
                  f"step {r['expanded_step_ms']} ms", flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    bad = [r["row"] for r in rows if r["expanded_simulate_s"] is not None and r["step_ms"] != r["expanded_step_ms"]]
    if bad:
        print(f"step time differs between the Job and its expansion: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
