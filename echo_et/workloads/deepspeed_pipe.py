"""DeepSpeed's pipeline engine, as Megatron-DeepSpeed trains GPT with pipeline parallelism
(``GPTModelPipe`` under ``deepspeed.PipelineEngine.train_batch``: its path unless
``--no-pipeline-parallel``). Written from DeepSpeed's public source (``runtime/pipe/
schedule.py``, ``engine.py``, ``p2p.py`` and ``PartitionedTensor`` in ``runtime/utils.py``);
what it does that Megatron-LM's 1F1B (:mod:`.pipeline`) does not, each traced here:

- **The TrainSchedule.** 2 x (micro-batches + stages - 1) steps; at each step a stage runs one
  forward or one backward, even and odd stages in opposite phases (:func:`train_schedule`). A
  forward step first receives its activation, then sends the gradient of the backward the
  step before ran; a backward step first sends the activation of the forward the step before
  ran, then receives its gradient. The compute order per stage is Megatron's 1F1B; the
  transfers are not.
- **One blocking call per tensor.** Every transfer is its own ``dist.send`` / ``dist.recv``
  (the compute stream waits for it before anything else runs), never a combined exchange and,
  with TP = 1, never followed by a device synchronisation.
- **Partitioned tensors with TP > 1.** DeepSpeed partitions whenever the model-parallel size
  is above one (``is_pipe_partitioned = is_grad_partitioned = is_model_parallel``): an
  activation or a gradient leaves as its partition metadata (a small int64 tensor copied to
  the device) and this TP rank's 1/TP piece (``narrow().clone()``), two sends; the receiver
  rebuilds it (``PartitionedTensor.full()``: a zeroed flat buffer, the local piece copied in,
  an all-gather over the TP group whose list form copies every piece back out, and a clone).
  A stage that sent its output partitioned freed it, so before its backward it rebuilds it
  the same way.
- **The host waits for the device at each partitioned tensor.** ``PartitionedTensor.to_meta()``
  copies the metadata list to the device with a blocking copy from pageable memory, which
  synchronises the compute stream (after each forward whose output leaves, and at each
  gradient that leaves); ``PartitionedTensor.from_meta()`` reads the metadata back on the host
  (``meta.tolist()``: at each received activation and gradient, and at the stage's own output
  rebuilt before its backward). With TP > 1 the host therefore never runs ahead of the device
  across a forward or a backward: five waits per micro-batch on a middle stage. (DeepSpeed
  releases from 2023 keep the received activation's metadata on the host after the first;
  the 2021-2022 engine Megatron-DeepSpeed's published runs used read it every time.)
- **Copies on receipt.** A received activation is cloned on arrival and again at the start
  of the forward that reads it.

What the engine does around the schedule (which stages load data, the tied embedding's
gradient reduced before the data-parallel one, the loss averaged at the end) belongs to the
model's step (:mod:`echo_et.workloads.gpt`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist

from echo_et.workloads.markers import comm_span, device_sync, span
from echo_et.workloads.pipeline import StageLink

# torch 2.13 renamed the tensor form; older releases only have the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def own_piece(t: torch.Tensor, parts: int, part: int) -> torch.Tensor:
    """This rank's 1/``parts`` of ``t``, a copy, as DeepSpeed partitions a tensor
    (``narrow().clone()`` of the flattened tensor)."""
    n = t.numel() // parts
    return t.detach().contiguous().view(-1).narrow(0, part * n, n).clone()


def gather_pieces(piece: torch.Tensor, group) -> torch.Tensor:
    """Every rank's piece of a partitioned tensor, flat, as DeepSpeed gathers one
    (``PartitionedTensor.full`` and its activation checkpoints): a zeroed buffer of the whole,
    this rank's piece copied in, and ``dist.all_gather`` in its list form, whose output
    pieces torch copies one by one out of a flat buffer it gathers into."""
    parts, part, n = dist.get_world_size(group), dist.get_rank(group), piece.numel()
    flat = torch.zeros(parts * n, dtype=piece.dtype, device=piece.device)
    mine = flat.narrow(0, part * n, n)
    mine.copy_(piece)
    gathered = torch.empty_like(flat)
    with comm_span(group):
        _all_gather(gathered, mine, group=group)
    for i in range(parts):
        flat.narrow(0, i * n, n).copy_(gathered.narrow(0, i * n, n))
    return flat


class Instruction(NamedTuple):
    """One instruction of a TrainSchedule step: ``op`` one of recv_act, send_grad, send_act,
    recv_grad, load, forward, backward; ``mb`` the micro-batch it concerns."""

    op: str
    mb: int


def _step_micro_batch(step: int, stages: int, stage: int) -> tuple[int, bool]:
    """(micro-batch, is forward) of ``stage`` at ``step``: forwards on the steps of the
    stage's parity, backwards on the others (DeepSpeed's ``_step_to_micro_batch``)."""
    half = step // 2
    if step % 2 == stage % 2:
        return half - stage // 2, True
    if step % 2 == 0:
        return half - stages + (stage + 1) // 2, False
    return half - stages + 1 + stage // 2, False


def train_schedule(stages: int, stage: int, microbatches: int) -> list[list[Instruction]]:
    """DeepSpeed's TrainSchedule for ``stage``: one list of instructions per step. A step's
    micro-batch outside [0, microbatches) is an idle step; ``load`` (first and last stage
    only) precedes each forward."""
    def valid(mb: int) -> bool:
        return 0 <= mb < microbatches

    steps: list[list[Instruction]] = []
    prev = -1
    has_prev, has_next = stage > 0, stage < stages - 1
    for step in range(2 * (microbatches + stages - 1)):
        mb, forward = _step_micro_batch(step, stages, stage)
        cmds: list[Instruction] = []
        if forward:
            if has_prev and valid(mb):
                cmds.append(Instruction("recv_act", mb))
            if has_prev and valid(prev):
                cmds.append(Instruction("send_grad", prev))
        else:
            if has_next and valid(prev):
                cmds.append(Instruction("send_act", prev))
            if has_next and valid(mb):
                cmds.append(Instruction("recv_grad", mb))
        if forward and valid(mb) and not (has_prev and has_next):
            cmds.append(Instruction("load", mb))
        if valid(mb):
            cmds.append(Instruction("forward" if forward else "backward", mb))
        steps.append(cmds)
        prev = mb
    return steps


class DeepSpeedLink(StageLink):
    """A stage's transfers as DeepSpeed's engine makes them (see the module docstring). With a
    ``split_group`` of TP > 1 ranks, tensors travel partitioned."""

    def __init__(self, group, shape: tuple[int, ...], dtype, device, *, split_group=None):
        super().__init__(group, shape, dtype, device, split_group=split_group)
        # PartitionedTensor.to_meta(): ndim, the shape, parts, this rank, the parts' bounds
        self.meta = ([len(shape), *shape, self.parts, self.part]
                     + [i * self.chunk for i in range(self.parts + 1)])

    def _send(self, t: torch.Tensor, offset: int, tag: dict) -> None:
        with span(**tag, stage=self.stage), comm_span(self.group):
            work = dist.isend(t, self.peer(offset), group=self.group)
        with comm_span(self.group):
            work.wait()

    def _recv(self, buf: torch.Tensor, offset: int, tag: dict) -> torch.Tensor:
        with span(**tag, stage=self.stage), comm_span(self.group):
            work = dist.irecv(buf, self.peer(offset), group=self.group)
        with comm_span(self.group):
            work.wait()
        return buf

    def partition(self, t: torch.Tensor, tag: dict) -> tuple[torch.Tensor, ...]:
        """What leaves for a neighbour: ``(meta, piece)`` with TP > 1, else ``(t,)``; the
        metadata's blocking copy to the device makes the host wait for it."""
        if self.split_group is None:
            return (t.detach(),)
        meta = torch.tensor(self.meta, dtype=torch.int64).to(self.device, copy=True)
        self._host_waits(tag)
        return meta, own_piece(t, self.parts, self.part)

    def _host_waits(self, tag: dict) -> None:
        """The host waits for the device: ``to_meta()``'s blocking copy, ``from_meta()``'s
        ``meta.tolist()``."""
        with span(**tag, stage=self.stage):
            device_sync(self.device)

    def rebuild(self, piece: torch.Tensor, mb: int) -> torch.Tensor:
        """The stage's own output, freed once sent, rebuilt before its backward
        (``from_meta`` of its saved metadata, then ``full()``)."""
        tag = {"phase": "backward", "mb": mb}
        self._host_waits(tag)
        return self.full(piece, tag)

    def full(self, piece: torch.Tensor, tag: dict) -> torch.Tensor:
        """``PartitionedTensor.full()``: the whole tensor from every TP rank's piece. The same
        work at every micro-batch: a meta-device trace records it once per phase and repeats it
        (:func:`echo_et.trace.units.repeat_region`)."""
        from echo_et.trace.units import repeat_region

        def run() -> torch.Tensor:
            with span(**tag, stage=self.stage):
                flat = gather_pieces(piece, self.split_group)
            return flat.view(self.shape).clone().detach()

        return repeat_region(("deepspeed-full", tag["phase"]), run, mb=tag["mb"])[0]

    def _receive(self, offset: int, tag: dict) -> list[torch.Tensor]:
        bufs = ([torch.empty(len(self.meta), dtype=torch.int64, device=self.device), self._piece_buffer()]
                if self.split_group is not None else [torch.empty(self.shape, dtype=self.dtype, device=self.device)])
        return [self._recv(b, offset, tag) for b in bufs]

    def _piece_buffer(self) -> torch.Tensor:
        return torch.empty(self.chunk, dtype=self.dtype, device=self.device)

    def send_activation(self, sent: tuple[torch.Tensor, ...], mb: int) -> None:
        for t in sent:
            self._send(t, 1, {"phase": "forward", "mb": mb})

    def recv_activation(self, mb: int) -> list[torch.Tensor]:
        """The received tensors, each cloned as it arrives."""
        return [b.clone().detach() for b in self._receive(-1, {"phase": "forward", "mb": mb})]

    def send_gradient(self, grad: torch.Tensor, mb: int) -> None:
        tag = {"phase": "backward", "mb": mb}
        for t in self.partition(grad, tag):
            self._send(t, -1, tag)

    def recv_gradient(self, mb: int) -> list[torch.Tensor]:
        return self._receive(1, {"phase": "backward", "mb": mb})

    def whole(self, received: list[torch.Tensor], mb: int, phase: str) -> torch.Tensor:
        """The tensor the received pieces stand for (rebuilt with TP > 1, once the host has
        read the metadata)."""
        if self.split_group is None:
            return received[-1]
        tag = {"phase": phase, "mb": mb}
        self._host_waits(tag)
        return self.full(received[-1], tag)


def train_batch(link: DeepSpeedLink, microbatches: int,
                forward: Callable[[int, torch.Tensor | None], torch.Tensor],
                backward: Callable[[int, torch.Tensor | None, torch.Tensor, torch.Tensor | None],
                                   torch.Tensor | None]) -> None:
    """Run the TrainSchedule's steps on this stage (without its closing reduction and
    optimizer step). ``forward(mb, input) -> output`` (the loss on the last stage; it loads
    its own micro-batch on the first and the last stage); ``backward(mb, input, output,
    output_grad) -> input_grad``."""
    received: dict[int, list[torch.Tensor]] = {}
    inputs: dict[int, torch.Tensor | None] = {}
    outputs: dict[int, torch.Tensor] = {}
    sent: dict[int, tuple[torch.Tensor, ...]] = {}
    kept: dict[int, torch.Tensor] = {}      # this rank's piece of each output sent partitioned
    grads: dict[int, list[torch.Tensor]] = {}
    input_grads: dict[int, torch.Tensor | None] = {}
    for cmds in train_schedule(link.stages, link.stage, microbatches):
        for op, mb in cmds:
            if op == "recv_act":
                received[mb] = link.recv_activation(mb)
            elif op == "send_grad":
                grad = input_grads.pop(mb)
                assert grad is not None
                link.send_gradient(grad, mb)
            elif op == "send_act":
                link.send_activation(sent.pop(mb), mb)
            elif op == "recv_grad":
                grads[mb] = link.recv_gradient(mb)
            elif op == "forward":
                inp = None
                if mb in received:     # cloned again as the forward starts
                    inp = link.whole([t.clone() for t in received.pop(mb)], mb, "forward").requires_grad_()
                inputs[mb] = inp
                out = forward(mb, inp)
                outputs[mb] = out
                if not link.last:
                    sent[mb] = link.partition(out, {"phase": "forward", "mb": mb})
                    kept[mb] = sent[mb][-1]
            elif op == "backward":
                out = outputs.pop(mb)
                out_grad = None
                if not link.last:
                    piece = kept.pop(mb)
                    if link.split_group is not None:   # the output was freed once sent: rebuilt
                        out.data = link.rebuild(piece, mb)
                    out_grad = link.whole(grads.pop(mb), mb, "backward")
                input_grads[mb] = backward(mb, inputs.pop(mb), out, out_grad)
            # "load": the forward loads its micro-batch itself

