"""Repeated units of work, for workloads: ``repeat_unit(key, fn, x, layer=i)`` and
``repeat_region(key, run, mb=m)``.

A workload marks a piece of its step that repeats (a transformer layer: the same code for
every layer and every micro-batch) so that a meta-device trace records it once and copies it
(:mod:`echo_et.trace.direct`). Everywhere else (real runs, CPU and GPU traces) it is just
``fn(x)``. The contract: ``fn`` takes one tensor and returns one tensor; two calls with the
same ``key`` and inputs of the same shape, strides, dtype and autograd state run the same
operators and the same communication, in the same order, forward and backward. A layer's
``fn`` must put its forward under ``span(layer=i)`` and bracket its backward with the
``backward_ends_here`` / ``backward_begins_here`` markers
(:mod:`echo_et.workloads.markers`): the backward to copy is found between them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator
from typing import Any


def repeat_unit(key: Hashable, fn: Callable[[Any], Any], x, *, layer: int | None = None):
    """``fn(x)``, recorded once per key and input kind when a meta-device trace records."""
    from echo_et.trace.direct import active_recorder

    rec = active_recorder()
    return fn(x) if rec is None else rec.unit(key, fn, x, layer)


def repeat_region(key: Hashable, run: Callable[[], Any], *, replay: bool | None = None,
                  **labels: Any) -> tuple[Any, bool]:
    """``(run(), False)``, or, when a meta-device trace already recorded a region with this
    ``key``, ``(stand-in, True)``: the recorded events again (annotation values such as
    ``mb=3`` substituted from ``labels``) and a tensor of the first run's result's shape
    (or None) instead of running. A region is a whole piece of the step that repeats without
    depending on what ran before (a micro-batch's forward; its backward, replayed exactly
    when its forward was: ``replay=True`` refuses to run, ``replay=False`` always runs)."""
    from echo_et.trace.direct import active_recorder

    rec = active_recorder()
    if rec is None:
        return run(), False
    return rec.region(key, run, labels, replay=replay)


@contextlib.contextmanager
def recorded_span(name: str) -> Iterator[None]:
    """``torch.profiler.record_function(name)``; while a meta-device trace records this
    thread, the span goes to the recorder directly (what it would see through the dispatcher,
    without dispatching two profiler operators per span: a pipeline schedule opens tens of
    thousands)."""
    from echo_et.trace.direct import active_recorder

    rec = active_recorder()
    if rec is None:
        import torch

        with torch.profiler.record_function(name):
            yield
        return
    rec.enter_span(name)
    try:
        yield
    finally:
        rec.exit_span()
