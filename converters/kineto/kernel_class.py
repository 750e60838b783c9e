"""A GPU kernel's class (gemm, attention, norm, ...) from its name: what the overlap-slowdown
model keys on. First matching rule wins; unmatched kernels are "other"."""

from __future__ import annotations

import re
from functools import lru_cache

from echo_et.ir.schema import pb

_RULES: list[tuple[int, re.Pattern[str]]] = [
    (pb.KC_ATTENTION, re.compile(r"flash|fmha|attention|attn|sdpa|mha_", re.I)),
    (pb.KC_NORM, re.compile(r"norm|bn_fw|bn_bw|batchnorm|_bn_|welford", re.I)),
    (pb.KC_CONV, re.compile(r"conv|implicit_gemm|winograd|wgrad|dgrad|fprop", re.I)),
    (pb.KC_GEMM, re.compile(r"gemm|gemv|cublas|cutlass|xmma|matmul|hgemm|sgemm|Cijk_|"
                            r"dot_kernel|splitk|nvjet", re.I)),
    (pb.KC_EMBEDDING, re.compile(r"embedding|split_embedding|tbe_|index_select|"
                                 r"indexSelect|gather_kernel|EmbeddingBag", re.I)),
    (pb.KC_OPTIMIZER, re.compile(r"adam|sgd|lamb|adagrad|multi_tensor_apply|optimizer|"
                                 r"_foreach_", re.I)),
    (pb.KC_REDUCTION, re.compile(r"reduce|softmax|sum_kernel|cross_entropy|nll_loss|"
                                 r"argmax|cumsum|scan_kernel|topk", re.I)),
    (pb.KC_MEMCPY, re.compile(r"copy_kernel|CatArray|memcpy|direct_copy|transpose|"
                              r"permute", re.I)),
    (pb.KC_ELEMENTWISE, re.compile(r"elementwise|pointwise|vectorized|unrolled|"
                                   r"activation|relu|gelu|silu|sigmoid|tanh|dropout|"
                                   r"fill_kernel|clamp", re.I)),
]


@lru_cache(maxsize=65536)
def kernel_class(name: str) -> int:
    head = name.split("(", 1)[0] if "(" in name else name
    for kc, pattern in _RULES:
        if pattern.search(head):
            return kc
    return pb.KC_OTHER
