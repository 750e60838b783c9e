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
waits (``echo:wait#k``). :func:`echo_et.trace.direct_graph.build_graph` turns the list
into the rank's graph, shaped like a GPU trace without its host side (that module, which
needs no torch, defines the event kinds and says what the graph holds).

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
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_GRAPH_NODES, format_size, total_memory
from echo_et.trace import annotations
from echo_et.trace.direct_graph import (
    COMM,
    MARK_BEGIN,
    MARK_END,
    OP,
    REGION_IN,
    REGION_OUT,
    REPEAT,
    SLOT,
    SPAN_IN,
    SPAN_OUT,
    STREAM,
    SYNC,
    WAIT,
    Region,
    copied,
    relabel,
)
from echo_et.trace.memo import KernelMemo
from echo_et.trace.ops import runs_kernel
from echo_et.trace.records import COMM_SPAN, WAIT_SPAN, CommRecord, span_index

SYNC_SPAN = "echo:sync"
STREAM_SYNC_SPAN = "echo:stream_sync"

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
        self._regions: dict[Hashable, Region] = {}
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
                    texts = (shapes, dtypes, _out_text(out, args), _causal_text(func._schema, args, kwargs))
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
            elif name == STREAM_SYNC_SPAN:
                if not self._suppress:
                    self.events.append((SYNC, STREAM))
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
                    slot.events = relabel(t.backward, {"layer": (t.layer, slot.layer)})
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
        self._extend(relabel(t.forward, {"layer": (t.layer, layer)}))
        if t.backward == [] or not x.requires_grad or not torch.is_grad_enabled():
            size, stride, dtype = t.out_meta
            with torch.no_grad():
                return torch.empty_strided(size, stride, dtype=dtype, device=x.device)
        return _Replayed.apply(x, self, t, layer)

    def replay_backward(self, t: _Template, layer: int | None) -> None:
        if t.backward is not None:
            self._extend(relabel(t.backward, {"layer": (t.layer, layer)}))
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
        replays are REPEAT events, which :func:`~echo_et.trace.direct_graph.build_graph`
        turns into instances of a repeat block (or copies, :meth:`flat_events` with
        ``compact=False``)."""
        active = self.replay and self.recording and not self._suppress
        t = self._regions.get(key) if active and replay is not False else None
        if t is None:
            if replay:
                raise EchoError(f"repeated region {key!r}: no recording to replay")
            new = active and key not in self._regions
            token = Region([], dict(labels), None) if new and self._region_depth == 0 else None
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
                    t = token if token is not None else Region([], dict(labels), None)
                    t.events, t.out_meta = events, meta
                    self._regions[key] = t
                    self.stats["regions_run"] += 1
            return out, False
        self.stats["regions_replayed"] += 1
        if self._region_depth == 0:
            self.events.append((REPEAT, t, dict(labels)))
        else:
            self._extend(relabel(t.events, {k: (t.labels.get(k), v) for k, v in labels.items()}))
        if t.out_meta is None:
            return None, True
        size, stride, dtype, device = t.out_meta
        with torch.no_grad():
            return torch.empty_strided(size, stride, dtype=dtype, device=device), True

    def _extend(self, events: list) -> None:
        self.events.extend(copied(events))
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
                out.extend(copied(relabel(t.events, {k: (t.labels.get(k), v) for k, v in labels.items()})))
            elif e[0] not in (REGION_IN, REGION_OUT):
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
            out.extend(copied(_flatten(slot.events)))
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


def _causal_text(schema, args: tuple, kwargs: dict) -> str:
    """"0" for an operator called with ``is_causal=False`` (an attention block over keys that
    are all visible, as a context-parallel ring's off-diagonal blocks), else "": the compute
    model takes attention as causal unless told (``attrs["is_causal"]``), as every traced
    GPT's is, and the profiler's shapes do not say it."""
    for pos, a in enumerate(schema.arguments):
        if a.name != "is_causal":
            continue
        if not a.kwarg_only and pos < len(args):
            v = args[pos]
        else:
            v = kwargs.get(a.name, a.default_value if a.has_default_value() else None)
        return "0" if v is False else ""
    return ""


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

