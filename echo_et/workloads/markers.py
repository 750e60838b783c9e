"""Profiler spans and backward markers carrying layer/phase/micro-batch/stage annotations.

See :mod:`echo_et.trace.annotations` for the grammar. Forward code is wrapped in spans;
backward ops are run by the autograd engine, so a layer's backward is bracketed by
zero-length markers emitted from the backward of identity Functions placed at the layer's
output (first to run in backward: ``begin``) and input (last to run: ``end``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from echo_et.trace.annotations import begin_name, end_name, span_name
from echo_et.trace.units import recorded_span


def span(**attrs: object) -> AbstractContextManager[None]:
    return recorded_span(span_name(**attrs))


def comm_span(group) -> AbstractContextManager[None]:
    """Encloses one communication call and names its process group (see
    :mod:`echo_et.trace.annotations`). The world group is "world" in both runs: torch calls
    a real run's "default_pg", the recording process group "world"."""
    desc = getattr(group, "group_desc", "") or "unknown"
    return recorded_span(span_name(group="world" if desc == "default_pg" else desc))


def device_sync(device) -> None:
    """Block the host until the device is done (``torch.cuda.synchronize()`` on a GPU; what
    ``.item()`` does too), marked ``echo:sync`` for the meta-device tracer."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    _mark("echo:sync")


def stream_sync(device) -> None:
    """Block the host until the current stream is done: what ``.item()`` and ``.cpu()`` do
    (``cudaStreamSynchronize``), so a communication issued with ``async_op`` and not yet
    waited for keeps running on its own stream; marked ``echo:stream_sync`` for the
    meta-device tracer."""
    if torch.device(device).type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    _mark("echo:stream_sync")


def _mark(name: str) -> None:
    with recorded_span(name):
        pass


class _Boundary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        _mark(ctx.name)
        return grad, None


def backward_begins_here(x: torch.Tensor, **attrs: object) -> torch.Tensor:
    """Place at a layer's output: its backward starts when the gradient reaches this point."""
    return _Boundary.apply(x, begin_name(**attrs)) if x.requires_grad else x


def backward_ends_here(x: torch.Tensor, **attrs: object) -> torch.Tensor:
    """Place at a layer's input: its backward ends when the gradient leaves this point."""
    return _Boundary.apply(x, end_name(**attrs)) if x.requires_grad else x
