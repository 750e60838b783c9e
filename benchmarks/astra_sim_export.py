"""Speed of the ASTRA-sim export (writing plus the contract check), printed as a table.

    python benchmarks/astra_sim_export.py [--moe-ranks 384]

Rows: the GPT-13B sequence-parallel AICB workload at 64 and 512 ranks, the full 9216-GPU
MoE SimAI workload at its smallest legal world (TP x PP x EP = 384 ranks; ``--moe-ranks``
to change), and the 8-rank DLRM Kineto job when the Kineto reader is present. Export time
includes the contract check that every export runs; the check is also timed alone.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from echo_et.converters import ReadOptions, read
from echo_et.converters.astra_sim import check_export, export

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared/data"
GPT = DATA / "workloads/aicb/workload/simAI/model_workload/G13B-M1-C02_GPT13B_megatron_tp8_pp1_mbs1_sp_A100.txt"
MOE = DATA / "workloads/SimAI/example/workload_analytical.txt"
DLRM = DATA / "traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"


def measure(name: str, job, tmp: Path) -> tuple:
    out = tmp / name.replace(" ", "_")
    t0 = time.perf_counter()
    res = export(job, out)
    t1 = time.perf_counter()
    issues = check_export(out)
    t2 = time.perf_counter()
    nodes = sum(v for k, v in res["mapped"].items() if "folded" not in k)
    size = sum(p.stat().st_size for p in out.iterdir()) / 2**20
    shutil.rmtree(out)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return (name, res["ranks"], nodes, t1 - t0, t2 - t1, nodes / (t1 - t0), size, rss,
            "ok" if not issues else "FAIL")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-ranks", type=int, default=384)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for world in (64, 512):
            rows.append(measure(f"GPT-13B sp, {world} ranks",
                                read([GPT], "simai", ReadOptions(world_size=world)), tmp))
        rows.append(measure(f"MoE 9216-GPU file, {args.moe_ranks} ranks",
                            read([MOE], "simai", ReadOptions(world_size=args.moe_ranks)), tmp))
        if DLRM.exists():
            with tarfile.open(DLRM) as tf:
                tf.extractall(tmp / "dlrm", filter="data")
            files = sorted((tmp / "dlrm").rglob("*.json"))
            try:
                rows.append(measure("DLRM Kineto, 8 ranks", read(files, "kineto", ReadOptions()), tmp))
            except Exception as e:  # noqa: BLE001 - the Kineto reader may be absent
                print(f"(DLRM skipped: {e})")
    head = ("job", "ranks", "nodes", "export s", "check s", "nodes/s", "MiB", "peak MiB", "check")
    print(f"{head[0]:<32} {head[1]:>6} {head[2]:>9} {head[3]:>9} {head[4]:>8} {head[5]:>9} "
          f"{head[6]:>7} {head[7]:>8} {head[8]:>5}")
    for r in rows:
        print(f"{r[0]:<32} {r[1]:>6} {r[2]:>9} {r[3]:>9.2f} {r[4]:>8.2f} {r[5]:>9.0f} {r[6]:>7.1f} "
              f"{r[7]:>8.0f} {r[8]:>5}")


if __name__ == "__main__":
    main()
