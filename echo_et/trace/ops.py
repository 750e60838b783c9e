"""Which aten operators are kernels, and of what kind: the vocabulary of meta-traced graphs.

A meta-device trace records each operator at the dispatch level (after autograd and after
composite operators such as ``aten::linear`` were decomposed): those are the operators a GPU
would run as kernels. Some of them run no kernel at all (views and other aliasing ops,
allocations, ``detach``): they are not recorded. The same rules pick the kernel-level
operators out of a profiler tree (a CPU trace), where composite operators appear with their
parts nested inside: :func:`decomposed` says which names to look through.

Torch is imported lazily (only :func:`decomposed` needs it).
"""

from __future__ import annotations

import functools
from typing import Any

from echo_et.ir.schema import pb

# Operators that launch no kernel on a GPU (aliasing, allocation, bookkeeping). Views are
# found from their schema (``OpOverload.is_view``); these are the rest.
NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::empty_permuted",
    "aten::new_empty", "aten::new_empty_strided", "aten::resize_", "aten::set_",
    "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::lift",
    "aten::_unsafe_view", "aten::_reshape_alias", "aten::unbind", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::unsafe_split", "aten::unsafe_chunk",
    "aten::_local_scalar_dense", "aten::is_nonzero", "aten::_has_compatible_shallow_copy_type",
    "aten::record_stream", "aten::_version", "aten::requires_grad_", "aten::retain_grad",
    "aten::output_nr", "aten::result_type", "aten::sym_size", "aten::sym_stride",
    "aten::sym_numel", "aten::sym_storage_offset", "aten::size", "aten::stride",
    "aten::dim", "aten::numel", "aten::is_same_size", "aten::_nested_tensor_size",
})

_GEMM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm",
         "aten::_addmm_activation", "aten::addmv", "aten::mv", "aten::dot", "aten::matmul",
         "aten::linear", "aten::_scaled_mm", "aten::_int_mm")
_ATTENTION = ("aten::_scaled_dot_product_flash_attention",
              "aten::_scaled_dot_product_efficient_attention",
              "aten::_scaled_dot_product_cudnn_attention",
              "aten::_scaled_dot_product_flash_attention_for_cpu",
              "aten::_flash_attention_forward", "aten::_efficient_attention_forward",
              "aten::_scaled_dot_product_flash_attention_backward",
              "aten::_scaled_dot_product_efficient_attention_backward",
              "aten::_scaled_dot_product_cudnn_attention_backward",
              "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
              "aten::_flash_attention_backward", "aten::_efficient_attention_backward")
_NORM = ("aten::native_layer_norm", "aten::native_layer_norm_backward",
         "aten::native_batch_norm", "aten::native_batch_norm_backward",
         "aten::_native_batch_norm_legit", "aten::native_group_norm",
         "aten::native_group_norm_backward", "aten::_fused_rms_norm",
         "aten::_fused_rms_norm_backward", "aten::_batch_norm_with_update")
_REDUCTION = ("aten::sum", "aten::mean", "aten::max", "aten::min", "aten::amax", "aten::amin",
              "aten::argmax", "aten::argmin", "aten::prod", "aten::norm", "aten::linalg_vector_norm",
              "aten::var", "aten::var_mean", "aten::std", "aten::logsumexp", "aten::_softmax",
              "aten::_log_softmax", "aten::_softmax_backward_data", "aten::_log_softmax_backward_data",
              "aten::cumsum", "aten::all", "aten::any", "aten::_foreach_norm",
              "aten::nll_loss_forward", "aten::nll_loss_backward", "aten::nll_loss2d_forward")
_EMBEDDING = ("aten::embedding", "aten::embedding_dense_backward", "aten::index_select",
              "aten::gather", "aten::scatter", "aten::scatter_add", "aten::scatter_add_",
              "aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_add_",
              "aten::embedding_backward")
_MEMCPY = ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::cat", "aten::stack",
           "aten::_copy_from", "aten::_copy_from_and_resize", "aten::contiguous")
_CONV = ("aten::convolution", "aten::_convolution", "aten::convolution_backward",
         "aten::cudnn_convolution", "aten::mkldnn_convolution")


@functools.cache
def kernel_class(name: str) -> int:
    """The IR kernel class (``pb.KC_*``) of an operator name (``aten::mm``)."""
    if name in _GEMM:
        return pb.KC_GEMM
    if name in _ATTENTION:
        return pb.KC_ATTENTION
    if name in _NORM:
        return pb.KC_NORM
    if name in _EMBEDDING:
        return pb.KC_EMBEDDING
    if name in _MEMCPY:
        return pb.KC_MEMCPY
    if name in _CONV:
        return pb.KC_CONV
    if "adam" in name or "sgd" in name:
        return pb.KC_OPTIMIZER
    if "softmax" in name:
        return pb.KC_REDUCTION
    if name in _REDUCTION:
        return pb.KC_REDUCTION
    if name.startswith(("aten::", "prims::", "echo::")):
        return pb.KC_ELEMENTWISE
    return pb.KC_OTHER


def _overloads(name: str) -> list[tuple[Any, str]] | None:
    """(packet, overload name) for the non-``out`` overloads of operator ``name`` (no
    overload in the name), or None when torch does not know the operator."""
    import torch

    ns, sep, op = name.partition("::")
    if not sep:
        return None
    try:
        packet = getattr(getattr(torch.ops, ns), op)
    except (AttributeError, RuntimeError):
        return None
    return [(packet, o) for o in packet.overloads() if not o.endswith("out")]


@functools.cache
def decomposed(name: str) -> bool:
    """Whether operator ``name`` (no overload) is composite: it has no kernel of its own and
    runs as other operators (every overload but ``out`` ones is CompositeImplicitAutograd),
    e.g. ``aten::linear``."""
    import torch

    found = False
    for packet, overload in _overloads(name) or ():
        try:
            implicit = torch._C._dispatch_has_kernel_for_dispatch_key(getattr(packet, overload).name(),
                                                                      "CompositeImplicitAutograd")
        except (AttributeError, RuntimeError):
            continue   # a TorchScript-only overload (``aten::__or__.bool``): no dispatch entry
        if not implicit:
            return False
        found = True
    return found


@functools.cache
def is_view_name(name: str) -> bool:
    """Whether every (non-out) tensor overload of operator ``name`` returns an alias of an
    input. Overloads on lists and strings (``aten::slice.t``, TorchScript's) are not tensor
    operators and do not count."""
    found = False
    for packet, overload in _overloads(name) or ():
        try:
            if not _takes_tensor(name, overload):
                continue
            if not getattr(packet, overload).is_view:
                return False
        except (AttributeError, RuntimeError):
            return False
        found = True
    return found


def _takes_tensor(name: str, overload: str) -> bool:
    import torch

    schema = torch._C._get_schema(name, "" if overload == "default" else overload)
    return any("Tensor" in str(a.type) for a in schema.arguments)


KERNEL_NAMESPACES = ("aten::", "echo::")   # echo:: = fused kernels (echo_et.workloads.fused)


def runs_kernel(name: str, is_view: bool | None = None) -> bool:
    """Whether a dispatch-level operator launches work on the device (not a view, an
    allocation or bookkeeping)."""
    if name in NO_KERNEL or not name.startswith(KERNEL_NAMESPACES):
        return False
    return not (is_view if is_view is not None else is_view_name(name))
