"""The profiler-span names a workload emits so that nodes get layer/phase/micro-batch/stage.

Grammar (``record_function`` names)::

    echo:phase=forward:mb=1:stage=0     a span: the ops inside it get these annotations
    echo:layer=3                        spans nest; the innermost value of each key wins
    echo:begin:layer=3 / echo:end:layer=3
                                        zero-length markers bracketing ops that no span can
                                        enclose (backward ops run by the autograd engine)

Keys: ``phase`` (forward, backward, optimizer), ``layer`` (global layer index), ``mb``
(micro-batch), ``stage`` (pipeline stage). The tracer turns them into ``Node.annotations``
and removes the marker nodes from the graph. ``echo:group=<group_desc>`` spans enclose each
communication call of the built-in workloads: they name the process group in traces of
real runs (gloo traces do not say which group an op used); the ex-situ tracer takes the
group from its recording instead and drops these spans. Workloads that emit none still trace; their
nodes simply carry no annotations.
"""

from __future__ import annotations

from collections.abc import Mapping

from echo_et.ir.schema import pb

PREFIX = "echo:"
INT_KEYS = ("layer", "mb", "stage")
KEYS = ("phase", "group", *INT_KEYS)


def span_name(**attrs: object) -> str:
    return PREFIX + ":".join(f"{k}={v}" for k, v in attrs.items() if v is not None)


def begin_name(**attrs: object) -> str:
    return PREFIX + "begin:" + span_name(**attrs).removeprefix(PREFIX)


def end_name(**attrs: object) -> str:
    return PREFIX + "end:" + span_name(**attrs).removeprefix(PREFIX)


def parse(name: str) -> tuple[str, dict[str, str | int]] | None:
    """("span"|"begin"|"end", attrs) for an annotation name, else None."""
    if not name.startswith(PREFIX):
        return None
    body = name[len(PREFIX):]
    kind = "span"
    for k in ("begin", "end"):
        if body.startswith(k + ":"):
            kind, body = k, body[len(k) + 1:]
            break
    attrs: dict[str, str | int] = {}
    for part in body.split(":"):
        key, sep, value = part.partition("=")
        if not sep or key not in KEYS:
            return None
        if key in INT_KEYS:
            try:
                attrs[key] = int(value)
            except ValueError:
                return None
        else:
            attrs[key] = value
    return (kind, attrs) if attrs else None


def apply(node: pb.Node, attrs: Mapping[str, str | int] | None) -> None:
    """Set ``node``'s annotations from a span's attrs (``mb`` is the node's ``microbatch``;
    ``group`` is not an annotation)."""
    if not attrs:
        return
    a = node.annotations
    if "phase" in attrs:
        a.phase = str(attrs["phase"])
    if "layer" in attrs:
        a.layer = int(attrs["layer"])
    if "mb" in attrs:
        a.microbatch = int(attrs["mb"])
    if "stage" in attrs:
        a.stage = int(attrs["stage"])
