"""Speed and memory of the Chakra ET reader and writer, printed as a table.

    python benchmarks/chakra_io.py [--nodes 200000]

Rows: the real ResNet trace (../shared/data, when present), plain and gzip; a synthetic
one-rank trace of N nodes (CPU op -> kernel pairs, a collective every 50 kernels, ctrl
deps to the parent op) with ids in program order; and the same trace with ids reversed,
so every dependency points forward and the reader must renumber all N nodes. Each row runs
in a fresh process: ``peak MB`` is that process's peak RSS (interpreter and imports
included, ``base MB`` of it), so it is what reading, checking and writing that input
costs. Times are wall-clock seconds on this machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from chakra.schema.protobuf import et_def_pb2 as et

from echo_et.converters import ReadOptions, chakra
from echo_et.ir import check_job
from echo_et.ir.io import write_delimited

REPO = Path(__file__).resolve().parents[1]
FEEDER = REPO.parent / "shared/data/traces/chakra/tests/data/feeder_tests_trace.tar.gz"


def synthetic(path: Path, n: int, *, reverse_ids: bool = False) -> Path:
    """N nodes in program order; with ``reverse_ids`` node i is written with id N + 1 - i,
    so every dependency names a larger id."""
    def nid(i: int) -> int:
        return n + 1 - i if reverse_ids else i

    with open(path, "wb") as f:
        write_delimited(f, et.GlobalMetadata(version="1.0.0"))
        for i in range(1, n + 1):
            node = et.Node(id=nid(i), duration_micros=i % 97)
            if i % 2:
                node.name, node.type = f"aten::op{i}", et.COMP_NODE
                node.attr.add(name="is_cpu_op", bool_val=True)
                if i > 2:
                    node.data_deps.append(nid(i - 2))
            elif i % 100 == 0:
                node.name, node.type = "ncclDevKernel_AllReduce", et.COMM_COLL_NODE
                node.attr.add(name="is_cpu_op", bool_val=False)
                node.attr.add(name="comm_type", int64_val=0)
                node.attr.add(name="comm_size", int64_val=1 << 20)
                node.data_deps.append(nid(i - 1))
                node.ctrl_deps.append(nid(i - 1))
            else:
                node.name, node.type = f"kernel{i}", et.COMP_NODE
                node.attr.add(name="is_cpu_op", bool_val=False)
                node.data_deps.append(nid(i - 1))
                node.ctrl_deps.append(nid(i - 1))
            write_delimited(f, node)
    return path


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(label: str, files: list[Path], out: Path) -> dict:
    base = _peak_mb()
    t0 = time.perf_counter()
    job = chakra.read(files, ReadOptions())
    t1 = time.perf_counter()
    issues = check_job(job)
    t2 = time.perf_counter()
    res = chakra.write(job, out / "trace")
    t3 = time.perf_counter()
    nodes = sum(len(job.graph_of(r)) for r in job.ranks())
    edges = sum(len(n.deps) for r in job.ranks() for n in job.graph_of(r).nodes)
    return {"input": label, "ranks": str(job.world_size), "nodes": str(nodes), "deps": str(edges),
            "in MB": f"{sum(f.stat().st_size for f in files) / 1e6:.1f}",
            "read s": f"{t1 - t0:.2f}", "check s": f"{t2 - t1:.2f}", "write s": f"{t3 - t2:.2f}",
            "nodes/s read": f"{nodes / (t1 - t0):,.0f}", "out MB": f"{res['bytes'] / 1e6:.1f}",
            "peak MB": f"{_peak_mb():.0f}", "base MB": f"{base:.0f}",
            "check": "ok" if not issues else f"{len(issues)} issues"}


def run_row(row: str, nodes: int, tmp: Path) -> dict:
    """One row, in this process (the parent runs each row in a child of its own)."""
    if row.startswith("feeder"):
        src = next((tmp / "feeder").rglob("chakra.0.et"))
        if row == "feeder-gz":
            gz = tmp / "chakra.0.et.gz"
            with open(src, "rb") as fi, gzip.open(gz, "wb") as fo:
                shutil.copyfileobj(fi, fo)
            return measure("feeder chakra.0.et.gz", [gz], tmp / "o-gz")
        return measure("feeder chakra.0.et", [src], tmp / "o-feeder")
    reverse = row == "reversed"
    f = synthetic(tmp / f"{row}.et", nodes, reverse_ids=reverse)
    return measure(f"synthetic {nodes}{', ids reversed' if reverse else ''}", [f], tmp / f"o-{row}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--tmp", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(run_row(args.row, args.nodes, Path(args.tmp))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        rows = ["synthetic", "reversed"]
        if FEEDER.exists():
            with tarfile.open(FEEDER) as tf:
                tf.extractall(t / "feeder", filter="data")
            rows = ["feeder", "feeder-gz", *rows]
        table = []
        for row in rows:
            done = subprocess.run([sys.executable, __file__, "--row", row, "--nodes", str(args.nodes),
                                   "--tmp", tmp], check=True, capture_output=True, text=True)
            table.append(json.loads(done.stdout.splitlines()[-1]))
    head = list(table[0])
    cells = [head] + [[r[k] for k in head] for r in table]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    print(f"(python {sys.version.split()[0]}; each row in a fresh process)")


if __name__ == "__main__":
    main()
