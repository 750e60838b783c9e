"""The least GPU memory a Megatron GPT rank needs: a configuration past it cannot run.

A lower bound, so that a configuration that ran is never refused: only what every
Megatron-LM / Megatron-DeepSpeed rank must hold at once is counted,

- the model state of its pipeline stage: 16-bit weights and gradients (2 + 2 bytes per
  parameter; an fp32 model 4 + 4; gradients accumulated in fp32, Megatron's
  ``--accumulate-allreduce-grads-in-fp32`` and its bf16 default, 2 + 4) and Adam's fp32
  master weights, first and second moments (4 + 4 + 4; an fp32 model's master weights are
  its weights: 4 + 4), the latter **sharded over the data-parallel ranks**, as DeepSpeed's
  ZeRO stage 1 (which Megatron-DeepSpeed runs with) and Megatron-LM's
  ``--use-distributed-optimizer`` shard them: 4 + 12 / dp bytes per parameter (16 at dp = 1,
  what Megatron's plain optimizer holds at any dp). The stage's
  share of the tensor-parallel split, the word embedding on the first and the last stage
  (Megatron ties them: both hold a copy), positions on the first;
- the activations of Megatron's layers (core attention without flash attention, as the
  ``megatron-gpt`` workload runs them; with sequence parallelism the tensors the TP ranks
  otherwise replicate, layer-norm and dropout inputs and masks, split along the sequence:
  ``--sequence-parallel``), counted as Korthikanti et al.
  (*Reducing Activation Recomputation in Large Transformer Models*, 2022, section 4) count
  them, per layer and micro-batch in flight (the first stage of the 1F1B schedule holds
  min(pp, micro-batches) of them):

  - full recomputation (``--recompute-granularity full``): the layer's input, e s b h bytes,
    split over the tensor-parallel ranks, e s b h / tp: Megatron-DeepSpeed partitions the
    checkpointed inputs over the model-parallel ranks (DeepSpeed's activation checkpointing,
    ``--partition-activations``) and Megatron-LM's sequence parallelism splits them along the
    sequence, so a run may hold only that much, though the ``megatron-gpt`` workload keeps
    the whole input (until 2026-12-06 the bound counted it whole, which refused layouts
    such as a 39B model at TP8 x PP16, micro-batch 24, on a 40 GB A100: 38.7 GB of layer
    inputs on the first stage, 4.8 GB partitioned);
  - selective (only the core attention recomputed): what the layer saves for its backward
    outside the core attention, (4 e + 2) s b h replicated over the tensor-parallel ranks
    (two layer-norm inputs, the inputs of the QKV and first MLP GEMMs, two 1-byte dropout
    masks) and 12 e s b h / tp split over them (Q, K, V, the output projection's input, the
    GeLU's input and output): 34 s b h at e = 2 bytes, tp = 1;
  - none: that, plus the core attention's (2 e + 1) a s^2 b / tp (the softmax output, its
    dropout mask and output: 5 a s^2 b at e = 2);

  without dropout the masks are not counted (and the attention keeps e a s^2 b / tp: the
  softmax output alone). On top of what the in-flight micro-batches keep, the peak holds at
  least the larger of two transients that are never live together: the backward of one
  layer (with full recomputation its whole recomputed forward; with selective, its
  recomputed core attention) and, on the last stage, the cross-entropy's fp32 softmax over
  the vocabulary slice (4 s b V / tp bytes, which Megatron saves for the loss's backward).
  ``tests/test_footprint.py`` checks these counts against what the ``megatron-gpt``
  workload's layer saves for its backward at each granularity.

The llama layer (``llama``: SwiGLU's three MLP matrices, no linear biases, RMSNorm's single
weight, rotary positions, an output layer of its own) and grouped-query attention (``kv``: the
keys' and values' width) are counted the same way: the weights of each, and among the kept
activations Q, K and V at their widths and the SwiGLU input (twice the MLP width) and output in
place of the GeLU's. With flash attention (``flash``) no sequence x sequence tensor is kept or
made. ``tests/test_llama.py`` checks these against what the llama layer saves.

Not counted: the other temporaries of a layer's forward and backward (gradients in
flight, the 16-bit logits), NCCL and allocator buffers, fragmentation; DeepSpeed's CPU
checkpointing (``cpu_checkpointing``), which moves the checkpointed inputs to the host at a
cost in PCIe copies echo-et does not simulate. So a row refused here
would not fit; a row accepted may still not (the true peak is often 20-40 % above this). The
step echo-et simulates is the plain optimizer's (a whole all-reduce, Adam over the rank's
whole stage) unless the distributed optimizer is asked for (``--use-distributed-optimizer``),
whichever of the two a run that fits only sharded would use.
"""

from __future__ import annotations

import math
from typing import Any

from echo_et.errors import EchoError

STATE_BYTES_PER_PARAM = 16          # per parameter at dp = 1 (16-bit or fp32 model alike)


# how a layout the GPU cannot hold is refused (the layout grid counts refusals by it)
DOES_NOT_FIT = "does not fit the GPU's memory"


def state_bytes_per_param(elem_bytes: int, dp: int, grad_bytes: int | None = None) -> float:
    """Weights in the model's dtype, gradients in ``grad_bytes`` (default: the model's),
    Adam's fp32 state sharded over ``dp``."""
    optimizer = 12 if elem_bytes < 4 else 8      # master copy, moments; fp32: the moments
    return elem_bytes + (grad_bytes or elem_bytes) + optimizer / max(1, dp)


def stage_parameters(*, layers: int, hidden: int, ffn: int, vocab: int, seq: int, tp: int, pp: int,
                     stage: int, stage_layers: int | None = None, kv: int | None = None,
                     llama: bool = False, experts: int = 0, shared_ffn: int = 0, moe_layers: int | None = None) -> int:
    """Parameters one tensor-parallel rank of pipeline ``stage`` holds (``vocab`` padded);
    ``stage_layers``: the stage's layers when the stages are uneven (default layers / pp);
    ``kv``: the width of the keys (and of the values), key/value heads x head size (default
    ``hidden``); ``llama``: the llama layer (SwiGLU's three MLP matrices, no linear biases,
    RMSNorm's one weight, rotary positions, an output layer of its own without a bias);
    ``experts``: a mixture of experts' layers, whose MLP here is the router and the shared
    expert of width ``shared_ffn`` (the routed experts' are :func:`stage_expert_parameters`);
    ``moe_layers``: how many of the stage's layers are MoE layers (default all of them)."""
    h = hidden
    kv = h if kv is None else kv
    attention = (h * (h + 2 * kv) + h * h) // tp

    def per_layer(mlp: int, width: int) -> int:
        return attention + mlp + (2 * h if llama else (h + 2 * kv + width) // tp + 6 * h)

    n = layers // pp if stage_layers is None else stage_layers
    m = (n if moe_layers is None else moe_layers) if experts else 0      # the stage's MoE layers
    dense = per_layer((3 if llama else 2) * h * ffn // tp, ffn)
    moe = per_layer(experts * h + (3 if llama else 2) * h * shared_ffn // tp, shared_ffn)
    out = m * moe + (n - m) * dense
    if stage == 0:
        out += vocab * h // tp + (0 if llama else seq * h)
    if stage == pp - 1:
        out += vocab * h // tp + (h if llama else 2 * h)
    return out


def stage_expert_parameters(*, layers: int, hidden: int, tp: int, pp: int, experts: int, expert_ffn: int,
                            ep: int, stage_layers: int | None = None, llama: bool = False) -> int:
    """The local experts' parameters one rank of a pipeline stage holds: ``experts / ep`` per
    layer, each an MLP of width ``expert_ffn`` split over the TP ranks (with biases but for
    the llama layer)."""
    h, fe = hidden, expert_ffn
    per_expert = (3 if llama else 2) * h * fe // tp + (0 if llama else fe // tp + h)
    return (layers // pp if stage_layers is None else stage_layers) * (experts // ep) * per_expert


RECOMPUTE_LEVELS = ("full", "selective", "none")


def layer_activation_bytes(*, seq: int, micro_batch: int, hidden: int, heads: int, tp: int, elem_bytes: int,
                           recompute: str, dropout: bool = True, sequence_parallel: bool = False,
                           ffn: int | None = None, kv: int | None = None, gated: bool = False,
                           flash: bool = False, modules: tuple[str, ...] = ("core_attn",)) -> tuple[int, int]:
    """(kept, transient) bytes of one layer and micro-batch at ``recompute``: what stays
    until its backward, and what its backward adds at once on top (see the module docstring).
    With ``sequence_parallel`` the tensors the TP ranks otherwise replicate are split along
    the sequence too (Korthikanti et al.: 34 s b h / tp at e = 2 with selective recomputation).
    ``ffn`` (default 4 x hidden) and ``kv`` (default hidden): the MLP's width and the keys';
    ``gated``: a SwiGLU MLP (its input twice as wide); ``flash``: flash attention, which keeps
    no s x s tensor. ``modules``: what selective recomputation recomputes (Megatron-Core's
    --recompute-modules): "core_attn" drops the s x s tensors, "mlp" the MLP activation's input
    and output (its checkpointed input, the second norm's output, is kept), "layernorm" the two
    norms' outputs (the inputs of the QKV and first MLP GEMMs); each recomputed part is live at
    once in the layer's backward, one after the other."""
    if recompute not in RECOMPUTE_LEVELS:
        raise ValueError(f"recompute {recompute!r} is not one of {RECOMPUTE_LEVELS}")
    ffn = 4 * hidden if ffn is None else ffn
    kv = hidden if kv is None else kv
    sb, mask = seq * micro_batch, 1 if dropout else 0
    sbh = sb * hidden
    replicated = (4 * elem_bytes + 2 * mask) * sbh
    # Q, K, V, the output projection's input, the MLP activation's input and output
    split = elem_bytes * sb * (2 * hidden + 2 * kv + (3 if gated else 2) * ffn) // tp
    outside_attention = (replicated // tp if sequence_parallel else replicated) + split
    scores = 0 if flash else (
        ((2 * elem_bytes + mask) if dropout else elem_bytes) * heads * seq * seq * micro_batch // tp)
    if recompute == "full":       # the checkpointed input, partitioned over the TP ranks
        kept = elem_bytes * sbh // tp
        return kept, outside_attention + scores - kept
    if recompute == "selective":
        mlp_act = elem_bytes * sb * (3 if gated else 2) * ffn // tp
        norm_out = 2 * elem_bytes * sbh // (tp if sequence_parallel else 1)
        dropped = {"core_attn": scores, "mlp": mlp_act, "layernorm": norm_out}
        kept = outside_attention + scores - sum(dropped[m] for m in modules)
        return kept, max([0, *(dropped[m] for m in modules)])
    return outside_attention + scores, 0


def megatron_min_bytes(*, layers: int, hidden: int, ffn: int, vocab: int, seq: int, micro_batch: int,
                       tp: int, pp: int, microbatches: int, elem_bytes: int, heads: int, dp: int = 1,
                       grad_bytes: int | None = None, recompute: str = "full",
                       dropout: bool = True, sequence_parallel: bool = False,
                       stage_layers: tuple[int, ...] | None = None, kv: int | None = None,
                       llama: bool = False, flash: bool = False, chunks: int = 1,
                       microbatch_group: int = 0, recompute_method: str = "uniform",
                       recompute_layers: int = 1,
                       recompute_modules: tuple[str, ...] = ("core_attn",), cp: int = 1, experts: int = 0,
                       topk: int = 0, expert_ffn: int = 0, ep: int = 1, shared_ffn: int = 0,
                       moe_layers: tuple[int, ...] | None = None) -> tuple[int, int, int]:
    """(total, model state, activations) in bytes on the rank that needs most;
    ``chunks``: model chunks per stage of Megatron's interleaved schedule, whose stage s keeps
    the activations of min(2 (pp - s - 1) + (chunks - 1) g + 1, micro-batches x chunks)
    chunk forwards (its warm-up and the first steady forward; the first stage about (1 + 1 /
    chunks) times 1F1B's: Korthikanti et al. 2022, section 4.2.3), g the micro-batches of a
    group (``microbatch_group``, Megatron-Core's per virtual stage; 0: pp);
    ``stage_layers``: each stage's layers, first to last, when they are uneven (default
    layers / pp each, where only the first and the last stage can need most); ``kv``,
    ``llama``, ``flash``: the keys' width, the llama layer, flash attention (as
    :func:`stage_parameters` and :func:`layer_activation_bytes` take them); with full
    recomputation, Megatron's ``recompute_method`` and its ``recompute_layers`` N: "uniform"
    keeps one input per group of N layers of a chunk and recomputes a group at once (its N
    layers' activations the transient), "block" checkpoints a chunk's first N layers and keeps
    all of the others' (:func:`chunk_activation_bytes`); ``cp``: context parallelism, whose
    ranks each keep the activations of seq / cp positions and shard the optimizer's state with
    the data-parallel ranks (Megatron-Core's distributed optimizer over dp x cp); ``experts``
    (a mixture of experts, ``topk`` per token, each of width ``expert_ffn``, over ``ep``
    expert-parallel ranks): each rank holds experts / ep of every layer's experts, their
    state sharded over the dp x cp / ep ranks holding the same, and a token's MLP activations
    are its k experts' and the shared expert's (an MLP of width k x expert_ffn + shared_ffn);
    ``moe_layers``: each stage's MoE layers when not every layer is one (its others dense, and
    every layer's activations then the narrower of the two MLPs', a lower bound)."""
    best = (0, 0, 0)
    per_param = state_bytes_per_param(elem_bytes, dp * cp, grad_bytes)
    per_expert_param = state_bytes_per_param(elem_bytes, max(1, dp * cp // ep), grad_bytes)
    local = seq // cp      # the positions of a context-parallel rank (the weights are the whole model's)
    mlp_width = topk * expert_ffn + shared_ffn if experts else ffn
    if experts and moe_layers is not None:
        mlp_width = min(mlp_width, ffn)
    layer_bytes = {level: layer_activation_bytes(seq=local, micro_batch=micro_batch, hidden=hidden, heads=heads,
                                                 tp=tp, elem_bytes=elem_bytes, recompute=level, dropout=dropout,
                                                 sequence_parallel=sequence_parallel, ffn=mlp_width, kv=kv,
                                                 gated=llama,
                                                 flash=flash, modules=recompute_modules)
                   for level in {recompute, "none"}}
    if stage_layers is not None and len(stage_layers) != pp:
        raise ValueError(f"{len(stage_layers)} stage layer counts for pp {pp}")
    counts = stage_layers or (layers // pp,) * pp
    # a middle stage needs most only when it holds more layers than every stage before it
    stages, most = [], -1
    for s, n in enumerate(counts):
        if s in (0, pp - 1) or n > most:
            stages.append(s)
        most = max(most, n)
    for stage in stages:
        state = math.floor(per_param * stage_parameters(layers=layers, hidden=hidden, ffn=ffn, vocab=vocab,
                                                         seq=seq, tp=tp, pp=pp, stage=stage,
                                                         stage_layers=counts[stage], kv=kv, llama=llama,
                                                         experts=experts, shared_ffn=shared_ffn,
                                                         moe_layers=None if moe_layers is None else moe_layers[stage]))
        if experts:
            state += math.floor(per_expert_param * stage_expert_parameters(
                layers=layers, hidden=hidden, tp=tp, pp=pp, experts=experts, expert_ffn=expert_ffn, ep=ep,
                stage_layers=counts[stage] if moe_layers is None else moe_layers[stage], llama=llama))
        loss_softmax = 4 * local * micro_batch * vocab // tp if stage == pp - 1 else 0
        if chunks > 1:      # chunk forwards whose activations are kept
            in_flight = min(2 * (pp - stage - 1) + (chunks - 1) * (microbatch_group or pp) + 1,
                            microbatches * chunks)
        else:
            in_flight = min(pp - stage, microbatches)
        kept, transient = chunk_activation_bytes(layer_bytes, recompute, counts[stage] // chunks,
                                                 recompute_method, recompute_layers)
        act = in_flight * kept + max(transient, loss_softmax)
        if state + act > best[0]:
            best = (state + act, state, act)
    return best


def chunk_activation_bytes(layer_bytes: dict[str, tuple[int, int]], recompute: str, layers: int,
                           method: str = "uniform", n: int = 1) -> tuple[int, int]:
    """(kept, transient) bytes of one forward of a model chunk of ``layers`` layers, from
    ``layer_bytes`` (:func:`layer_activation_bytes` at ``recompute`` and at "none"): under full
    recomputation by the uniform method, one input per group of ``n`` layers kept and a group's
    recomputed forward (its ``n`` layers' activations, less the input) the transient; by the
    block method, the first ``n`` layers' inputs and the rest's activations kept, one recomputed
    layer the transient; otherwise ``layers`` times the layer's."""
    kept, transient = layer_bytes[recompute]
    if recompute != "full" or (method, n) == ("uniform", 1):
        return layers * kept, transient
    whole = layer_bytes["none"][0]
    if method == "uniform":
        return -(-layers // n) * kept, min(n, layers) * whole - kept
    checkpointed = min(n, layers)
    return checkpointed * kept + (layers - checkpointed) * whole, transient if checkpointed else 0


RECOMPUTE_SAID = {"full": "full recomputation", "selective": "selective recomputation",
                  "none": "no recomputation"}


def recompute_said(shape: dict[str, Any]) -> str:
    """The recomputation of a footprint's keywords, in words ("full recomputation (block
    method, 2 layers)", "selective recomputation (core_attn, mlp)")."""
    level = shape.get("recompute", "full")
    modules = shape.get("recompute_modules", ("core_attn",))
    if level == "selective" and tuple(modules) != ("core_attn",):
        return f"{RECOMPUTE_SAID[level]} ({', '.join(modules)})"
    method, n = shape.get("recompute_method", "uniform"), shape.get("recompute_layers", 1)
    if level != "full" or (method, n) == ("uniform", 1):
        return RECOMPUTE_SAID[level]
    return f"{RECOMPUTE_SAID[level]} ({method} method, {n} layer{'s' if n > 1 else ''})"


def check_fits(memory_gb: float, gpu: str, **shape: Any) -> None:
    """EchoError naming the numbers when even the lower bound exceeds ``memory_gb``."""
    if memory_gb <= 0:
        return
    total, state, act = megatron_min_bytes(**shape)
    dp, cp = shape.get("dp", 1), shape.get("cp", 1)
    sharded = (f" with Adam's sharded over {dp} data-parallel x {cp} context-parallel ranks" if cp > 1
               else f" with Adam's sharded over {dp} data-parallel ranks" if dp > 1 else "")
    wide = (shape.get("grad_bytes") or 0) > shape["elem_bytes"]
    grads = "fp32 gradients" if wide else "gradients"
    if total > memory_gb * 1e9:
        raise EchoError(f"{DOES_NOT_FIT}: each rank needs at least {total / 1e9:.1f} GB "
                        f"(weights, {grads} and Adam states{sharded} {state / 1e9:.1f} GB, activations with "
                        f"{recompute_said(shape)} {act / 1e9:.1f} GB), "
                        f"{gpu} has {memory_gb:g} GB")
