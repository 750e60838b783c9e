"""How the cost of `scale` grows with world size: wall time to scale, write and check, and
the manifest size, for a Job scaled from 8 ranks to 1K, 8K and 100K.

    python benchmarks/scale_manifest.py [JOB] [--dp 128,1024,12500]

JOB is an echo-et Job directory or trace (default: the DLRM 8-rank Kineto trace from
../shared/data, converted on the fly). Graphs are shared across data-parallel replicas, so
only the manifest (groups and rank bindings) grows with the world size.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DLRM = REPO.parent / "shared" / "data" / "traces" / "param" / "et_replay" / "tests" / "inputs" / "dlrm_kineto.tar.gz"


def _load(arg: str | None, tmp: Path):
    from echo_et.converters import ReadOptions, read

    if arg:
        return read([Path(arg)], None, ReadOptions()), arg
    if not DLRM.exists():
        sys.exit(f"no JOB given and {DLRM} is absent")
    with tarfile.open(DLRM) as tf:
        tf.extractall(tmp, filter="data")
    return read(sorted(tmp.rglob("*.json")), "kineto", ReadOptions()), "DLRM 8-rank Kineto (shared data)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job", nargs="?")
    ap.add_argument("--dp", default="128,1024,12500",
                    help="data-parallel degrees (world = dp * tp * pp of the job)")
    args = ap.parse_args()
    from echo_et.ir import check_job, save_job
    from echo_et.passes import infer_layout, scale

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        job, what = _load(args.job, tmp)
        lay = infer_layout(job)
        print(f"input: {what}: {job.world_size} ranks, {len(job.graph_ids())} graphs, "
              f"layout dp={lay.dp} tp={lay.tp} pp={lay.pp}")
        print(f"{'world':>8} {'graphs':>6} {'groups':>7} {'scale_s':>8} {'write_s':>8} {'check_s':>8} "
              f"{'manifest_B':>11} {'B/rank':>7} {'graph_files_B':>14} {'maxrss_MB':>9}")
        for dp in [int(x) for x in args.dp.split(",")]:
            t0 = time.perf_counter()
            out, report = scale(job, dp=dp)
            t1 = time.perf_counter()
            dest = save_job(out, tmp / f"dp{dp}")
            t2 = time.perf_counter()
            issues = check_job(out)
            t3 = time.perf_counter()
            if issues:
                sys.exit(f"scaled job fails check: {issues[0]}")
            manifest = (dest / "manifest.pb").stat().st_size
            graphs = sum(p.stat().st_size for p in (dest / "graphs").iterdir())
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(f"{out.world_size:>8} {report.graphs:>6} {report.groups:>7} {t1 - t0:>8.2f} "
                  f"{t2 - t1:>8.2f} {t3 - t2:>8.2f} {manifest:>11} {manifest // out.world_size:>7} "
                  f"{graphs:>14} {rss:>9.0f}")


if __name__ == "__main__":
    main()
