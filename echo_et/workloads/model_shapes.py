"""Published model shapes by name, so a user plans "llama2-70b on 512 A100s" without looking up
its layers, widths and vocabulary. Each entry is what its paper or released configuration
says; options given beside a name override its fields. Torch-free: the CLI reads it."""

from __future__ import annotations

from dataclasses import dataclass, fields

from echo_et.errors import EchoError


@dataclass(frozen=True)
class ModelShape:
    """One model's shape, in the GPTConfig's terms (0: the GPTConfig default)."""

    arch: str            # "gpt" or "llama" (GPTConfig.arch)
    layers: int
    hidden: int
    heads: int
    seq: int             # the sequence length it was trained at
    vocab: int           # before Megatron pads it to a multiple of 128 x tp
    ffn_hidden: int = 0  # 0: 4 x hidden
    kv_heads: int = 0    # 0: one per head
    num_experts: int = 0     # a mixture of experts: experts per layer (0: a dense MLP)
    moe_topk: int = 0        # experts per token
    moe_ffn_hidden: int = 0  # each expert's width (0: ffn_hidden)
    moe_shared_ffn: int = 0  # a shared expert's width (0: none)
    source: str = ""

    def options(self) -> dict[str, int | str]:
        """The shape as option values (GPTConfig field names), defaults left out."""
        return {f.name: v for f in fields(self) if f.name != "source" and (v := getattr(self, f.name))}


_GPT3 = "Brown et al. 2020 (arXiv 2005.14165), Table 2.1; GPT-2's 50257-token vocabulary"
_MEGATRON = "Narayanan et al. 2021 (arXiv 2104.04473), Table 1; vocabulary 51200 as its scripts"
_LLAMA2 = "Touvron et al. 2023 (arXiv 2307.09288) and Meta's released config.json"
_LLAMA3 = "Llama Team 2024 (arXiv 2407.21783), Table 3, and Meta's released config.json"
_MIXTRAL = "Jiang et al. 2024 (arXiv 2401.04088), Table 1"
_OLMOE = ("Muennighoff et al. 2024 (arXiv 2409.02060) and the released OLMoE-1B-7B config.json (its QK norm not "
          "modelled)")

MODEL_SHAPES: dict[str, ModelShape] = {
    "gpt3-6.7b": ModelShape("gpt", 32, 4096, 32, 2048, 50257, source=_GPT3),
    "gpt3-175b": ModelShape("gpt", 96, 12288, 96, 2048, 50257, source=_GPT3),
    "megatron-1.7b": ModelShape("gpt", 24, 2304, 24, 2048, 51200, source=_MEGATRON),
    "megatron-3.6b": ModelShape("gpt", 30, 3072, 32, 2048, 51200, source=_MEGATRON),
    "megatron-7.5b": ModelShape("gpt", 36, 4096, 32, 2048, 51200, source=_MEGATRON),
    "megatron-18b": ModelShape("gpt", 40, 6144, 48, 2048, 51200, source=_MEGATRON),
    "megatron-39b": ModelShape("gpt", 48, 8192, 64, 2048, 51200, source=_MEGATRON),
    "megatron-76b": ModelShape("gpt", 60, 10240, 80, 2048, 51200, source=_MEGATRON),
    "megatron-145b": ModelShape("gpt", 80, 12288, 96, 2048, 51200, source=_MEGATRON),
    "megatron-310b": ModelShape("gpt", 96, 16384, 128, 2048, 51200, source=_MEGATRON),
    "megatron-530b": ModelShape("gpt", 105, 20480, 128, 2048, 51200, source=_MEGATRON),
    "megatron-1t": ModelShape("gpt", 128, 25600, 160, 2048, 51200, source=_MEGATRON),
    "llama2-7b": ModelShape("llama", 32, 4096, 32, 4096, 32000, ffn_hidden=11008, source=_LLAMA2),
    "llama2-13b": ModelShape("llama", 40, 5120, 40, 4096, 32000, ffn_hidden=13824, source=_LLAMA2),
    "llama2-70b": ModelShape("llama", 80, 8192, 64, 4096, 32000, ffn_hidden=28672, kv_heads=8, source=_LLAMA2),
    "llama3-8b": ModelShape("llama", 32, 4096, 32, 8192, 128256, ffn_hidden=14336, kv_heads=8, source=_LLAMA3),
    "llama3-70b": ModelShape("llama", 80, 8192, 64, 8192, 128256, ffn_hidden=28672, kv_heads=8, source=_LLAMA3),
    "llama3-405b": ModelShape("llama", 126, 16384, 128, 8192, 128256, ffn_hidden=53248, kv_heads=8,
                              source=_LLAMA3),
    "mixtral-8x7b": ModelShape("llama", 32, 4096, 32, 32768, 32000, ffn_hidden=14336, kv_heads=8, num_experts=8,
                               moe_topk=2, source=_MIXTRAL),
    "olmoe-1b-7b": ModelShape("llama", 16, 2048, 16, 4096, 50304, ffn_hidden=1024, num_experts=64, moe_topk=8,
                              source=_OLMOE),
}


def model_shape(name: str) -> ModelShape:
    """The named model's shape; an EchoError listing the names when there is none."""
    try:
        return MODEL_SHAPES[name.strip().lower()]
    except KeyError:
        raise EchoError(f"{name[:40]!r} is not a model echo-et knows; one of {', '.join(MODEL_SHAPES)}") from None


__all__ = ["MODEL_SHAPES", "ModelShape", "model_shape"]
