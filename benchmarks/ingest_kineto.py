"""Speed and peak memory of Kineto ingestion, side by side with ``json.load`` + a dict walk.

    python benchmarks/ingest_kineto.py [--trace PATH] [--repeat 3]

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
"""

from __future__ import annotations

import argparse
import json
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
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
base = rss_mb()
t = time.perf_counter()
if method == "json":
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
print(json.dumps({{"wall": wall, "peak": rss_mb(), "base": base, "events": events}}))
"""

METHODS = [("json", "json.load + walk"), ("stream", "echo-et stream parse"),
           ("job", "echo-et Kineto -> Job")]


def run(method: str, trace: Path) -> dict:
    code = _CHILD.format(repo=str(REPO))
    out = subprocess.run([sys.executable, "-c", code, method, str(trace)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not args.trace.exists():
        sys.exit(f"error: {args.trace}: no such file (needs ../shared/data)")
    results = {}
    for method, _ in METHODS:
        runs = [run(method, args.trace) for _ in range(args.repeat)]
        results[method] = min(runs, key=lambda r: r["wall"]) | {
            "peak": max(r["peak"] for r in runs), "base": min(r["base"] for r in runs)}
    n_events = results["json"]["events"]
    size = args.trace.stat().st_size / 1e6
    print(f"trace: {args.trace.name} ({size:.1f} MB on disk, {n_events} events), "
          f"best of {args.repeat} runs, one process per run")
    print()
    print("| method | wall s | events/s | peak RSS MB | above imports MB |")
    print("|---|---:|---:|---:|---:|")
    for method, label in METHODS:
        r = results[method]
        rate = n_events / r["wall"]
        print(f"| {label} | {r['wall']:.2f} | {rate:,.0f} | {r['peak']:.0f} | "
              f"{r['peak'] - r['base']:.0f} |")


if __name__ == "__main__":
    main()
