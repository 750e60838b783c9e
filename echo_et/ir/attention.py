"""Whether a traced attention call was causal, from the argument values a trace recorded.

The compute model prices attention from shapes, and a causal call does about half the work of
a bidirectional one of the same shapes (an encoder's, a context-parallel ring's off-diagonal
blocks). Shapes do not say which: the argument values do. Kineto records them, as text, in a
host operator's ``Concrete Inputs`` (with ``record_shapes``); a host execution trace records
them, as JSON values, in a node's ``inputs.values`` and names them in its ``op_schema``. Both
list every argument of the operator's schema in order, keyword-only ones included, so one
position per operator finds the flag in either.

The converters write what they find as ``attrs[CAUSAL_ATTR]`` ("1" or "0") on the operator's
node; the meta-device tracer writes "0" for ``is_causal=False``; the compute model reads it,
and takes attention as causal when it is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CAUSAL_ATTR = "is_causal"

# Operator -> positions of its causal argument, from the public schemas (PyTorch 2.x's
# native_functions.yaml; flash-attn 2's torch.library registrations), tried in order: the
# first that holds a flag is the one (an overload with more leading arguments, as the
# quantized flash attention's three scales, moves it; arguments added at the end in later
# releases do not). "custom_mask_type" (the efficient-attention kernels) is an int: 0 no
# mask, 1 causal from the top left, 2 causal from the bottom right.
CAUSAL_POSITIONS: dict[str, tuple[int, ...]] = {
    "aten::scaled_dot_product_attention": (5,),
    "aten::_scaled_dot_product_flash_attention": (4, 7),
    "aten::_scaled_dot_product_flash_attention_for_cpu": (4,),
    "aten::_scaled_dot_product_efficient_attention": (6,),
    "aten::_scaled_dot_product_cudnn_attention": (6,),
    "aten::_scaled_dot_product_fused_attention_overrideable": (5,),
    "aten::_flash_attention_forward": (8,),
    "aten::_efficient_attention_forward": (9,),
    "aten::_scaled_dot_product_flash_attention_backward": (11,),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": (7,),
    "aten::_scaled_dot_product_efficient_attention_backward": (11,),
    "aten::_scaled_dot_product_cudnn_attention_backward": (14,),
    "aten::_scaled_dot_product_fused_attention_overrideable_backward": (13,),
    "aten::_flash_attention_backward": (11,),
    "aten::_efficient_attention_backward": (14,),
    "flash_attn::_flash_attn_forward": (5,),
    "flash_attn::_flash_attn_varlen_forward": (9,),
    "flash_attn::_flash_attn_backward": (11,),
    "flash_attn::_flash_attn_varlen_backward": (15,),
}
_CAUSAL_NAMES = ("is_causal", "causal", "custom_mask_type")
_TRUE = frozenset({"True", "true", "1"})
_FALSE = frozenset({"False", "false", "0"})
_NOT_CAUSAL = frozenset({"0", "false", "False", "no"})


def is_causal(attrs: Mapping[str, str]) -> bool:
    """What a node's attrs say (``CAUSAL_ATTR``): causal unless told otherwise, as every
    traced GPT's attention is and as a trace without the flag is taken."""
    return attrs.get(CAUSAL_ATTR, "1") not in _NOT_CAUSAL


def is_attention(op: str) -> bool:
    """An operator whose recorded arguments say whether it was causal."""
    return op in CAUSAL_POSITIONS


def causal_text(op: str, values: Any, schema: str = "") -> str:
    """"1" or "0" for an attention call's recorded argument values (Kineto's ``Concrete
    Inputs`` strings or a host trace's JSON values; a host trace's ``op_schema`` names the
    argument), "" when they do not say: no flag where the schema (or, without one, the
    operator's entry in CAUSAL_POSITIONS) puts it."""
    if type(values) is not list or not values:
        return ""
    if schema:
        pos = _position_in_schema(schema)
        if 0 <= pos < len(values):
            return _flag_text(values[pos])
    for pos in CAUSAL_POSITIONS.get(op, ()):
        if pos < len(values):
            got = _flag_text(values[pos])
            if got:
                return got
    return ""


def _flag_text(v: Any) -> str:
    if v is True or v is False:
        return "1" if v else "0"
    if type(v) is int:   # custom_mask_type in a host trace
        return "0" if v == 0 else ("1" if v in (1, 2) else "")
    if type(v) is str:
        v = v.strip()
        if v in _TRUE or v == "2":
            return "1"
        if v in _FALSE:
            return "0"
    return ""


def _position_in_schema(schema: str) -> int:
    """Position of the causal argument in an ``op_schema`` text (``ns::op(Tensor query, ...,
    bool is_causal=False, *, float? scale=None) -> Tensor``), -1 when it names none."""
    start = schema.find("(")
    end = schema.rfind(") ->")
    if start < 0 or end < start:
        return -1
    pos = 0
    for arg in schema[start + 1:end].split(","):
        arg = arg.strip()
        if not arg or arg == "*":
            continue
        name = arg.split("=", 1)[0].split()[-1] if arg.split("=", 1)[0].split() else ""
        if name in _CAUSAL_NAMES:
            return pos
        pos += 1
    return -1
