"""Scaling a traced Job agrees with tracing the target layout directly.

    python benchmarks/scale_vs_trace.py [--rounds 5] [--steps 12] [--dp-from 2] [--dp-to 8]
                                        [--tp 2] [--pp 2] [--pp-to 2] [--preset a100-ib]

Each round traces the built-in GPT on CPU at the small layout and at the target layout
(in alternating order, so that a slow spell of the machine does not always hit the same
side), scales the small Job to the target with ``scale``, simulates both in predict mode
and prints: whether the collective/P2P sequences (type, group members, bytes, peer) are
identical on every rank, both step times and their ratio; then the same comparison for
the best of the rounds so far (each layout's traces combined piece by piece, as
``--steps`` does within one trace, so that a slow spell lasting a whole trace is left out
too). The last lines give the median per-round ratio and the spread of the direct traces
themselves (the measurement noise a single comparison has to be read against).

CPU timings on a shared machine carry noise that only adds time; ``--steps K`` profiles K
steps per traced rank and keeps each piece's shortest time (``echo-et trace --steps``),
which is what makes two separate traces comparable here.
"""

from __future__ import annotations

import argparse
import statistics
import time

from echo_et.ir import Job, check_job
from echo_et.models.comm import CommModel
from echo_et.passes import scale
from echo_et.sim import simulate
from echo_et.trace.compare import comm_sequence
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.steps import fastest_per_op, step_span_ns
from echo_et.trace.tracer import TraceOptions, trace
from echo_et.workloads import GPTConfig, Workload


def best_of(jobs: list[Job]) -> Job:
    """One Job from several traces of the same layout: each graph combined piece by piece,
    each rank's measured step the combined graph's."""
    out = jobs[0].copy()
    for gid in out.graph_ids():
        out.add_graph(fastest_per_op([j.graph(gid) for j in jobs], where=f"graph {gid}"))
    for b in out.manifest.bindings:
        b.measured_step_ns = step_span_ns(out.graph(b.graph))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12, help="measured steps per traced rank")
    ap.add_argument("--dp-from", type=int, default=2)
    ap.add_argument("--dp-to", type=int, default=8)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--pp-to", type=int, default=None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--preset", default="a100-ib")
    args = ap.parse_args(argv)
    pp_to = args.pp_to or args.pp
    wl = Workload(gpt=GPTConfig(layers=args.layers))
    small = ParallelLayout(dp=args.dp_from, tp=args.tp, pp=args.pp, microbatches=args.microbatches)
    target = ParallelLayout(dp=args.dp_to, tp=args.tp, pp=pp_to, microbatches=args.microbatches)
    wl.validate(small)
    wl.validate(target)
    model = CommModel.preset(args.preset)
    opts = TraceOptions(measured_steps=args.steps)
    print(f"GPT layers={args.layers} (defaults otherwise), CPU, {args.steps} measured steps per "
          f"traced rank; {small.describe()} scaled to {target.describe()} vs traced there; "
          f"simulate --mode predict --preset {args.preset}")
    header = ("| round | sequences identical | scaled step ms | traced step ms | scaled / traced | "
              "best-of-rounds scaled ms | best-of-rounds traced ms | best-of-rounds ratio |")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    direct_world = target.world_size

    def compare(src: Job, direct: Job) -> tuple[float, float, bool]:
        """Scale ``src`` to the target; both step times (ms) and whether every rank's
        communication sequence is the directly traced one."""
        scaled, _ = scale(src, dp=args.dp_to, **({"pp": pp_to} if pp_to != args.pp else {}))
        if check_job(scaled):
            raise SystemExit("scaled Job fails check")
        same = all(comm_sequence(scaled, r) == comm_sequence(direct, r)
                   for r in range(direct.world_size))
        a = simulate(scaled, "predict", comm_model=model).step_time_ns / 1e6
        b = simulate(direct, "predict", comm_model=model).step_time_ns / 1e6
        return a, b, same

    ratios: list[float] = []
    direct_ms: list[float] = []
    history: dict[str, list[Job]] = {small.describe(): [], target.describe(): []}
    t0 = time.perf_counter()
    for rnd in range(1, args.rounds + 1):
        order = [small, target] if rnd % 2 else [target, small]
        jobs = {lay.describe(): trace(wl.build_fn(), lay, opts).job for lay in order}
        for key, job in jobs.items():
            history[key].append(job)
        a, b, same = compare(jobs[small.describe()], jobs[target.describe()])
        ratios.append(a / b)
        direct_ms.append(b)
        ba, bb, bsame = compare(best_of(history[small.describe()]),
                                best_of(history[target.describe()]))
        print(f"| {rnd} | {'yes' if same and bsame else 'NO'} ({direct_world} ranks) | "
              f"{a:.2f} | {b:.2f} | {a / b:.3f} | {ba:.2f} | {bb:.2f} | {ba / bb:.3f} |", flush=True)
    med = statistics.median(ratios)
    print(f"median scaled/traced: {med:.3f} ({(med - 1) * 100:+.1f} %); per round "
          f"{min(ratios):.3f}..{max(ratios):.3f}")
    print(f"direct traces alone: {min(direct_ms):.2f}..{max(direct_ms):.2f} ms "
          f"(spread {(max(direct_ms) / min(direct_ms) - 1) * 100:.1f} %); "
          f"wall {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
