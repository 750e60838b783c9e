"""The IR's one home for dtypes and collective names: every spelling readers meet."""

from __future__ import annotations

import pytest

from echo_et.ir import pb
from echo_et.ir.collectives import (
    RECV,
    SEND,
    SIMAI_NAMES,
    collective_word,
    find_collective,
    kernel_collective,
    normalize_collective,
    normalize_comm,
)
from echo_et.ir.dtypes import SIZES, c10_name, canonical_dtype, dtype_size


@pytest.mark.parametrize(("spelling", "canonical", "size"), [
    # torch
    ("torch.bfloat16", "bfloat16", 2), ("torch.float32", "float32", 4), ("torch.int64", "int64", 8),
    ("c10::BFloat16", "bfloat16", 2), ("c10::Half", "float16", 2), ("BFloat16", "bfloat16", 2),
    ("Float", "float32", 4), ("Long", "int64", 8), ("Char", "int8", 1), ("Byte", "uint8", 1),
    ("Tensor(c10::Half)", "float16", 2), ("long int", "int64", 8), ("unsigned char", "uint8", 1),
    ("c10::complex<float>", "complex64", 8), ("c10::complex<c10::Half>", "complex32", 4),
    ("Float8_e4m3fn", "float8_e4m3fn", 1), ("c10::Float8_e5m2", "float8_e5m2", 1),
    # nccl-tests type column and NCCL kernel name pieces
    ("float", "float32", 4), ("half", "float16", 2), ("bfloat16", "bfloat16", 2), ("int8", "int8", 1),
    ("uint8", "uint8", 1), ("int32", "int32", 4), ("int64", "int64", 8), ("double", "float64", 8),
    ("f8e4m3", "float8_e4m3fn", 1), ("fp8_e5m2", "float8_e5m2", 1), ("bf16", "bfloat16", 2),
    ("f32", "float32", 4), ("int8_t", "int8", 1), ("uint64_t", "uint64", 8),
    # unknown
    ("nonsense", None, None), ("", None, None), (None, None, None),
])
def test_dtype_spellings(spelling, canonical, size) -> None:
    assert canonical_dtype(spelling) == canonical
    assert dtype_size(spelling) == size


def test_every_canonical_dtype_has_a_c10_name_and_reads_back() -> None:
    for name, size in SIZES.items():
        assert canonical_dtype(name) == name and dtype_size(name) == size
        assert canonical_dtype(c10_name(name)) == name


@pytest.mark.parametrize(("name", "want"), [
    # c10d op and record_param_comms names, with prefixes and decorations
    ("allreduce", pb.COLL_ALL_REDUCE), ("c10d::allreduce_", pb.COLL_ALL_REDUCE),
    ("_allgather_base", pb.COLL_ALL_GATHER), ("allgather_into_tensor_coalesced", pb.COLL_ALL_GATHER),
    ("_c10d_functional::all_gather_into_tensor", pb.COLL_ALL_GATHER),
    ("c10d::reduce_scatter_tensor_coalesced_", pb.COLL_REDUCE_SCATTER),
    ("all_to_allv", pb.COLL_ALL_TO_ALL), ("alltoall_base", pb.COLL_ALL_TO_ALL),
    ("monitored_barrier", pb.COLL_BARRIER), ("recvAnySource", RECV), ("c10d::send", SEND),
    # backend annotations
    ("nccl:all_reduce", pb.COLL_ALL_REDUCE), ("gloo:broadcast", pb.COLL_BROADCAST),
    ("nccl:send 0->1", SEND), ("fake:all_to_all", pb.COLL_ALL_TO_ALL),
    # NCCL kernels
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", pb.COLL_ALL_GATHER),
    ("void ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", pb.COLL_ALL_REDUCE),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", None),  # grouped P2P
    # Chakra / ASTRA-sim, SimAI and the IR's own names
    ("ALL_REDUCE", pb.COLL_ALL_REDUCE), ("REDUCE_SCATTER_BLOCK", pb.COLL_REDUCE_SCATTER),
    ("ALL_TO_ALL", pb.COLL_ALL_TO_ALL), ("ALLGATHER", pb.COLL_ALL_GATHER), ("all_reduce", pb.COLL_ALL_REDUCE),
    # not communication
    ("c10d::wait", None), ("_c10d_functional::wait_tensor", None), ("init", None),
    ("startCoalescing", None), ("aten::add", None), ("", None),
])
def test_one_normaliser(name, want) -> None:
    assert normalize_comm(name) == want
    assert normalize_collective(name) == (want if isinstance(want, int) else None)


def test_strict_words_find_in_text_and_simai() -> None:
    assert collective_word("allreduce_foo") is None and normalize_comm("allreduce_foo") == pb.COLL_ALL_REDUCE
    assert kernel_collective("ncclDevKernel_SendRecv(x)") == "sendrecv"
    assert find_collective("ncclDevKernel_SendRecv") == pb.COLL_ALL_TO_ALL  # NCCL's all-to-all
    assert find_collective("sendrecv_perf", sendrecv=None) is None
    assert find_collective("all_reduce_perf.log") == pb.COLL_ALL_REDUCE
    assert find_collective("reduce_scatter_perf") == pb.COLL_REDUCE_SCATTER
    assert find_collective("matmul") is None
    assert SIMAI_NAMES["REDUCESCATTER"] == pb.COLL_REDUCE_SCATTER and "all_reduce" not in SIMAI_NAMES
