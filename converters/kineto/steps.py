"""``ProfilerStep#N`` windows: which step to keep, on every rank the same.

A step is *complete* in a file when its host span lies inside the profiler's recording
window (the ``PyTorch Profiler`` trace span when the file has one, else the span of its
events) and, for the last step, when it is not cut short by the profiler stopping (fewer
than half the host ops of the median earlier step). By default the last step complete in
every file is kept; ``--step N`` picks N, which every file must contain. Files without any
step marker are taken whole; a mix of files with and without markers is refused (they
cannot be one job's one step).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from echo_et.errors import EchoError, OptionError

from .events import K_CPU, TraceFile


@dataclass(frozen=True)
class Window:
    step: int            # -1 when the trace is taken whole
    start: int           # ns on the file's clock; inclusive
    end: int             # exclusive

    def holds(self, ts: int) -> bool:
        return self.start <= ts < self.end


def recording_span(tf: TraceFile) -> tuple[int, int]:
    if tf.window is not None:
        return tf.window
    return min(e.ts for e in tf.events), max(e.end for e in tf.events)


def complete_steps(tf: TraceFile) -> list[int]:
    lo, hi = recording_span(tf)
    done = sorted(n for n, ev in tf.steps.items() if ev.ts >= lo and ev.end <= hi)
    if len(done) >= 2:
        # Without a schedule the profiler closes the last step when it stops, so that
        # step holds only what ran after the last prof.step(): far fewer ops than the rest.
        ops = _ops_per_step(tf, done)
        earlier = sorted(ops[n] for n in done[:-1])
        if ops[done[-1]] * 2 < earlier[len(earlier) // 2]:
            done.pop()
    return done


def _ops_per_step(tf: TraceFile, steps: list[int]) -> dict[int, int]:
    spans = sorted((tf.steps[n].ts, tf.steps[n].end, n) for n in steps)
    starts = [s for s, _, _ in spans]
    counts = dict.fromkeys(steps, 0)
    for ev in tf.events:
        if ev.kind != K_CPU:
            continue
        i = bisect_right(starts, ev.ts) - 1
        if i >= 0 and ev.ts < spans[i][1]:
            counts[spans[i][2]] += 1
    return counts


def _fmt_steps(steps) -> str:
    steps = sorted(steps)
    if not steps:
        return "none"
    if len(steps) > 6:
        return f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
    return ", ".join(str(s) for s in steps)


def choose_step(files: list[TraceFile], requested: int | None) -> int | None:
    """The step number to keep in every file, or None to keep whole traces."""
    with_steps = [tf for tf in files if tf.steps]
    if not with_steps:
        if requested is not None:
            raise OptionError("step", f"{files[0].path}: step {requested} asked for, but the trace has no "
                                      "ProfilerStep markers")
        return None
    if len(with_steps) != len(files):
        bare = next(tf for tf in files if not tf.steps)
        raise EchoError(f"{bare.path}: has no ProfilerStep markers while "
                        f"{with_steps[0].name} has; not traces of one job")
    if requested is not None:
        for tf in files:
            if requested not in tf.steps:
                raise EchoError(f"{tf.path}: no ProfilerStep#{requested} (steps: "
                                f"{_fmt_steps(tf.steps)})")
        return requested
    common: set[int] | None = None
    for tf in files:
        done = set(complete_steps(tf))
        common = done if common is None else common & done
    if not common:
        raise OptionError("step", f"{files[0].path}: no ProfilerStep is complete in every file ("
                          + "; ".join(f"{tf.name}: {_fmt_steps(complete_steps(tf))}"
                                      for tf in files[:4])
                          + "); choose a step")
    return max(common)


def window_of(tf: TraceFile, step: int | None) -> Window | None:
    if step is None:
        return None
    ev = tf.steps[step]
    return Window(step, ev.ts, ev.end)
