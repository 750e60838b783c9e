"""The compute model's operator tables: FLOPs, bytes and kernels per operator family, from
hand-computed shapes."""

from __future__ import annotations

import json

import pytest

from echo_et.models.compute import kernels as K
from echo_et.models.compute import ops
from echo_et.models.compute.ops import GUESSED, NO_SHAPES, NO_WORK, PRICED, op_cost

F, BF = "float", "c10::BFloat16"


def cost(op: str, args: list[tuple[object, str]], out_shapes=None, causal: bool = True) -> ops.OpCost:
    return op_cost(op, json.dumps([a for a, _ in args]), json.dumps([d for _, d in args]),
                   json.dumps(out_shapes) if out_shapes is not None else "", causal)


def one(c: ops.OpCost) -> K.Kernel:
    assert c.status == PRICED and len(c.kernels) == 1, c
    return c.kernels[0]


# -- GEMMs ----------------------------------------------------------------------------------
def test_mm_flops_bytes_and_dims():
    k = one(cost("aten::mm", [([64, 128], F), ([128, 32], F)]))
    assert (k.kind, k.m, k.n, k.k, k.batch, k.math) == (K.GEMM, 64, 32, 128, 1, "fp32")
    assert k.flops == 2 * 64 * 32 * 128
    assert k.bytes == (64 * 128 + 128 * 32 + 64 * 32) * 4


def test_addmm_counts_bias_read_and_add():
    k = one(cost("aten::addmm", [([32], BF), ([64, 128], BF), ([128, 32], BF), ([], "Scalar"), ([], "Scalar")]))
    assert k.math == "bf16"
    assert k.flops == 2 * 64 * 32 * 128 + 64 * 32
    assert k.bytes == (32 + 64 * 128 + 128 * 32 + 64 * 32) * 2


def test_bmm_and_baddbmm():
    k = one(cost("aten::bmm", [([8, 16, 64], BF), ([8, 64, 16], BF)]))
    assert (k.batch, k.m, k.n, k.k) == (8, 16, 16, 64)
    assert k.flops == 2 * 8 * 16 * 16 * 64
    assert k.bytes == 8 * (16 * 64 + 64 * 16 + 16 * 16) * 2
    k2 = one(cost("aten::baddbmm", [([8, 16, 16], BF), ([8, 16, 64], BF), ([8, 64, 16], BF), ([], "Scalar"),
                                    ([], "Scalar")]))
    assert k2.flops == k.flops + 8 * 16 * 16


def test_matmul_folds_leading_dims_of_a_2d_right_operand_and_batches_otherwise():
    k = one(cost("aten::matmul", [([4, 10, 32], F), ([32, 8], F)]))
    assert (k.m, k.n, k.k, k.batch) == (40, 8, 32, 1)
    k = one(cost("aten::matmul", [([4, 2, 10, 32], F), ([4, 2, 32, 8], F)]))
    assert (k.m, k.n, k.k, k.batch) == (10, 8, 32, 8)


def test_linear_with_and_without_bias():
    k = one(cost("aten::linear", [([2, 5, 16], F), ([24, 16], F), ([24], F)]))
    assert (k.m, k.n, k.k) == (10, 24, 16)
    assert k.flops == 2 * 10 * 24 * 16 + 10 * 24
    assert k.bytes == (2 * 5 * 16 + 24 * 16 + 24 + 10 * 24) * 4
    k = one(cost("aten::linear", [([2, 5, 16], F), ([24, 16], F), ([], "")]))
    assert k.flops == 2 * 10 * 24 * 16


def test_overload_suffix_is_ignored():
    a = one(cost("aten::mm.default", [([64, 128], F), ([128, 32], F)]))
    b = one(cost("aten::mm", [([64, 128], F), ([128, 32], F)]))
    assert a == b


# -- attention -------------------------------------------------------------------------------
def test_sdpa_flash_forward_flops_causal_halves():
    q = ([2, 4, 256, 64], BF)
    full = one(cost("aten::_scaled_dot_product_flash_attention", [q, q, q, ([], "Scalar")], causal=False))
    half = one(cost("aten::_scaled_dot_product_flash_attention", [q, q, q, ([], "Scalar")], causal=True))
    assert full.kind == K.ATTN_FWD and full.flops == 4 * 2 * 4 * 256 * 256 * 64
    assert half.flops == full.flops / 2
    assert (full.m, full.n, full.k, full.batch) == (256, 256, 64, 8)
    # q, k, v, out (bf16) and the fp32 logsumexp
    assert full.bytes == 4 * 2 * 4 * 256 * 64 * 2 + 2 * 4 * 256 * 4


def test_flash_attention_layout_bshd_reads_heads_from_the_third_dim():
    a = one(cost("aten::_flash_attention_forward", [([2, 256, 4, 64], BF)] * 3, causal=False))
    b = one(cost("aten::_scaled_dot_product_flash_attention", [([2, 4, 256, 64], BF)] * 3, causal=False))
    assert a.flops == b.flops and a.batch == b.batch == 8


def test_attention_backward_is_2_5x_forward_and_efficient_backward_adds_delta_kernels():
    q = ([2, 4, 256, 64], BF)
    fwd = one(cost("aten::_scaled_dot_product_flash_attention", [q, q, q]))
    bwd = one(cost("aten::_scaled_dot_product_flash_attention_backward", [q, q, q, q, q]))
    assert bwd.kind == K.ATTN_BWD and bwd.flops == pytest.approx(2.5 * fwd.flops)
    q4 = ([2, 256, 4, 64], BF)
    eff = cost("aten::_efficient_attention_backward", [q4] * 4 + [([], "")] + [q4])
    assert eff.status == PRICED and [k.kind for k in eff.kernels] == [K.MEM, K.MEM, K.MEM, K.ATTN_BWD]


# -- memory-bound families ----------------------------------------------------------------------
def test_layer_norm_forward_and_backward_kernels():
    n = 8 * 1024
    x = ([8, 1024], BF)
    fwd = one(cost("aten::native_layer_norm", [x, ([1024], "ScalarList"), ([1024], BF), ([1024], BF),
                                               ([], "Scalar")]))
    assert fwd.cls == "norm"
    assert fwd.bytes == 2 * n * 2 + 8 * 4 * 2 + 1024 * 2   # read x, write y, mean+rstd, weight
    bwd = cost("aten::native_layer_norm_backward", [x, x, ([1024], "ScalarList"), ([8, 1], F), ([8, 1], F),
                                                    ([1024], BF), ([1024], BF), ([], "ScalarList")])
    assert [k.cls for k in bwd.kernels] == ["norm", "norm_param_grad"]


def test_softmax_forward_reads_and_writes_backward_reads_two():
    x = ([4, 16, 128], BF)
    n = 4 * 16 * 128 * 2
    assert one(cost("aten::_softmax", [x, ([], "Scalar"), ([], "Scalar")])).bytes == 2 * n
    assert one(cost("aten::_softmax_backward_data", [x, x, ([], "Scalar"), ([], "Scalar")])).bytes == 3 * n


def test_elementwise_broadcast_inplace_and_predicates():
    k = one(cost("aten::add", [([4, 8], F), ([8], F), ([], "Scalar")]))
    assert k.cls == "elementwise" and k.bytes == (32 + 8 + 32) * 4
    assert one(cost("aten::gelu", [([4, 8], BF), ([], "")])).bytes == 2 * 32 * 2
    assert one(cost("aten::mul_", [([4, 8], F), ([], "Scalar")])).bytes == 2 * 32 * 4
    assert one(cost("aten::lt", [([4, 8], F), ([], "Scalar")])).bytes == 32 * 4 + 32 * 1
    assert one(cost("aten::__or__", [([4, 8], "bool"), ([4, 8], "bool")])).bytes == 3 * 32


def test_copies_cat_and_fills():
    assert one(cost("aten::copy_", [([10, 10], F), ([10, 10], BF), ([], "Scalar")])).bytes == 100 * (4 + 2)
    c = one(cost("aten::cat", [([[2, 3], [4, 3]], "TensorList"), ([], "Scalar")]))
    assert c.cls == "copy" and c.bytes == 2 * 18 * 4
    assert one(cost("aten::fill_", [([1000], BF), ([], "Scalar")])).bytes == 2000
    z = one(cost("aten::zeros", [([], "ScalarList"), ([], "Scalar")], out_shapes=[[10, 20]]))
    assert z.cls == "fill" and z.bytes == 200 * 4


def test_dropout_writes_a_one_byte_mask():
    k = one(cost("aten::native_dropout", [([100], BF), ([], "Scalar"), ([], "Scalar")]))
    assert k.bytes == 100 * (2 * 2 + 1)


def test_embedding_forward_and_backward_paths():
    k = one(cost("aten::embedding", [([1000, 64], F), ([4, 16], "long int"), ([], "Scalar"), ([], "Scalar"),
                                     ([], "Scalar")]))
    assert k.cls == "index" and k.bytes == 2 * 64 * 64 * 4 + 64 * 8
    g = ([4, 16, 64], F)
    small = cost("aten::embedding_dense_backward", [g, ([4, 16], "long int")], out_shapes=[[1000, 64]])
    assert [k.cls for k in small.kernels] == ["fill", "embedding_bwd"]   # one-kernel path: 64 indices
    assert small.kernels[0].bytes == 1000 * 64 * 4
    big = cost("aten::embedding_dense_backward", [([8, 1024, 64], F), ([8, 1024], "long int")],
               out_shapes=[[1000, 64]])
    assert len(big.kernels) == ops.EMBEDDING_BWD_SMALL_KERNELS + 3          # the sort path


def test_nll_loss_backward_fills_then_scatters():
    c = cost("aten::nll_loss_backward", [([], F), ([32, 100], F), ([32], "long int")])
    assert [k.cls for k in c.kernels] == ["fill", "index"] and c.kernels[0].bytes == 32 * 100 * 4


def test_foreach_and_fused_adam():
    lst = ([[1000, 10], [10]], "TensorList")
    c = cost("aten::_foreach_add_", [lst, lst, ([], "Scalar")])
    assert len(c.kernels) == 1 and c.kernels[0].cls == "optimizer"
    assert c.kernels[0].bytes == (2 * 10010 + 10010) * 4    # read both lists, write the first
    steps = ([[], []], "TensorList")
    adam = cost("aten::_fused_adamw_", [lst, lst, lst, lst, ([], "TensorList"), steps])
    assert sum(k.bytes for k in adam.kernels) == pytest.approx(7 * 10010 * 4, rel=1e-3)
    many = cost("aten::_foreach_mul_", [([[4]] * 300, "TensorList"), ([], "Scalar")])
    assert len(many.kernels) == 3    # 110 tensors per launch


def test_views_and_communication_cost_nothing():
    for op in ("aten::view", "aten::reshape", "aten::transpose", "aten::empty", "aten::detach", "c10d::allreduce_"):
        assert cost(op, [([4, 4], F)]).status == NO_WORK
        assert cost(op, [([4, 4], F)]).kernels == ()


def test_unknown_operator_is_guessed_and_missing_shapes_reported():
    g = cost("aten::some_new_op", [([4, 4], F)])
    assert g.status == GUESSED and len(g.kernels) == 1 and g.kernels[0].bytes == 2 * 16 * 4
    assert op_cost("aten::mm", "", "").status == NO_SHAPES
    assert op_cost("aten::mm", "not json", "[]").status == NO_SHAPES


def test_megatron_fused_kernels_are_one_memory_bound_kernel_each():
    x = ([4, 8, 16], "c10::Half")
    n = 4 * 8 * 16
    sm = one(cost("echo::scaled_upper_triang_masked_softmax", [x, ([], "Scalar")]))
    # Megatron's kernel reads only the causal triangle (row i: i + 1 of 16 keys) and writes every row
    causal = n * (16 + 1) / (2 * 16)
    assert sm.cls == "softmax" and sm.bytes == pytest.approx((causal + n) * 2)
    assert one(cost("echo::scaled_upper_triang_masked_softmax_backward", [x, x, ([], "Scalar")])).bytes == \
        pytest.approx((2 * causal + n) * 2)
    # the plain softmax reads all of it
    assert one(cost("aten::_softmax", [x, ([], "int"), ([], "bool")])).bytes == 2 * n * 2
    bda = one(cost("echo::bias_dropout_add", [x, ([16], "c10::Half"), x, ([], "Scalar")]))
    assert bda.bytes == (n + 16 + n + n) * 2 + n      # x, bias, residual, out, and the keep mask
    assert one(cost("echo::bias_gelu", [x, ([16], "c10::Half")])).bytes == (n + 16 + n) * 2
