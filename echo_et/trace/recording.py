"""A torch.distributed backend that answers as rank r of a world of N and records, not moves.

``RecordingProcessGroup`` is a Python ``ProcessGroup`` registered under the backend name
``echo-record``. ``init_process_group("echo-record", rank=r, world_size=N, store=HashStore())``
makes one process play rank r of an N-rank job: ``get_rank``/``get_world_size``, ``new_group``
subgroups and ``DeviceMesh`` answer as they would in the real job, every collective and
send/recv returns at once with outputs of the right shape, and each call is appended to the
process-wide :class:`Recorder` (type, bytes, dtype, group ranks, peer, order).

No data crosses ranks. Outputs are filled so that values stay finite and plausible, as if
every peer held the same data as this rank: all-gather copies the local input into every
slot, reduce-scatter keeps the local chunk, reductions leave the local tensor as it is,
recv zero-fills. Those local fills run inside the ``echo:comm#k`` profiler span that marks
the call, so the tracer can cut them out of the measured graph.

Each call's issue point is that span; its completion point is the first ``wait()`` on the
returned work (``echo:wait#k``). c10d waits at once for synchronous calls, so async calls
(``async_op=True``, autograd hooks, ``batch_isend_irecv``) are told apart only by where the
wait happens. Work handed out as a future (DDP's reducer) is waited inside C++ where no span
can be seen: such a record has ``waited=False``.

Imports torch at module import: only the tracer imports this module.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.futures import Future

from echo_et.errors import EchoError
from echo_et.ir.limits import MAX_GRAPH_NODES
from echo_et.trace.records import COMM_SPAN, WAIT_SPAN, CommRecord
from echo_et.trace.units import recorded_span

BACKEND_NAME = "echo-record"


@dataclass
class Recorder:
    """What one traced rank issued; ``records`` is in issue order."""

    records: list[CommRecord] = field(default_factory=list)
    enabled: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self._lock:
            self.records = []

    def add(self, rec: CommRecord) -> CommRecord:
        if len(self.records) >= MAX_GRAPH_NODES:   # a step that never stops communicating
            raise EchoError(f"the step issued more than {MAX_GRAPH_NODES:,} collectives and sends, the limit of "
                            "nodes per graph")
        with self._lock:
            rec.index = len(self.records)
            self.records.append(rec)
        return rec


RECORDER = Recorder()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _flat(tensors) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    out: list[torch.Tensor] = []
    for t in tensors:
        out.extend(_flat(t))
    return out


class RecordingWork(dist.distributed_c10d.Work):
    """A finished Work whose first ``wait()`` marks the completion point in the profile."""

    def __init__(self, record: CommRecord, result: list[torch.Tensor]):
        super().__init__()
        self._record = record
        self._result = result

    def wait(self, timeout=None) -> bool:  # noqa: ARG002 - c10d signature
        if not self._record.waited:
            self._record.waited = True
            with recorded_span(f"{WAIT_SPAN}{self._record.index}"):
                pass
        return True

    def get_future(self) -> Future:
        fut: Future = Future()
        fut.set_result(self._result)
        return fut

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        self.wait()


class RecordingProcessGroup(dist.ProcessGroup):
    """Rank ``rank`` of a group of ``size`` whose members are ``global_ranks``."""

    def __init__(self, rank: int, size: int, global_ranks: tuple[int, ...], name: str,
                 recorder: Recorder):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self.global_ranks = global_ranks
        self._name = name
        self._desc = ""
        self._recorder = recorder

    # -- identity ----------------------------------------------------------------------
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def getBackendName(self) -> str:  # noqa: N802 - c10d name
        return BACKEND_NAME

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc

    def __repr__(self) -> str:
        return f"RecordingProcessGroup(rank={self._rank}, ranks={list(self.global_ranks)})"

    # -- recording ---------------------------------------------------------------------
    def _issue(self, op: str, ins: list[torch.Tensor], outs: list[torch.Tensor], *,
               in_bytes: int | None = None, out_bytes: int | None = None,
               peer: int | None = None, tag: int = 0, root: int | None = None,
               fill=None) -> RecordingWork:
        first = (ins or outs or [None])[0]
        rec = CommRecord(
            index=-1, op=op, group_ranks=self.global_ranks, group_name=self._name,
            group_desc=self._desc,
            in_bytes=_nbytes(ins) if in_bytes is None else in_bytes,
            out_bytes=_nbytes(outs) if out_bytes is None else out_bytes,
            dtype=_dtype_name(first.dtype) if first is not None else "",
            peer=peer, tag=int(tag), root=root,
        )
        if self._recorder.enabled:
            self._recorder.add(rec)
        with recorded_span(f"{COMM_SPAN}{rec.index}"), torch.no_grad():
            if fill is not None:
                fill()
        return RecordingWork(rec, outs)

    # -- collectives -------------------------------------------------------------------
    def allreduce(self, tensors, opts=None) -> RecordingWork:
        ts = _flat(tensors)
        return self._issue("all_reduce", ts, ts)

    def allreduce_coalesced(self, tensors, opts=None) -> RecordingWork:
        ts = _flat(tensors)
        return self._issue("all_reduce", ts, ts)

    def reduce(self, tensors, opts=None) -> RecordingWork:
        ts = _flat(tensors)
        return self._issue("reduce", ts, ts, root=int(opts.rootRank) if opts else 0)

    def broadcast(self, tensors, opts=None) -> RecordingWork:
        ts = _flat(tensors)
        return self._issue("broadcast", ts, ts, root=int(opts.rootRank) if opts else 0)

    def allgather(self, output_lists, inputs, opts=None) -> RecordingWork:
        ins = _flat(inputs)

        def fill() -> None:
            for outs, src in zip(output_lists, ins, strict=False):
                for o in outs:
                    o.copy_(src.reshape(o.shape).clone())

        return self._issue("all_gather", ins, _flat(output_lists), fill=fill)

    def allgather_coalesced(self, output_lists, inputs, opts=None) -> RecordingWork:
        return self.allgather(output_lists, inputs, opts)

    def all_gather_single(self, output, input, opts=None) -> RecordingWork:  # noqa: A002
        def fill() -> None:
            output.view(self._size, -1).copy_(input.reshape(1, -1).clone())

        return self._issue("all_gather", [input], [output], fill=fill)

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None) -> RecordingWork:
        def fill() -> None:
            for o, i in zip(outputs, inputs, strict=True):
                o.view(self._size, -1).copy_(i.reshape(1, -1).clone())

        return self._issue("all_gather", list(inputs), list(outputs), fill=fill)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None) -> RecordingWork:
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None) -> RecordingWork:
        outs = _flat(outputs)

        def fill() -> None:
            for o, chunks in zip(outs, input_lists, strict=False):
                o.copy_(chunks[self._rank].reshape(o.shape))

        return self._issue("reduce_scatter", _flat(input_lists), outs, fill=fill)

    def reduce_scatter_single(self, output, input, opts=None) -> RecordingWork:  # noqa: A002
        def fill() -> None:
            output.copy_(input.reshape(self._size, -1)[self._rank].reshape(output.shape))

        return self._issue("reduce_scatter", [input], [output], fill=fill)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None) -> RecordingWork:
        def fill() -> None:
            for o, i in zip(outputs, inputs, strict=True):
                o.copy_(i.reshape(self._size, -1)[self._rank].reshape(o.shape))

        return self._issue("reduce_scatter", list(inputs), list(outputs), fill=fill)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None) -> RecordingWork:
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def alltoall(self, outputs, inputs, opts=None) -> RecordingWork:
        def fill() -> None:
            for o, i in zip(outputs, inputs, strict=False):
                if o.numel() == i.numel():
                    o.copy_(i.reshape(o.shape))
                else:
                    o.zero_()

        return self._issue("all_to_all", list(inputs), list(outputs), fill=fill)

    def all_to_all_single(self, output, input, output_split_sizes=None,  # noqa: A002
                          input_split_sizes=None, opts=None) -> RecordingWork:
        def fill() -> None:
            if output.numel() == input.numel():
                output.copy_(input.reshape(output.shape))
            else:
                output.zero_()

        return self._issue("all_to_all", [input], [output], fill=fill)

    alltoall_base = all_to_all_single

    def gather(self, output_lists, inputs, opts=None) -> RecordingWork:
        ins = _flat(inputs)
        root = int(opts.rootRank) if opts else 0
        outs = _flat(output_lists) if self._rank == root else []

        def fill() -> None:
            for o in outs:
                o.copy_(ins[0].reshape(o.shape))

        return self._issue("gather", ins, outs, root=root, fill=fill)

    def scatter(self, outputs, input_lists, opts=None) -> RecordingWork:
        outs = _flat(outputs)
        root = int(opts.rootRank) if opts else 0
        ins = _flat(input_lists) if self._rank == root else []

        def fill() -> None:
            for o in outs:
                if ins:
                    o.copy_(input_lists[0][self._rank].reshape(o.shape))
                else:
                    o.zero_()

        return self._issue("scatter", ins, outs, root=root, fill=fill)

    def barrier(self, opts=None) -> RecordingWork:
        return self._issue("barrier", [], [], in_bytes=0, out_bytes=0)

    def monitored_barrier(self, timeout=None, wait_all_ranks=False) -> None:
        self.barrier().wait()

    # -- point to point ----------------------------------------------------------------
    def send(self, tensors, dstRank, tag=0) -> RecordingWork:  # noqa: N803 - c10d name
        ts = _flat(tensors)
        return self._issue("send", ts, [], out_bytes=0, peer=int(dstRank), tag=tag)

    def recv(self, tensors, srcRank, tag=0) -> RecordingWork:  # noqa: N803 - c10d name
        ts = _flat(tensors)

        def fill() -> None:
            for t in ts:
                t.zero_()

        return self._issue("recv", [], ts, in_bytes=_nbytes(ts), peer=int(srcRank), tag=tag,
                           fill=fill)

    def recv_anysource(self, tensors, tag=0) -> RecordingWork:
        raise RuntimeError("echo-record: recv from any source cannot be traced ex-situ "
                           "(the peer is decided at run time)")


def _create(common_opts, backend_opts) -> RecordingProcessGroup:
    ranks = tuple(int(r) for r in common_opts.global_ranks_in_group)
    if not ranks:  # the default group
        ranks = tuple(range(int(common_opts.group_size)))
    return RecordingProcessGroup(int(common_opts.group_rank), int(common_opts.group_size), ranks,
                                 str(common_opts.group_id), RECORDER)


_REGISTERED = False


def register_backend() -> None:
    """Make ``echo-record`` known to torch.distributed (idempotent)."""
    global _REGISTERED
    if _REGISTERED or BACKEND_NAME.upper() in dist.Backend._plugins:
        _REGISTERED = True
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                  devices=["cpu", "cuda", "meta"])
    _REGISTERED = True
