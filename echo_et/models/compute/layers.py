"""The operator calls of one transformer layer, as a profiler would record them on a GPU.

Used to price per-layer compute times stated without a trace (the SimAI/AICB workloads) and
in tests. Megatron-style tensor parallelism: column-parallel QKV and MLP-in, row-parallel
projection and MLP-out, each rank holding ``heads / tp`` heads; sequence-first activations
``[s, b, h]``; fused (flash) attention. GPT: LayerNorm, GeLU MLP, biases. Llama: RMSNorm,
rotary embedding, SwiGLU MLP, no biases.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from echo_et.errors import EchoError

DTYPE_NAMES = {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp32": "float"}


@dataclass(frozen=True)
class OpCall:
    op: str
    shapes: str
    dtypes: str
    attrs: dict[str, str] = field(default_factory=dict)


def call(op: str, args: list[tuple[list, str]], **attrs: str) -> OpCall:
    return OpCall(op, json.dumps([a for a, _ in args]), json.dumps([d for _, d in args]), dict(attrs))


@dataclass(frozen=True)
class LayerShape:
    kind: str          # "gpt" or "llama"
    hidden: int
    heads: int
    ffn: int
    seq: int
    micro_batch: int
    tp: int = 1
    dtype: str = "bf16"

    def check(self) -> None:
        if self.kind not in ("gpt", "llama"):
            raise EchoError(f"layer kind {self.kind!r}: use gpt or llama")
        for name in ("hidden", "heads", "ffn", "seq", "micro_batch", "tp"):
            if getattr(self, name) < 1:
                raise EchoError(f"layer {name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.tp or self.ffn % self.tp or self.hidden % self.heads:
            raise EchoError(f"tp {self.tp} must divide heads {self.heads} and ffn {self.ffn}, "
                            f"heads must divide hidden {self.hidden}")
        if self.dtype not in DTYPE_NAMES:
            raise EchoError(f"layer dtype {self.dtype!r}: use one of {', '.join(DTYPE_NAMES)}")


def _linear_fwd(x: list[int], k: int, n: int, dt: str, bias: bool) -> OpCall:
    rows = x[0] * x[1]
    if bias:
        return call("aten::addmm", [([n], dt), ([rows, k], dt), ([k, n], dt), ([], "Scalar"), ([], "Scalar")])
    return call("aten::mm", [([rows, k], dt), ([k, n], dt)])


def _linear_bwd(x: list[int], k: int, n: int, dt: str, bias: bool) -> list[OpCall]:
    rows = x[0] * x[1]
    out = [call("aten::mm", [([rows, n], dt), ([n, k], dt)]),          # grad input
           call("aten::mm", [([n, rows], dt), ([rows, k], dt)])]       # grad weight
    if bias:
        out.append(call("aten::sum", [([rows, n], dt), ([], "ScalarList"), ([], "Scalar"), ([], "")],
                        out_shapes=json.dumps([[n]])))
    return out


def layer_forward(ls: LayerShape) -> tuple[list[OpCall], list[OpCall]]:
    """(attention block, MLP block) of one layer's forward on one tensor-parallel rank."""
    ls.check()
    dt = DTYPE_NAMES[ls.dtype]
    s, b, h, t = ls.seq, ls.micro_batch, ls.hidden, ls.tp
    hp, fp, heads, d = h // t, ls.ffn // t, ls.heads // t, h // ls.heads
    x = [s, b, h]
    gpt = ls.kind == "gpt"
    norm = (call("aten::native_layer_norm", [(x, dt), ([h], "ScalarList"), ([h], dt), ([h], dt), ([], "Scalar")])
            if gpt else call("aten::_fused_rms_norm", [(x, dt), ([h], "ScalarList"), ([h], dt), ([], "Scalar")]))
    q = [b, heads, s, d]
    attn = [norm, _linear_fwd(x, h, 3 * hp, dt, gpt)]
    if not gpt:  # rotary embedding on q and k: x*cos + rotate_half(x)*sin
        for _ in range(2):
            attn += [call("aten::mul", [(q, dt), ([1, 1, s, d], dt)]), call("aten::cat", [([q, q], "TensorList"),
                                                                                     ([], "Scalar")]),
                     call("aten::mul", [(q, dt), ([1, 1, s, d], dt)]), call("aten::add", [(q, dt), (q, dt)])]
    attn += [call("aten::_scaled_dot_product_flash_attention", [(q, dt), (q, dt), (q, dt), ([], "Scalar"),
                                                                 ([], "Scalar"), ([], "Scalar"), ([], "Scalar")],
                  is_causal="1"),
             _linear_fwd([s, b, hp], hp, h, dt, False)]
    if gpt:  # bias + dropout + residual add
        attn += [call("aten::add", [(x, dt), ([h], dt)]), call("aten::native_dropout", [(x, dt), ([], "Scalar"),
                                                                                       ([], "Scalar")])]
    attn.append(call("aten::add", [(x, dt), (x, dt)]))
    mlp = [norm]
    if gpt:
        mlp += [_linear_fwd(x, h, fp, dt, True), call("aten::gelu", [([s, b, fp], dt), ([], "")]),
                _linear_fwd([s, b, fp], fp, h, dt, False), call("aten::add", [(x, dt), ([h], dt)]),
                call("aten::native_dropout", [(x, dt), ([], "Scalar"), ([], "Scalar")])]
    else:
        mlp += [_linear_fwd(x, h, 2 * fp, dt, False), call("aten::silu", [([s, b, fp], dt)]),
                call("aten::mul", [([s, b, fp], dt), ([s, b, fp], dt)]), _linear_fwd([s, b, fp], fp, h, dt, False)]
    mlp.append(call("aten::add", [(x, dt), (x, dt)]))
    return attn, mlp


def layer_backward(ls: LayerShape) -> tuple[list[OpCall], list[OpCall]]:
    """(attention block, MLP block) of one layer's backward on one tensor-parallel rank."""
    ls.check()
    dt = DTYPE_NAMES[ls.dtype]
    s, b, h, t = ls.seq, ls.micro_batch, ls.hidden, ls.tp
    hp, fp, heads, d = h // t, ls.ffn // t, ls.heads // t, h // ls.heads
    x = [s, b, h]
    gpt = ls.kind == "gpt"
    stat = [s, b, 1]
    norm_bwd = (call("aten::native_layer_norm_backward", [(x, dt), (x, dt), ([h], "ScalarList"), (stat, "float"),
                                                         (stat, "float"), ([h], dt), ([h], dt), ([], "ScalarList")])
                if gpt else call("aten::_fused_rms_norm_backward", [(x, dt), (x, dt), ([h], "ScalarList"),
                                                                    (stat, "float"), ([h], dt), ([], "ScalarList")]))
    mlp: list[OpCall] = []
    if gpt:
        mlp += [call("aten::native_dropout_backward", [(x, dt), (x, "bool"), ([], "Scalar")])]
        mlp += _linear_bwd([s, b, fp], fp, h, dt, True)
        mlp += [call("aten::gelu_backward", [([s, b, fp], dt), ([s, b, fp], dt), ([], "")])]
        mlp += _linear_bwd(x, h, fp, dt, True)
    else:
        mlp += _linear_bwd([s, b, fp], fp, h, dt, False)
        mlp += [call("aten::mul", [([s, b, fp], dt), ([s, b, fp], dt)]),
                call("aten::mul", [([s, b, fp], dt), ([s, b, fp], dt)]),
                call("aten::silu_backward", [([s, b, fp], dt), ([s, b, fp], dt)]),
                call("aten::cat", [([[s, b, fp], [s, b, fp]], "TensorList"), ([], "Scalar")])]
        mlp += _linear_bwd(x, h, 2 * fp, dt, False)
    mlp += [norm_bwd, call("aten::add", [(x, dt), (x, dt)])]
    q = [b, heads, s, d]
    attn: list[OpCall] = []
    if gpt:
        attn += [call("aten::native_dropout_backward", [(x, dt), (x, "bool"), ([], "Scalar")])]
    attn += _linear_bwd([s, b, hp], hp, h, dt, gpt)
    attn += [call("aten::_scaled_dot_product_flash_attention_backward",
                  [(q, dt), (q, dt), (q, dt), (q, dt), (q, dt), ([b, heads, s], "float")] + [([], "Scalar")] * 9,
                  is_causal="1")]
    if not gpt:
        for _ in range(2):
            attn += [call("aten::mul", [(q, dt), ([1, 1, s, d], dt)]), call("aten::mul", [(q, dt), ([1, 1, s, d], dt)]),
                     call("aten::add", [(q, dt), (q, dt)])]
    attn += _linear_bwd(x, h, 3 * hp, dt, gpt)
    attn += [norm_bwd, call("aten::add", [(x, dt), (x, dt)])]
    return attn, mlp
