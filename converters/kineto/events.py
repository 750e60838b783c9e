"""Kineto events reduced to what the converter uses, one small object each.

Each raw event dict from the stream is classified by phase and category and copied into
an :class:`Ev` (times in integer ns, interned names, a handful of args); the dict is then
dropped. What is not kept is counted by reason in :attr:`TraceFile.dropped`.

Time unit: Chrome-trace ``ts``/``dur`` are microseconds. Kineto's ``displayTimeUnit``
("ms", or "ns" in some traces) only tells viewers how to *display* them; the
``ns_resolution_trace`` of HTA, marked "ns", still carries microseconds (its memcpy
``bytes``/``dur`` agree with its ``memory bandwidth (GB/s)`` only in microseconds, which
``tests/test_kineto_units.py`` proves). ``time_unit_check`` repeats that check on every
file that has such memcpys and the reader follows its verdict.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any

import msgspec

from echo_et.errors import EchoError
from echo_et.ir.attention import is_attention
from echo_et.ir.collectives import is_nccl_kernel
from echo_et.ir.limits import INT64_MAX, MAX_NS, MAX_WORLD_SIZE, checked_int

from .jsonstream import read_document

# Event kinds.
K_CPU = 1        # host operator or annotation (cpu_op, user_annotation, python_function)
K_RUNTIME = 2    # CUDA/HIP runtime or driver call
K_KERNEL = 3     # GPU kernel
K_MEMCPY = 4
K_MEMSET = 5
K_SYNC_ACT = 6   # GPU-side record of a sync or event record (Kineto "cuda_sync", "cuda_event")

GPU_KINDS = frozenset({K_KERNEL, K_MEMCPY, K_MEMSET})

_CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "operator", "python"})
_KERNEL_CATS = frozenset({"kernel", "gpu_kernel"})
_MEMCPY_CATS = frozenset({"gpu_memcpy", "memcpy"})
_MEMSET_CATS = frozenset({"gpu_memset", "memset"})
# Categories that carry no work of their own: skipped silently (flows, metadata, spans).
_QUIET_CATS = frozenset({"ac2g", "fwdbwd", "async_cpu_to_gpu", "trace", "python_function_flow"})

COMM_ARG_KEYS = (
    "Collective name", "In msg nelems", "Out msg nelems", "dtype", "Group size",
    "Process Group Name", "Process Group Description", "Process Group Ranks",
    "Global rank start", "Global rank stride", "In split size", "Out split size",
    "Rank", "Src Rank", "Dst Rank", "Seq",
)
_CPU_ARG_KEYS = ("Record function id", "Ev Idx", "Input Dims", "Input type")
_SYNC_ARG_KEYS = ("stream", "wait_on_stream", "wait_on_cuda_event_record_corr_id")
# An NCCL kernel's launch configuration: blocks = the channels it runs on, threads per block
# tell the protocol (kept for NCCL kernels only; read by echo_et.models.comm.launch).
LAUNCH_ARG_KEYS = ("grid", "block")
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

# -- typed decoding -------------------------------------------------------------------------
# An event as msgspec decodes it straight from the text: only the fields and args the
# collector reads (a host op's "Input Strides", "External id"... are skipped unread), into
# structs the garbage collector does not track. Floats arrive as their literal text (the
# decoder's float_hook, as parse_float for the stdlib), so times stay exact. An event that
# does not fit (args that are not an object, NaN) comes as a dict and goes through the same
# rules in _Collector.__call__; _Collector.typed gives the same Ev (tests/test_kineto_fastpath.py).
_UNSET: Any = msgspec.UNSET
_ARG_KEYS = ("correlation", *_CPU_ARG_KEYS, *COMM_ARG_KEYS, "Concrete Inputs", "size", "stream",
             "device", "wait_on_stream", "wait_on_cuda_event_record_corr_id", "bytes",
             "memory bandwidth (GB/s)", *LAUNCH_ARG_KEYS)
_ARG_ATTR = {k: re.sub(r"\W+", "_", k.lower()).strip("_") for k in dict.fromkeys(_ARG_KEYS)}
EventArgs = msgspec.defstruct(
    "EventArgs", [(a, Any, msgspec.field(default=_UNSET, name=k)) for k, a in _ARG_ATTR.items()],
    gc=False)
_NO_ARGS = EventArgs()


class KinetoEvent(msgspec.Struct, gc=False):
    ph: Any = _UNSET
    cat: Any = _UNSET
    name: Any = _UNSET
    pid: Any = _UNSET
    tid: Any = _UNSET
    ts: Any = _UNSET
    dur: Any = _UNSET
    args: EventArgs | None = None  # type: ignore[valid-type]


def _kept(a: Any, keys: tuple[str, ...], into: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{k: args[k] for k in keys if k in args}`` for EventArgs (into ``into`` if given)."""
    out = {} if into is None else into
    for k in keys:
        v = getattr(a, _ARG_ATTR[k])
        if v is not _UNSET:
            out[k] = v
    return out


class Ev(msgspec.Struct, eq=False, gc=False):
    """One kept event. ``thread`` is (pid, tid) for host events and (device, stream) for
    GPU events; ``ts``/``dur`` are ns on the file's own clock (``TraceFile.base_ns`` + ts
    is wall-clock ns when the file states its base). A struct (a trace makes hundreds of
    thousands), compared by identity, not tracked by the garbage collector (it holds JSON
    values only, never a cycle)."""

    kind: int
    name: str
    thread: tuple
    ts: int
    dur: int
    corr: int
    idx: int
    args: dict[str, Any] | None

    @property
    def end(self) -> int:
        return self.ts + self.dur

    def arg(self, key: str, default: Any = None) -> Any:
        return self.args.get(key, default) if self.args else default

    def __repr__(self) -> str:
        return f"Ev({self.kind}, {self.name[:40]!r}, {self.thread}, ts={self.ts}, dur={self.dur})"


@dataclass
class TraceFile:
    """One Kineto file: its metadata and its kept events in file order."""

    path: Path
    events: list[Ev] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    distributed: dict[str, Any] = field(default_factory=dict)
    display_time_unit: str = ""
    base_ns: int = 0
    device_names: list[str] = field(default_factory=list)
    window: tuple[int, int] | None = None       # the profiler's recording span (ns)
    steps: dict[int, Ev] = field(default_factory=dict)  # ProfilerStep#N -> its host event
    rf_id_source: str = "ev_idx"               # which arg gives record-function ids
    time_unit: str = "us"
    raw_event_count: int = 0
    extra: dict[str, Any] = field(default_factory=dict)  # other top-level keys (small ones)

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    @property
    def name(self) -> str:
        return self.path.name


# Categories that are not events of their own (negative kinds).
_TRACE, _QUIET, _GPU_ANNOTATION, _INSTANT, _UNKNOWN = -1, -2, -3, -4, -5


def _kind_of_category(raw: Any) -> int:
    cat = str(raw).lower()
    if cat in _CPU_CATS:
        return K_CPU
    if cat.endswith(("_runtime", "_driver")) or cat == "runtime":
        return K_RUNTIME
    if cat in _KERNEL_CATS:
        return K_KERNEL
    if cat in _MEMCPY_CATS:
        return K_MEMCPY
    if cat in _MEMSET_CATS:
        return K_MEMSET
    if cat in ("cuda_sync", "cuda_event"):
        return K_SYNC_ACT
    if cat == "trace":
        return _TRACE
    if cat in _QUIET_CATS:
        return _QUIET
    if cat == "gpu_user_annotation":
        return _GPU_ANNOTATION
    if cat == "cpu_instant_event":
        return _INSTANT
    return _UNKNOWN


_OUT_OF_RANGE = MAX_NS + 1


def us_to_ns(value: Any) -> int | None:
    """Microseconds (int, or the decimal text of a float) to integer ns, exactly; None for
    what is not a finite number."""
    if type(value) is int:
        return value * 1000
    if isinstance(value, str):
        if len(value) > 40:  # a number of 40 digits is no time; Decimal would build it anyway
            return _OUT_OF_RANGE
        return _decimal_text_to_milli(value)
    if isinstance(value, float):
        return round(value * 1000) if math.isfinite(value) else None
    return None


def _plausible_us(value: Any) -> bool:
    ns = us_to_ns(value)
    return ns is not None and -MAX_NS <= ns <= MAX_NS


def _decimal_text_to_milli(s: str) -> int | None:
    """``"12.3456"`` -> 12346 (value x 1000, rounded half to even), without floats."""
    i = s.find(".")
    if 0 < i == len(s) - 4 and s[0] != "-":   # the common "1234.567": its digits are the answer
        try:
            return int(s[:i] + s[i + 1:])
        except ValueError:
            pass
    if "e" in s or "E" in s or s.count(".") > 1:
        try:
            d = Decimal(s)
            if not d.is_finite():
                return None
            if d.adjusted() > 18:  # beyond any time: never build its integer (1e999999999)
                return _OUT_OF_RANGE if d > 0 else -_OUT_OF_RANGE
            return int((d * 1000).to_integral_value(rounding=ROUND_HALF_EVEN))
        except ArithmeticError:
            return None
    neg = s.startswith("-")
    if neg:
        s = s[1:]
    whole, _, frac = s.partition(".")
    try:
        v = int(whole or "0") * 1000 + int((frac + "000")[:3])
    except ValueError:
        return None
    rest = frac[3:]
    if rest:
        first = rest[0]
        if first > "5" or (first == "5" and (rest[1:].strip("0") or v % 2)):
            v += 1
    return -v if neg else v


def _int_arg(v: Any) -> int | None:
    if type(v) is int:
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


# A pid/tid/device/stream is an int64 (a protobuf stream's native id) or a name. A float
# literal arrives as its text (parse_float=str): such a "name" is a number that is no id.
_ID_LIMIT = INT64_MAX + 1
_FLOAT_TEXT = re.compile(r"^-?\d+(\.\d*)?([eE][+-]?\d+)?$|^-?(Infinity|NaN)$")


class _Collector:
    """Turns raw event dicts into Ev objects for one file (the ``on_event`` callback)."""

    def __init__(self, tf: TraceFile):
        self.tf = tf
        self.names: dict[str, str] = {}
        self.idx = 0
        self.rf_nonzero = False
        self.bandwidth_samples: list[tuple[int, int, float]] = []
        self.kinds: dict[Any, int] = {}

    def __call__(self, e: dict) -> None:
        tf = self.tf
        tf.raw_event_count += 1
        ph = e.get("ph")
        if ph != "X":
            if ph == "i" or ph == "I":
                name = e.get("name")
                if name not in ("Iteration Start: PyTorch Profiler", "Record Window End"):
                    tf.drop("instant_event")
            return  # metadata (M), flows (s/f/t), counters: not events of their own
        cat = e.get("cat", "")
        if type(cat) is not str:
            cat = str(cat)
        kind = self.kinds.get(cat)
        if kind is None:
            kind = self.kinds[cat] = _kind_of_category(cat)
        if kind < 0:
            if kind == _TRACE:
                ts, dur = us_to_ns(e.get("ts")), us_to_ns(e.get("dur"))
                if ts is not None and dur is not None and tf.window is None:
                    tf.window = (ts, ts + dur)
            elif kind == _GPU_ANNOTATION:
                tf.drop("gpu_user_annotation")
            elif kind == _INSTANT:
                tf.drop("instant_event")
            elif kind == _UNKNOWN:
                tf.drop(f"unknown_category:{str(cat).lower() or '-'}")
            return
        args = e.get("args")
        if not isinstance(args, dict):
            args = {}
        raw_ts = e.get("ts")
        ts = raw_ts * 1000 if type(raw_ts) is int else us_to_ns(raw_ts)
        raw_dur = e.get("dur", 0)
        dur = raw_dur * 1000 if type(raw_dur) is int else us_to_ns(raw_dur)
        if ts is None or dur is None:
            if isinstance(raw_ts, float) or isinstance(raw_dur, float):  # NaN, Infinity
                self._refuse_time(e, raw_ts, raw_dur)
            tf.drop("event_without_time")
            return
        if not (-MAX_NS <= ts <= MAX_NS and dur <= MAX_NS):
            self._refuse_time(e, raw_ts, raw_dur)
        if dur < 0:
            tf.drop("event_with_negative_duration")
            return
        name = e.get("name")
        if type(name) is not str:
            name = str(name)
        name = self.names.setdefault(name, name)
        corr = args.get("correlation", -1)
        if type(corr) is not int:
            corr = _int_arg(corr)
        kept: dict[str, Any] | None = None
        if kind == K_CPU:
            thread = self.host_thread(name, e.get("pid"), e.get("tid"))
            kept = {k: args[k] for k in _CPU_ARG_KEYS if k in args}
            if "Collective name" in args or name.startswith(("c10d::", "gloo:", "nccl:")) \
                    or name == "record_param_comms":
                for k in COMM_ARG_KEYS:
                    if k in args:
                        kept[k] = args[k]
                if "Concrete Inputs" in args:
                    kept["Concrete Inputs"] = args["Concrete Inputs"]
            elif "Concrete Inputs" in args and is_attention(name):   # whether it was causal
                kept["Concrete Inputs"] = args["Concrete Inputs"]
            if not self.rf_nonzero and _int_arg(args.get("Record function id")):
                self.rf_nonzero = True
        elif kind == K_RUNTIME:
            thread = self.host_thread(name, e.get("pid"), e.get("tid"))
            if "size" in args or "stream" in args:
                kept = {k: args[k] for k in ("size", "stream") if k in args}
        elif kind == K_SYNC_ACT:
            thread = self.device_thread(name, _int_arg(args.get("device", e.get("pid"))),
                                        _int_arg(args.get("stream", e.get("tid"))))
            kept = {k: args[k] for k in _SYNC_ARG_KEYS if k in args}
        else:
            device = args.get("device", e.get("pid"))
            stream = args.get("stream", e.get("tid"))
            thread = self.device_thread(name, _int_arg(device), _int_arg(stream))
            if kind == K_KERNEL and "grid" in args and is_nccl_kernel(name):
                kept = {k: args[k] for k in LAUNCH_ARG_KEYS if k in args}
            if "bytes" in args or "Collective name" in args:
                kept = {k: args[k] for k in COMM_ARG_KEYS if k in args} | (kept or {})
                if "bytes" in args:
                    kept["bytes"] = args["bytes"]
                    if kind != K_KERNEL:
                        self._sample_bandwidth(args["bytes"], args.get("memory bandwidth (GB/s)"), dur)
        self._record(Ev(kind, name, thread, ts, dur, corr if corr is not None else -1, self.idx, kept or None))

    def typed(self, e: KinetoEvent) -> None:
        """__call__ for a KinetoEvent: the same rules, read from the struct's fields."""
        tf = self.tf
        tf.raw_event_count += 1
        ph = e.ph
        if ph != "X":
            if ph == "i" or ph == "I":
                name = None if e.name is _UNSET else e.name
                if name not in ("Iteration Start: PyTorch Profiler", "Record Window End"):
                    tf.drop("instant_event")
            return
        cat = "" if e.cat is _UNSET else e.cat
        if type(cat) is not str:
            cat = str(cat)
        kind = self.kinds.get(cat)
        if kind is None:
            kind = self.kinds[cat] = _kind_of_category(cat)
        raw_ts = None if e.ts is _UNSET else e.ts
        raw_dur = 0 if e.dur is _UNSET else e.dur
        if kind < 0:
            if kind == _TRACE:
                ts, dur = us_to_ns(raw_ts), us_to_ns(None if e.dur is _UNSET else e.dur)
                if ts is not None and dur is not None and tf.window is None:
                    tf.window = (ts, ts + dur)
            elif kind == _GPU_ANNOTATION:
                tf.drop("gpu_user_annotation")
            elif kind == _INSTANT:
                tf.drop("instant_event")
            elif kind == _UNKNOWN:
                tf.drop(f"unknown_category:{str(cat).lower() or '-'}")
            return
        a = e.args
        if a is None:
            a = _NO_ARGS
        # us_to_ns, with its common cases inline: an int, or "1234.567" (its digits are the
        # answer); anything else goes through it.
        if type(raw_ts) is int:
            ts = raw_ts * 1000
        else:
            ts = None
            if type(raw_ts) is str and len(raw_ts) <= 40:
                i = raw_ts.find(".")
                if 0 < i == len(raw_ts) - 4 and raw_ts[0] != "-":
                    try:
                        ts = int(raw_ts[:i] + raw_ts[i + 1:])
                    except ValueError:
                        pass
            if ts is None:
                ts = us_to_ns(raw_ts)
        if type(raw_dur) is int:
            dur = raw_dur * 1000
        else:
            dur = None
            if type(raw_dur) is str and len(raw_dur) <= 40:
                i = raw_dur.find(".")
                if 0 < i == len(raw_dur) - 4 and raw_dur[0] != "-":
                    try:
                        dur = int(raw_dur[:i] + raw_dur[i + 1:])
                    except ValueError:
                        pass
            if dur is None:
                dur = us_to_ns(raw_dur)
        if ts is None or dur is None:
            if isinstance(raw_ts, float) or isinstance(raw_dur, float):  # pragma: no cover - not JSON msgspec reads
                self._refuse_time({"name": None if e.name is _UNSET else e.name}, raw_ts, raw_dur)
            tf.drop("event_without_time")
            return
        if not (-MAX_NS <= ts <= MAX_NS and dur <= MAX_NS):
            self._refuse_time({"name": None if e.name is _UNSET else e.name}, raw_ts, raw_dur)
        if dur < 0:
            tf.drop("event_with_negative_duration")
            return
        name = None if e.name is _UNSET else e.name
        if type(name) is not str:
            name = str(name)
        name = self.names.setdefault(name, name)
        corr = a.correlation
        if corr is _UNSET:
            corr = -1
        elif type(corr) is not int:
            corr = _int_arg(corr)
        pid = None if e.pid is _UNSET else e.pid
        tid = None if e.tid is _UNSET else e.tid
        kept: dict[str, Any] | None = None
        if kind == K_CPU:
            thread = self.host_thread(name, pid, tid)
            kept = {}
            rf = a.record_function_id
            if rf is not _UNSET:
                kept["Record function id"] = rf
            v = a.ev_idx
            if v is not _UNSET:
                kept["Ev Idx"] = v
            v = a.input_dims
            if v is not _UNSET:
                kept["Input Dims"] = v
            v = a.input_type
            if v is not _UNSET:
                kept["Input type"] = v
            if a.collective_name is not _UNSET or name.startswith(("c10d::", "gloo:", "nccl:")) \
                    or name == "record_param_comms":
                _kept(a, COMM_ARG_KEYS, kept)
                if a.concrete_inputs is not _UNSET:
                    kept["Concrete Inputs"] = a.concrete_inputs
            elif a.concrete_inputs is not _UNSET and is_attention(name):   # whether it was causal
                kept["Concrete Inputs"] = a.concrete_inputs
            if not self.rf_nonzero and rf is not _UNSET and (rf if type(rf) is int else _int_arg(rf)):
                self.rf_nonzero = True
        elif kind == K_RUNTIME:
            thread = self.host_thread(name, pid, tid)
            if a.size is not _UNSET or a.stream is not _UNSET:
                kept = _kept(a, ("size", "stream"))
        elif kind == K_SYNC_ACT:
            thread = self.device_thread(name, _int_arg(pid if a.device is _UNSET else a.device),
                                        _int_arg(tid if a.stream is _UNSET else a.stream))
            kept = _kept(a, _SYNC_ARG_KEYS)
        else:
            thread = self.device_thread(name, _int_arg(pid if a.device is _UNSET else a.device),
                                        _int_arg(tid if a.stream is _UNSET else a.stream))
            if kind == K_KERNEL and a.grid is not _UNSET and is_nccl_kernel(name):
                kept = _kept(a, LAUNCH_ARG_KEYS)
            if a.bytes is not _UNSET or a.collective_name is not _UNSET:
                kept = _kept(a, COMM_ARG_KEYS) | (kept or {})
                if a.bytes is not _UNSET:
                    kept["bytes"] = a.bytes
                    if kind != K_KERNEL:
                        self._sample_bandwidth(a.bytes, None if a.memory_bandwidth_gb_s is _UNSET
                                               else a.memory_bandwidth_gb_s, dur)
        self._record(Ev(kind, name, thread, ts, dur, corr if corr is not None else -1, self.idx, kept or None))

    def _record(self, ev: Ev) -> None:
        """Keep an event in file order; a ``ProfilerStep#N`` range marks step N."""
        self.idx += 1
        self.tf.events.append(ev)
        if ev.kind == K_CPU and ev.name.startswith("ProfilerStep#"):
            m = STEP_RE.match(ev.name)
            if m:
                self.tf.steps.setdefault(int(m.group(1)), ev)

    def _sample_bandwidth(self, raw_bytes: Any, bw: Any, dur: float) -> None:
        """Up to 64 (bytes, duration, GB/s) samples of the memory operations Kineto states a
        bandwidth for."""
        if not bw or len(self.bandwidth_samples) >= 64:
            return
        b = _int_arg(raw_bytes)
        try:
            bwf = float(bw)
        except (TypeError, ValueError):
            bwf = 0.0
        if b and dur > 0 and bwf > 0:
            self.bandwidth_samples.append((b, dur, bwf))

    def on_event(self, e: Any) -> None:
        """The stream reader's callback: typed events and plain dicts alike."""
        if type(e) is KinetoEvent:
            self.typed(e)
        else:
            self(e)

    def host_thread(self, name: str, pid: Any, tid: Any) -> tuple:
        """(pid, tid) of a host event: each an int64 or a name (Kineto writes ints; some tools
        strings); anything else (an object, a list, a bool, a fraction, a number beyond int64)
        is refused, so no stream id overflows and no thread key is unhashable."""
        if type(pid) is int and type(tid) is int and -_ID_LIMIT <= pid < _ID_LIMIT \
                and -_ID_LIMIT <= tid < _ID_LIMIT:
            return (pid, tid)
        return (self._thread_id(name, "pid", pid), self._thread_id(name, "tid", tid))

    def device_thread(self, name: str, device: int | None, stream: int | None) -> tuple:
        """(device, stream) of a device event, refused beyond int64 like a host thread's."""
        for label, v in (("device", device), ("stream", stream)):
            if v is not None and not -_ID_LIMIT <= v < _ID_LIMIT:
                self._thread_id(name, label, v)
        return (device, stream)

    def _thread_id(self, name: str, field: str, v: Any) -> Any:
        if v is None or (type(v) is int and -_ID_LIMIT <= v < _ID_LIMIT):
            return v
        if type(v) is str and not _FLOAT_TEXT.match(v):
            return v
        text = v if type(v) is str else repr(v)
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise EchoError(f"{self.tf.path}: event #{self.tf.raw_event_count - 1} ({str(name)[:60]}): "
                        f"{field} = {shown} is not a thread id (an integer within int64, or a name)")

    def _refuse_time(self, e: dict, ts: Any, dur: Any) -> None:
        field, value = ("ts", ts) if not _plausible_us(ts) else ("dur", dur)
        name = str(e.get("name"))[:60]
        raise EchoError(f"{self.tf.path}: event #{self.tf.raw_event_count - 1} ({name}): {field} = "
                        f"{str(value)[:40]} is not a finite time in microseconds within the int64 ns range")

    def finish(self) -> None:
        self.tf.rf_id_source = "record_function_id" if self.rf_nonzero else "ev_idx"
        self.tf.time_unit = time_unit_check(self.bandwidth_samples)


def time_unit_check(samples: list[tuple[int, int, float]]) -> str:
    """"us" or "ns": which reading of ``dur`` makes memcpy bytes/dur equal the bandwidth
    Kineto printed beside them. ``dur`` here is already value x 1000 (read as us)."""
    if not samples:
        return "us"
    votes_us = votes_ns = 0
    for nbytes, dur_milli, bw in samples:
        as_us = nbytes / dur_milli  # bytes per ns = GB/s when dur was microseconds
        as_ns = as_us * 1000.0
        if abs(as_us / bw - 1) < 0.05:
            votes_us += 1
        elif abs(as_ns / bw - 1) < 0.05:
            votes_ns += 1
    return "ns" if votes_ns > votes_us else "us"


def load_trace(path: Path) -> TraceFile:
    """Read one Kineto file into a TraceFile (raises EchoError naming the file)."""
    tf = TraceFile(Path(path))
    col = _Collector(tf)
    meta = read_document(tf.path, col.on_event, KinetoEvent)
    col.finish()
    if "traceEvents" not in meta:
        raise EchoError(f"{path}: no 'traceEvents' array: not a Kineto trace")
    if not tf.raw_event_count:
        raise EchoError(f"{path}: the trace has no events")
    if not tf.events:
        raise EchoError(f"{path}: the trace has no timed events (only metadata)")
    tf.distributed = _distributed_info(meta.get("distributedInfo"), path)
    tf.display_time_unit = str(meta.get("displayTimeUnit", "") or "")
    base = _int_arg(meta.get("baseTimeNanoseconds"))
    tf.base_ns = base or 0
    props = meta.get("deviceProperties")
    if isinstance(props, list):
        tf.device_names = [str(p.get("name", "")) for p in props if isinstance(p, dict)]
    for k in ("trace_id", "mast_job_name", "tw_job", "host_name", "schemaVersion"):
        if k in meta and isinstance(meta[k], (str, int)):
            tf.extra[k] = meta[k]
    if tf.time_unit == "ns":
        _rescale_from_ns(tf)
    return tf


def _distributed_info(dist: Any, path: Path) -> dict[str, Any]:
    """``distributedInfo`` with the types its readers rely on: a ``rank`` that is stated must
    be an integer (``inf``, ``true``, ``"0"`` or ``1.5`` name no rank) and ``pg_config`` a list;
    a ``distributedInfo`` that is not an object is no information."""
    if not isinstance(dist, dict):
        return {}
    rank = dist.get("rank")
    if rank is not None:
        checked_int(rank, "distributedInfo.rank", hi=MAX_WORLD_SIZE - 1, where=str(path))
    pgs = dist.get("pg_config")
    if pgs is not None and not isinstance(pgs, list):
        text = repr(pgs)
        raise EchoError(f"{path}: distributedInfo.pg_config = {text if len(text) <= 40 else text[:37] + '...'} "
                        "is not a list of process groups")
    return dist


def _rescale_from_ns(tf: TraceFile) -> None:
    """The file's numbers were nanoseconds, not microseconds: divide what was multiplied."""
    for ev in tf.events:
        ev.ts //= 1000
        ev.dur //= 1000
    if tf.window:
        tf.window = (tf.window[0] // 1000, tf.window[1] // 1000)
