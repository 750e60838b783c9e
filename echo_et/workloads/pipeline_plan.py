"""The interleaved 1F1B schedule as a plan: what each stage computes and exchanges, in order,
as Megatron-Core's ``forward_backward_pipelining_with_interleaving`` runs it; torch-free, so
the configuration checks and the memory bound read the same rules the tracer runs.

Virtual micro-step k of a stage runs ``schedule_table(...)[k]``: the micro-batches go in
groups of pp (or ``--microbatch-group-size-per-virtual-pipeline-stage``), each group through
chunk 0, chunk 1, ..., the backward steps the same micro-batches with the chunks reversed.
Chunk c of stage s is virtual stage c x pp + s; activations leave chunk c of the last stage
for chunk c + 1 of the first (and gradients the reverse way), so the pipeline group is a
ring. The leading stage (the first going forward, the last going back) runs pp - 1 steps
ahead of the trailing one and receives what it finished pp - 1 steps before, holding it
until the chunk that needs it runs (with groups larger than pp, several steps later).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from echo_et.errors import EchoError


class Transfer(NamedTuple):
    """One send or receive of the interleaved schedule. ``peer``: -1 the previous stage, +1
    the next (around the ring); ``phase``: forward (an activation) or backward (a gradient);
    ``mb`` and ``chunk``: the micro-batch and the model chunk of this stage that produced the
    tensor (a send) or will consume it (a receive)."""

    send: bool
    peer: int
    phase: str
    mb: int
    chunk: int


# ("forward", mb, chunk) | ("backward", mb, chunk) | ("comm", transfers)
ScheduleItem = tuple


def schedule_table(microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """Megatron-Core's schedule table: virtual micro-step k's (micro-batch, model chunk) in
    forward order. The micro-batches go in groups of ``group`` (its
    ``--microbatch-group-size-per-virtual-pipeline-stage``, pp by default), each group through
    chunk 0, then chunk 1, ..., the last group taking what is left."""
    table: list[tuple[int, int]] = []
    for first in range(0, microbatches, group):
        end = min(first + group, microbatches)
        table.extend((mb, c) for c in range(chunks) for mb in range(first, end))
    return table


class VirtualSteps:
    """The virtual micro-steps of one interleaved schedule (``stages`` stages, ``chunks``
    model chunks per stage, ``microbatches`` micro-batches in groups of ``group``; 0: one
    group of ``stages`` micro-batches per chunk, Megatron's default), as Megatron-Core's
    schedule indexes them: forward step k runs ``table[k]``, backward step k the same
    micro-batch on the chunks in reverse order."""

    def __init__(self, stages: int, chunks: int, microbatches: int, group: int = 0) -> None:
        self.stages, self.chunks, self.microbatches = stages, chunks, microbatches
        self.group = group or stages
        self.table = schedule_table(microbatches, chunks, self.group)
        self.total = len(self.table)

    def chunk(self, k: int, *, forward: bool) -> int:
        """The model chunk of virtual micro-step ``k`` (taken modulo the steps, as Megatron
        does)."""
        c = self.table[k % self.total][1]
        return c if forward else self.chunks - 1 - c

    def microbatch(self, k: int) -> int:
        return self.table[k][0]

    def warmup(self, stage: int) -> int:
        """Forward micro-steps before the first backward on ``stage``: (stages - stage - 1)
        x 2 + (chunks - 1) x group, or all of them when that is as many."""
        return min((self.stages - stage - 1) * 2 + (self.chunks - 1) * self.group, self.total)

    def leading_recv(self, k: int, *, forward: bool) -> int | None:
        """What the leading stage (the first going forward, the last going back) receives
        after its step ``k``: the chunk after the one the trailing stage ran stages - 1 steps
        earlier (it runs that far behind), None before it has run any or when that was the
        model's end."""
        if k < self.stages - 1:
            return None
        c = self.chunk(k - (self.stages - 1), forward=forward)
        if c == (self.chunks - 1 if forward else 0):
            return None
        return c + 1 if forward else c - 1


@functools.lru_cache(maxsize=32)
def virtual_steps(stages: int, chunks: int, microbatches: int, group: int = 0) -> VirtualSteps:
    """One :class:`VirtualSteps` per schedule, shared by every stage and step that asks."""
    return VirtualSteps(stages, chunks, microbatches, group)


def microbatch_group_problem(stages: int, microbatches: int, group: int = 0) -> str | None:
    """What Megatron-Core's rules for the micro-batch groups (``group``, default pp) refuse,
    as what the schedule needs ("" read after "needs"), or None: groups from pp to the
    micro-batches, and a last group either whole or at least pp (else the pipeline waits
    inside it; ``forward_backward_pipelining_with_interleaving`` raises on either)."""
    g = group or stages
    if not stages <= g <= microbatches:
        return f"micro-batch groups from pp ({stages}) to the micro-batches ({microbatches}), got {g}"
    rest = microbatches % g
    if 0 < rest < stages:
        return (f"micro-batch groups that leave a last group of 0 or at least pp ({stages}); groups of {g} "
                f"leave {rest} of the {microbatches} micro-batches")
    return None


def check_interleaving(stages: int, chunks: int, microbatches: int, group: int = 0, *,
                       overlapped: bool = False) -> None:
    """Megatron-Core's rules for the interleaved schedule: more than 2 stages (more than 1
    with the transfers ``overlapped``, posted one by one: a batched exchange's two sends to the
    one neighbour of a 2-stage ring cannot be told apart) and the micro-batch groups'
    (:func:`microbatch_group_problem`)."""
    if stages < (2 if overlapped else 3):
        raise EchoError(f"the interleaved pipeline schedule needs more than {1 if overlapped else 2} stages, "
                        f"got {stages}")
    if chunks < 1 or microbatches < 1:
        raise EchoError(f"the interleaved pipeline schedule needs chunks ({chunks}) and micro-batches "
                        f"({microbatches}) >= 1")
    problem = microbatch_group_problem(stages, microbatches, group)
    if problem:
        raise EchoError(f"the interleaved pipeline schedule needs {problem}")


def interleaved_warmup(stages: int, stage: int, chunks: int, microbatches: int, group: int = 0) -> int:
    """Forward micro-steps before the first backward on ``stage``: (stages - stage - 1) x 2
    + (chunks - 1) x group, or all of them when that is as many."""
    return virtual_steps(stages, chunks, microbatches, group).warmup(stage)


def interleaved_schedule(stages: int, stage: int, chunks: int, microbatches: int,
                         group: int = 0, *, overlapped: bool = False) -> list[ScheduleItem]:
    """Stage ``stage``'s interleaved 1F1B schedule: its forward and backward micro-steps and
    its combined exchanges, in order (see the module docstring). A receive is labelled with the
    micro-batch that it carries: each chunk receives activations, and gradients, in micro-batch
    order. ``overlapped``: to be run as :func:`overlapped_plan` splits it (which admits 2
    stages)."""
    check_interleaving(stages, chunks, microbatches, group, overlapped=overlapped)
    return _InterleavedPlan(virtual_steps(stages, chunks, microbatches, group), stage).items()


class _InterleavedPlan:
    """One stage's interleaved schedule, written phase by phase: the warm-up forwards, the
    steady one-forward-one-backward steps, the cool-down backwards."""

    def __init__(self, steps: VirtualSteps, stage: int) -> None:
        self.steps = steps
        self.stages, self.s, self.chunks = steps.stages, stage, steps.chunks
        self.last_stage = steps.stages - 1
        self.total = steps.total
        self.warmup = steps.warmup(stage)
        self.steady = self.total - self.warmup
        self.all_warmup = self.warmup == self.total
        self.received: dict[tuple[str, int], int] = {}
        self.out: list[ScheduleItem] = []

    def items(self) -> list[ScheduleItem]:
        if self.s != 0:
            self.comm(recv_prev=0)
        self.warmup_steps()
        self.steady_steps()
        self.cooldown_steps()
        return self.out

    def fchunk(self, k: int) -> int:
        return self.steps.chunk(k, forward=True)

    def bchunk(self, k: int) -> int:
        return self.steps.chunk(k, forward=False)

    def mb_of(self, k: int) -> int:
        return self.steps.microbatch(k)

    def recv_prev_after(self, k: int) -> int | None:
        """The chunk whose activation this stage receives after forward step ``k``."""
        if self.s == 0:
            return self.steps.leading_recv(k, forward=True)
        return self.fchunk(k + 1)

    def recv_next_after(self, k: int) -> int | None:
        """The chunk whose gradient this stage receives after backward step ``k``."""
        if self.s == self.last_stage:
            return self.steps.leading_recv(k, forward=False)
        return self.bchunk(k + 1)

    def activation_out(self, mb: int, c: int) -> tuple[int, int] | None:
        """What a forward of chunk ``c`` sends on: all but the model's last chunk."""
        return None if (self.s == self.last_stage and c == self.chunks - 1) else (mb, c)

    def gradient_out(self, mb: int, c: int) -> tuple[int, int] | None:
        """What a backward of chunk ``c`` sends back: all but the model's first chunk."""
        return None if (self.s == 0 and c == 0) else (mb, c)

    def recv(self, phase: str, chunk: int, peer: int) -> Transfer:
        mb = self.received.get((phase, chunk), 0)
        self.received[(phase, chunk)] = mb + 1
        return Transfer(False, peer, phase, mb, chunk)

    def comm(self, send_prev: tuple[int, int] | None = None, recv_prev: int | None = None,
             send_next: tuple[int, int] | None = None, recv_next: int | None = None) -> None:
        ops = []
        if send_prev is not None:
            ops.append(Transfer(True, -1, "backward", *send_prev))
        if recv_prev is not None:
            ops.append(self.recv("forward", recv_prev, -1))
        if send_next is not None:
            ops.append(Transfer(True, 1, "forward", *send_next))
        if recv_next is not None:
            ops.append(self.recv("backward", recv_next, 1))
        if ops:
            self.out.append(("comm", tuple(ops)))

    def warmup_steps(self) -> None:
        for k in range(self.warmup):
            c, mb = self.fchunk(k), self.mb_of(k)
            self.out.append(("forward", mb, c))
            # nothing comes after the last step
            recv_prev = self.recv_prev_after(k) if k != self.total - 1 else None
            if k == self.warmup - 1 and not self.all_warmup:   # the first gradient comes with the last one
                self.comm(recv_prev=recv_prev, send_next=self.activation_out(mb, c),
                          recv_next=self.chunks - 1 if self.s != self.last_stage else None)
            else:
                self.comm(recv_prev=recv_prev, send_next=self.activation_out(mb, c))

    def steady_steps(self) -> None:
        for k in range(self.steady):
            fk = k + self.warmup
            fc, fmb = self.fchunk(fk), self.mb_of(fk)
            bc, bmb = self.bchunk(k), self.mb_of(k)
            self.out.append(("forward", fmb, fc))
            self.out.append(("backward", bmb, bc))
            recv_prev = self.recv_prev_after(fk) if k != self.steady - 1 else None
            self.comm(send_prev=self.gradient_out(bmb, bc), recv_prev=recv_prev,
                      send_next=self.activation_out(fmb, fc), recv_next=self.recv_next_after(k))

    def cooldown_steps(self) -> None:
        if self.all_warmup and self.s != self.last_stage:
            self.comm(recv_next=self.chunks - 1)
        for k in range(self.steady, self.total):
            bc, bmb = self.bchunk(k), self.mb_of(k)
            self.out.append(("backward", bmb, bc))
            recv_next = self.recv_next_after(k) if k != self.total - 1 else None
            self.comm(send_prev=self.gradient_out(bmb, bc), recv_next=recv_next)


def param_sync_chunk(step: int, stages: int, stage: int, chunks: int, microbatches: int,
                     group: int = 0) -> int | None:
    """The model chunk whose weights' all-gathers Megatron's interleaved schedule issues
    before forward virtual micro-step ``step`` of ``stage`` (None: none). With the gathers
    aligned across stages (``--align-param-gather``), virtual micro-step k + stage being the
    first micro-batch of chunk c issues chunk c + 1's, for c + 1 from 2 (chunks 0 and 1 are
    issued before the schedule) to the last: so every stage issues chunk c + 1's at the same
    time, c x group virtual micro-steps into the schedule."""
    steps = virtual_steps(stages, chunks, microbatches, group)
    k = step + stage
    if k >= steps.total or steps.microbatch(k) != 0:
        return None
    c = steps.chunk(k, forward=True) + 1
    return c if 1 < c < chunks else None


def grad_sync_chunk(step: int, stages: int, stage: int, chunks: int, microbatches: int,
                    group: int = 0) -> int | None:
    """The model chunk whose gradient collectives Megatron's interleaved schedule issues after
    backward virtual micro-step ``step`` of ``stage`` (None: none). With the reductions
    aligned across stages (``--align-grad-reduce``), a chunk's are issued once virtual
    micro-step ``step - stage`` is that chunk's last backward micro-batch: every stage issues
    them at the same time, the later stages ``stage`` steps after their own last backward of
    the chunk."""
    steps = virtual_steps(stages, chunks, microbatches, group)
    k = step - stage
    if k < 0 or k >= steps.total or steps.microbatch(k) != microbatches - 1:
        return None
    return steps.chunk(k, forward=False)


def overlapped_plan(items: list[ScheduleItem], *, first: bool, last: bool, chunks: int,
                    warmup_flush: bool = False) -> list[ScheduleItem]:
    """The interleaved schedule ``items`` of a stage (the pipeline's ``first`` and/or ``last``,
    ``chunks`` model chunks) as Megatron-Core runs it with ``overlap_p2p_comm`` (and Megatron-LM's
    ``deallocate_pipeline_outputs``), its transfers posted one by one, unbatched:

    - steady 1F1B steps: the forward's send and the next forward's receive posted right after
      the forward, ("post", transfers), its send waited for at once (("settle", "forward"):
      the output is freed after it); the backward's send and the next backward's receive
      posted right after the backward, its send waited for at the next such post;
    - warm-up and cool-down: each exchange posted and waited for at once, ("exchange",
      transfers), but the first gradient's receive, posted with the last warm-up forward's
      exchange. With ``warmup_flush`` (its ``overlap_p2p_comm_warmup_flush``) they are posted as
      in the steady steps, and a stage that is not the leading one (the first going forward,
      the last going back) posts the receive for the next step before the compute of this one,
      ("prefetch", transfers): posted, nothing waited for;
    - ("await", direction): the oldest receive of that direction posted and not waited for
      yet is waited for, before every compute of the steady steps (of the warm-up, with
      ``warmup_flush``, of the cool-down but its first step) but the model's first chunk's
      forwards and its last chunk's backwards, which receive nothing: Megatron-Core's one
      ``wait()`` per step, in posting order.

    A post's sends wait for the sends of their direction posted before (Megatron's previous
    handle), after posting."""
    out: list[ScheduleItem] = []
    first_backward = next((i for i, item in enumerate(items) if item[0] == "backward"), len(items))
    at = {"forward": 0, "backward": 0}     # compute steps of each direction so far
    before = after_forward = 0             # where the last compute went in ``out``; after its forward
    for i, item in enumerate(items):
        kind = item[0]
        if kind != "comm":
            c = item[2]
            # a steady step is a forward and the backward right after it
            if kind == "forward":
                steady = i + 1 < len(items) and items[i + 1][0] == "backward"
                waits = (steady or (warmup_flush and at[kind] > 0)) and not (first and c == 0)
            else:
                steady = items[i - 1][0] == "forward"
                waits = (steady or at[kind] > 0) and not (last and c == chunks - 1)
            if waits:
                out.append(("await", kind))
            before = len(out)
            out.append(item)
            if kind == "forward":
                after_forward = len(out)
            at[kind] += 1
            continue
        fwd = tuple(t for t in item[1] if t.phase == "forward")
        bwd = tuple(t for t in item[1] if t.phase == "backward")
        if i >= 2 and items[i - 2][0] == "forward" and items[i - 1][0] == "backward":   # a steady step
            if fwd:    # right after the forward, before the backward
                out[after_forward:after_forward] = [("post", fwd), ("settle", "forward")]
            if bwd:
                out.append(("post", bwd))
        elif i == 0 or items[i - 1][0] == "comm" or not warmup_flush:
            if i < first_backward and bwd and items[i - 1][0] == "forward":   # the first gradient's receive,
                # posted with the last warm-up exchange (with every step in the warm-up, received at once)
                out += [("exchange", fwd)] if fwd else []
                out.append(("post", bwd))
            else:      # the receives before the first step of a direction are waited for at once
                out.append(("exchange", item[1]))
        else:
            phase = items[i - 1][0]
            own = fwd if phase == "forward" else bwd
            leading = first if phase == "forward" else last
            ahead = () if leading else tuple(t for t in own if not t.send)
            now = tuple(t for t in own if t not in ahead)
            if ahead:
                out.insert(before, ("prefetch", ahead))
            if now:
                out.append(("post", now))
                if phase == "forward" and any(t.send for t in now):
                    out.append(("settle", "forward"))
            if phase == "forward" and bwd:          # the first gradient's receive
                out.append(("post", bwd))
    return out


def overlapped_schedule(stages: int, stage: int, chunks: int, microbatches: int, group: int = 0, *,
                        warmup_flush: bool = False) -> list[ScheduleItem]:
    """Stage ``stage``'s interleaved schedule as :func:`overlapped_plan` runs it."""
    return overlapped_plan(interleaved_schedule(stages, stage, chunks, microbatches, group, overlapped=True),
                           first=stage == 0, last=stage == stages - 1, chunks=chunks,
                           warmup_flush=warmup_flush)
