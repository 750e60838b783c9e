"""Data-parallel gradient synchronisation with buckets, overlapped with the last backward.

Gradients live in flat per-bucket buffers (each ``param.grad`` is a view into one), so
micro-batches accumulate in place and a bucket is reduced without a copy. During the last
micro-batch's backward, a post-accumulate-grad hook counts the parameters of each bucket;
the bucket's collective is issued asynchronously as soon as its last gradient lands, like
DDP and Megatron-LM's overlapped grad reduce (Megatron-Core's arms each model chunk's buckets at that
chunk's last backward, ``arm(chunk)``, with a cap per chunk: ``bucket_bytes`` a list):

- ZeRO stage 0: all-reduce of the bucket; every rank then updates all parameters.
- ZeRO stage 1: reduce-scatter of the bucket into this rank's shard, an optimizer over the
  shard only, then an all-gather of the updated parameters into the bucket (with Megatron's
  optimizer, its ``--use-distributed-optimizer``). With ``reduce_scatter=False`` the bucket is
  all-reduced whole and the rank keeps its shard of it, twice the bytes on the wire: DeepSpeed's
  ZeRO with ``"reduce_scatter": false`` and its bfloat16 optimizer (``BF16_Optimizer``, which
  all-reduces the fp32 gradients before each rank updates its partition).

Buckets are filled in reverse parameter order (close to the order gradients become ready)
and padded to a multiple of the data-parallel size so that every shard is equal.

With ``overlap=False`` (Megatron-DeepSpeed's local DDP, vTrain's "bucketing off") the
gradients live in one flat buffer and are reduced after the backward pass: the buffer is
divided by the data-parallel size and all-reduced at once, before the optimizer. With
``buffers`` (the model chunks of the interleaved schedule, each its own DDP module in
Megatron) each group of parameters has its own buffer, reduced in the groups' order.

With ``grad_dtype`` wider than the parameters' (Megatron's
``--accumulate-allreduce-grads-in-fp32``, forced on with bf16), the buffers hold that dtype
and each parameter gets a ``main_grad`` view into them instead of a ``grad``: after every
micro-batch's backward a hook adds the parameter's 16-bit gradient into its ``main_grad``
and drops it, as Megatron's local DDP does, so the data-parallel reduction moves fp32
bytes. :func:`grad_of` is where a reader finds a parameter's accumulated gradient.

With ``gather_in_forward`` (ZeRO stage 1 only; Megatron-Core's ``--overlap-param-gather``) the
updated parameters are not all-gathered after the optimizer: the next step gathers them
while its forward runs. :meth:`GradientSync.start_step` (Megatron's ``zero_grad``) issues the
all-gather of the bucket the forward uses first; a forward pre-hook on each module that owns
parameters waits for its buckets' all-gathers the first time it runs in the step and issues
the next bucket's, so one all-gather is in flight ahead of the layers that need it (Megatron
keeps one in flight too, so that its all-gathers do not block the compute kernels queued
behind them on one device connection).

With ``alone`` (Megatron-Core's shared word embedding under its distributed optimizer, on the
first and the last pipeline stage) each of those parameters gets a bucket of its own, whatever
the cap, so that both stages shard its gradient alike: Megatron-Core's
``_does_param_require_new_bucket``. Overlapped buckets only.

With ``align_reduce`` (Megatron-Core's overlapped sync with Megatron-LM's default
``--align-grad-reduce``, on the pipeline stages after the first, and on every stage under the
interleaved schedule) no bucket is issued by the gradient hooks: the interleaved schedule
issues all of one model chunk's collectives at once (:meth:`GradientSync.reduce_chunk`,
Megatron's ``start_grad_sync``) at points aligned across the pipeline stages, and
:meth:`GradientSync.finish_and_step` issues the chunks it has not (with the plain schedule, all
of them, after it).

With ``align_gather`` too (Megatron-LM's default with the interleaved schedule,
``--align-param-gather``), nothing is issued at the step's start nor by the pre-hooks: the
schedule issues all of one model chunk's all-gathers at once (:meth:`GradientSync.gather_chunk`,
Megatron's ``start_param_sync``), at points aligned across the pipeline stages, and a pre-hook
only waits for its buckets (issuing one the schedule has not, as Megatron's does). Not aligned,
with several model chunks (``--no-align-param-gather``), each chunk's buckets are a chain of
their own: nothing is issued at the step's start, the chunk's first forward issues its first
all-gather and waits for it, and each wait issues the chunk's next (Megatron-Core links the
bucket groups of one DDP module only).

With ``flatten`` (DeepSpeed's engine without ZeRO: ``buffered_allreduce_fallback``) the
gradients are not reduced in place: each run of parameters holding more than
:data:`DEEPSPEED_BUCKET_ELEMENTS` is concatenated into a new flat tensor, all-reduced,
averaged after the reduction, and copied back parameter by parameter.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from echo_et.workloads.markers import comm_span

# torch 2.13 renamed the tensor forms; older releases only have the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

#: DeepSpeed's ``MEMORY_OPT_ALLREDUCE_SIZE``: a flattened bucket closes past this many elements
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000


def all_reduce_flattened(tensors: list[torch.Tensor], group, *, scale: float | None = None) -> None:
    """Reduce ``tensors`` over ``group`` in one call, the way Megatron and DeepSpeed reduce
    loose gradients: concatenated into a new flat tensor (``torch.cat``), all-reduced, scaled
    when asked, and copied back tensor by tensor."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    with comm_span(group):
        dist.all_reduce(flat, group=group)
    if scale is not None:
        flat.mul_(scale)
    offset = 0
    for t in tensors:
        t.copy_(flat.narrow(0, offset, t.numel()).view_as(t))
        offset += t.numel()


def grad_of(p: torch.Tensor) -> torch.Tensor | None:
    """The gradient a parameter accumulated: its ``main_grad`` when it has one, else ``grad``."""
    main = getattr(p, "main_grad", None)
    return p.grad if main is None else main


class _Bucket:
    def __init__(self, params: list[nn.Parameter], dp: int, device, dtype):
        self.params = params
        numel = sum(p.numel() for p in params)
        self.padded = -(-numel // dp) * dp
        self.grad = torch.zeros(self.padded, device=device, dtype=dtype)
        self.pending = len(params)
        self.armed = False        # its gradients of this backward are the step's last
        self.chunk = 0            # the buffer (model chunk) it belongs to
        self.work = None
        self.reduced = False      # its collective of this step is issued
        self.gather = None        # the all-gather of the updated parameters, in flight
        self.gathered = True      # this step's forward has them


def _fill(params, bucket_bytes: int, alone: frozenset[int] = frozenset()) -> list[list[nn.Parameter]]:
    """``params`` in order, cut into buckets of at least ``bucket_bytes`` (the last smaller);
    a parameter whose id is in ``alone`` closes the bucket before it and gets one of its own."""
    groups: list[list[nn.Parameter]] = []
    current: list[nn.Parameter] = []
    size = 0
    for p in params:
        if id(p) in alone:
            if current:
                groups.append(current)
            groups.append([p])
            current, size = [], 0
            continue
        current.append(p)
        size += p.numel() * p.element_size()
        if size >= bucket_bytes:
            groups.append(current)
            current, size = [], 0
    if current:
        groups.append(current)
    return groups


class GradientSync:
    """Bucketed gradient reduction over ``group`` for ``params`` (see the module docstring)."""

    def __init__(self, params: list[nn.Parameter], group, *, zero: int, bucket_bytes: int | list[int],
                 optimizer_factory, overlap: bool = True, grad_dtype: torch.dtype | None = None,
                 buffers: list[list[nn.Parameter]] | None = None, flatten: bool = False,
                 reduce_scatter: bool = True, gather_in_forward: list[nn.Module] | None = None,
                 align_gather: bool = False, align_reduce: bool = False,
                 alone: list[nn.Parameter] | None = None, gather_with_step: bool = False,
                 average_over: int | None = None):
        """``average_over``: the ranks the reduced gradients are averaged over (the group's
        size by default; Megatron-Core averages the expert parameters' over the dense
        data-parallel ranks, whose tokens their gradients sum)."""
        self.group = group
        self.reduce_scatter = reduce_scatter
        self.flatten = flatten and not zero
        self.dp = dist.get_world_size(group)
        self.divisor = average_over or self.dp
        self.rank = dist.get_rank(group)
        self.zero = zero
        self.overlap = overlap
        params = [p for p in params if p.requires_grad]
        if not overlap:
            bucket_bytes = sum(p.numel() * p.element_size() for p in params) + 1
        device, dtype = params[0].device, params[0].dtype
        # gradients accumulated apart from the parameters (``main_grad``), in a wider dtype
        self.separate = grad_dtype is not None and grad_dtype != dtype
        grad_dtype = grad_dtype or dtype
        caps = bucket_bytes if isinstance(bucket_bytes, list) else [bucket_bytes] * len(buffers or [params])
        single = frozenset(id(p) for p in alone or ()) if overlap else frozenset()
        chunks: list[int] = []       # the buffer (model chunk) of each bucket
        if buffers is not None:
            # one flat buffer per group, reduced in the groups' order (Megatron's local DDP
            # per model chunk of the interleaved schedule); overlapped, each group's own buckets
            mine = {id(p) for p in params}
            groups = []
            for c, g in enumerate(buffers):
                own = [p for p in reversed(g) if id(p) in mine]
                cut = _fill(own, caps[c], single) if overlap else [own]
                groups += cut
                chunks += [c] * len(cut)
        else:
            groups = _fill(reversed(params), caps[0], single)
            chunks = [0] * len(groups)
        self.buckets = [_Bucket(g, self.dp, device, grad_dtype) for g in groups]
        for b, c in zip(self.buckets, chunks, strict=True):
            b.chunk = c
        self._bucket_of: dict[int, _Bucket] = {}
        for b in self.buckets:
            offset = 0
            if zero:
                b.param_flat = torch.zeros(b.padded, device=device, dtype=dtype)
            for p in b.params:
                n = p.numel()
                view = b.grad[offset:offset + n].view_as(p)
                if self.separate:
                    p.main_grad = view
                else:
                    p.grad = view
                if zero:
                    b.param_flat[offset:offset + n].copy_(p.detach().reshape(-1))
                    p.data = b.param_flat[offset:offset + n].view_as(p)
                offset += n
                self._bucket_of[id(p)] = b
                p.register_post_accumulate_grad_hook(self._on_grad)
        if zero:
            shard = [self._shard_param(b) for b in self.buckets]
            self.optimizer = optimizer_factory(shard)
        else:
            self.optimizer = optimizer_factory(params)
        # the buckets in the order the forward uses them (the gradients fill them in reverse)
        self._gather_order: list[_Bucket] = []
        # not aligned: each model chunk's buckets a chain of their own, in that order, and how
        # many of each chain are issued (Megatron-Core links a DDP module's bucket groups only)
        self._chains: dict[int, list[_Bucket]] = {}
        self._issued: dict[int, int] = {}
        self.align_gather = align_gather
        self.align_reduce = align_reduce and overlap
        self.gather_with_step = gather_with_step
        if gather_in_forward is not None and zero and self.dp > 1:
            self._gather_order = list(reversed(self.buckets))
            for b in self._gather_order:
                self._chains.setdefault(b.chunk, []).append(b)
            for module in (m for root in gather_in_forward for m in root.modules()):
                own = [self._bucket_of[id(p)] for p in module.parameters(recurse=False) if id(p) in self._bucket_of]
                if own:
                    module.register_forward_pre_hook(self._pre_forward(own))

    def _shard_param(self, b: _Bucket) -> nn.Parameter:
        k = b.padded // self.dp
        p = nn.Parameter(b.param_flat[self.rank * k:(self.rank + 1) * k])
        b.grad_shard = torch.zeros(k, device=b.grad.device, dtype=b.grad.dtype)
        if self.separate:
            p.main_grad = b.grad_shard
        else:
            p.grad = b.grad_shard
        return p

    def _on_grad(self, p: torch.Tensor) -> None:
        if self.separate:
            if getattr(p, "grad_added_to_main_grad", False):   # fused into its weight-gradient GEMM
                p.grad_added_to_main_grad = False
            else:
                p.main_grad.add_(p.grad)
            p.grad = None
        if not self.overlap:
            return
        b = self._bucket_of[id(p)]
        if not b.armed:
            return
        b.pending -= 1
        if b.pending == 0:
            self._reduce(b)

    def _reduce(self, b: _Bucket) -> None:
        """Issue bucket ``b``'s collective (asynchronous; nothing to do with one rank)."""
        if self.dp > 1:
            with comm_span(self.group):
                if self.zero and self.reduce_scatter:
                    b.work = _reduce_scatter(b.grad_shard, b.grad, group=self.group, async_op=True)
                else:
                    b.work = dist.all_reduce(b.grad, group=self.group, async_op=True)
        b.reduced = True

    def reduce_chunk(self, chunk: int) -> None:
        """Issue every collective of model chunk ``chunk``'s buckets not yet issued, in the
        order the backward fills them (Megatron's ``start_grad_sync`` of one chunk)."""
        for b in self.buckets:
            if b.chunk == chunk and not b.reduced:
                self._reduce(b)

    def arm(self, chunk: int | None = None) -> None:
        """Issue each bucket's collective (of model chunk ``chunk``'s buffer; None: all) as its
        gradients complete in the next backward."""
        for b in self.buckets:
            if chunk is None or b.chunk == chunk:
                b.armed, b.pending = True, len(b.params)

    def finish_and_step(self, before_step=None, step: bool = True) -> None:
        """Wait for the gradient collectives, average, update, and (ZeRO-1) gather.
        ``before_step()`` runs between the reduction and the optimizer (Megatron all-reduces
        the shared embedding's gradient there). ``step`` False: stop before the optimizer
        (:meth:`step` runs it: :class:`ChainedSync`)."""
        if self.align_reduce:     # Megatron's "launch any remaining grad reductions", chunk order
            for c in sorted({b.chunk for b in self.buckets}):
                self.reduce_chunk(c)
        for b in self.buckets:
            b.armed, b.reduced = False, False
        if not self.overlap and self.dp > 1:
            if self.zero and before_step is not None:
                # Megatron's distributed optimizer reduces the embedding's gradient before
                # scattering the buffer (its shard must hold the other stage's share)
                before_step()
                before_step = None
            for b in self.buckets:
                if self.flatten:
                    self._flattened_all_reduce(b.params)
                    continue
                target = b.grad_shard if self.zero else b.grad
                b.grad.div_(self.divisor)
                with comm_span(self.group):
                    if self.zero and self.reduce_scatter:
                        _reduce_scatter(target, b.grad, group=self.group)
                    else:
                        dist.all_reduce(b.grad, group=self.group)
                if self.zero and not self.reduce_scatter:
                    self._keep_shard(b)
            if before_step is not None:
                before_step()
            if step:
                self.step()
            return
        for b in self.buckets:
            if b.work is not None:
                with comm_span(self.group):
                    b.work.wait()
                b.work = None
            if self.zero:
                if self.dp == 1:
                    b.grad_shard.copy_(b.grad)
                    if self.divisor > 1:
                        b.grad_shard.div_(self.divisor)
                elif self.reduce_scatter:
                    b.grad_shard.div_(self.divisor)
                else:
                    b.grad.div_(self.divisor)
                    self._keep_shard(b)
            elif self.divisor > 1:
                b.grad.div_(self.divisor)
        if before_step is not None:
            before_step()
        if step:
            self.step()

    def _keep_shard(self, b: _Bucket) -> None:
        """This rank's shard of an all-reduced bucket, for the optimizer over the shard."""
        k = b.padded // self.dp
        b.grad_shard.copy_(b.grad[self.rank * k:(self.rank + 1) * k])

    def _step_then_gather_first_chunk(self) -> None:
        """Megatron-Core's ``--overlap-param-gather-with-optimizer-step``: the first model
        chunk's shards are updated first (its own optimizer in Megatron's chain), its all-gathers
        issued then, while the other chunks' shards are updated, and waited for at the step's
        end (the next step's first forward, in a run of many steps, waits for them there)."""
        first = [b for b in self.buckets if b.chunk == 0]
        assert self.buckets[:len(first)] == first      # the optimizer's shards are in bucket order

        def gather() -> None:
            for b in reversed(first):                 # in the order the forward uses them
                b.gathered = False
                self._dispatch(b)

        self.optimizer.step(first=len(first), between=gather)
        for b in first:
            with comm_span(self.group):
                b.gather.wait()
            b.gather, b.gathered = None, True

    def _flattened_all_reduce(self, params: list[nn.Parameter]) -> None:
        """DeepSpeed's ``allreduce_no_retain``: buckets closed past
        :data:`DEEPSPEED_BUCKET_ELEMENTS`, each flattened, all-reduced, averaged, copied back."""
        bucket: list[torch.Tensor] = []
        numel = 0
        for p in params:
            g = grad_of(p)
            bucket.append(g)
            numel += g.numel()
            if numel > DEEPSPEED_BUCKET_ELEMENTS or p is params[-1]:
                all_reduce_flattened(bucket, self.group, scale=1.0 / self.divisor)
                bucket, numel = [], 0

    def start_step(self) -> None:
        """The step's start (Megatron's ``zero_grad``): with the gather in the forward and one
        model chunk, issue the all-gather of the bucket the forward uses first (aligned: none,
        the schedule issues them; several chunks not aligned: none, each chunk's first forward
        issues its first, as Megatron-Core's pre-hook does)."""
        if not self._gather_order:
            return
        for b in self.buckets:
            # with the optimizer step: the first chunk's were gathered at the step's end
            b.gathered = self.gather_with_step and b.chunk == 0
        self._issued = dict.fromkeys(self._chains, 0)
        if not self.align_gather and len(self._chains) == 1:
            self._issue_gather(self._gather_order[0].chunk)

    def gather_chunk(self, chunk: int) -> None:
        """Issue every all-gather of model chunk ``chunk``'s buckets not yet issued, in the
        order its forward uses them (Megatron's ``start_param_sync`` of one chunk)."""
        for b in self._gather_order:
            if b.chunk == chunk and not b.gathered and b.gather is None:
                self._dispatch(b)

    def _issue_gather(self, chunk: int) -> None:
        """Issue the next all-gather of model chunk ``chunk``'s chain not yet issued."""
        chain = self._chains[chunk]
        while self._issued[chunk] < len(chain):
            b = chain[self._issued[chunk]]
            self._issued[chunk] += 1
            if not b.gathered and b.gather is None:
                self._dispatch(b)
                return

    def _dispatch(self, b: _Bucket) -> None:
        k = b.padded // self.dp
        with comm_span(self.group):
            b.gather = _all_gather(b.param_flat, b.param_flat[self.rank * k:(self.rank + 1) * k],
                                   group=self.group, async_op=True)

    def _pre_forward(self, buckets: list[_Bucket]):
        def hook(module, args) -> None:
            for b in buckets:
                if b.gathered:
                    continue
                if b.gather is None:
                    if self.align_gather:
                        self._dispatch(b)      # one the schedule has not issued: issued now
                    while b.gather is None and self._issued[b.chunk] < len(self._chains[b.chunk]):
                        self._issue_gather(b.chunk)   # its chain's first, or one used out of order: now
                if b.gather is not None:
                    with comm_span(self.group):
                        b.gather.wait()
                b.gather, b.gathered = None, True
                if not self.align_gather:
                    self._issue_gather(b.chunk)   # the chain's next, while these layers run
        return hook

    def step(self) -> None:
        """The optimizer, then (ZeRO-1, gathers not in the forward) the weights' all-gathers."""
        if self.gather_with_step and self._gather_order:
            self._step_then_gather_first_chunk()
        else:
            self.optimizer.step()
        if self.zero and self.dp > 1 and not self._gather_order:
            for b in self.buckets:
                k = b.padded // self.dp
                shard = b.param_flat[self.rank * k:(self.rank + 1) * k]
                with comm_span(self.group):
                    _all_gather(b.param_flat, shard, group=self.group)
        for b in self.buckets:
            b.grad.zero_()


class ChainedSync:
    """Megatron-Core's data-parallel reduction of a model with experts: the dense and the expert
    parameters in buffers of their own, each reduced over its group (the expert ones over the
    ranks holding the same experts), then its ``ChainedOptimizer``: each part's optimizer (its
    own gradient norm) in turn. The first sync's settings (overlap, alignment) are the
    schedule's."""

    def __init__(self, syncs: list[GradientSync]):
        self.syncs = syncs
        self.overlap = syncs[0].overlap
        self.align_reduce = syncs[0].align_reduce
        self.align_gather = syncs[0].align_gather

    def arm(self, chunk: int | None = None) -> None:
        for s in self.syncs:
            s.arm(chunk)

    def reduce_chunk(self, chunk: int) -> None:
        for s in self.syncs:
            s.reduce_chunk(chunk)

    def start_step(self) -> None:
        for s in self.syncs:
            s.start_step()

    def gather_chunk(self, chunk: int) -> None:
        for s in self.syncs:
            s.gather_chunk(chunk)

    def finish_and_step(self, before_step=None) -> None:
        for i, s in enumerate(self.syncs):
            s.finish_and_step(before_step if i == 0 else None, step=False)
        for s in self.syncs:
            s.step()
