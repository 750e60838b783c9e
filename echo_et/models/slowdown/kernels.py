"""Kernel names and classes as the slowdown model sees them.

Profilers name the same kernel differently (``void at::native::vectorized_elementwise_kernel
<4, ...>(int, ...)`` in Kineto, ``vectorized_elementwise_kernel`` as Nsight's short name);
the model keys kernels by the short form so that factors learned from one source apply to
the other.
"""

from __future__ import annotations

import re

from echo_et.ir.schema import KERNEL_CLASS_NAMES, pb

_CLASS_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE))
    for name, pattern in (
        ("attention", r"fmha|flash|attention|attn|sdpa"),
        ("conv", r"conv|winograd|wgrad|dgrad"),
        ("gemm", r"gemm|matmul|cublas|cutlass.*(?:tensorop|wmma)|\bmm\b|addmm|bmm|linear"),
        ("norm", r"norm|gammabeta"),
        ("optimizer", r"adam|sgd|lamb|optimizer|multi_tensor_apply"),
        ("embedding", r"embedding|embed"),
        ("reduction", r"reduce|softmax|sum_|\bsum\b|mean|argmax|topk|scan|sort"),
        ("elementwise", r"elementwise|unrolled|vectorized|activation|gelu|relu|silu|dropout|mul|add"),
        ("memcpy", r"memcpy|copy|catarray|\bcat\b|gather|scatter|index"),
    )
)
_TEMPLATE = re.compile(r"<[^<>]*>")


def short_kernel_name(name: str) -> str:
    """``void ns::kernel<T, ...>(args)`` -> ``kernel``; plain names are returned as is."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    # Drop template arguments (nested ones too) and the argument list.
    prev = None
    while prev != s:
        prev = s
        s = _TEMPLATE.sub("", s)
    s = s.split("(", 1)[0].strip()
    s = s.rsplit("::", 1)[-1]
    return s or name


def classify_kernel(name: str) -> str:
    """Kernel class name (see ``echo_et.ir.schema.KERNEL_CLASS_NAMES``) guessed from a name."""
    short = short_kernel_name(name)
    for cls, rx in _CLASS_RULES:
        if rx.search(short):
            return cls
    return "other"


def node_kernel_class(node: pb.Node) -> str:
    """The class a converter recorded, else one guessed from the kernel name."""
    if node.HasField("compute") and node.compute.kernel_class != pb.KC_OTHER:
        return KERNEL_CLASS_NAMES.get(node.compute.kernel_class, "other")
    return classify_kernel(node_kernel_name(node))


def node_kernel_name(node: pb.Node) -> str:
    if node.HasField("compute") and node.compute.op:
        return node.compute.op
    return node.name
