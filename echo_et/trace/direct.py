"""Meta-device tracing: record a rank's step as the operators a GPU would run, not as time.

On the ``meta`` device every tensor keeps its shape and dtype and no memory is allocated, so
one CPU core can run the training step of any model size. Nothing is timed (meta kernels
have no device time: a compute model times them later). Instead of the profiler (whose tree
on meta shows the Python decompositions meta kernels run), a ``TorchDispatchMode``
(:class:`DirectRecorder`) sees each operator once, at the dispatch level: after autograd
and after composite operators (``aten::linear``) are decomposed, which is what a GPU launches
as kernels. Operators that launch no kernel (views, allocations; :mod:`echo_et.trace.ops`)
are left out.

The recorder keeps one event list per rank, in program order: operators, the workload's
annotation spans and backward markers (:mod:`echo_et.trace.annotations`; the dispatch mode
sees ``record_function`` enter/exit as operators), and the recording process group's
communication calls (``echo:comm#k`` spans, whose local output fills are skipped) and
waits (``echo:wait#k``). :func:`build_graph` turns the list into the rank's graph, shaped
like a GPU trace without its host side:

- ``gpu0-compute`` (GPU compute stream): one compute node per operator, payload
  ``compute`` with ``op``, ``kernel_class``, ``shapes`` and ``dtypes`` in the text form the
  Kineto reader gives CPU operators (the profiler's "Input Dims" / "Input type": one entry
  per schema argument), ``attrs["out_shapes"]`` (JSON list of output shapes) unless the
  output is shaped like the first input, ``duration_ns = 0``;
- communication on ``gpu0-comm:<key>`` (collectives) and ``gpu0-comm:<key>:send|recv:<peer>``
  (point-to-point), with NCCL's stream semantics: a communication node has DEP_SYNC on the
  last compute node issued before it (and on what the compute stream waited for since); the
  first compute node after a ``wait()`` has DEP_SYNC on the communication waited for;
- the host that issues this work, on ``host:0``: one KIND_LAUNCH node (``cpu.op`` = the
  operator or ``c10d::<collective>``) before each compute and communication node, which
  depends on it (DEP_LAUNCH), and a KIND_SYNC node wherever the workload blocks the host on
  the device (an ``echo:sync`` span: ``torch.cuda.synchronize()``, ``.item()``), with DEP_SYNC
  on the last node of every device stream so far. A compute model gives launches their host
  cost; an iteration whose kernels are shorter than that is then bound by the host, as real
  eager PyTorch runs of small models are;
- annotations (phase, layer, micro-batch, stage) as the profiler-based splice gives them;
- every start time 0 (an untimed layout: the simulator adds no gaps and keeps every
  dependency); header attribute ``trace.timing = "untimed"``.

**Repeated work is recorded once** (:meth:`DirectRecorder.unit`): a workload marks a unit of
work that repeats with the same inputs (a transformer layer, for each layer and each
micro-batch). The first time a unit runs with a given key it runs for real and its events
are kept as a template: its forward events, and its backward events (from its ``begin``
marker to its ``end`` marker) when the autograd engine runs them. Every later run with the
same key does not execute: its forward events are copied from the template (layer index
substituted) and an autograd Function stands in for it, whose backward copies the template's
backward events. A backward that runs before the template's own backward was seen (the
first micro-batch's later layers) leaves a placeholder that is filled once it is. The
result is the event list a full run would give (tests prove it against full CPU traces).

**A kernel called again is not run again** (:mod:`echo_et.trace.memo`): what a meta kernel
returns depends only on its arguments' metadata, so a call with a signature seen before gets
the first call's results (and the same operator texts) without running its kernel, which is
mostly Python on the meta device. The events are the same either way (``memo=False`` runs
every call; tests compare the Jobs byte for byte).

Imports torch: only the tracer imports this module.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from echo_et.errors import EchoError
from echo_et.ir import Graph, GraphBuilder
from echo_et.ir.limits import MAX_GRAPH_NODES, format_size, total_memory
from echo_et.ir.repeats import p2p_seq_key
from echo_et.ir.schema import COLLECTIVE_BY_NAME, pb
from echo_et.trace import annotations
from echo_et.trace.memo import KernelMemo
from echo_et.trace.ops import kernel_class, runs_kernel
from echo_et.trace.records import COMM_SPAN, WAIT_SPAN, CommRecord, span_index

# Event kinds. Events are tuples (kind, payload...), cheap to copy.
OP = 0          # (OP, name, shapes_text, dtypes_text, out_shapes_text or "")
SPAN_IN = 1     # (SPAN_IN, attrs)
SPAN_OUT = 2    # (SPAN_OUT,)
MARK_BEGIN = 3  # (MARK_BEGIN, attrs)
MARK_END = 4    # (MARK_END, attrs)
COMM = 5        # (COMM, CommRecord)
WAIT = 6        # (WAIT, CommRecord)
SLOT = 7        # (SLOT, _Slot): a unit's backward, filled when its template is known
SYNC = 8        # (SYNC,): the host waits for the device (``echo:sync``)
REGION_IN = 9   # (REGION_IN, _Region): a repeated region's first run begins
REGION_OUT = 10  # (REGION_OUT, _Region): ... and ends
REPEAT = 11     # (REPEAT, _Region, labels): the region again, with these annotation values

SYNC_SPAN = "echo:sync"
HOST_STREAM = "host:0"

COMPUTE_STREAM = "gpu0-compute"
COMM_STREAM_PREFIX = "gpu0-comm:"

_RF_ENTER = torch.ops.profiler._record_function_enter_new.default
_RF_EXITS = frozenset(getattr(torch.ops.profiler._record_function_exit, o)
                      for o in torch.ops.profiler._record_function_exit.overloads())

_DTYPE_TEXT = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
    torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
    torch.bool: "bool", torch.complex64: "c10::complex<float>",
    torch.complex128: "c10::complex<double>",
}

_LOCAL = threading.local()


def active_recorder() -> DirectRecorder | None:
    """The recorder tracing this thread, if any."""
    return getattr(_LOCAL, "recorder", None)


@dataclass
class _Slot:
    """Where a unit's backward goes before its template's backward is known."""

    template: _Template
    layer: int | None
    events: list | None = None


@dataclass
class _Template:
    key: Hashable
    layer: int | None
    forward: list
    out_meta: tuple[tuple[int, ...], tuple[int, ...], torch.dtype]
    backward: list | None = None
    waiting: list[_Slot] = field(default_factory=list)
    uses: int = 0


@dataclass
class _Region:
    events: list
    labels: dict
    out_meta: tuple | None
    _facts: tuple[bool, int] | None = None

    def facts(self) -> tuple[bool, int]:
        """(holds a host sync, communication calls it never waits for): read once per region,
        asked at every replay."""
        if self._facts is None:
            self._facts = (any(e[0] == SYNC for e in self.events), _unwaited(self.events))
        return self._facts


class _Replayed(torch.autograd.Function):
    """Stands in for a unit that was not executed: the output's shape without the work; its
    backward copies the template's backward events."""

    @staticmethod
    def forward(ctx, x, recorder, template, layer):
        ctx.recorder, ctx.template, ctx.layer = recorder, template, layer
        ctx.x_meta = (tuple(x.shape), tuple(x.stride()), x.dtype, x.device)
        size, stride, dtype = template.out_meta
        return torch.empty_strided(size, stride, dtype=dtype, device=x.device)

    @staticmethod
    def backward(ctx, grad):
        ctx.recorder.replay_backward(ctx.template, ctx.layer)
        size, stride, dtype, device = ctx.x_meta
        return torch.empty_strided(size, stride, dtype=dtype, device=device), None, None, None


# How often (in recorded operators) the recorder looks at the process's memory.
_BUDGET_EVERY = 1 << 14


class RecordingBudget:
    """The bound a recording may not pass, decided before the step runs: at most
    ``max_ops`` operators (a graph's node limit) and a process of at most ``max_rss``
    bytes (this machine's memory or its container's limit). A user's script is unknown
    before it runs, so this is checked as it records, every ``_BUDGET_EVERY`` operators:
    the step stops with one line naming the limit, never hours of recording or the OOM
    killer."""

    def __init__(self, max_ops: int | None = None, max_rss: int | None = None):
        self.max_ops = MAX_GRAPH_NODES if max_ops is None else max_ops
        self.max_rss = total_memory() * 9 // 10 if max_rss is None else max_rss

    def check(self, ops: int) -> None:
        if ops > self.max_ops:
            raise EchoError(f"the step recorded more than {self.max_ops:,} operators, the limit of nodes per "
                            "graph; trace a smaller model or fewer layers per rank")
        rss = _current_rss()
        if rss > self.max_rss:
            raise EchoError(f"recording the step took {format_size(rss)} of memory after {ops:,} operators; the "
                            f"limit is {format_size(self.max_rss)} (9/10 of this machine's memory)")


def _current_rss() -> int:
    """This process's resident memory in bytes (Linux /proc; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * os.sysconf("SC_PAGE_SIZE")


class DirectRecorder(TorchDispatchMode):
    """Records dispatch-level operators, annotation spans and communication of one rank."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """Not wrapped in ``torch._dynamo.disable`` (TorchDispatchMode's documented switch):
        the recorder never runs under ``torch.compile``, and the wrapper adds a Python frame
        (and a switch of the frame-evaluation callback) to every dispatched operator."""
        return False

    def __init__(self, *, replay: bool = True, budget: RecordingBudget | None = None,
                 memo: bool = True):
        super().__init__()
        # Calls made again with the same argument metadata give the first call's results
        # without running its meta kernel again (:mod:`echo_et.trace.memo`); the events
        # are the same either way.
        self.memo = KernelMemo() if memo else None
        self.events: list[tuple] = []
        self.budget = budget or RecordingBudget()
        self._ops = 0                   # operators recorded since reset (replayed copies included)
        self._next_check = _BUDGET_EVERY
        self.replay = replay
        self.recording = False
        self._open: list[int] = []      # kinds of the open record_function spans (LIFO)
        self._suppress = 0
        self._templates: dict[Hashable, _Template] = {}
        self._regions: dict[Hashable, _Region] = {}
        self._capturing: list[tuple[_Template, int]] = []   # (template, start index)
        self._region_depth = 0
        self.stats: Counter = Counter()
        self._records: Callable[[], list[CommRecord]] | None = None

    # -- lifetime ------------------------------------------------------------------------
    def attach(self, records: Callable[[], list[CommRecord]]) -> None:
        """``records()`` is the recording process group's record list (record k is the call
        of span ``echo:comm#k``)."""
        self._records = records

    def __enter__(self):
        _LOCAL.recorder = self
        return super().__enter__()

    def __exit__(self, *exc):
        _LOCAL.recorder = None
        return super().__exit__(*exc)

    def forget_units(self) -> None:
        """Forget the templates of repeated units and regions."""
        self._templates = {}
        self._regions = {}

    def reset(self) -> None:
        """Forget the events (not the templates of repeated units)."""
        self.events = []
        self._ops = 0
        self._next_check = _BUDGET_EVERY
        self._open = []
        self._suppress = 0
        self._capturing = []
        self.stats = Counter()

    # -- dispatch --------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _RF_ENTER:
            handle = func(*args, **kwargs)
            self._span_enter(args[0], handle)
            return handle
        if func in _RF_EXITS:
            self._span_exit(args[0])
            return func(*args, **kwargs)
        memo = self.memo
        key = entry = None
        where = None
        if memo is not None:
            key, entry, where = memo.find(func, args, kwargs)
        if entry is not None:
            out = entry.result(args)
        else:
            out = func(*args, **kwargs)
            if key is not None:
                entry = memo.learn(func, key, args, kwargs, out, where)   # type: ignore[union-attr]
        if self.recording and not self._suppress:
            name = func._schema.name
            if runs_kernel(name, func.is_view):
                texts = entry.texts if entry is not None else None
                if texts is None:
                    shapes, dtypes = _arg_texts(func._schema, args, kwargs)
                    texts = (shapes, dtypes, _out_text(out, args))
                    if entry is not None:
                        entry.texts = texts
                self.events.append((OP, name, *texts))
                self._ops += 1
                if self._ops >= self._next_check:
                    self._check_budget()
        return out

    def _check_budget(self) -> None:
        self._next_check = self._ops + _BUDGET_EVERY
        self.budget.check(self._ops)

    def enter_span(self, name: str) -> None:
        """A ``record_function`` span opens (:func:`echo_et.trace.units.recorded_span`)."""
        self._span_enter(name, None)

    def exit_span(self) -> None:
        self._span_exit(None)

    def _span_enter(self, name: str, handle) -> None:
        kind = 0
        if self.recording:
            k = span_index(name, COMM_SPAN)
            if k is not None:
                recs = self._records() if self._records is not None else []
                if not 0 <= k < len(recs):
                    raise EchoError(f"communication span {name} has no record")
                self.events.append((COMM, recs[k]))
                self._suppress += 1
                kind = 1
            elif name == SYNC_SPAN:
                if not self._suppress:
                    self.events.append((SYNC,))
            else:
                k = span_index(name, WAIT_SPAN)
                if k is not None:
                    recs = self._records() if self._records is not None else []
                    if 0 <= k < len(recs):
                        self.events.append((WAIT, recs[k]))
                elif not self._suppress:
                    parsed = annotations.parse(name)
                    if parsed is not None:
                        what, attrs = parsed
                        if what == "span":
                            self.events.append((SPAN_IN, attrs))
                            kind = 2
                        elif what == "begin":
                            self._on_begin(attrs)
                        else:
                            self._on_end(attrs)
        self._open.append(kind)

    def _span_exit(self, handle) -> None:
        kind = self._open.pop() if self._open else 0
        if kind == 1:
            self._suppress -= 1
        elif kind == 2:
            self.events.append((SPAN_OUT,))

    def _on_begin(self, attrs: dict) -> None:
        self.events.append((MARK_BEGIN, attrs))
        layer = attrs.get("layer")
        for t in self._templates.values():
            if t.backward is None and t.layer == layer and not any(c[0] is t for c in self._capturing):
                self._capturing.append((t, len(self.events) - 1))
                break

    def _on_end(self, attrs: dict) -> None:
        self.events.append((MARK_END, attrs))
        layer = attrs.get("layer")
        for i in range(len(self._capturing) - 1, -1, -1):
            t, start = self._capturing[i]
            if t.layer == layer:
                del self._capturing[i]
                t.backward = self.events[start:]
                for slot in t.waiting:
                    slot.events = _relabel(t.backward, {"layer": (t.layer, slot.layer)})
                t.waiting = []
                break

    # -- repeated units -------------------------------------------------------------------
    def unit(self, key: Hashable, fn: Callable[[Any], Any], x, layer: int | None):
        """Run ``fn(x)`` as a unit of repeated work (see the module docstring)."""
        if not (self.replay and self.recording) or self._suppress:
            return fn(x)
        full_key = (key, tuple(x.shape), tuple(x.stride()), x.dtype, x.requires_grad,
                    x.is_leaf, torch.is_grad_enabled())
        t = self._templates.get(full_key)
        if t is None:
            start = len(self.events)
            out = fn(x)
            if not isinstance(out, torch.Tensor):
                return out
            t = _Template(key=full_key, layer=layer, forward=self.events[start:],
                          out_meta=(tuple(out.shape), tuple(out.stride()), out.dtype))
            if not (out.requires_grad and torch.is_grad_enabled()):
                t.backward = []
            self._templates[full_key] = t
            self.stats["units_run"] += 1
            return out
        t.uses += 1
        self.stats["units_replayed"] += 1
        self._extend(_relabel(t.forward, {"layer": (t.layer, layer)}))
        if t.backward == [] or not x.requires_grad or not torch.is_grad_enabled():
            size, stride, dtype = t.out_meta
            with torch.no_grad():
                return torch.empty_strided(size, stride, dtype=dtype, device=x.device)
        return _Replayed.apply(x, self, t, layer)

    def replay_backward(self, t: _Template, layer: int | None) -> None:
        if t.backward is not None:
            self._extend(_relabel(t.backward, {"layer": (t.layer, layer)}))
            return
        slot = _Slot(t, layer)
        t.waiting.append(slot)
        self.events.append((SLOT, slot))

    def region(self, key: Hashable, run: Callable[[], Any], labels: dict[str, Any],
               replay: bool | None = None) -> tuple[Any, bool]:
        """``(run(), False)`` the first time ``key`` is seen (its events are kept), then
        ``(stand-in, True)``: the region again with the annotation values of ``labels``
        substituted, and a tensor like the first run's result (or None) instead of running.
        ``replay``: True refuses to run (the caller's state cannot run it), False always runs
        (and keeps the events if ``key`` is new).

        An outermost region's first run is bracketed by REGION_IN / REGION_OUT and its
        replays are REPEAT events, which :func:`build_graph` turns into instances of a repeat
        block (or copies, :meth:`flat_events` with ``compact=False``)."""
        active = self.replay and self.recording and not self._suppress
        t = self._regions.get(key) if active and replay is not False else None
        if t is None:
            if replay:
                raise EchoError(f"repeated region {key!r}: no recording to replay")
            new = active and key not in self._regions
            token = _Region([], dict(labels), None) if new and self._region_depth == 0 else None
            if token is not None:
                self.events.append((REGION_IN, token))
            start = len(self.events)
            self._region_depth += 1
            try:
                out = run()
            finally:
                self._region_depth -= 1
            end = len(self.events)
            if token is not None:
                self.events.append((REGION_OUT, token))
            if new:
                try:
                    events = _flatten(self.events[start:end])
                except EchoError:
                    events = None      # a unit inside still waits for its backward
                if events is not None and (out is None or isinstance(out, torch.Tensor)):
                    meta = None if out is None else (tuple(out.shape), tuple(out.stride()),
                                                     out.dtype, out.device)
                    t = token if token is not None else _Region([], dict(labels), None)
                    t.events, t.out_meta = events, meta
                    self._regions[key] = t
                    self.stats["regions_run"] += 1
            return out, False
        self.stats["regions_replayed"] += 1
        if self._region_depth == 0:
            self.events.append((REPEAT, t, dict(labels)))
        else:
            self._extend(_relabel(t.events, {k: (t.labels.get(k), v) for k, v in labels.items()}))
        if t.out_meta is None:
            return None, True
        size, stride, dtype, device = t.out_meta
        with torch.no_grad():
            return torch.empty_strided(size, stride, dtype=dtype, device=device), True

    def _extend(self, events: list) -> None:
        self.events.extend(_copied(events))
        self._ops += len(events)
        if self._ops >= self._next_check:
            self._check_budget()

    # -- results -------------------------------------------------------------------------
    def flat_events(self, *, compact: bool = True) -> list[tuple]:
        """The events with every placeholder replaced by its (copied) backward; with
        ``compact=False`` also every replayed region by its copied events (and no region
        brackets)."""
        flat = _flatten(self.events)
        if compact:
            return flat
        out: list[tuple] = []
        for e in flat:
            if e[0] == REPEAT:
                t, labels = e[1], e[2]
                out.extend(_copied(_relabel(t.events, {k: (t.labels.get(k), v) for k, v in labels.items()})))
            elif e[0] not in (REGION_IN, REGION_OUT):
                out.append(e)
        return out


def _copied(events: list) -> list:
    """Copies of ``events`` for another run of the same work: communication gets fresh
    records (its own issue order and wait)."""
    out = []
    fresh: dict[int, CommRecord] = {}
    for e in events:
        kind = e[0]
        if kind == COMM:
            rec = replace(e[1], index=-1, waited=False)
            fresh[id(e[1])] = rec
            out.append((COMM, rec))
        elif kind == WAIT:
            out.append((WAIT, fresh.get(id(e[1]), e[1])))
        else:
            out.append(e)
    return out


def _flatten(events: list) -> list:
    out: list = []
    for e in events:
        if e[0] == SLOT:
            slot = e[1]
            if slot.events is None:
                raise EchoError("a repeated unit's backward ran but its template's backward "
                                "never did; trace without unit replay")
            out.extend(_copied(_flatten(slot.events)))
        else:
            out.append(e)
    return out


def _relabel(events: list, subs: dict[str, tuple[Any, Any]]) -> list:
    """``events`` with annotation values replaced: ``subs[key] = (old, new)``."""
    subs = {k: v for k, v in subs.items() if v[0] is not None and v[0] != v[1]}
    if not subs:
        return events
    out = []
    for e in events:
        if e[0] in (SPAN_IN, MARK_BEGIN, MARK_END):
            attrs = e[1]
            changed = None
            for k, (old, new) in subs.items():
                if attrs.get(k) == old:
                    changed = changed if changed is not None else dict(attrs)
                    changed[k] = new
            out.append((e[0], changed) if changed is not None else e)
        else:
            out.append(e)
    return out


# -- operator arguments as the profiler writes them ---------------------------------------------
_TEXT_CACHE: dict[Any, str] = {}


def _json(value: Any) -> str:
    key = repr(value)
    got = _TEXT_CACHE.get(key)
    if got is None:
        got = json.dumps(value)
        if len(_TEXT_CACHE) < 200_000:
            _TEXT_CACHE[key] = got
    return got


def _arg_texts(schema, args: tuple, kwargs: dict) -> tuple[str, str]:
    """(shapes, dtypes) of every schema argument, like the profiler's "Input Dims" and
    "Input type" (a Python number passed for a Tensor argument is the 0-dim "wrapped number"
    tensor the profiler sees; strings and devices are "")."""
    shapes: list = []
    types: list = []
    pos = 0
    for a in schema.arguments:
        if not a.kwarg_only and pos < len(args):
            v = args[pos]
            pos += 1
        elif a.name in kwargs:
            v = kwargs[a.name]
        else:
            v = a.default_value if a.has_default_value() else None
        shapes.append(_shape_of(v))
        types.append(_type_of(v, a))
    return _json(shapes), _json(types)


def _out_text(out: Any, args: tuple) -> str:
    """Output shapes (JSON) when they are not simply the first input's shape, else ""."""
    outs = out if isinstance(out, tuple | list) else (out,)
    shapes = [list(o.shape) if isinstance(o, torch.Tensor) else [] for o in outs]
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is not None and len(shapes) == 1 and shapes[0] == list(first.shape):
        return ""
    return _json(shapes)


def _shape_of(v: Any) -> list:
    if isinstance(v, torch.Tensor):
        return list(v.shape)
    if isinstance(v, list | tuple) and v and all(isinstance(t, torch.Tensor) or t is None for t in v):
        return [list(t.shape) if t is not None else [] for t in v]
    return []


_WRAPPED = {bool: "bool", int: "long int", float: "double", complex: "c10::complex<double>"}


def _type_of(v: Any, arg) -> str:
    if isinstance(v, torch.Tensor):
        return _DTYPE_TEXT.get(v.dtype, str(v.dtype).removeprefix("torch."))
    if isinstance(v, list | tuple):
        if v and all(isinstance(t, torch.Tensor) or t is None for t in v):
            return "TensorList"
        return "TensorList" if "Tensor" in str(arg.type) else "ScalarList"
    if v is None or isinstance(v, str | torch.device):
        return ""
    if isinstance(v, bool | int | float | complex) and str(arg.type) == "Tensor":
        return _WRAPPED[type(v)]
    if isinstance(v, bool | int | float | complex | torch.SymInt | torch.SymFloat | torch.dtype
                  | torch.layout | torch.memory_format):
        return "Scalar"
    return ""


# -- the graph ----------------------------------------------------------------------------------
@dataclass
class DirectResult:
    graph: Graph
    records: list[CommRecord]
    keys: list[str]
    dropped: Counter


# Annotation labels a region substitutes, and the Annotations field each one sets.
_LABEL_FIELD = {"layer": "layer", "mb": "microbatch", "stage": "stage"}


@dataclass
class _Body:
    """The first run of a repeated region, as built: what its copies are made from."""

    first_id: int
    pos: int                           # index of its first node in the graph's store
    current: dict
    stack_len: int
    entry: list[int | None]            # entry state slots (see _Build.slots)
    coll_seq: dict[str, int]
    p2p_seq: dict[tuple, int]
    rec_start: int
    syncs: bool
    shape: tuple
    last_id: int = 0
    ext_deps: list[tuple[int, int, int]] = field(default_factory=list)   # (node id, slot, dep kind)
    exit: list[tuple[bool, int]] = field(default_factory=list)   # waited + last compute: (internal, rel or slot)
    wrote: dict[int, int] = field(default_factory=dict)            # stream -> its last body node (rel)
    coll_counts: dict[str, int] = field(default_factory=dict)
    p2p_counts: dict[tuple, int] = field(default_factory=dict)
    label_values: dict[str, Any] = field(default_factory=dict)   # the region's labels in this body
    labels: dict[str, set] = field(default_factory=dict)          # label -> values its nodes carry
    block: pb.RepeatBlock | None = None
    ok: bool = True


class _Build:
    """Builds one rank's graph from its event list (see the module docstring). A region
    replayed with the same entry state as its first run becomes an instance of a repeat
    block (``GraphHeader.repeats``) instead of copies of its nodes."""

    def __init__(self, key_of: Callable[[CommRecord], str], graph_id: str, where: str, *,
                 compact: bool):
        self.key_of, self.where, self.compact = key_of, where, compact
        self.gb = gb = GraphBuilder(graph_id)
        gb.graph.header.attrs["trace.timing"] = "untimed"
        self.host = gb.stream(pb.STREAM_CPU_THREAD, HOST_STREAM)
        self.compute = gb.stream(pb.STREAM_GPU_COMPUTE, COMPUTE_STREAM, device=0)
        self.store = gb.graph.stored_nodes
        self.new_node = self.store.add
        self.last_on: dict[int, int] = {}               # device stream -> its last node
        self.comm_streams: dict[str, int] = {}
        self.stack: list[tuple[str, dict, dict]] = []   # (kind, raw attrs, merged attrs)
        self.current: dict = {}
        self.last_compute: int | None = None
        self.waited: list[int] = []                     # comm nodes the compute stream waits for
        self.comm_of: dict[int, int] = {}               # id(record) -> node id
        self.records: list[CommRecord] = []
        self.keys: list[str] = []
        self.keys_used: dict[str, int] = {}
        self.dropped: Counter = Counter()
        self.next_id = 1
        self.coll_seq: dict[str, int] = {}
        self.p2p_seq: dict[tuple, int] = {}
        self.bodies: dict[tuple, _Body] = {}            # (id(region), build state shape) -> body
        self.open_body: tuple[int, _Body] | None = None
        self.unwaited_extra = 0

    # -- events --------------------------------------------------------------------------
    def run(self, events: list[tuple]) -> DirectResult:
        for e in events:
            self.event(e)
        if self.stack:
            self.dropped["ex_situ_annotation_begin_without_end"] += sum(1 for s in self.stack if s[0] == "mark")
        unwaited = _unwaited(events) + self.unwaited_extra
        if unwaited:
            self.dropped["ex_situ_wait_not_observed"] += unwaited
        for key, size in sorted(self.keys_used.items()):
            self.gb.declare_group(key, size)
        graph = self.gb.build()
        for body in sorted((b for b in self.bodies.values() if b.block is not None),
                           key=lambda b: b.first_id):
            graph.header.repeats.append(body.block)
        return DirectResult(graph, self.records, self.keys, self.dropped)

    def event(self, e: tuple) -> None:
        kind = e[0]
        if kind == OP:
            self.op(e)
        elif kind == COMM:
            self.comm(e[1])
        elif kind == WAIT:
            nid = self.comm_of.get(id(e[1]))
            if nid is not None and nid not in self.waited:
                self.waited.append(nid)
        elif kind == SYNC:
            n = self.new_node(id=self.next_id, name="sync", kind=pb.KIND_SYNC, stream=self.host)
            self.next_id += 1
            for nid in sorted(self.last_on.values()):
                n.deps.add(id=nid, kind=pb.DEP_SYNC)
            self.annotate(n)
        elif kind in (SPAN_IN, MARK_BEGIN):
            merged = {**self.current, **e[1]}
            self.stack.append(("span" if kind == SPAN_IN else "mark", e[1], merged))
            self.current = merged
        elif kind in (SPAN_OUT, MARK_END):
            want = "span" if kind == SPAN_OUT else "mark"
            for i in range(len(self.stack) - 1, -1, -1):
                if self.stack[i][0] == want and (kind == SPAN_OUT or self.stack[i][1] == e[1]):
                    del self.stack[i]
                    break
            else:
                self.dropped["ex_situ_annotation_end_without_begin"] += 1
            self.current = self.stack[-1][2] if self.stack else {}
        elif kind == REGION_IN:
            self.region_in(e[1])
        elif kind == REGION_OUT:
            self.region_out(e[1])
        elif kind == REPEAT:
            self.repeat(e[1], e[2])
        elif kind == SLOT:
            raise EchoError(f"{self.where}: internal: unfilled placeholder in a flat event list")

    def annotate(self, n: pb.Node) -> None:
        annotations.apply(n, self.current)

    def op(self, e: tuple) -> None:
        nid = self.next_id
        launch = self.new_node(id=nid, name="launch", kind=pb.KIND_LAUNCH, stream=self.host)
        launch.cpu.op = e[1]
        n = self.new_node(id=nid + 1, name=e[1], kind=pb.KIND_COMPUTE, stream=self.compute)
        n.deps.add(id=nid, kind=pb.DEP_LAUNCH)
        self.next_id += 2
        c = n.compute
        c.op = e[1]
        c.kernel_class = kernel_class(e[1])
        c.shapes = e[2]
        c.dtypes = e[3]
        if e[4]:
            n.attrs["out_shapes"] = e[4]
        for w in self.waited:
            n.deps.add(id=w, kind=pb.DEP_SYNC)
        self.waited = []
        self.annotate(n)
        self.last_compute = nid + 1
        self.last_on[self.compute] = nid + 1

    def comm(self, rec: CommRecord) -> None:
        original = rec
        rec = replace(rec, index=len(self.records))
        key = self.key_of(rec)
        self.records.append(rec)
        self.keys.append(key)
        self.keys_used[key] = len(rec.group_ranks)
        sname = f"{key}:{rec.op}:{rec.peer}" if rec.is_p2p else key
        sid = self.comm_streams.get(sname)
        if sid is None:
            sid = self.gb.stream(pb.STREAM_GPU_COMM, COMM_STREAM_PREFIX + sname, device=0)
            self.comm_streams[sname] = sid
        nid = self.next_id
        launch = self.new_node(id=nid, name="launch", kind=pb.KIND_LAUNCH, stream=self.host)
        launch.cpu.op = f"c10d::{rec.op}"
        deps: list[tuple[int, int]] = [(nid, pb.DEP_LAUNCH)]
        if self.last_compute is not None:
            deps.append((self.last_compute, pb.DEP_SYNC))
        deps.extend((w, pb.DEP_SYNC) for w in self.waited)
        if rec.is_p2p:
            assert rec.peer is not None
            send = rec.op == "send"
            n = self.new_node(id=nid + 1, name=rec.op, stream=sid,
                              kind=pb.KIND_SEND if send else pb.KIND_RECV)
            pkey = (key, rec.peer, send)
            n.p2p.group = key
            n.p2p.peer = rec.peer
            n.p2p.bytes = rec.in_bytes if send else rec.out_bytes
            n.p2p.tag = rec.tag
            n.p2p.seq = self.p2p_seq.get(pkey, 0)
            self.p2p_seq[pkey] = n.p2p.seq + 1
        else:
            coll = COLLECTIVE_BY_NAME.get(rec.op)
            if coll is None:
                raise EchoError(f"{self.where}: unknown collective {rec.op!r} in the recording")
            n = self.new_node(id=nid + 1, name=rec.op, stream=sid, kind=pb.KIND_COLLECTIVE)
            c = n.collective
            c.type = coll
            c.group = key
            c.in_bytes = rec.in_bytes
            c.out_bytes = rec.out_bytes
            c.dtype = rec.dtype
            c.seq = self.coll_seq.get(key, 0)
            self.coll_seq[key] = c.seq + 1
            if rec.root is not None:
                c.root = rec.root
        self.next_id += 2
        for d, dk in deps:
            n.deps.add(id=d, kind=dk)
        n.attrs["timing"] = "placeholder"
        self.annotate(n)
        self.annotate(launch)
        self.comm_of[id(original)] = n.id
        self.last_on[sid] = n.id

    # -- repeated regions ------------------------------------------------------------------
    def slots(self, with_streams: bool) -> list[int | None]:
        """The build state a region's nodes can depend on from outside, as slots: every
        waited communication node, the last compute node and, for a region that holds a
        host sync (which waits for every device stream), the last node of every stream."""
        out: list[int | None] = [*self.waited, self.last_compute]
        if with_streams:
            out.extend(self.last_on.get(s) for s in self.streams_seen())
        return out

    def streams_seen(self) -> list[int]:
        return [self.compute, *sorted(self.comm_streams.values())]

    def shape(self, with_streams: bool) -> tuple:
        """What must agree between a region's first run and a replay for the replay to be a
        copy: how many waits are pending, which slots are empty, which are equal."""
        vals = self.slots(with_streams)
        first: dict[int, int] = {}
        pattern = tuple(-1 if v is None else first.setdefault(v, i) for i, v in enumerate(vals))
        return len(self.waited), pattern, tuple(self.streams_seen()) if with_streams else ()

    def region_in(self, region: _Region) -> None:
        if self.compact and self.open_body is None:
            self.open_region(region, dict(region.labels))

    def open_region(self, region: _Region, labels: dict[str, Any]) -> None:
        """Start the body of ``region`` for the current build state, unless one exists."""
        syncs = region.facts()[0]
        shape = self.shape(syncs)
        key = (id(region), shape)
        if key in self.bodies:
            return
        body = _Body(first_id=self.next_id, pos=len(self.store), current=dict(self.current),
                     stack_len=len(self.stack), entry=self.slots(syncs), coll_seq=dict(self.coll_seq),
                     p2p_seq=dict(self.p2p_seq), rec_start=len(self.records), syncs=syncs,
                     shape=shape, label_values=labels)
        self.open_body = (id(region), body)
        self.bodies[key] = body

    def region_out(self, region: _Region) -> None:
        if self.open_body is None or self.open_body[0] != id(region):
            return
        _, body = self.open_body
        self.open_body = None
        body.last_id = self.next_id - 1
        body.ok = self.region_summary(body)

    def region_summary(self, body: _Body) -> bool:
        """Fill in what a copy needs from the body; False when a copy of it cannot be told
        by slots (the region reads build state this summary does not capture)."""
        if body.last_id < body.first_id or self.current != body.current or len(self.stack) != body.stack_len:
            return False
        if body.syncs and tuple(self.streams_seen()) != body.shape[2]:
            return False
        slot_of: dict[int, int] = {}
        for i, v in enumerate(body.entry):
            if v is not None:
                slot_of.setdefault(v, i)
        for n in self.store[body.pos:]:
            for d in n.deps:
                if d.id < body.first_id:
                    slot = slot_of.get(d.id)
                    if slot is None:
                        return False
                    body.ext_deps.append((n.id, slot, d.kind))
            if n.kind in (pb.KIND_COMPUTE, pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV):
                body.wrote[n.stream] = n.id - body.first_id
            if n.HasField("annotations"):
                a = n.annotations
                for label, name in _LABEL_FIELD.items():
                    if a.HasField(name):
                        body.labels.setdefault(label, set()).add(getattr(a, name))
        for v in [*self.waited, self.last_compute]:
            if v is None:
                body.exit.append((False, -1))
            elif v >= body.first_id:
                body.exit.append((True, v - body.first_id))
            elif v in slot_of:
                body.exit.append((False, slot_of[v]))
            else:
                return False
        body.coll_counts = {k: v - body.coll_seq.get(k, 0) for k, v in self.coll_seq.items()
                            if v != body.coll_seq.get(k, 0)}
        body.p2p_counts = {k: v - body.p2p_seq.get(k, 0) for k, v in self.p2p_seq.items()
                           if v != body.p2p_seq.get(k, 0)}
        return True

    def repeat(self, region: _Region, labels: dict[str, Any]) -> None:
        """A replay of ``region`` with annotation values ``labels``: an instance of the body
        built for the same build state when there is one, else copies of its events (which
        become that state's body)."""
        syncs, unwaited = region.facts()
        self.unwaited_extra += unwaited
        body = self.bodies.get((id(region), self.shape(syncs))) if self.open_body is None else None
        deltas = self.deltas(body, labels) if body is not None else None
        if body is None or deltas is None:
            opened = False
            if self.compact and self.open_body is None and body is None:
                self.open_region(region, {**region.labels, **labels})
                opened = self.open_body is not None
            subs = {k: (region.labels.get(k), v) for k, v in labels.items()}
            for e in _copied(_relabel(region.events, subs)):
                self.event(e)
            if opened:
                self.region_out(region)
            return
        self.instance(body, region, deltas)

    def instance(self, body: _Body, region: _Region, deltas: dict[str, int]) -> None:
        """Record a copy of ``body`` here and move the build state past it."""
        entry = self.slots(body.syncs)
        off = self.next_id - body.first_id
        if body.block is None:
            body.block = pb.RepeatBlock(id=sum(1 for b in self.bodies.values() if b.block) + 1,
                                        name=_block_name(body.label_values),
                                        first_node=body.first_id, last_node=body.last_id)
        inst = body.block.instances.add(id_offset=off)
        for k, n in sorted(body.coll_counts.items()):
            now, then = self.coll_seq.get(k, 0), body.coll_seq.get(k, 0)
            if now != then:
                inst.seq_offsets[k] = now - then
            self.coll_seq[k] = now + n
        for pk, n in sorted(body.p2p_counts.items()):
            now, then = self.p2p_seq.get(pk, 0), body.p2p_seq.get(pk, 0)
            if now != then:
                inst.seq_offsets[p2p_seq_key(*pk)] = now - then
            self.p2p_seq[pk] = now + n
        for name, delta in sorted(deltas.items()):
            inst.annotation_deltas[name] = delta
        for node_id, slot, kind in body.ext_deps:
            target = entry[slot]
            assert target is not None
            inst.deps.add(node=node_id, id=target, kind=kind)
        # The copy's calls are the body's (same groups, same sizes): listed again, as they are.
        n_recs = sum(body.coll_counts.values()) + sum(body.p2p_counts.values())
        self.records.extend(self.records[body.rec_start:body.rec_start + n_recs])
        self.keys.extend(self.keys[body.rec_start:body.rec_start + n_recs])
        base = self.next_id
        self.next_id += body.last_id - body.first_id + 1
        exit_vals = [base + rel if internal else (entry[rel] if rel >= 0 else None)
                     for internal, rel in body.exit]
        self.waited = [v for v in exit_vals[:-1] if v is not None]
        self.last_compute = exit_vals[-1]
        for sid, rel in body.wrote.items():
            self.last_on[sid] = base + rel

    def deltas(self, body: _Body, labels: dict[str, Any]) -> dict[str, int] | None:
        """The annotation deltas of a replay of ``body`` with ``labels``, or None when it
        cannot be an instance."""
        if not body.ok or self.current != body.current or len(self.stack) != body.stack_len:
            return None
        out: dict[str, int] = {}
        for k, v in labels.items():
            old = body.label_values.get(k)
            if old == v:
                continue
            name = _LABEL_FIELD.get(k)
            if name is None or not isinstance(v, int) or not isinstance(old, int):
                return None
            seen = body.labels.get(k)
            if seen:
                if seen != {old}:
                    return None
                out[name] = v - old
        return out


def _unwaited(events: list) -> int:
    """Communication calls of ``events`` that no wait of ``events`` waits for."""
    waits = {id(e[1]) for e in events if e[0] == WAIT}
    return sum(1 for e in events if e[0] == COMM and id(e[1]) not in waits)


def _block_name(labels: dict[str, Any]) -> str:
    return "region " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items(), key=lambda kv: kv[0]))


def build_graph(events: list[tuple], key_of: Callable[[CommRecord], str], *, graph_id: str,
                where: str, compact: bool = True) -> DirectResult:
    """The device graph of one rank from its event list (see the module docstring).
    ``compact``: replayed regions become instances of repeat blocks where their entry state
    agrees with the first run (else, and when False, their events are built as copies)."""
    return _Build(key_of, graph_id, where, compact=compact).run(events)
