"""Kernels already seen, for the meta-device recorder: the outputs of a call made again with
the same argument metadata, without running the kernel again.

On the meta device an operator's result is only metadata (shape, strides, dtype), and it is a
function of the call's argument metadata and plain values alone: there is no data to read.
Yet most meta kernels are Python (``torch._refs``, ``torch._meta_registrations``, with
PyTorch's elementwise type-promotion and shape checks), 0.05-2 ms a call, and a model runs
the same calls over and over: every transformer layer that is not recorded once
(:mod:`echo_et.trace.units`; an overlapped gradient sync runs the last micro-batch's layers
for real) and every parameter of a per-parameter optimizer. :class:`KernelMemo` keeps, per
operator and argument signature, what the first call returned, proven on that call to be
rebuildable, and gives it again:

- a *functional* operator (no argument or result aliased or written in its schema): new
  tensors of the recorded shape, strides and dtype (``torch.empty_strided`` on meta), and the
  same plain values (a flash attention's ``max_q``), in the same tuple or list;
- an operator *in place on its first argument* that returns it (``add_``, ``addcdiv_``,
  ``copy_``): the argument itself, when the first call left its shape and strides as they
  were (the version counter is bumped above the dispatch mode, by autograd, either way).

Never memoised: other namespaces than ``aten`` (a user's custom operator may have side
effects), views (cheap, and their results must alias), operators whose output shape depends
on data (``nonzero``, ``item``), calls with an argument that is not a meta tensor or a plain
value (a CPU tensor, a generator, a symbolic size) or with a list of more than ``MAX_LIST``
items (a multi-tensor kernel over every parameter, called once a step), and results that are not fresh, dense,
plain meta tensors (the first call's result sharing storage with an input, a storage larger
than its strides need, a zero, conjugate or negative bit). The signature holds every
tensor's shape, strides and dtype, which of the call's tensors share a storage and where
they begin in it (an in-place kernel refuses partly overlapping arguments; a tensor alone in
its storage is seen the same at any offset: the parameters' gradients, views into one
gradient bucket, are each the same call), every plain value with its type, and the default
dtype. An in-place call is kept when it left its argument's shape, strides, storage and
offset as they were. The recorded operator texts (:func:`echo_et.trace.direct` events) depend on
nothing else either, so a signature keeps them too.

Imports torch: only the tracer imports this module.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch

# What a memoised call does again.
FRESH = 1       # new tensors (and plain values) as the first call's results
SELF = 2        # its first argument, changed in place

# Entries at most (a step calls a few hundred distinct signatures; a script whose shapes
# never repeat stops adding here).
MEMO_LIMIT = 200_000
# Longer list arguments are not memoised: a multi-tensor kernel over every parameter
# (``_foreach_norm``) is called once or twice a step, and its signature would keep a tuple
# per tensor.
MAX_LIST = 256

_META = torch.device("meta")
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_PLAIN_VALUES = (bool, int, float, str, type(None), torch.dtype, torch.device, torch.layout,
                 torch.memory_format)
_NOT = object()           # a signature or result that cannot be memoised
_TENSOR, _VALUE, _SEQ = 0, 1, 2
# id(operator) -> (operator, memo_kind(operator)): hashing an OpOverload is a Python call.
_KINDS: dict[int, tuple[Any, int]] = {}
_UNSAFE_TAGS = frozenset({torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape,
                          torch.Tag.inplace_view})


def memo_kind(func, schema) -> int:
    """FRESH, SELF or 0 (never memoised) for operator overload ``func`` of schema
    ``schema``."""
    if func.namespace != "aten" or func.is_view or _UNSAFE_TAGS.intersection(func.tags):
        return 0
    arg_alias = [a.alias_info for a in schema.arguments]
    ret_alias = [r.alias_info for r in schema.returns]
    if all(a is None for a in arg_alias) and all(r is None for r in ret_alias):
        return FRESH
    first = arg_alias[0] if arg_alias else None
    if (first is not None and first.is_write and len(ret_alias) == 1 and ret_alias[0] is not None
            and ret_alias[0].is_write and ret_alias[0].before_set == first.before_set
            and all(a is None for a in arg_alias[1:])):
        return SELF
    return 0


def _sig(v: Any, storages: list[tuple[int, int]]) -> Any:
    """The part of argument ``v`` a meta kernel can see, hashable (each tensor's storage, by
    identity, and storage offset appended to ``storages``); ``_NOT`` when it has more (a
    tensor of another device or kind, an object)."""
    t = type(v)
    if t in _PLAIN_TENSORS:
        if (not v.is_meta or v.layout is not torch.strided or torch.Tensor._is_zerotensor(v)
                or v.is_conj() or v.is_neg()):
            return _NOT
        storages.append((torch._C._storage_id(v), v.storage_offset()))
        return (v.shape, v.stride(), v.dtype)
    if t in _PLAIN_VALUES:
        return (t, v)
    if t is list or t is tuple:
        out = []
        for x in v:
            s = _sig(x, storages)
            if s is _NOT:
                return _NOT
            out.append(s)
        return (t, tuple(out))
    return _NOT


def _sharing(storages: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Where the tensors of a call share a storage (a kernel refuses partly overlapping
    arguments): () when none do, else for each tensor the index of the first one with its
    storage, and its storage offset from that one's."""
    if len({s for s, _ in storages}) == len(storages):
        return ()
    first: dict[int, int] = {}
    out = []
    for i, (s, off) in enumerate(storages):
        j = first.setdefault(s, i)
        out.append((j, off - storages[j][1]))
    return tuple(out)


def _storages(values: Any, into: set[int]) -> set[int]:
    """The storages of the tensors in ``values`` (nested lists and tuples), by identity."""
    for v in values:
        if isinstance(v, torch.Tensor):
            into.add(torch._C._storage_id(v))
        elif isinstance(v, list | tuple):
            _storages(v, into)
    return into


def _spec(out: Any, inputs: set[int], seen: set[int]) -> Any:
    """How to make ``out`` again, or ``_NOT``."""
    t = type(out)
    if t is torch.Tensor:
        if (not out.is_meta or out.layout is not torch.strided or out.storage_offset() != 0
                or out.requires_grad or torch.Tensor._is_zerotensor(out) or out.is_conj() or out.is_neg()):
            return _NOT
        storage = torch._C._storage_id(out)
        if storage in inputs or storage in seen:
            return _NOT
        seen.add(storage)
        shape, stride, dtype = tuple(out.shape), out.stride(), out.dtype
        again = torch.empty_strided(shape, stride, dtype=dtype, device=_META)
        if again.untyped_storage().nbytes() != out.untyped_storage().nbytes():
            return _NOT
        return (_TENSOR, shape, stride, dtype)
    if t in (bool, int, float, type(None)):
        return (_VALUE, out)
    if t is list or t is tuple:
        specs = []
        for o in out:
            s = _spec(o, inputs, seen)
            if s is _NOT:
                return _NOT
            specs.append(s)
        return (_SEQ, t, tuple(specs))
    return _NOT


def _make(spec: tuple) -> Any:
    tag = spec[0]
    if tag == _TENSOR:
        return torch.empty_strided(spec[1], spec[2], dtype=spec[3], device=_META)
    if tag == _VALUE:
        return spec[1]
    return spec[1](_make(s) for s in spec[2])


def _has_tensor(spec: tuple) -> bool:
    if spec[0] == _TENSOR:
        return True
    return spec[0] == _SEQ and any(_has_tensor(s) for s in spec[2])


class MemoEntry:
    """One signature's result, and the recorder's texts for it (filled on first use)."""

    __slots__ = ("kind", "spec", "texts")

    def __init__(self, kind: int, spec: tuple | None):
        self.kind = kind
        self.spec = spec
        self.texts: tuple[str, str, str, str] | None = None

    def result(self, args: tuple) -> Any:
        """What the call returns again."""
        if self.kind == SELF:
            return args[0]
        assert self.spec is not None
        return _make(self.spec)


class KernelMemo:
    """Results of meta-device calls by signature (see the module docstring)."""

    def __init__(self, limit: int = MEMO_LIMIT):
        self.limit = limit
        self.hits = 0
        self._entries: dict[Hashable, MemoEntry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, func, args: tuple, kwargs: dict) -> tuple[Hashable | None, MemoEntry | None, Any]:
        """(signature of this call or None when it cannot be memoised, its entry or None,
        where its first tensor lies (storage, offset), for :meth:`learn`)."""
        got = _KINDS.get(id(func))
        if got is None:
            got = _KINDS[id(func)] = (func, memo_kind(func, func._schema))   # holds func: its id stays its own
        if not got[1]:
            return None, None, 0
        storages: list[tuple[int, int]] = []
        parts = []
        for v in args:     # _sig(args), the common cases first
            t = type(v)
            if t in _PLAIN_TENSORS:
                if (not v.is_meta or v.layout is not torch.strided or torch.Tensor._is_zerotensor(v)
                        or v.is_conj() or v.is_neg()):
                    return None, None, 0
                storages.append((torch._C._storage_id(v), v.storage_offset()))
                parts.append((v.shape, v.stride(), v.dtype))
            elif t in _PLAIN_VALUES:
                parts.append((t, v))
            else:
                if (t is list or t is tuple) and len(v) > MAX_LIST:
                    return None, None, 0
                part = _sig(v, storages)
                if part is _NOT:
                    return None, None, 0
                parts.append(part)
        sig = (tuple, tuple(parts))
        if kwargs:
            kw = _sig(tuple(sorted(kwargs.items())), storages)
            if kw is _NOT:
                return None, None, 0
        else:
            kw = ()
        key = (id(func), sig, kw, _sharing(storages), torch.get_default_dtype())
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
        return key, entry, storages[0] if storages else None

    def learn(self, func, key: Hashable, args: tuple, kwargs: dict, out: Any,
              where: Any = None) -> MemoEntry | None:
        """Keep what call ``key`` (just made: ``out = func(*args, **kwargs)``) returned, when
        it can be made again; the entry, or None. ``where``: what :meth:`find` said of the
        first argument before the call."""
        if len(self._entries) >= self.limit:
            return None
        if _KINDS[id(func)][1] == SELF:
            # The call's signature holds the argument's metadata before the call; it must
            # still be in the same storage at the same offset (``set_`` moves it).
            if (out is not args[0] or _sig(args[0], []) != key[1][1][0]    # type: ignore[index]
                    or (torch._C._storage_id(args[0]), args[0].storage_offset()) != where):
                return None
            entry = MemoEntry(SELF, None)
        else:
            inputs = _storages(args, set())
            _storages(kwargs.values(), inputs)
            spec = _spec(out, inputs, set())
            if spec is _NOT or not _has_tensor(spec):
                return None
            entry = MemoEntry(FRESH, spec)
        self._entries[key] = entry
        return entry
