"""Does the ASTRA-sim export keep the step? Every real multi-rank input, exported and run in
the real ASTRA-sim binaries (current master and the older Chakra reader), against the
measured step and echo-et's own simulation of the same job. Printed as a Markdown table.

    python benchmarks/astra_sim_fidelity.py [--bin-dir DIR] [--only NAME] [--skip-scaled]

Columns:
  measured      the traced step (the slowest rank's; per-rank traced times for ex-situ jobs,
                which were never measured together)
  echo-et       echo-et's replay of the job when its communication was measured; its
                prediction with the CC preset (slowdown off) when the communication is a
                placeholder (ex-situ traces, SimAI workloads)
  export        echo-et's replay of exactly what was exported (``expected_step_ns``), with
                the communication times the fitted network is meant to reproduce
  master/legacy ASTRA-sim's step on the export: each rank's finish minus its start offset,
                the slowest rank; error against measured (m) and echo-et (e)
  run s         ASTRA-sim's wall time, master / legacy
Network: "measured" = fitted to the job's own collectives, a preset name = fitted to that CC
model; the largest residual of the fit is shown.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from echo_et.converters import ReadOptions, read
from echo_et.errors import EchoError
from echo_et.experiments.astra_sim import export_with_report, run_astra_sim
from echo_et.ir import load_job
from echo_et.ir.schema import pb
from echo_et.models.comm import CommModel
from echo_et.sim import simulate
from echo_et.sim.validate import measured_step

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
BIN_DIR = REPO.parent / "shared" / "tools" / "astra-sim" / "bin"
READERS = ("astra_analytical", "astra_analytical_legacy")
AICB = DATA / "workloads" / "aicb" / "workload" / "simAI"
SIMAI = DATA / "workloads" / "SimAI" / "example"


def _untar(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    return dest


def _simai_world(path: Path) -> tuple[int, Path, str]:
    lines = path.read_text().splitlines()
    toks = lines[0].split()
    h = {toks[i].rstrip(":"): int(toks[i + 1]) for i in range(1, len(toks) - 1) if toks[i + 1].isdigit()}
    if h.get("all_gpus", 0) > 1024:
        # The 9216-GPU MoE workload at its smallest world (TP x PP x EP), first 40 layers.
        world = h["model_parallel_NPU_group"] * h["pp"] * h["ep"]
        short = Path(tempfile.mkdtemp()) / path.name
        short.write_text("\n".join([lines[0], "40", *lines[2:42]]) + "\n")
        return world, short, f"{path.stem} (first 40 layers)"
    return h.get("all_gpus") or 2 * max(2, h.get("model_parallel_NPU_group", 1)), path, path.stem


def inputs(tmp: Path) -> list[tuple[str, object, dict]]:
    """(name, loader, how to export): loaders are called lazily."""
    out: list[tuple[str, object, dict]] = []
    dlrm = DATA / "traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz"
    if dlrm.exists():
        def load_dlrm():
            folder = _untar(dlrm, tmp / "dlrm")
            return read(sorted(p for p in folder.rglob("*.json") if p.is_file()), "kineto", ReadOptions())
        out.append(("DLRM Kineto, 8x V100", load_dlrm, {"network": "measured"}))
        out.append(("DLRM Kineto, 8x V100", load_dlrm, {"network": "v100-ib"}))
    hta = DATA / "traces/HolisticTraceAnalysis/tests/data/trace_filter"
    if hta.exists():
        out.append(("HTA sampled ranks 0-1 of 128 (A100)",
                    lambda: read(sorted(hta.glob("*.json.gz")), "kineto", ReadOptions()), {"network": "measured"}))
    for name, rel in (("DDP gloo, 4 CPU processes", "fixtures/traces/ddp_gloo4"),
                      ("gloo collectives, 3 CPU processes", "fixtures/kineto/gloo3")):
        folder = REPO / rel
        out.append((name, lambda f=folder: read(sorted(p for p in f.glob("*.json.gz") if ".et." not in p.name),
                                                "kineto", ReadOptions()),
                    {"network": "measured"}))
    chakra = DATA / "traces/chakra/tests/data/feeder_tests_trace.tar.gz"
    if chakra.exists():
        def load_chakra():
            src = next(_untar(chakra, tmp / "chakra").rglob("chakra.0.et"))
            return read([src], "chakra", ReadOptions())
        out.append(("chakra.0.et (rank 0 of ResNet DDP)", load_chakra, {"network": "default"}))
    for job in ("gpt-tp2-pp2-dp2", "gpt-tp2-pp2-dp8", "gpt-dp4-zero1", "ddp-dp4"):
        out.append((f"fixture {job} (ex-situ, CPU)", lambda j=job: load_job(REPO / "fixtures/jobs" / j),
                    {"network": "a100-ib"}))
    for path in sorted([*AICB.glob("model_workload/*.txt"), *AICB.glob("micro_test/*.txt"),
                        *SIMAI.glob("*.txt")]):
        world, src, label = _simai_world(path)
        out.append((f"SimAI {label}", lambda s=src, w=world: read([s], "simai", ReadOptions(world_size=w)),
                    {"network": "a100-ib"}))
    return out


def _pct(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "-"
    return f"{100.0 * (a - b) / b:+.1f}"


def _ms(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e6:.3f}"


def measure(name: str, job, how: dict, out: Path, binaries: list[str]) -> dict:
    net = how["network"]
    model = None if net in ("measured", "default") else CommModel.preset(net)
    t0 = time.perf_counter()
    res = export_with_report(job, out, comm_model=model, measured_network=net == "measured", fit_splits=True)
    export_s = time.perf_counter() - t0
    comm = [n for g in job.graphs() for n in g.nodes if n.kind in (pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV)]
    # Communication without a measured time: ex-situ placeholders, SimAI workloads.
    placeholder = bool(comm) and all(n.attrs.get("timing") == "placeholder" or n.duration_ns == 0 for n in comm)
    timed = any(len({n.start_ns for n in g.nodes}) > 1 for g in job.graphs())
    try:
        if placeholder and model is not None:
            echo = simulate(job, "predict", comm_model=model).step_time_ns
            echo_mode = "predict"
        else:
            echo = res["replay_step_ns"]
            echo_mode = "replay" if echo is not None else "cannot replay"
    except EchoError:
        echo, echo_mode = None, "cannot simulate"
    # A step was measured only where the graph has a timeline (SimAI workloads and Chakra
    # files from the PyTorch converter have none).
    measured = (max((measured_step(job, r)[0] for r in job.ranks()), default=0) or None) if timed else None
    row = {"name": name, "ranks": job.world_size, "network": net, "measured": measured, "echo": echo,
           "echo_mode": echo_mode, "export": res.get("expected_step_ns"), "export_s": export_s,
           "fit_err": (res["network_fit"] or {}).get("max_abs_error_pct"), "astra": {}}
    for b in binaries:
        got = run_astra_sim(out, b, timeout_s=3600)
        row["astra"][Path(b).name] = (got["step_ns"], got["wall_s"], len(got["finished_cycles"]))
    return row


def scaled_row(tmp: Path, binaries: list[str]) -> dict:
    job_dir = tmp / "gpt1024"
    subprocess.run([sys.executable, "-m", "echo_et.cli.main", "scale", str(REPO / "fixtures/jobs/gpt-tp2-pp2-dp2"),
                    "--dp", "256", "-o", str(job_dir)], check=True, capture_output=True)
    job = load_job(job_dir)
    return measure("fixture gpt-tp2-pp2-dp2 scaled to dp 256 (1,024 ranks)", job, {"network": "a100-ib"},
                   tmp / "gpt1024_astra", binaries)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin-dir", type=Path, default=BIN_DIR)
    ap.add_argument("--only", default="", help="only inputs whose name contains this text")
    ap.add_argument("--skip-scaled", action="store_true", help="leave out the 1,024-rank job")
    args = ap.parse_args()
    binaries = [str(args.bin_dir / r) for r in READERS if (args.bin_dir / r).exists()]
    if not binaries:
        sys.exit(f"no ASTRA-sim binaries in {args.bin_dir}")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for k, (name, load, how) in enumerate(inputs(tmp)):
            if args.only and args.only not in name:
                continue
            try:
                job = load()
                rows.append(measure(name, job, how, tmp / f"out{k}", binaries))
            except EchoError as e:
                rows.append({"name": name, "error": str(e)})
            shutil.rmtree(tmp / f"out{k}", ignore_errors=True)
            print(f"done: {name} ({how['network']})", file=sys.stderr)
        if not args.skip_scaled and (not args.only or args.only in "scaled 1,024"):
            rows.append(scaled_row(tmp, binaries))
    print("| input | ranks | network (max fit error %) | measured ms | echo-et ms | export ms "
          "| ASTRA-sim master ms (m %, e %) | ASTRA-sim legacy ms (m %, e %) | run s master / legacy |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | | error: {r['error']} | | | | | | |")
            continue
        cells = []
        for b in READERS:
            got = r["astra"].get(b)
            if got is None:
                cells.append("-")
                continue
            step, _, done = got
            miss = "" if done >= r["ranks"] else f", {done}/{r['ranks']} ranks"
            cells.append(f"{_ms(step)} ({_pct(step, r['measured'])}, {_pct(step, r['echo'])}{miss})")
        walls = " / ".join(f"{r['astra'][b][1]:.2f}" for b in READERS if b in r["astra"])
        fit = "" if r["fit_err"] is None else f" ({r['fit_err']:.0f})"
        echo = f"{_ms(r['echo'])} {r['echo_mode']}" if r["echo"] is not None else r["echo_mode"]
        print(f"| {r['name']} | {r['ranks']} | {r['network']}{fit} | {_ms(r['measured'])} | {echo} "
              f"| {_ms(r['export'])} | {cells[0]} | {cells[1]} | {walls} |")


if __name__ == "__main__":
    main()
