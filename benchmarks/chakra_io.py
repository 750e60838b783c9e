"""Speed of the Chakra ET reader and writer, printed as a table.

    python benchmarks/chakra_io.py [--nodes 200000]

Rows: the real ResNet trace (../shared/data, when present) and a synthetic one-rank trace
of N nodes (CPU op -> kernel pairs, a collective every 50 kernels, ctrl deps to the
parent op). Times are wall-clock seconds on this machine; peak RSS is the whole process.
"""

from __future__ import annotations

import argparse
import resource
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


def synthetic(path: Path, n: int) -> Path:
    with open(path, "wb") as f:
        write_delimited(f, et.GlobalMetadata(version="1.0.0"))
        for i in range(1, n + 1):
            node = et.Node(id=i, duration_micros=i % 97)
            if i % 2:
                node.name, node.type = f"aten::op{i}", et.COMP_NODE
                node.attr.add(name="is_cpu_op", bool_val=True)
                if i > 2:
                    node.data_deps.append(i - 2)
            elif i % 100 == 0:
                node.name, node.type = "ncclDevKernel_AllReduce", et.COMM_COLL_NODE
                node.attr.add(name="is_cpu_op", bool_val=False)
                node.attr.add(name="comm_type", int64_val=0)
                node.attr.add(name="comm_size", int64_val=1 << 20)
                node.data_deps.append(i - 1)
                node.ctrl_deps.append(i - 1)
            else:
                node.name, node.type = f"kernel{i}", et.COMP_NODE
                node.attr.add(name="is_cpu_op", bool_val=False)
                node.data_deps.append(i - 1)
                node.ctrl_deps.append(i - 1)
            write_delimited(f, node)
    return path


def measure(label: str, files: list[Path], out: Path) -> list[str]:
    t0 = time.perf_counter()
    job = chakra.read(files, ReadOptions())
    t1 = time.perf_counter()
    issues = check_job(job)
    t2 = time.perf_counter()
    res = chakra.write(job, out / "trace")
    t3 = time.perf_counter()
    nodes = sum(len(job.graph_of(r)) for r in job.ranks())
    edges = sum(len(n.deps) for r in job.ranks() for n in job.graph_of(r).nodes)
    return [label, str(job.world_size), str(nodes), str(edges), f"{t1 - t0:.2f}", f"{t2 - t1:.2f}",
            f"{t3 - t2:.2f}", f"{nodes / (t1 - t0):,.0f}", f"{res['bytes'] / 1e6:.1f}",
            "ok" if not issues else f"{len(issues)} issues"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200_000)
    args = ap.parse_args()
    rows = [["input", "ranks", "nodes", "deps", "read s", "check s", "write s", "nodes/s read",
             "out MB", "check"]]
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        if FEEDER.exists():
            with tarfile.open(FEEDER) as tf:
                tf.extractall(t / "feeder", filter="data")
            rows.append(measure("feeder chakra.0.et", list((t / "feeder").rglob("chakra.0.et")), t / "o1"))
        rows.append(measure(f"synthetic {args.nodes}", [synthetic(t / "syn.et", args.nodes)], t / "o2"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak:.0f} MB (python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
