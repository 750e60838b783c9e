"""The ranges a number may take in the IR, and the one way readers and options check them.

Every number that comes from a file or an option goes through :func:`checked_int` or
:func:`checked_float` at the edge, so that a NaN, an infinity, a 40-digit size or a world
size of four billion is one clear line naming the field, the value and the file, never a
traceback deep inside (``OverflowError``, ``MemoryError``, a protobuf ``Value out of range``)
nor hours of work. The bounds are of two sorts:

* what the type holds: times are int64 nanoseconds, sizes int64 bytes (Chakra and ASTRA-sim
  read them as int64), so nothing written can overflow a protobuf field;
* what is plausible: a count (ranks, GPUs per node, micro-batches) bounds the work and memory
  a command spends, so it must stay within what a real job has.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError, OptionError

INT64_MAX = (1 << 63) - 1
# Times in ns: a start of 2**62 ns is the year 2116 on an epoch clock; start + duration and
# the offsets the simulator adds still fit int64.
MAX_NS = 1 << 62
# A rank's clock offset (its measured times + offset = the job clock): 2**60 ns is 36 years,
# and two ranks' offsets apart plus a time of MAX_NS still fit int64.
MAX_CLOCK_OFFSET_NS = 1 << 60
# Bytes of one transfer, tensor or operator: 8 PiB, exact in a float64 (models use floats).
MAX_BYTES = 1 << 53
# Ranks of one job. Echo-et aims at 100K ranks; 2**18 leaves room, and refuses the sizes whose
# bindings alone would take gigabytes.
MAX_WORLD_SIZE = 1 << 18
MAX_GPUS_PER_NODE = 1024        # NVL576 racks count as one node
MAX_MICROBATCHES = 4096
MAX_PIPELINE_STAGES = 4096
MAX_TRACE_STEPS = 100          # warm-up and measured steps of one traced rank (each runs the model)
MAX_TRACED_STEP_RUNS = 1 << 16  # steps a trace runs the model for: traced ranks x (warm-up + measured steps)
MAX_SWEEP_ROWS = 10_000        # layouts or configurations of one sweep (each a Job and a simulation)
MAX_GRAPH_NODES = 1 << 20       # nodes a pass may build into one graph (1-2 GB in memory, minutes)
MAX_GROUPS = 1 << 22            # process groups of one job (2 per rank and axis at 100K ranks)
MAX_BANDWIDTH_GBPS = 1e6        # GB/s per GPU; a petabyte per second is not a link
MAX_FACTOR = 1e6                # a what-if factor (compute scale, straggler slowdown)


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def _prefix(where: str) -> str:
    return f"{where}: " if where else ""


def checked_int(value: Any, field: str, *, lo: int = 0, hi: int = INT64_MAX, where: str = "") -> int:
    """``value`` as an int in ``[lo, hi]``; an integral float (``1e3``) is accepted, anything
    else (NaN, infinity, a fraction, a string, a bool) is one EchoError naming ``field``."""
    if isinstance(value, bool):
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a finite number")
        if not value.is_integer():
            raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a whole number")
        if not lo - 1 < value < hi + 1:  # compare as floats first: int(1e300) is slow and huge
            raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is out of range ({lo}..{hi})")
        value = int(value)
    elif not isinstance(value, int):
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not an integer")
    if not lo <= value <= hi:
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is out of range ({lo}..{hi})")
    return value


def checked_float(value: Any, field: str, *, lo: float = 0.0, hi: float = math.inf, lo_open: bool = False,
                  where: str = "") -> float:
    """``value`` as a finite float in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a number")
    try:
        x = float(value)
    except OverflowError:
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is out of range") from None
    if not math.isfinite(x):
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a finite number")
    if x < lo or (lo_open and x == lo) or x > hi:
        low = f"> {lo:g}" if lo_open else f">= {lo:g}"
        high = f" and <= {hi:g}" if math.isfinite(hi) else ""
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is out of range (must be {low}{high})")
    return x


def ns_of(value: Any, field: str, *, scale: float = 1.0, where: str = "", allow_negative: bool = False) -> int:
    """A time in ns from a number in some unit (``scale`` ns per unit): finite, within int64
    with room for sums (``MAX_NS``), rounded to the nearest ns."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is not a finite number")
    if type(value) is int and scale == 1.0:
        ns = value
    else:
        x = float(value) * scale
        if not -MAX_NS <= x <= MAX_NS:
            raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is out of range for a time in ns")
        ns = round(x)
    lo = -MAX_NS if allow_negative else 0
    if not lo <= ns <= MAX_NS:
        raise EchoError(f"{_prefix(where)}{field} = {_shown(value)} is out of range for a time in ns")
    return ns


def fills_nodes(world: int, gpus_per_node: int) -> bool:
    """Whether ``world`` ranks fill whole nodes of ``gpus_per_node`` GPUs or fit in one (the
    rule :func:`check_node_fill` enforces)."""
    return gpus_per_node >= 1 and (world <= gpus_per_node or world % gpus_per_node == 0)


def check_node_fill(world: int, gpus_per_node: int | None) -> None:
    """What GPUs per node ``G`` means for ``world`` ranks, the same in every verb: node of rank
    r is r // G, and the ranks fill whole nodes (G divides the world size) or fit in one node
    (world size <= G, a job on part of a node). A last node partly filled is refused: the
    collective model, the NIC share and ASTRA-sim's network all assume equal nodes."""
    if gpus_per_node is None or gpus_per_node < 1 or fills_nodes(world, gpus_per_node):
        return
    raise OptionError("gpus_per_node", f"world size {world} is not a multiple of {gpus_per_node} GPUs per node "
                      f"(nodes would be partly filled: {world // gpus_per_node} full and one of "
                      f"{world % gpus_per_node}); give a G that divides {world}, or one >= {world}")


def format_size(n: int) -> str:
    """Bytes as a person reads them in an error: ``8.0 GB``, ``512.0 MB``, ``4,096 bytes``."""
    if n < 10**5:
        return f"{n:,} bytes"
    if n >= 10**9:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.1f} MB"


def total_memory() -> int:
    """This machine's memory in bytes, or the container's limit when that is smaller: what
    bounds the work a command may start (a sweep's workers, a trace's estimate)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        text = "max"
    return min(total, int(text)) if text.isdigit() else total
