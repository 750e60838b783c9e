"""Megatron-Core's mixture-of-experts MLP, in plain PyTorch: what one rank runs of a ``MoELayer``
with the top-k router, the "alltoall" or the "allgather" token dispatcher
(``--moe-token-dispatcher-type``; the second is its default) and the ``SequentialMLP`` experts
(what it runs without ``--moe-grouped-gemm``; with it, ``GroupedMLP``: the local experts'
weights stacked and each of their GEMMs one batched kernel).

On a rank holding ``T`` tokens (``s / tp x b`` with sequence parallelism, ``/ cp`` with
context parallelism) of a layer with ``E`` experts, ``k`` of them per token, and expert
parallelism ``ep`` (each rank of an "ep" group holds ``E / ep`` local experts; their weights
split over the tensor-parallel ranks as a dense MLP's are, Megatron-Core's default expert
tensor parallelism):

forward
  the router's GEMM (``T x h`` by ``h x E``), top-k of the scores and a softmax over the k
  kept; the load-balancing loss (a float32 softmax over every score, the tokens per expert
  summed, all-reduced over the tensor-parallel ranks, which see different tokens);
  the token counts gathered over "tp_ep" and read by the host (the all-to-all's split sizes:
  a stream synchronisation, as the dispatcher's ``.tolist()``); the tokens copied into
  expert order (``T k`` rows); one all-to-all over "ep" (each rank receives the rows routed
  to its experts); with tp > 1 an all-gather over "tp" (each TP rank runs every received
  token on its slice of the experts); the rows sorted by local expert; per local expert
  its two GEMMs and the activation; the rows sorted back; the reverse: a reduce-scatter
  over "tp", the all-to-all back, and the rows weighted by their router probabilities and
  summed into their tokens.

with the allgather dispatcher, instead of the counts, the all-to-alls and the TP gathers
  (``MoEAllGatherTokenDispatcher``): every rank's tokens, probabilities and routing map
  all-gathered over "tp_ep" (the TP ranks when ep is 1), the host reading the local experts'
  counts (a stream synchronisation), the rows of the local experts picked from every token
  of the group, the experts, the weighted rows summed into the group's tokens and
  reduce-scattered back over "tp_ep".

backward
  what autograd derives from that: every collective's mirror (all-to-all for all-to-all,
  reduce-scatter for the gather), the experts' data- and weight-gradient GEMMs, the
  router's.

Routing is taken as balanced: every expert gets ``T k / E`` of each rank's rows (the
load-balancing loss's aim). Which token goes to which expert changes no kernel's shape, so
the rows are routed by a fixed table made once (no kernel of a step): a rank's routed row
``p`` (token ``p // k``) goes to the ep rank ``p // (T k / ep)``, whose local experts take
its rows in turn, under either dispatcher (so both compute the same function); the measured
imbalance of a real run (its slowest expert) is not modelled. The expert parameters'
gradients are reduced over "edp" (the ranks holding the same experts), the others' over
the dense data-parallel group, each with its own optimizer (Megatron-Core's
``ChainedOptimizer`` of the dense and the expert parameters).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from echo_et.workloads.markers import comm_span, stream_sync

# torch 2.13 renamed the tensor form; older releases only have the old name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def is_expert(p: nn.Parameter) -> bool:
    """Whether ``p`` is a local expert's (reduced over the expert data-parallel group)."""
    return getattr(p, "expert", False)


def _size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _all_to_all(x: torch.Tensor, group) -> torch.Tensor:
    out = torch.empty_like(x)
    with comm_span(group):
        dist.all_to_all_single(out, x.contiguous(), group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Equal-split all-to-all along dimension 0 in forward, and the same in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_to_all(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad, ctx.group), None


class _AttachAuxLoss(torch.autograd.Function):
    """Megatron-Core's ``MoEAuxLossAutoScaler``: the router probabilities unchanged, and in
    the backward the load-balancing loss's gradient (its coefficient) started from them."""

    @staticmethod
    def forward(ctx, probs, aux):
        ctx.save_for_backward(aux)
        return probs

    @staticmethod
    def backward(ctx, grad):
        (aux,) = ctx.saved_tensors
        return grad, torch.ones_like(aux) * 1e-2


def expert_rows(tokens: int, topk: int, experts: int, ep: int) -> list[int]:
    """Rows each local expert of an ep rank receives from one rank under balanced routing:
    ``tokens x topk / ep`` rows per ep rank, shared as evenly as can be by its ``experts /
    ep`` local experts (the same on every rank, so that every rank runs the same shapes)."""
    per_rank = tokens * topk // ep
    local = experts // ep
    base, extra = divmod(per_rank, local)
    return [base + (1 if i < extra else 0) for i in range(local)]


class MoEMLP(nn.Module):
    """One MoE layer's MLP on one rank (see the module docstring): ``forward`` takes the
    ``[s, b, h]`` input the dense MLP would (``s`` the rank's share of the sequence) and
    returns its output, with no bias left to add."""

    def __init__(self, cfg, tp_group, ep_group, tp_ep_group, *, tokens: int, gen, device, dtype):
        super().__init__()
        from echo_et.workloads.tensor_parallel import init_weight, mark_sequence_parallel

        h, e = cfg.hidden, cfg.num_experts
        tp, ep = _size(tp_group), _size(ep_group)
        self.tp_group, self.ep_group = tp_group, ep_group
        self.topk = cfg.moe_topk
        self.experts = e
        self.llama = cfg.llama
        self.fusion = cfg.gradient_accumulation_fusion
        self.local = e // ep
        ffn = cfg.moe_ffn_size
        # the router: every TP rank routes its own rows, so its gradient is all-reduced over tp
        self.router = nn.Parameter(torch.empty(e, h, device=device, dtype=dtype))
        init_weight(self.router, gen)
        if tp > 1:
            mark_sequence_parallel(self.router)
        inner = ffn * (2 if cfg.llama else 1) // tp        # SwiGLU's two halves
        # --moe-grouped-gemm: the local experts' weights stacked, each GEMM one batched kernel
        # over all of them (Megatron-Core's GroupedMLP; no biases, as it has none)
        self.grouped = cfg.moe_grouped_gemm
        if self.grouped:
            self.w1 = nn.Parameter(torch.empty(self.local, inner, h, device=device, dtype=dtype))
            self.w2 = nn.Parameter(torch.empty(self.local, h, ffn // tp, device=device, dtype=dtype))
            init_weight(self.w1, gen)
            init_weight(self.w2, gen)
            self.w1.expert = self.w2.expert = True
        self.fc1 = nn.ParameterList()
        self.fc2 = nn.ParameterList()
        self.fc1_bias = nn.ParameterList()
        self.fc2_bias = nn.ParameterList()
        for _ in range(0 if self.grouped else self.local):
            w1 = nn.Parameter(torch.empty(inner, h, device=device, dtype=dtype))
            w2 = nn.Parameter(torch.empty(h, ffn // tp, device=device, dtype=dtype))
            init_weight(w1, gen)
            init_weight(w2, gen)
            self.fc1.append(w1)
            self.fc2.append(w2)
            if not cfg.llama:       # the GPT layer's linears have biases (Megatron's add_bias_linear)
                self.fc1_bias.append(nn.Parameter(torch.zeros(inner, device=device, dtype=dtype)))
                self.fc2_bias.append(nn.Parameter(torch.zeros(h, device=device, dtype=dtype)))
        for p in (*self.fc1, *self.fc2, *self.fc1_bias, *self.fc2_bias):
            p.expert = True
        # the fixed routing (module docstring): row i of the expert-ordered copy is token
        # order[i] // topk's, weighted by its probability order[i]
        rows = tokens * self.topk
        order = torch.arange(rows, device=device)
        self.register_buffer("order", order, persistent=False)
        self.register_buffer("token_of_row", order // self.topk, persistent=False)
        self.rows = expert_rows(tokens, self.topk, e, ep)     # from one rank, per local expert
        self.sources = ep * tp                                 # ranks whose rows each expert runs
        self.dispatcher = cfg.moe_token_dispatcher
        # the group the dispatcher gathers over (counts, or tokens): tp x ep, tp alone without ep
        self.gather_group = tp_ep_group if tp_ep_group is not None else tp_group
        if self.dispatcher == "allgather":
            # the group's routed rows this rank's experts take, expert by expert, source by source
            # (member m of the group, tp fastest, is ep rank m // tp)
            q = dist.get_rank(ep_group) if ep > 1 else 0
            sources = torch.arange(self.sources, device=device).unsqueeze(1) * rows
            first = q * (rows // ep)
            parts = []
            for n in self.rows:        # made on the device: a large layer's table is millions long
                parts.append((sources + first + torch.arange(n, device=device)).reshape(-1))
                first += n
            pair = torch.cat(parts)
            self.register_buffer("ag_pair", pair, persistent=False)
            self.register_buffer("ag_token_of_row", pair // self.topk, persistent=False)

    def route(self, x: torch.Tensor) -> torch.Tensor:
        """The router's top-k probabilities, ``[T, k]`` (the load-balancing loss attached)."""
        logits = F.linear(x, self.router)
        scores, _ = torch.topk(logits, self.topk, dim=-1)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).type_as(logits)
        # the load-balancing loss: every score's probability, the tokens per expert (summed
        # over the rows the TP ranks see between them)
        full = torch.softmax(logits, dim=-1, dtype=torch.float32)
        counts = torch.zeros(self.experts, device=x.device, dtype=torch.float32)
        if _size(self.tp_group) > 1:
            with comm_span(self.tp_group):
                dist.all_reduce(counts, group=self.tp_group)
        aux = torch.sum(full.mean(0) * counts)
        return _AttachAuxLoss.apply(probs, aux)

    def _exchange_counts(self, device) -> None:
        """The alltoall dispatcher's token counts per expert gathered over "tp_ep" and read on
        the host (the all-to-all's split sizes, and the local experts' rows): one small
        all-gather, then a stream sync; the sync alone with one rank and several local experts."""
        if _size(self.gather_group) > 1:
            self._gather_small(torch.zeros(self.experts, device=device, dtype=torch.int64))
        elif self.local == 1:
            return
        stream_sync(device)

    def _gather_small(self, mine: torch.Tensor) -> None:
        """``mine`` all-gathered over the dispatcher's group (what needs no gradient)."""
        every = torch.empty((mine.shape[0] * _size(self.gather_group), *mine.shape[1:]), device=mine.device,
                            dtype=mine.dtype)
        with comm_span(self.gather_group):
            _all_gather(every, mine, group=self.gather_group)

    def _experts(self, x: torch.Tensor) -> torch.Tensor:
        """Each local expert's MLP on its rows (``x`` sorted by local expert)."""
        from echo_et.workloads import fused
        from echo_et.workloads.tensor_parallel import linear

        if self.grouped:        # every expert the same rows (GPTConfig.check_experts)
            y = torch.bmm(x.view(self.local, -1, x.shape[-1]), self.w1.transpose(1, 2))
            y = torch.bmm(fused.swiglu(y), self.w2.transpose(1, 2))
            return y.reshape(-1, y.shape[-1])
        outs = []
        for i, part in enumerate(x.split([n * self.sources for n in self.rows], dim=0)):
            y = linear(part, self.fc1[i], None, self.fusion)
            y = fused.swiglu(y) if self.llama else fused.bias_gelu(y, self.fc1_bias[i])
            y = linear(y, self.fc2[i], None, self.fusion)
            outs.append(y if self.llama else y + self.fc2_bias[i])
        return torch.cat(outs) if len(outs) > 1 else outs[0]

    def _sort_chunks(self, x: torch.Tensor, by_expert: bool) -> torch.Tensor:
        """Rows grouped by source rank then local expert, regrouped by local expert then source
        rank (``by_expert``), or back: Megatron-Core's ``sort_chunks_by_idxs`` (one copy)."""
        if self.local == 1 or self.sources == 1:
            return x
        n, k = self.sources, self.local
        if by_expert:
            chunks = x.split([r for _ in range(n) for r in self.rows], dim=0)      # [source][expert]
            order = [s * k + e for e in range(k) for s in range(n)]
        else:
            chunks = x.split([r for r in self.rows for _ in range(n)], dim=0)      # [expert][source]
            order = [e * n + s for s in range(n) for e in range(k)]
        return torch.cat([chunks[i] for i in order])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from echo_et.workloads.tensor_parallel import gather_from_sequence, reduce_scatter_to_sequence

        s, b, h = x.shape
        tokens = x.reshape(s * b, h)
        probs = self.route(tokens)
        if self.dispatcher == "allgather":
            return self._allgather(tokens, probs).view(s, b, h)
        self._exchange_counts(x.device)
        rows = tokens.index_select(0, self.token_of_row)            # [T k, h], expert order
        if _size(self.ep_group) > 1:
            rows = _AllToAll.apply(rows, self.ep_group)
        if self.tp_group is not None and _size(self.tp_group) > 1:
            rows = gather_from_sequence(rows, self.tp_group)
        out = self._sort_chunks(self._experts(self._sort_chunks(rows, True)), False)
        if self.tp_group is not None and _size(self.tp_group) > 1:
            out = reduce_scatter_to_sequence(out, self.tp_group)
        if _size(self.ep_group) > 1:
            out = _AllToAll.apply(out, self.ep_group)
        weighted = out * probs.reshape(-1).index_select(0, self.order).unsqueeze(-1)
        summed = torch.zeros_like(tokens).index_add(0, self.token_of_row, weighted)
        return summed.view(s, b, h)

    def _allgather(self, tokens: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """The allgather dispatcher (see the module docstring): ``[T, h]`` in and out."""
        from echo_et.workloads.tensor_parallel import gather_from_sequence, reduce_scatter_to_sequence

        group = self.gather_group
        gathered = group is not None and _size(group) > 1
        if gathered:
            tokens = gather_from_sequence(tokens, group)
            probs = gather_from_sequence(probs, group)
            self._gather_small(torch.zeros(probs.shape[0] // _size(group), self.experts, device=tokens.device,
                                           dtype=torch.bool))
        stream_sync(tokens.device)      # the local experts' counts read on the host
        out = self._experts(tokens.index_select(0, self.ag_token_of_row))
        weighted = out * probs.reshape(-1).index_select(0, self.ag_pair).unsqueeze(-1)
        summed = torch.zeros_like(tokens).index_add(0, self.ag_token_of_row, weighted)
        return reduce_scatter_to_sequence(summed, group) if gathered else summed
