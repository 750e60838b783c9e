"""What one Kineto event says about its node's payload: a host op's shapes, dtypes and
record-function id, a copy's bytes and direction, a kernel's launch shape, an all-to-all's
bytes per peer. Shared texts are cached: a trace repeats a few hundred shape lists."""

from __future__ import annotations

import json
import math
from collections import Counter

from echo_et.ir.limits import INT64_MAX, MAX_BYTES, checked_int
from echo_et.ir.schema import pb

try:  # a fast canonical key for the shapes-text cache; optional
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]

from . import comm
from .events import Ev


def launch_dims(value: object) -> int | None:
    """The product of a kernel's ``grid`` or ``block`` ([x, y, z]); None when not that."""
    if not isinstance(value, list) or not 1 <= len(value) <= 3:
        return None
    out = 1
    for v in value:
        if type(v) is not int or not 1 <= v <= 1 << 31:
            return None
        out *= v
    return out


def launch_shape(kernels: list) -> tuple[int, int] | None:
    """(blocks, threads per block) of the first kernel that states both."""
    for k in kernels:
        blocks, threads = launch_dims(k.arg("grid")), launch_dims(k.arg("block"))
        if blocks is not None and threads is not None:
            return blocks, threads
    return None


# Node attrs with an all-to-all's bytes per peer (comma-separated, group-rank order), read
# by the ASTRA-sim exporter (converters/astra_sim: in_split_bytes).
IN_SPLIT_ATTR, OUT_SPLIT_ATTR = "in_split_bytes", "out_split_bytes"


def split_attrs(node: pb.Node, info: comm.CommInfo, group_size: int, drop: Counter) -> None:
    """Uneven all-to-all: the bytes sent to / received from each peer, when the trace
    recorded split sizes (``In/Out split size`` args, or the c10d op's split-size inputs)."""
    if info.splits_truncated:
        drop["all_to_all_splits_truncated"] += 1
    for splits, total, attr in ((info.in_splits, info.in_bytes, IN_SPLIT_ATTR),
                                (info.out_splits, info.out_bytes, OUT_SPLIT_ATTR)):
        per_peer, why = comm.split_bytes(splits, total, group_size)
        if why:
            drop[why] += 1
        elif per_peer is not None:
            node.attrs[attr] = ",".join(str(b) for b in per_peer)


def is_rf_id(rf: object) -> bool:
    """A record-function id the IR can hold (an int64); any other value links nothing."""
    return type(rf) is int and -INT64_MAX - 1 <= rf <= INT64_MAX


def cpu_payload(node: pb.Node, ev: Ev, rf_source: str) -> None:
    c = node.cpu
    if rf_source == "record_function_id":
        rf = ev.arg("Record function id")
    else:
        rf = ev.arg("Ev Idx")
    if is_rf_id(rf):
        c.rf_id = rf
        node.attrs["rf_id_source"] = rf_source
    dims = ev.arg("Input Dims")
    if dims is not None:
        c.shapes = json_text(dims)
    types = ev.arg("Input type")
    if types is not None:
        c.dtypes = json_text(types)


_JSON_CACHE: dict[bytes | str, str] = {}
_PAIR_CACHE: dict[bytes | str, tuple[str, str]] = {}


def shape_texts(dims, types) -> tuple[str, str]:
    """(shapes, dtypes) texts of a host op's ``Input Dims`` and ``Input type`` ("" for one
    that is None): json_text of each, cached per pair (ops repeat a few hundred pairs), so
    that a node costs one key and one look-up."""
    try:
        key: bytes | str = _orjson.dumps((dims, types)) if _orjson is not None else repr((dims, types))
    except TypeError:  # an integer beyond 64 bits
        key = repr((dims, types))
    got = _PAIR_CACHE.get(key)
    if got is None:
        got = ("" if dims is None else json_text(dims), "" if types is None else json_text(types))
        if len(_PAIR_CACHE) < 100_000:
            _PAIR_CACHE[key] = got
    return got


def json_text(value) -> str:
    """JSON text of a shapes/types list; many ops repeat the same lists, so the text is cached
    under orjson's (fast, canonical) encoding of the value."""
    try:
        key: bytes | str = _orjson.dumps(value) if _orjson is not None else repr(value)
    except TypeError:  # an integer beyond 64 bits
        key = repr(value)
    text = _JSON_CACHE.get(key)
    if text is None:
        text = json.dumps(value)
        if len(_JSON_CACHE) < 100_000:
            _JSON_CACHE[key] = text
    return text


def bytes_of(ev: Ev, launches: list[Ev]) -> int:
    b = ev.arg("bytes")
    if b is not None:
        return checked_bytes(b, "bytes", ev)
    for launch in launches:  # HIP records the size on the runtime call only
        s = launch.arg("size")
        if s is not None:
            return checked_bytes(s, "size", launch)
    return 0


def checked_bytes(value, field: str, ev: Ev) -> int:
    """A byte count from an event's args: an integer (or integral number text) in
    0..MAX_BYTES, else one EchoError naming the event."""
    if type(value) is str:  # floats are kept as their text
        try:
            f = float(value)
        except ValueError:
            f = math.nan
        value = int(f) if math.isfinite(f) and f.is_integer() and abs(f) <= MAX_BYTES else value
    return checked_int(value, f"{field} of {ev.name[:60]!r}", hi=MAX_BYTES)


def copy_direction(name: str) -> str:
    for d in ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "DtoA", "AtoD", "HtoA", "AtoH"):
        if d in name:
            return d
    return "other"
