"""Pipeline-parallel point-to-point transfers and the 1F1B schedules, plain and interleaved.

Stage s receives activations from s-1 and gradients from s+1. A combined "send one way,
receive the other" posts both transfers before waiting on either, as Megatron-LM's
``send_forward_recv_backward`` does, so neighbouring stages never wait on each other in a
cycle. Peers are addressed by their index in the pipeline group.

With a ``split_group`` (the stage's tensor-parallel group, of size TP > 1) the link does what
Megatron-LM calls the scatter/gather communication optimization (Narayanan et al., SC'21,
arXiv 2104.04473, section 4.1; ``--scatter-gather-tensors-in-pipeline``, on unless
``--no-scatter-gather-tensors-in-pipeline``): the TP ranks of a stage hold the same
activation, so each sends only its 1/TP slice of it (the flattened tensor cut in TP equal
pieces, piece ``tp_rank``) to the same TP rank of the next stage, and the receiving stage
all-gathers the pieces inside its TP group (NVLink) into the whole tensor. Gradients going
back travel the same way. Without sequence parallelism, as here, every TP rank holds the
whole activation, so the slice is a view and costs no kernel.

:func:`interleaved_one_f_one_b` runs Megatron-LM's interleaved 1F1B schedule (Narayanan et
al., SC'21, section 2.2.2; ``--num-layers-per-virtual-pipeline-stage``) as
:mod:`.pipeline_plan` plans it: each stage holds ``chunks`` model chunks, chunk c of stage s
being virtual stage c x stages + s. Every exchange is one combined call posting, in
Megatron's order, send-to-previous, receive-from-previous, send-to-next, receive-from-next,
and waiting for all of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from echo_et.errors import EchoError
from echo_et.workloads.markers import comm_span, device_sync, span
from echo_et.workloads.pipeline_plan import (
    Transfer,
    grad_sync_chunk,
    interleaved_schedule,
    overlapped_plan,
    param_sync_chunk,
)

# torch 2.13 renamed the tensor form; older releases only have the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class StageLink:
    """``sync_after``: block the host on the device after every exchange, as Megatron-LM's
    ``_communicate`` does (``torch.cuda.synchronize()`` after ``batch_isend_irecv``).
    ``sync_before``: and before it, as Megatron's synchronising timers do
    (``GPTConfig.sync_timers``).
    ``split_group``: send 1/size of each tensor and all-gather it in this group on arrival
    (see the module docstring); None, or a group of one rank, sends tensors whole."""

    def __init__(self, group, shape: tuple[int, ...], dtype, device, *, sync_after: bool = False,
                 sync_before: bool = False, split_group=None):
        self.group = group
        self.stage = dist.get_rank(group)
        self.stages = dist.get_world_size(group)
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.sync_after = sync_after
        self.sync_before = sync_before
        self.split_group = split_group if split_group is not None and dist.get_world_size(split_group) > 1 \
            else None
        self.parts, self.part = ((dist.get_world_size(split_group), dist.get_rank(split_group))
                                 if self.split_group is not None else (1, 0))
        numel = math.prod(shape)
        if numel % self.parts:
            raise EchoError(f"a pipeline tensor of {numel} elements does not split in {self.parts} equal pieces")
        self.chunk = numel // self.parts

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def peer(self, offset: int) -> int:
        # modulo: the interleaved schedule's ring (the plain schedule never wraps)
        return dist.get_global_rank(self.group, (self.stage + offset) % self.stages)

    def _buffer(self) -> torch.Tensor:
        shape = self.shape if self.split_group is None else (self.chunk,)
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def _slice(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's piece of ``t`` (Megatron's ``split_tensor_into_1d_equal_chunks``: the
        elements ``[part x chunk, (part + 1) x chunk)`` of the flattened tensor, a view; taken
        as a row of a ``[parts, chunk]`` view, whose ``select`` is a view operator in every
        overload, where ``slice`` has a non-view overload that a CPU trace would count as a
        kernel)."""
        t = t.contiguous()
        if self.split_group is None:
            return t
        return t.view(self.parts, self.chunk)[self.part]

    def _gather(self, piece: torch.Tensor, tag: dict) -> torch.Tensor:
        """The whole tensor from every TP rank's piece (Megatron's ``gather_split_1d_tensor``:
        one all-gather into a flat buffer, viewed in the tensor's shape)."""
        whole = torch.empty(self.parts * self.chunk, dtype=self.dtype, device=self.device)
        with span(**tag, stage=self.stage), comm_span(self.split_group):
            _all_gather(whole, piece, group=self.split_group)
        return whole.view(self.shape)

    def _exchange(self, send: torch.Tensor | None, send_to: int, send_tag: dict,
                  recv_from: int | None, recv_tag: dict) -> torch.Tensor | None:
        """Post a send and/or a receive, then wait for both. ``*_tag`` are the annotations
        (phase, micro-batch) of what travels."""
        works = []
        if self.sync_before and (send is not None or recv_from is not None):
            device_sync(self.device)
        if send is not None:
            send = self._slice(send)
            with span(**send_tag, stage=self.stage), comm_span(self.group):
                works.append(dist.isend(send, self.peer(send_to), group=self.group))
        buf = None
        if recv_from is not None:
            buf = self._buffer()
            with span(**recv_tag, stage=self.stage), comm_span(self.group):
                works.append(dist.irecv(buf, self.peer(recv_from), group=self.group))
        for w in works:
            with comm_span(self.group):
                w.wait()
        if self.sync_after and works:
            device_sync(self.device)
        if buf is not None and self.split_group is not None:
            buf = self._gather(buf, recv_tag)
        return buf

    def exchange(self, transfers: tuple[Transfer, ...],
                 outgoing: dict[tuple[str, int, int], torch.Tensor]) -> list[torch.Tensor]:
        """One combined call of the interleaved schedule: post ``transfers`` in their order
        (a send takes ``outgoing[(phase, mb, chunk)]``, detached), wait for all of them, then
        all-gather the received pieces (with a ``split_group``). Returns the received
        tensors in the order of their transfers; activations require grad."""
        works = []
        bufs: list[tuple[torch.Tensor, Transfer]] = []
        if self.sync_before and transfers:
            device_sync(self.device)
        for t in transfers:
            tag = {"phase": t.phase, "mb": t.mb}
            if t.send:
                send = self._slice(outgoing.pop((t.phase, t.mb, t.chunk)).detach())
                with span(**tag, stage=self.stage), comm_span(self.group):
                    works.append(dist.isend(send, self.peer(t.peer), group=self.group))
            else:
                buf = self._buffer()
                with span(**tag, stage=self.stage), comm_span(self.group):
                    works.append(dist.irecv(buf, self.peer(t.peer), group=self.group))
                bufs.append((buf, t))
        for w in works:
            with comm_span(self.group):
                w.wait()
        if self.sync_after and works:
            device_sync(self.device)
        return [self.arrived(t, buf) for buf, t in bufs]

    def post(self, transfers: tuple[Transfer, ...], outgoing: dict[tuple[str, int, int], torch.Tensor]
             ) -> list[tuple[Transfer, object, torch.Tensor | None]]:
        """Post ``transfers`` as separate asynchronous calls and return them unwaited, each with
        its receive buffer (Megatron's ``overlap_p2p_comm``: no batched call, no device
        synchronisation; the schedule waits for them before the compute that needs them)."""
        posted = []
        for t in transfers:
            tag = {"phase": t.phase, "mb": t.mb}
            if t.send:
                send = self._slice(outgoing.pop((t.phase, t.mb, t.chunk)).detach())
                with span(**tag, stage=self.stage), comm_span(self.group):
                    posted.append((t, dist.isend(send, self.peer(t.peer), group=self.group), None))
            else:
                buf = self._buffer()
                with span(**tag, stage=self.stage), comm_span(self.group):
                    posted.append((t, dist.irecv(buf, self.peer(t.peer), group=self.group), buf))
        return posted

    def arrived(self, t: Transfer, buf: torch.Tensor) -> torch.Tensor:
        """A received piece as the schedule uses it: all-gathered whole (with a
        ``split_group``); an activation requires grad."""
        if self.split_group is not None:
            buf = self._gather(buf, {"phase": t.phase, "mb": t.mb})
        return buf.requires_grad_() if t.phase == "forward" else buf

    def recv_forward(self, mb: int) -> torch.Tensor | None:
        if self.first:
            return None
        buf = self._exchange(None, 0, {}, -1, _fwd(mb))
        assert buf is not None
        return buf.requires_grad_()

    def send_forward(self, out: torch.Tensor, mb: int) -> None:
        if not self.last:
            self._exchange(out.detach(), 1, _fwd(mb), None, {})

    def recv_backward(self, mb: int) -> torch.Tensor | None:
        return None if self.last else self._exchange(None, 0, {}, 1, _bwd(mb))

    def send_backward(self, grad: torch.Tensor | None, mb: int) -> None:
        if not self.first and grad is not None:
            self._exchange(grad, -1, _bwd(mb), None, {})

    def send_forward_recv_backward(self, out: torch.Tensor, send_mb: int,
                                   recv_mb: int) -> torch.Tensor | None:
        return None if self.last else self._exchange(out.detach(), 1, _fwd(send_mb), 1,
                                                     _bwd(recv_mb))

    def send_backward_recv_forward(self, grad: torch.Tensor | None, send_mb: int,
                                   recv_mb: int) -> torch.Tensor | None:
        if self.first:
            return None
        buf = self._exchange(grad, -1, _bwd(send_mb), -1, _fwd(recv_mb))
        assert buf is not None
        return buf.requires_grad_()


def _fwd(mb: int) -> dict:
    return {"phase": "forward", "mb": mb}


def _bwd(mb: int) -> dict:
    return {"phase": "backward", "mb": mb}


def one_f_one_b(link: StageLink, microbatches: int,
                forward: Callable[[int, torch.Tensor | None], torch.Tensor],
                backward: Callable[[int, torch.Tensor | None, torch.Tensor, torch.Tensor | None],
                                   torch.Tensor | None]) -> None:
    """Run ``microbatches`` forward and backward passes of this stage in 1F1B order.

    ``forward(mb, input) -> output`` (the loss on the last stage);
    ``backward(mb, input, output, output_grad) -> input_grad``.
    """
    warmup = min(link.stages - link.stage - 1, microbatches)
    remaining = microbatches - warmup
    saved: list[tuple[int, torch.Tensor | None, torch.Tensor]] = []
    fwd_mb = 0
    for _ in range(warmup):
        inp = link.recv_forward(fwd_mb)
        out = forward(fwd_mb, inp)
        link.send_forward(out, fwd_mb)
        saved.append((fwd_mb, inp, out))
        fwd_mb += 1
    inp = link.recv_forward(fwd_mb) if remaining > 0 else None
    for i in range(remaining):
        out = forward(fwd_mb, inp)
        saved.append((fwd_mb, inp, out))
        sent_mb = fwd_mb
        fwd_mb += 1
        mb, b_inp, b_out = saved.pop(0)
        out_grad = link.send_forward_recv_backward(out, sent_mb, mb)
        in_grad = backward(mb, b_inp, b_out, out_grad)
        if i == remaining - 1:
            inp = None
            link.send_backward(in_grad, mb)
        else:
            inp = link.send_backward_recv_forward(in_grad, mb, fwd_mb)
    for _ in range(warmup):
        mb, b_inp, b_out = saved.pop(0)
        out_grad = link.recv_backward(mb)
        in_grad = backward(mb, b_inp, b_out, out_grad)
        link.send_backward(in_grad, mb)


def interleaved_one_f_one_b(link: StageLink, microbatches: int, chunks: int,
                            forward: Callable[[int, int, torch.Tensor | None], torch.Tensor],
                            backward: Callable[[int, int, torch.Tensor | None, torch.Tensor,
                                                torch.Tensor | None], torch.Tensor | None],
                            param_sync: Callable[[int, int], None] | None = None,
                            grad_sync: Callable[[int, int], None] | None = None,
                            overlap_p2p: bool = False, group: int = 0, warmup_flush: bool = False) -> None:
    """Run this stage's ``chunks`` model chunks over ``microbatches`` micro-batches in the
    interleaved 1F1B order (:func:`interleaved_schedule`).

    ``forward(mb, chunk, input) -> output`` (the loss on the model's last chunk; input None
    on its first); ``backward(mb, chunk, input, output, output_grad) -> input_grad``;
    ``param_sync(chunk, mb)``, when given, issues a chunk's weight all-gathers (Megatron's
    ``param_sync_func``): chunks 0 and 1 before the schedule, the others where
    :func:`param_sync_chunk` says, before the forward of micro-batch ``mb``; ``grad_sync(chunk,
    mb)``, when given, issues a chunk's gradient collectives (Megatron's ``grad_sync_func``)
    where :func:`grad_sync_chunk` says, after the backward of micro-batch ``mb``, and the
    chunks it has not reached after the schedule, in chunk order. ``overlap_p2p``: Megatron's
    ``overlap_p2p_comm`` (:func:`overlapped_plan`): the transfers posted one by one, a post's
    sends waited for at the next post of their direction (or at once after a "settle"), the
    receives one by one, in posting order, where the plan awaits them; ``warmup_flush`` its
    ``overlap_p2p_comm_warmup_flush`` (the warm-up's and the cool-down's too). ``group``:
    Megatron-Core's micro-batch group per virtual stage (:func:`schedule_table`; 0: pp).
    """
    if param_sync is not None:
        param_sync(0, 0)
        param_sync(1, 0)
    forwards = backwards = 0
    synced: set[int] = set()
    first = link.first
    last_chunk = chunks - 1 if link.last else None
    inputs: dict[tuple[int, int], torch.Tensor] = {}
    out_grads: dict[tuple[int, int], torch.Tensor] = {}
    saved: dict[tuple[int, int], tuple[torch.Tensor | None, torch.Tensor]] = {}
    outgoing: dict[tuple[str, int, int], torch.Tensor] = {}
    plan = interleaved_schedule(link.stages, link.stage, chunks, microbatches, group, overlapped=overlap_p2p)
    pending: dict[str, list[tuple[Transfer, object, torch.Tensor | None]]] = {"forward": [], "backward": []}

    def settle(phase: str, t: Transfer, work, buf: torch.Tensor | None) -> None:
        with comm_span(link.group):
            work.wait()
        if buf is not None:
            (inputs if phase == "forward" else out_grads)[(t.mb, t.chunk)] = link.arrived(t, buf)

    def arrive(phase: str, sends_only: bool = False) -> None:
        """Wait for what was posted in ``phase``'s direction: all of it, or its sends only."""
        keep = []
        for t, work, buf in pending[phase]:
            if sends_only and not t.send:
                keep.append((t, work, buf))
            else:
                settle(phase, t, work, buf)
        pending[phase] = keep

    def await_oldest(phase: str) -> None:
        """Wait for the oldest receive of ``phase``'s direction not waited for yet, if any."""
        at = next((k for k, p in enumerate(pending[phase]) if not p[0].send), None)
        if at is not None:
            settle(phase, *pending[phase].pop(at))

    if overlap_p2p:
        plan = overlapped_plan(plan, first=first, last=link.last, chunks=chunks, warmup_flush=warmup_flush)
    for item in plan:
        kind = item[0]
        if kind in ("post", "exchange", "prefetch"):
            phases = [ph for ph in ("forward", "backward") if any(t.phase == ph for t in item[1])]
            if kind == "exchange":
                for phase in phases:
                    arrive(phase)
            posted = link.post(item[1], outgoing)
            for phase in phases if kind != "prefetch" else ():
                arrive(phase, sends_only=True)     # the sends posted before (Megatron's previous handle)
            for p in posted:
                pending[p[0].phase].append(p)
            if kind == "exchange":
                for phase in phases:
                    arrive(phase)
            continue
        if kind == "settle":
            arrive(item[1], sends_only=True)
            continue
        if kind == "await":
            await_oldest(item[1])
            continue
        if kind == "comm":
            transfers = item[1]
            got = link.exchange(transfers, outgoing)
            for t, tensor in zip((t for t in transfers if not t.send), got, strict=True):
                (inputs if t.phase == "forward" else out_grads)[(t.mb, t.chunk)] = tensor
            continue
        _, mb, c = item
        if kind == "forward":
            sync = None if param_sync is None else param_sync_chunk(forwards, link.stages, link.stage, chunks,
                                                                    microbatches, group)
            if sync is not None:
                param_sync(sync, mb)
            forwards += 1
            inp = None if first and c == 0 else inputs.pop((mb, c))
            out = forward(mb, c, inp)
            saved[(mb, c)] = (inp, out)
            if c != last_chunk:
                outgoing[("forward", mb, c)] = out
        else:
            inp, out = saved.pop((mb, c))
            grad = None if c == last_chunk else out_grads.pop((mb, c))
            in_grad = backward(mb, c, inp, out, grad)
            if not (first and c == 0):
                assert in_grad is not None
                outgoing[("backward", mb, c)] = in_grad
            sync = None if grad_sync is None else grad_sync_chunk(backwards, link.stages, link.stage, chunks,
                                                                  microbatches, group)
            if sync is not None:
                grad_sync(sync, mb)
                synced.add(sync)
            backwards += 1
    arrive("forward")
    arrive("backward")
    if grad_sync is not None:
        for c in range(chunks):
            if c not in synced:
                grad_sync(c, microbatches - 1)
