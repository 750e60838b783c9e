"""Speed and peak memory of Kineto ingestion, side by side with ``json.load`` + a dict walk.

    python benchmarks/ingest_kineto.py [--trace PATH | --large STEPS] [--repeat 3]

Default trace: HTA's df_index_resolver (216k events, 2.9 MB gzip, 54 MB of JSON). Each
method runs in a fresh Python process (so peak RSS is its own); the table shows the best
wall time of ``--repeat`` runs, events per second, and peak resident memory, both in total
and above the process's footprint after its imports (the cost of the trace itself).

Methods:
  json.load + walk         gzip + json.load of the whole document, then one pass over the
                           events reading ph/cat/ts/dur (what a naive converter starts with)
  echo-et stream parse     the incremental reader alone (jsonstream.read_document) with a
                           callback that drops every event
  echo-et Kineto -> Job    the full reader: parse, classify, build the graph and the Job
  HTA TraceAnalysis load   HolisticTraceAnalysis's TraceAnalysis(trace_dir=...) on a folder
                           holding the trace (its parse into dataframes; no analysis run)

The library line prints HTA's load time over echo-et's full Job (wall and CPU, same run).

Then the same comparison as a user makes it, whole processes, imports, start-up and output
included (``--no-processes`` skips it):
  echo-et convert (process)  ``echo-et convert TRACE --from kineto -o DIR``: the command a
                             user runs, writing the Job directory
  HTA load (process)         ``python -c "from hta.trace_analysis import TraceAnalysis;
                             TraceAnalysis(trace_dir=DIR)"``, DIR holding the trace
each the median of ``--repeat`` runs taking turns, wall and CPU (user + system) of the
process and its peak RSS; its last line is the user-facing ratio (goal >= 2x).

Children run with compiled bytecode, as installed tools do (HTA's was written by pip):
``PYTHONDONTWRITEBYTECODE`` is dropped and bytecode goes to a temporary
``PYTHONPYCACHEPREFIX``, filled by one unmeasured warm-up run of each method. Imports are
outside the clock for both tools alike: HTA's ``TraceAnalysis`` is imported before its clock
starts, and so is echo-et's Kineto reader (which ``read`` would otherwise import on first use,
about 0.1 s). The CLI benchmark of host ETs (ingest_host_et.py) times a whole command,
imports included.
``--large 8`` profiles the same run as ``ingest_host_et.py --large 8`` (about 21 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = (REPO.parent / "shared/data/traces/HolisticTraceAnalysis/tests/data"
           / "df_index_resolver/df_index_resolver.json.gz")

_CHILD = r"""
import gzip, json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
method, path = sys.argv[1], Path(sys.argv[2])
from echo_et.converters import ReadOptions, read
from echo_et.converters.kineto.jsonstream import read_document
import echo_et.converters.kineto.reader  # imported before the clock, as HTA's TraceAnalysis is
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss_mb()
t = time.perf_counter()
c = time.process_time()
if method == "hta":
    import logging, shutil, tempfile
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    d = tempfile.mkdtemp(prefix="bench_hta.")
    shutil.copy(path, d)
    base = rss_mb()
    t = time.perf_counter()
    c = time.process_time()
    ta = TraceAnalysis(trace_dir=d)
    events = sum(len(df) for df in ta.t.get_all_traces().values()) if hasattr(ta.t, "get_all_traces") else None
    shutil.rmtree(d)
elif method == "json":
    with gzip.open(path, "rt") if path.name.endswith(".gz") else open(path) as f:
        doc = json.load(f)
    n = 0
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") is not None and e.get("ts") is not None:
            n += 1
        e.get("dur")
    events = len(doc["traceEvents"])
elif method == "stream":
    count = [0]
    def drop(e):
        count[0] += 1
    read_document(path, drop)
    events = count[0]
else:
    job = read([path], "kineto", ReadOptions())
    events = None
wall = time.perf_counter() - t
cpu = time.process_time() - c
print(json.dumps({{"wall": wall, "cpu": cpu, "peak": rss_mb(), "base": base, "events": events}}))
"""

METHODS = [("json", "json.load + walk"), ("stream", "echo-et stream parse"),
           ("job", "echo-et Kineto -> Job"), ("hta", "HTA TraceAnalysis load")]


def make_large(dest: Path, steps: int) -> Path:
    """The Kineto trace of the run ``ingest_host_et.py --large`` profiles (a 6-layer encoder on
    CPU, ``steps`` steps), written by torch.profiler."""
    code = f"""
import torch
from torch.profiler import profile, ProfilerActivity
torch.manual_seed(0)
torch.set_num_threads(1)
layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(4, 32, 64)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range({steps}):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        prof.step()
prof.export_chrome_trace({str(dest)!r})
"""
    subprocess.run([sys.executable, "-c", code], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return dest


CHILD_ENV = dict(os.environ)


def use_bytecode_cache(tmp: Path) -> None:
    """Children load compiled bytecode from a cache under ``tmp`` (see the module docstring)."""
    CHILD_ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    CHILD_ENV["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")


def run(method: str, trace: Path) -> dict:
    code = _CHILD.format(repo=str(REPO))
    out = subprocess.run([sys.executable, "-c", code, method, str(trace)], capture_output=True,
                         text=True, check=True, env=CHILD_ENV)
    return json.loads(out.stdout.strip().splitlines()[-1])


HTA_PROCESS = ("import logging, sys\n"
               "logging.disable(logging.CRITICAL)\n"
               "from hta.trace_analysis import TraceAnalysis\n"
               "TraceAnalysis(trace_dir=sys.argv[1])\n")


def processes(trace: Path, tmp: Path, repeat: int) -> None:
    """``echo-et convert`` against a Python process loading the trace with HTA, each a whole
    process as a user runs it (see the module docstring)."""
    import shutil
    import statistics

    from ingest_host_et import run_measured
    from ingest_host_et import use_bytecode_cache as use_host_et_bytecode_cache

    hta_dir = tmp / "hta_in"
    hta_dir.mkdir()
    shutil.copy(trace, hta_dir)
    echo = shutil.which("echo-et", path=str(Path(sys.executable).parent)) or "echo-et"
    cmds = {"echo-et convert (process)": [echo, "convert", str(trace), "--from", "kineto", "-o", str(tmp / "job")],
            "HTA load (process)": [sys.executable, "-c", HTA_PROCESS, str(hta_dir)]}
    runs: dict[str, list[tuple[float, float, int, float]]] = {k: [] for k in cmds}
    use_host_et_bytecode_cache(tmp)
    for cmd in cmds.values():   # warm-up, unmeasured (bytecode cache)
        run_measured(cmd, tmp)
    for _ in range(repeat):
        for name, cmd in cmds.items():
            r = run_measured(cmd, tmp)
            if r[2] != 0:
                sys.exit(f"error: {name} exited {r[2]}")
            runs[name].append(r)
    print()
    print(f"whole processes, median of {repeat} runs taking turns")
    print()
    print("| process | wall s | CPU s | peak RSS MB |")
    print("|---|---:|---:|---:|")
    med = {}
    for name, rs in runs.items():
        med[name] = (statistics.median(r[0] for r in rs), statistics.median(r[3] for r in rs))
        print(f"| {name} | {med[name][0]:.2f} | {med[name][1]:.2f} | {max(r[1] for r in rs):.0f} |")
    (ew, ec), (hw, hc) = med["echo-et convert (process)"], med["HTA load (process)"]
    print()
    print(f"HTA load process / echo-et convert process: {hw / ew:.2f}x wall, {hc / ec:.2f}x CPU (goal >= 2x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--large", type=int, default=0, metavar="STEPS",
                    help="profile the ingest_host_et.py transformer for STEPS steps and use that trace")
    ap.add_argument("--no-processes", action="store_true", help="skip the whole-process comparison")
    args = ap.parse_args()
    import tempfile
    tmp = tempfile.TemporaryDirectory(prefix="bench_kineto.")
    if args.large:
        args.trace = make_large(Path(tmp.name) / "rank0.pt.trace.json", args.large)
    if not args.trace.exists():
        sys.exit(f"error: {args.trace}: no such file (needs ../shared/data)")
    use_bytecode_cache(Path(tmp.name))
    for method, _ in METHODS:   # warm-up, unmeasured: fills the bytecode cache
        run(method, args.trace)
    results = {}
    runs_of: dict[str, list[dict]] = {m: [] for m, _ in METHODS}
    for _ in range(args.repeat):  # methods take turns, so that load from other jobs falls on all
        for method, _ in METHODS:
            runs_of[method].append(run(method, args.trace))
    for method, runs in runs_of.items():
        results[method] = min(runs, key=lambda r: r["wall"]) | {
            "cpu": min(r["cpu"] for r in runs),
            "peak": max(r["peak"] for r in runs), "base": min(r["base"] for r in runs)}
    n_events = results["json"]["events"]
    size = args.trace.stat().st_size / 1e6
    print(f"trace: {args.trace.name} ({size:.1f} MB on disk, {n_events} events), "
          f"best of {args.repeat} runs, one process per run")
    print()
    print("| method | wall s | CPU s | events/s | peak RSS MB | above imports MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for method, label in METHODS:
        r = results[method]
        rate = n_events / r["wall"]
        print(f"| {label} | {r['wall']:.2f} | {r['cpu']:.2f} | {rate:,.0f} | {r['peak']:.0f} | "
              f"{r['peak'] - r['base']:.0f} |")
    job, hta = results["job"], results["hta"]
    print()
    print(f"HTA TraceAnalysis load / echo-et Kineto -> Job: {hta['wall'] / job['wall']:.2f}x wall, "
          f"{hta['cpu'] / job['cpu']:.2f}x CPU (library calls, imports outside the clock)")
    if not args.no_processes:
        processes(args.trace, Path(tmp.name), args.repeat)
    tmp.cleanup()


if __name__ == "__main__":
    main()
