"""Simulator speed: a GPT-like TP x PP x DP step (``echo_et.experiments.synthetic.gpt_3d_job``:
1F1B over micro-batches, TP all-reduces, PP send/recv, DP all-reduce) at 1,024 and 8,192
ranks, ranks bound to one shared graph per pipeline stage.

Each configuration runs in its own process so that peak memory (max RSS) is its own.
Columns: build (make the Job with the builders), check (IR checker), simulate (compile,
symmetry, event loop, breakdown, critical path; wall, and its CPU time, the stable number on
a shared machine), simulated node-events and events/s,
all-rank node-events (what the step contains) per second of simulate, peak RSS.

    python benchmarks/sim_speed.py [--sizes 1024 8192] [--no-symmetry-too] [--mode replay|predict] [--json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

LAYOUTS = {  # world size -> (tp, pp, dp)
    64: (8, 4, 2),
    1024: (8, 8, 16),
    8192: (8, 8, 128),
}


def one(world: int, symmetry: bool, mode: str, microbatches: int, layers: int) -> dict:
    from echo_et.experiments.synthetic import gpt_3d_job
    from echo_et.ir import check_job
    from echo_et.sim import SimOptions, simulate

    tp, pp, dp = LAYOUTS[world]
    t0 = time.perf_counter()
    job = gpt_3d_job(tp, pp, dp, microbatches=microbatches, layers=layers)
    t1 = time.perf_counter()
    issues = check_job(job)
    t2 = time.perf_counter()
    if issues:
        raise SystemExit(f"synthetic job fails check: {issues[0]}")
    comm = None
    if mode == "predict":
        from echo_et.models.comm import CommModel

        comm = CommModel.preset("a100-ib")
    t3, c3 = time.perf_counter(), time.process_time()
    res = simulate(job, mode, options=SimOptions(symmetry=symmetry, check=False), comm_model=comm)
    t4, c4 = time.perf_counter(), time.process_time()
    nodes_per_rank = {gid: len(job.graph(gid)) for gid in job.graph_ids()}
    all_nodes = sum(nodes_per_rank[b.graph] for b in job.manifest.bindings)
    return {
        "world": world, "layout": f"tp{tp} pp{pp} dp{dp}", "microbatches": microbatches, "layers": layers,
        "mode": mode, "symmetry": symmetry, "graphs": len(nodes_per_rank),
        "build_s": round(t1 - t0, 3), "check_s": round(t2 - t1, 3), "simulate_s": round(t4 - t3, 3),
        "simulate_cpu_s": round(c4 - c3, 3),
        "simulated_ranks": res.simulated_ranks, "events": res.events,
        "events_per_s": round(res.events / (t4 - t3)), "all_rank_nodes": all_nodes,
        "all_rank_nodes_per_s": round(all_nodes / (t4 - t3)), "step_time_ns": res.step_time_ns,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 8192], choices=sorted(LAYOUTS))
    ap.add_argument("--no-symmetry-too", action="store_true", help="also time every rank simulated separately")
    ap.add_argument("--mode", choices=("replay", "predict"), default="replay")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--layers", type=int, default=4, help="layers per pipeline stage")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("WORLD", "SYMMETRY"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(int(args.one[0]), args.one[1] == "on", args.mode, args.microbatches, args.layers)))
        return 0
    rows = []
    for world in args.sizes:
        for sym in ([True, False] if args.no_symmetry_too else [True]):
            cmd = [sys.executable, __file__, "--one", str(world), "on" if sym else "off", "--mode", args.mode,
                   "--microbatches", str(args.microbatches), "--layers", str(args.layers)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            rows.append(json.loads(proc.stdout))
            print(f"done: {world} ranks, symmetry {'on' if sym else 'off'}", file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1, sort_keys=True))
        return 0
    print("| ranks | layout | symmetry | build s | check s | simulate s | simulate CPU s | simulated ranks | "
          "node-events | events/s | all-rank nodes/s | peak RSS MiB |")
    print("|" + "---|" * 12)
    for r in rows:
        print(f"| {r['world']} | {r['layout']} | {'on' if r['symmetry'] else 'off'} | {r['build_s']} | "
              f"{r['check_s']} | {r['simulate_s']} | {r['simulate_cpu_s']} | {r['simulated_ranks']} | {r['events']} | "
              f"{r['events_per_s']:,} | {r['all_rank_nodes_per_s']:,} | {r['peak_rss_mib']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
