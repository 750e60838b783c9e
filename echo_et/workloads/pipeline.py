"""Pipeline-parallel point-to-point transfers and the non-interleaved 1F1B schedule.

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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from echo_et.errors import EchoError
from echo_et.workloads.markers import comm_span, device_sync, span

# torch 2.13 renamed the tensor form; older releases only have the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class StageLink:
    """``sync_after``: block the host on the device after every exchange, as Megatron-LM's
    ``_communicate`` does (``torch.cuda.synchronize()`` after ``batch_isend_irecv``).
    ``split_group``: send 1/size of each tensor and all-gather it in this group on arrival
    (see the module docstring); None, or a group of one rank, sends tensors whole."""

    def __init__(self, group, shape: tuple[int, ...], dtype, device, *, sync_after: bool = False,
                 split_group=None):
        self.group = group
        self.stage = dist.get_rank(group)
        self.stages = dist.get_world_size(group)
        self.shape = shape
        self.dtype = dtype
        self.device = device
        self.sync_after = sync_after
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

    def _peer(self, offset: int) -> int:
        return dist.get_global_rank(self.group, self.stage + offset)

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
        if send is not None:
            send = self._slice(send)
            with span(**send_tag, stage=self.stage), comm_span(self.group):
                works.append(dist.isend(send, self._peer(send_to), group=self.group))
        buf = None
        if recv_from is not None:
            buf = self._buffer()
            with span(**recv_tag, stage=self.stage), comm_span(self.group):
                works.append(dist.irecv(buf, self._peer(recv_from), group=self.group))
        for w in works:
            with comm_span(self.group):
                w.wait()
        if self.sync_after and works:
            device_sync(self.device)
        if buf is not None and self.split_group is not None:
            buf = self._gather(buf, recv_tag)
        return buf

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
