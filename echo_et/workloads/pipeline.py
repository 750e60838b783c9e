"""Pipeline-parallel point-to-point transfers and the non-interleaved 1F1B schedule.

Stage s receives activations from s-1 and gradients from s+1. A combined "send one way,
receive the other" posts both transfers before waiting on either, as Megatron-LM's
``send_forward_recv_backward`` does, so neighbouring stages never wait on each other in a
cycle. Peers are addressed by their index in the pipeline group.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from echo_et.workloads.markers import comm_span


class StageLink:
    def __init__(self, group, shape: tuple[int, ...], dtype, device):
        self.group = group
        self.stage = dist.get_rank(group)
        self.stages = dist.get_world_size(group)
        self.shape = shape
        self.dtype = dtype
        self.device = device

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def _peer(self, offset: int) -> int:
        return dist.get_global_rank(self.group, self.stage + offset)

    def _buffer(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def _exchange(self, send: torch.Tensor | None, send_to: int,
                  recv_from: int | None) -> torch.Tensor | None:
        works = []
        if send is not None:
            send = send.contiguous()
            with comm_span(self.group):
                works.append(dist.isend(send, self._peer(send_to), group=self.group))
        buf = None
        if recv_from is not None:
            buf = self._buffer()
            with comm_span(self.group):
                works.append(dist.irecv(buf, self._peer(recv_from), group=self.group))
        for w in works:
            with comm_span(self.group):
                w.wait()
        return buf

    def recv_forward(self) -> torch.Tensor | None:
        if self.first:
            return None
        buf = self._exchange(None, 0, -1)
        assert buf is not None
        return buf.requires_grad_()

    def send_forward(self, out: torch.Tensor) -> None:
        if not self.last:
            self._exchange(out.detach(), 1, None)

    def recv_backward(self) -> torch.Tensor | None:
        return None if self.last else self._exchange(None, 0, 1)

    def send_backward(self, grad: torch.Tensor | None) -> None:
        if not self.first and grad is not None:
            self._exchange(grad, -1, None)

    def send_forward_recv_backward(self, out: torch.Tensor) -> torch.Tensor | None:
        return None if self.last else self._exchange(out.detach(), 1, 1)

    def send_backward_recv_forward(self, grad: torch.Tensor | None) -> torch.Tensor | None:
        if self.first:
            return None
        buf = self._exchange(grad, -1, -1)
        assert buf is not None
        return buf.requires_grad_()


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
    bwd_mb = 0
    for _ in range(warmup):
        inp = link.recv_forward()
        out = forward(fwd_mb, inp)
        link.send_forward(out)
        saved.append((fwd_mb, inp, out))
        fwd_mb += 1
    inp = link.recv_forward() if remaining > 0 else None
    for i in range(remaining):
        out = forward(fwd_mb, inp)
        saved.append((fwd_mb, inp, out))
        fwd_mb += 1
        out_grad = link.send_forward_recv_backward(out)
        mb, b_inp, b_out = saved.pop(0)
        in_grad = backward(mb, b_inp, b_out, out_grad)
        bwd_mb += 1
        if i == remaining - 1:
            inp = None
            link.send_backward(in_grad)
        else:
            inp = link.send_backward_recv_forward(in_grad)
    for _ in range(warmup):
        out_grad = link.recv_backward()
        mb, b_inp, b_out = saved.pop(0)
        in_grad = backward(mb, b_inp, b_out, out_grad)
        bwd_mb += 1
        link.send_backward(in_grad)
