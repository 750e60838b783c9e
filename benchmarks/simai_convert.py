"""Speed of the SimAI/AICB workload importer, printed as a table.

    python benchmarks/simai_convert.py

Rows: every workload under ../shared/data/workloads (AICB files without ``all_gpus`` at 16
ranks) and the 9216-GPU MoE workload, which must convert without one graph per rank.
Columns: ranks, distinct graphs, nodes per graph, process groups, convert and check seconds
(wall clock on this machine), peak RSS of the whole process so far.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

from echo_et.converters import ReadOptions, read
from echo_et.ir import check_job

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = REPO.parent / "shared/data/workloads"


def main() -> None:
    if not WORKLOADS.exists():
        raise SystemExit(f"needs {WORKLOADS}")
    rows = []
    for path in sorted(WORKLOADS.rglob("*.txt")):
        lines = path.read_text().splitlines()
        if len(lines) < 2 or not lines[1].strip().isdigit():
            continue
        world = None if "all_gpus:" in lines[0] else 16
        t0 = time.perf_counter()
        job = read([path], "simai", ReadOptions(world_size=world))
        t1 = time.perf_counter()
        issues = check_job(job)
        t2 = time.perf_counter()
        graph = job.graph(job.graph_ids()[0])
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append((path.name[:48], job.world_size, len(job.graph_ids()), len(graph.nodes),
                     len(job.manifest.groups), t1 - t0, t2 - t1, rss, "ok" if not issues else "FAIL"))
    head = ("workload", "ranks", "graphs", "nodes/graph", "groups", "convert s", "check s",
            "peak MiB", "check")
    print(f"{head[0]:<48} {head[1]:>6} {head[2]:>6} {head[3]:>11} {head[4]:>6} {head[5]:>9} "
          f"{head[6]:>8} {head[7]:>8} {head[8]:>5}")
    for r in rows:
        print(f"{r[0]:<48} {r[1]:>6} {r[2]:>6} {r[3]:>11} {r[4]:>6} {r[5]:>9.2f} {r[6]:>8.2f} "
              f"{r[7]:>8.0f} {r[8]:>5}")


if __name__ == "__main__":
    main()
