"""Megatron-Core's context parallelism (``--context-parallel-size``): every rank of a
context-parallel group holds 1/cp of each sequence, and attention exchanges the keys and
values between them as Transformer Engine does for Megatron-Core's ``--cp-comm-type``:
"p2p" (its default, :class:`RingAttention`: ``AttnFuncWithCPAndKVP2P``, described below),
"allgather" (:class:`AllGatherAttention`: ``AttnFuncWithCPAndKVAllGather``) and "a2a"
(:class:`A2AAttention`: ``AttnFuncWithCPAndQKVOA2A``, DeepSpeed's Ulysses).

- The split (Megatron's ``get_batch_on_this_cp_rank``): each sequence is cut into 2 cp chunks
  and rank r keeps chunks r and 2 cp - 1 - r, so that every rank does the same share of the
  causal attention (:func:`split_sequence`).
- Forward: cp steps. Step 0 is causal attention of the rank's queries over its own keys (its
  two chunks in position order: a plain causal mask). Before step i computes, the keys and
  values it holds (one packed tensor) are sent to rank r + 1 and the next ones received from
  rank r - 1, so the exchange runs under the compute. Step i > 0 holds those of rank
  src = (r - i) mod cp: with src < r its first chunk is before both of the rank's chunks and
  its second after them (all queries over the first half of the keys); with src > r both
  are before the rank's second chunk and after its first (the second half of the queries
  over all the keys). Every step after the first is half a block, on every rank: the load is
  even. The per-step outputs are merged with their log-sum-exps (TE's output correction).
- Backward: the ring the other way (keys and values sent to rank r - 1, received from
  r + 1), each step's key/value gradient travelling with the keys and values it belongs to
  and summed on the way, then one last exchange that brings each rank its own; each block's
  backward uses the merged output and log-sum-exp (flash attention's backward).

On the meta device and on CUDA each block is one flash-attention kernel (what the compute
model prices and what TE runs); on a CPU (in-situ runs with gloo, the tests) the same blocks
are computed in float32 with plain operators (attention dropout's mask kept for the backward).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from echo_et.errors import EchoError
from echo_et.workloads.markers import comm_span

_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def split_sequence(t: torch.Tensor, dim: int, cp: int, rank: int) -> torch.Tensor:
    """``t``'s chunks ``rank`` and ``2 cp - 1 - rank`` of 2 cp along ``dim``, in that order
    (Megatron's ``get_batch_on_this_cp_rank``: the index made on the host and copied to the
    device, one ``index_select``)."""
    if cp == 1:
        return t
    shape = t.shape
    if shape[dim] % (2 * cp):
        raise EchoError(f"a sequence of {shape[dim]} does not split into 2 x {cp} equal chunks")
    v = t.view(*shape[:dim], 2 * cp, shape[dim] // (2 * cp), *shape[dim + 1:])
    index = torch.tensor([rank, 2 * cp - 1 - rank], dtype=torch.int64).to(t.device)
    return v.index_select(dim, index).view(*shape[:dim], shape[dim] // cp, *shape[dim + 1:])


def _uses_flash(q: torch.Tensor) -> bool:
    return q.device.type == "meta" or (q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16))


def _grouped(k: torch.Tensor, heads: int) -> torch.Tensor:
    """Keys or values with each key/value head repeated for its group of query heads."""
    return k if k.shape[1] == heads else k.repeat_interleave(heads // k.shape[1], dim=1)


def _ungrouped(g: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """The gradient of :func:`_grouped`'s output summed back onto the key/value heads."""
    b, h, s, d = g.shape
    return g if h == kv_heads else g.view(b, kv_heads, h // kv_heads, s, d).sum(2)


def _scores(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    s = torch.matmul(q.float(), _grouped(k, q.shape[1]).float().transpose(-1, -2)) * scale
    if causal:     # aligned at the bottom right: the last query sees every key (flash attention's)
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1 + sk - sq), float("-inf"))
    return s


class _Block:
    """One block of the ring: attention of ``q`` over ``k``, ``v`` ([b, heads, s, d]), causal
    on the diagonal block only."""

    def __init__(self, dropout: float, scale: float):
        self.p = dropout
        self.scale = scale
        self.state: list = []     # per forward block: what its flash backward needs

    def forward(self, q, k, v, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(output, log-sum-exp [b, heads, sq] float32)."""
        if _uses_flash(q):
            heads = q.shape[1]
            kk, vv = (k, v) if q.device.type == "meta" else (_grouped(k, heads), _grouped(v, heads))
            out, lse, cq, ck, mq, mk, seed, off, _ = torch.ops.aten._scaled_dot_product_flash_attention(
                q, kk, vv, self.p, causal, scale=self.scale)
            self.state.append((cq, ck, mq, mk, seed, off))
            return out, lse
        s = _scores(q, k, causal, self.scale)
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - lse.unsqueeze(-1))
        keep = None     # attention dropout's scaled mask, kept for the backward
        if self.p > 0:
            keep = torch.bernoulli(torch.full_like(p, 1.0 - self.p)) / (1.0 - self.p)
            p = p * keep
        out = torch.matmul(p, _grouped(v, q.shape[1]).float())
        self.state.append(keep)
        return out.to(q.dtype), lse

    def backward(self, step: int, dout, q, k, v, out, lse, causal: bool):
        """(dq, dk, dv) of forward block ``step`` given the merged ``out`` and ``lse``."""
        if _uses_flash(q):
            heads, kv_heads = q.shape[1], k.shape[1]
            grouped = q.device.type != "meta" and heads != kv_heads
            kk, vv = (_grouped(k, heads), _grouped(v, heads)) if grouped else (k, v)
            cq, ck, mq, mk, seed, off = self.state[step]
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
                dout, q, kk, vv, out, lse, cq, ck, mq, mk, self.p, causal, seed, off, scale=self.scale)
            return (dq, _ungrouped(dk, kv_heads), _ungrouped(dv, kv_heads)) if grouped else (dq, dk, dv)
        s = _scores(q, k, causal, self.scale)
        p = torch.exp(s - lse.unsqueeze(-1))
        keep = self.state[step]
        do, o = dout.float(), out.float()
        vv = _grouped(v, q.shape[1]).float()
        dp = torch.matmul(do, vv.transpose(-1, -2))
        if keep is not None:
            dp = dp * keep
        ds = p * (dp - (do * o).sum(-1, keepdim=True))
        dq = torch.matmul(ds, _grouped(k, q.shape[1]).float()) * self.scale
        dk = torch.matmul(ds.transpose(-1, -2), q.float()) * self.scale
        dv = torch.matmul((p if keep is None else p * keep).transpose(-1, -2), do)
        kv_heads = k.shape[1]
        return dq.to(q.dtype), _ungrouped(dk, kv_heads).to(k.dtype), _ungrouped(dv, kv_heads).to(v.dtype)


def _exchange(send: torch.Tensor, to: int, recv_from: int, group) -> tuple[torch.Tensor, list]:
    """Post a send of ``send`` to group rank ``to`` and a receive of a tensor like it from
    ``recv_from``; returns the receive buffer and the two requests."""
    buf = torch.empty_like(send)
    with comm_span(group):
        works = [dist.isend(send, dist.get_global_rank(group, to), group=group),
                 dist.irecv(buf, dist.get_global_rank(group, recv_from), group=group)]
    return buf, works


def _wait(works: list, group) -> None:
    for w in works:
        with comm_span(group):
            w.wait()


def _kind(step: int, src: int, rank: int) -> str:
    """Which block step ``step`` computes with the keys of rank ``src``: "diagonal" (causal,
    all over all), "kv-half" (all queries, the first half of the keys), "q-half" (the second
    half of the queries, all the keys)."""
    if step == 0:
        return "diagonal"
    return "kv-half" if src < rank else "q-half"


def _rows(kind: str, q: torch.Tensor) -> slice:
    """The query rows a block of ``kind`` computes: the second half for "q-half", else all."""
    return slice(q.shape[2] // 2, None) if kind == "q-half" else slice(None)


def _operands(kind: str, q, k, v):
    c = q.shape[2] // 2
    if kind == "kv-half":
        return q, k[:, :, :c], v[:, :, :c]
    if kind == "q-half":
        return q[:, :, c:], k, v
    return q, k, v


class RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries ([b, heads, s / cp, d]) over the whole
    sequence's keys and values, which the context-parallel ``group``'s ranks hold in
    load-balanced chunks (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, group, dropout: float, scale: float):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        block = _Block(dropout, scale)
        kv = torch.stack((k, v))                       # TE's packed key/value buffer
        nxt, prev = (rank + 1) % cp, (rank - 1) % cp
        lse = None
        pieces = []
        for step in range(cp):
            works: list = []
            if step + 1 < cp:
                recv, works = _exchange(kv, nxt, prev, group)
            src = (rank - step) % cp
            kind = _kind(step, src, rank)
            qq, kk, vv = _operands(kind, q, kv[0], kv[1])
            o, s = block.forward(qq, kk, vv, kind == "diagonal")
            pieces.append((kind, o, s))
            if lse is None:
                lse = s.clone()
            elif kind == "q-half":
                half = lse[:, :, _rows(kind, q)]
                half.copy_(torch.logaddexp(half, s))
            else:
                lse = torch.logaddexp(lse, s)
            if works:
                _wait(works, group)
                kv = recv
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        for kind, o, s in pieces:       # TE's output correction, one step at a time
            rows = _rows(kind, q)
            out[:, :, rows].add_(o.float() * torch.exp(s - lse[:, :, rows]).unsqueeze(-1))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.block = group, block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, block = ctx.group, ctx.block
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        nxt, prev = (rank + 1) % cp, (rank - 1) % cp
        dout = dout.contiguous()
        kv = torch.stack((k, v))
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dkv = None       # the key/value gradient of the keys held, as far as it has come
        c = q.shape[2] // 2
        for step in range(cp):
            # posted before the block computes: the keys for the next step (but at the last),
            # with the gradient of the keys held last step (but at the first)
            payload = (kv if dkv is None else torch.cat((kv, dkv))) if step + 1 < cp else dkv
            works: list = []
            if payload is not None:
                recv, works = _exchange(payload, prev, nxt, group)
            src = (rank + step) % cp
            kind = _kind(step, src, rank)
            qq, kk, vv = _operands(kind, q, kv[0], kv[1])
            rows = _rows(kind, q)
            forward_step = (rank - src) % cp      # the forward step that computed this block
            gq, gk, gv = block.backward(forward_step, dout[:, :, rows], qq, kk, vv, out[:, :, rows],
                                        lse[:, :, rows].contiguous(), kind == "diagonal")
            dq[:, :, rows].add_(gq.float())
            if kind == "kv-half":
                mine = torch.zeros_like(kv)
                mine[0, :, :, :c].copy_(gk)
                mine[1, :, :, :c].copy_(gv)
            else:
                mine = torch.stack((gk, gv))
            before = None         # what the ranks before this one added to the held keys' gradient
            if works:
                _wait(works, group)
                if step + 1 < cp:
                    kv, before = (recv, None) if dkv is None else (recv[:2], recv[2:])
                else:
                    before = recv
            dkv = mine if before is None else mine + before
        # the last block's gradient, carried to the rank the keys belong to
        if cp > 1:
            own, works = _exchange(dkv, prev, nxt, group)
            _wait(works, group)
            dkv = own
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, dropout: float,
                               scale: float, comm_type: str = "p2p") -> torch.Tensor:
    """Causal attention of this CP rank's chunks (``q``, ``k``, ``v``: [b, heads, s / cp, d])
    over the whole sequence, its keys and values exchanged as ``comm_type`` says (Megatron-Core's
    --cp-comm-type: "p2p", the ring; "allgather"; "a2a", Ulysses)."""
    fn = {"p2p": RingAttention, "allgather": AllGatherAttention, "a2a": A2AAttention}[comm_type]
    return fn.apply(q, k, v, group, dropout, scale)


def _chunk_order(cp: int) -> list[int]:
    """The sequence's 2 cp chunks in the order the CP ranks hold them, rank after rank (each
    rank's chunks r and 2 cp - 1 - r): what a gather along the ranks puts side by side."""
    return [j for r in range(cp) for j in (r, 2 * cp - 1 - r)]


def _to_sequence_order(t: torch.Tensor, dim: int, cp: int) -> torch.Tensor:
    """``t``, whose ``dim`` holds the 2 cp chunks in :func:`_chunk_order`, with them in
    sequence order (one ``index_select``, TE's reorder)."""
    order = _chunk_order(cp)
    index = torch.tensor([order.index(j) for j in range(2 * cp)], dtype=torch.int64).to(t.device)
    return t.index_select(dim, index)


def _to_rank_order(t: torch.Tensor, dim: int, cp: int) -> torch.Tensor:
    """The inverse of :func:`_to_sequence_order`."""
    index = torch.tensor(_chunk_order(cp), dtype=torch.int64).to(t.device)
    return t.index_select(dim, index)


def _gather_kv(k: torch.Tensor, v: torch.Tensor, group) -> torch.Tensor:
    """Every CP rank's keys and values, [2, b, heads, s, d] in sequence order: one
    all-gather of the packed local ones, then the reorder."""
    cp = dist.get_world_size(group)
    kv = torch.stack((k, v))                           # [2, b, h, s_l, d]
    two, b, h, s_l, d = kv.shape
    gathered = torch.empty((cp * kv.numel(),), dtype=kv.dtype, device=kv.device)
    with comm_span(group):
        _all_gather(gathered, kv.reshape(-1), group=group)
    c = s_l // 2
    chunks = gathered.view(cp, two, b, h, 2, c, d).permute(1, 2, 3, 0, 4, 5, 6).reshape(two, b, h, 2 * cp, c, d)
    return _to_sequence_order(chunks, 3, cp).reshape(two, b, h, cp * s_l, d)


def _prefix_chunks(q: torch.Tensor, cp: int, rank: int) -> tuple[int, int]:
    """The last chunk of the keys each of the rank's two query chunks attends to: its own
    chunks, r and 2 cp - 1 - r. On the meta device every rank takes the middle rank's, cp - 1
    and cp (the same FLOPs and bytes: the two blocks always cover 2 cp + 1 chunks of keys
    between them), so that the CP ranks trace one graph and are simulated as one class; the
    values a real device computes need the rank's own."""
    if q.device.type == "meta":
        return cp - 1, cp
    return rank, 2 * cp - 1 - rank


class AllGatherAttention(torch.autograd.Function):
    """Megatron-Core's ``--cp-comm-type allgather`` (TE's ``AttnFuncWithCPAndKVAllGather``,
    what Llama 3's long-context training describes): the keys and values of every CP rank
    all-gathered, then each of the rank's two query chunks attends, causally, to the keys up to
    its own chunk. The backward gathers them again (not kept) and reduce-scatters their
    gradient."""

    @staticmethod
    def forward(ctx, q, k, v, group, dropout: float, scale: float):
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        block = _Block(dropout, scale)
        kv = _gather_kv(k, v, group)
        c = q.shape[2] // 2
        outs, lses = [], []
        for i, j in enumerate(_prefix_chunks(q, cp, rank)):
            o, s = block.forward(q[:, :, i * c:(i + 1) * c], kv[0, :, :, :(j + 1) * c], kv[1, :, :, :(j + 1) * c], True)
            outs.append(o)
            lses.append(s)
        out = torch.cat(outs, dim=2)
        ctx.save_for_backward(q, k, v, out, *lses)
        ctx.group, ctx.block = group, block
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, *lses = ctx.saved_tensors
        group, block = ctx.group, ctx.block
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        kv = _gather_kv(k, v, group)
        dout = dout.contiguous()
        c = q.shape[2] // 2
        dq = torch.empty_like(q)
        dkv = torch.zeros_like(kv)
        for i, j in enumerate(_prefix_chunks(q, cp, rank)):
            rows, keys = slice(i * c, (i + 1) * c), slice(None, (j + 1) * c)
            gq, gk, gv = block.backward(i, dout[:, :, rows], q[:, :, rows], kv[0, :, :, keys], kv[1, :, :, keys],
                                        out[:, :, rows], lses[i], True)
            dq[:, :, rows].copy_(gq)
            dkv[0, :, :, keys].add_(gk)
            dkv[1, :, :, keys].add_(gv)
        two, b, h, s, d = dkv.shape
        ranked = _to_rank_order(dkv.view(two, b, h, 2 * cp, c, d), 3, cp)
        ranked = ranked.view(two, b, h, cp, 2, c, d).permute(3, 0, 1, 2, 4, 5, 6).contiguous()
        mine = torch.empty((ranked.numel() // cp,), dtype=dkv.dtype, device=dkv.device)
        with comm_span(group):
            _reduce_scatter(mine, ranked.view(-1), group=group)
        mine = mine.view(two, b, h, 2 * c, d)
        return dq, mine[0], mine[1], None, None, None


def _a2a_heads_to_sequence(t: torch.Tensor, group) -> torch.Tensor:
    """[b, heads, s / cp, d] -> [b, heads / cp, s, d] in sequence order: one all-to-all
    (each rank sends its positions of the others' heads), then the reorder (Ulysses)."""
    cp = dist.get_world_size(group)
    b, h, s_l, d = t.shape
    send = t.view(b, cp, h // cp, s_l, d).transpose(0, 1).contiguous()     # [cp, b, h/cp, s_l, d]
    recv = torch.empty_like(send)
    with comm_span(group):
        dist.all_to_all_single(recv, send, group=group)
    c = s_l // 2
    chunks = recv.view(cp, b, h // cp, 2, c, d).permute(1, 2, 0, 3, 4, 5).reshape(b, h // cp, 2 * cp, c, d)
    return _to_sequence_order(chunks, 2, cp).reshape(b, h // cp, cp * s_l, d)


def _a2a_sequence_to_heads(t: torch.Tensor, group) -> torch.Tensor:
    """The inverse of :func:`_a2a_heads_to_sequence`: [b, heads / cp, s, d] -> [b, heads, s / cp, d]."""
    cp = dist.get_world_size(group)
    b, hl, s, d = t.shape
    c = s // (2 * cp)
    ranked = _to_rank_order(t.view(b, hl, 2 * cp, c, d), 2, cp).view(b, hl, cp, 2 * c, d)
    send = ranked.permute(2, 0, 1, 3, 4).contiguous()                       # [cp, b, h/cp, s_l, d]
    recv = torch.empty_like(send)
    with comm_span(group):
        dist.all_to_all_single(recv, send, group=group)
    return recv.transpose(0, 1).reshape(b, hl * cp, 2 * c, d)


class A2AAttention(torch.autograd.Function):
    """Megatron-Core's ``--cp-comm-type a2a`` (TE's ``AttnFuncWithCPAndQKVOA2A``, DeepSpeed's
    Ulysses): the queries, keys and values all-to-all'd from 1/cp of the positions of every
    head to every position of 1/cp of the heads, causal attention over the whole sequence, the
    output all-to-all'd back; the backward the same way round with the gradients."""

    @staticmethod
    def forward(ctx, q, k, v, group, dropout: float, scale: float):
        block = _Block(dropout, scale)
        qs, ks, vs = (_a2a_heads_to_sequence(t, group) for t in (q, k, v))
        o, lse = block.forward(qs, ks, vs, True)
        ctx.save_for_backward(qs, ks, vs, o, lse)
        ctx.group, ctx.block = group, block
        return _a2a_sequence_to_heads(o, group)

    @staticmethod
    def backward(ctx, dout):
        qs, ks, vs, o, lse = ctx.saved_tensors
        group, block = ctx.group, ctx.block
        ds = _a2a_heads_to_sequence(dout.contiguous(), group)
        gq, gk, gv = block.backward(0, ds, qs, ks, vs, o, lse, True)
        return (*(_a2a_sequence_to_heads(g, group) for g in (gq, gk, gv)), None, None, None)
