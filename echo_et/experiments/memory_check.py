"""Whether a Megatron GPT configuration fits its GPU, and when it does not, what would.

The bound is :mod:`echo_et.models.footprint`'s (a lower bound: a configuration refused here
cannot run). A refusal is a dead end unless it says which change is enough, so the error
also names the two that leave the layout as it is: recomputing whole layers (when the row
keeps more), and the same GPU with more memory (an A100 40 GB row on the 80 GB part).
"""

from __future__ import annotations

import re
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.dtypes import dtype_size
from echo_et.models.compute import DATASHEETS, GpuSpec
from echo_et.models.footprint import check_fits, megatron_min_bytes


def megatron_shape(cfg: Any, layout: Any) -> dict[str, Any]:
    """The footprint's keywords for a ``GPTConfig`` at ``layout``."""
    return dict(layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn_size,
                vocab=cfg.padded_vocab(layout.tp), seq=cfg.seq, micro_batch=cfg.micro_batch, tp=layout.tp,
                pp=layout.pp, microbatches=layout.microbatches, elem_bytes=dtype_size(cfg.dtype), dp=layout.dp,
                grad_bytes=dtype_size(cfg.grad_buffer_dtype), heads=cfg.heads,
                recompute=cfg.recompute_level, dropout=cfg.dropout > 0,
                **({"recompute_method": cfg.recompute_method, "recompute_layers": cfg.recompute_num_layers}
                   if cfg.recomputes_layers and (cfg.recompute_method, cfg.recompute_num_layers) != ("uniform", 1)
                   else {}),
                **({"recompute_modules": cfg.selective_modules()}
                   if cfg.selective_modules() not in ((), ("core_attn",)) else {}),
                sequence_parallel=cfg.sequence_parallel and layout.tp > 1,
                **({"stage_layers": cfg.stage_layer_counts(layout.pp)} if cfg.uneven_stages else {}),
                **({"chunks": cfg.virtual_chunks(layout.pp)} if cfg.interleaved else {}),
                **({"microbatch_group": cfg.microbatch_group_size} if cfg.microbatch_group_size else {}),
                **({"kv": cfg.hidden // cfg.heads * cfg.query_groups} if cfg.query_groups != cfg.heads else {}),
                **({"llama": True} if cfg.llama else {}), **({"flash": True} if cfg.flash_attention else {}),
                **({"cp": layout.cp} if layout.cp > 1 else {}),
                **({"experts": cfg.num_experts, "topk": cfg.moe_topk, "expert_ffn": cfg.moe_ffn_size, "ep": layout.ep,
                    "shared_ffn": cfg.moe_shared_ffn} if cfg.num_experts else {}),
                **({"moe_layers": stage_moe_layers(cfg, layout.pp)}
                   if cfg.num_experts and not all(cfg.moe_layer_pattern()) else {}))


def stage_moe_layers(cfg: Any, pp: int) -> tuple[int, ...]:
    """The MoE layers each pipeline stage holds (over its model chunks), first to last."""
    chunks = cfg.virtual_chunks(pp)
    counts = cfg.stage_layer_counts(pp)
    return tuple(sum(cfg.moe_layer_count(cfg.chunk_first_layer(pp, s, c), counts[s] // chunks)
                     for c in range(chunks)) for s in range(pp))


def check_memory(cfg: Any, layout: Any, gpu: str) -> None:
    """EchoError when the configuration cannot fit ``gpu``'s memory even at the lower bound
    (weights, gradients, Adam states sharded over the data-parallel ranks, the activations
    kept at the configuration's recomputation), naming what would fit."""
    spec = DATASHEETS.get(gpu)
    if spec is None:
        return
    shape = megatron_shape(cfg, layout)
    try:
        check_fits(spec.memory_gb, spec.name, **shape)
    except EchoError as e:
        raise EchoError(f"layout {layout.describe()}: {e}{what_fits(shape, spec)}") from None


def what_fits(shape: dict[str, Any], spec: GpuSpec) -> str:
    """The changes that make ``shape`` fit while keeping its layout, as the tail of the
    refusal ("" when neither does): full recomputation of every layer on ``spec``, and the larger-memory
    variants of ``spec``'s GPU (same name but the memory size), each with its bound."""
    hints = []
    partial = (shape.get("recompute_method", "uniform"), shape.get("recompute_layers", 1)) != ("uniform", 1)
    if shape.get("recompute", "full") != "full" or partial:
        every = {k: v for k, v in shape.items() if k not in ("recompute_method", "recompute_layers")}
        full = megatron_min_bytes(**{**every, "recompute": "full"})[0]
        if full <= spec.memory_gb * 1e9:
            what = "every layer recomputed (the uniform method, 1 layer)" if partial else "full recomputation"
            hints.append(f"with {what} it needs at least {full / 1e9:.1f} GB")
    need = megatron_min_bytes(**shape)[0]
    larger = [s for s in _variants(spec) if s.memory_gb > spec.memory_gb and need <= s.memory_gb * 1e9]
    if larger:
        hints.append(" or ".join(f"{s.name} ({s.key}, {s.memory_gb:g} GB)" for s in larger) + " holds it")
    return "".join(f"; {h}" for h in hints)


def _variants(spec: GpuSpec) -> list[GpuSpec]:
    """The data sheets of ``spec``'s GPU in every memory size, smallest first."""
    family = _MEMORY_SUFFIX.sub("", spec.name)
    return sorted((s for s in DATASHEETS.values() if _MEMORY_SUFFIX.sub("", s.name) == family),
                  key=lambda s: (s.memory_gb, s.key))


_MEMORY_SUFFIX = re.compile(r"-\d+GB$")
