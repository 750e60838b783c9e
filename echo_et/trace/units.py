"""Repeated units of work, for workloads: ``repeat_unit(key, fn, x, layer=i)``.

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

from collections.abc import Callable, Hashable
from typing import Any


def repeat_unit(key: Hashable, fn: Callable[[Any], Any], x, *, layer: int | None = None):
    """``fn(x)``, recorded once per key and input kind when a meta-device trace records."""
    from echo_et.trace.direct import active_recorder

    rec = active_recorder()
    return fn(x) if rec is None else rec.unit(key, fn, x, layer)
