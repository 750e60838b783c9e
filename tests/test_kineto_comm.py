"""Naming and sizing communication: NCCL kernel names of every era, host op names, bytes."""

from __future__ import annotations

import pytest

from echo_et.converters.kineto import comm
from echo_et.converters.kineto.events import K_CPU, Ev
from echo_et.converters.kineto.kernel_class import kernel_class
from echo_et.ir import pb


@pytest.mark.parametrize("name, coll, algo, dtype", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     pb.COLL_ALL_REDUCE, "ring_ll", "float"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", pb.COLL_ALL_REDUCE, "ring_ll", "float"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", "sendrecv", "ring_simple", "int8_t"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
     pb.COLL_BROADCAST, "ring_ll", "int8_t"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", pb.COLL_ALL_GATHER,
     "ring_ll", ""),
    ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
     pb.COLL_REDUCE_SCATTER, "ring_ll", "bf16"),
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL128(ncclDevKernelArgsStorage<4096ul>)",
     pb.COLL_ALL_REDUCE, "tree_ll128", "f32"),
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", pb.COLL_ALL_REDUCE, "ring_ll", "f32"),
    ("ncclReduceTreeLLKernel_sum_f16(ncclColl)", pb.COLL_REDUCE, "tree_ll", "f16"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "sendrecv", "", ""),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None, "", ""),
])
def test_nccl_kernel_names(name, coll, algo, dtype):
    assert comm.is_nccl_kernel(name) and not comm.is_other_comm_kernel(name)
    k = comm.parse_nccl_kernel(name)
    assert (k.coll, k.algorithm, k.dtype) == (coll, algo, dtype)


@pytest.mark.parametrize("name, other", [
    ("void vllm::cross_device_reduce_1stage<float, 8>(vllm::RankData*, ...)", True),
    ("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", True),
    ("mscclpp::allreduce6(float*)", True),
    ("userbuffers_fp16_sum_inplace_gpu_rw(int, int)", True),
    ("void c10d::symmetric_memory::two_shot_all_reduce_kernel<float, 8>(float**)", True),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor>(int)", False),
    ("volta_sgemm_128x64_nn", False),
])
def test_other_communication_kernels(name, other):
    assert comm.is_other_comm_kernel(name) is other


@pytest.mark.parametrize("word, coll", [
    ("allreduce", pb.COLL_ALL_REDUCE), ("_allgather_base", pb.COLL_ALL_GATHER),
    ("allgather_into_tensor_coalesced", pb.COLL_ALL_GATHER),
    ("reduce_scatter_tensor_coalesced", pb.COLL_REDUCE_SCATTER),
    ("_reduce_scatter_base", pb.COLL_REDUCE_SCATTER), ("all_to_all", pb.COLL_ALL_TO_ALL),
    ("alltoall_base", pb.COLL_ALL_TO_ALL), ("all_to_allv", pb.COLL_ALL_TO_ALL),
    ("broadcast", pb.COLL_BROADCAST), ("reduce", pb.COLL_REDUCE), ("barrier", pb.COLL_BARRIER),
    ("send", "send"), ("recv", "recv"), ("recvAnySource", "recv"),
    ("wait", None), ("init", None), ("startCoalescing", None),
])
def test_collective_words(word, coll):
    assert comm.collective_word(word) == coll


@pytest.mark.parametrize("op, coll", [
    ("nccl:all_reduce", pb.COLL_ALL_REDUCE), ("nccl:_all_gather_base", pb.COLL_ALL_GATHER),
    ("nccl:send 0->1", "send"), ("gloo:all_to_all", pb.COLL_ALL_TO_ALL),
    ("c10d::_reduce_scatter_base_", pb.COLL_REDUCE_SCATTER), ("c10d::recv_", "recv"),
    ("_c10d_functional::all_gather_into_tensor", pb.COLL_ALL_GATHER),
    ("_c10d_functional::wait_tensor", None), ("aten::add", None), ("record_param_comms", None),
])
def test_host_op_names(op, coll):
    assert comm.op_collective(op) == coll


def _op(name, dims, types, concrete=None) -> Ev:
    args = {"Input Dims": dims, "Input type": types}
    if concrete is not None:
        args["Concrete Inputs"] = concrete
    return Ev(K_CPU, name, (1, 1), 0, 10, -1, 0, args)


def test_c10d_input_and_output_tensors():
    # alltoall_base_(output, input, ...): the output comes first.
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("c10d::alltoall_base_", [[768], [3392], [], [], [], []],
                              ["int", "int", "", "", "", "Scalar"]))
    assert (info.coll, info.in_bytes, info.out_bytes) == (pb.COLL_ALL_TO_ALL, 3392 * 4, 768 * 4)
    # all-gather: per-rank input is the shard; output is shard x group size.
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("c10d::_allgather_base_", [[1024], [16], [], [], []],
                              ["float", "float", "", "Scalar", "Scalar"]))
    assert comm.finish_sizes(info, 64) == ""
    assert (info.in_bytes, info.out_bytes) == (64, 4096)
    # reduce-scatter from an annotation (input only): output = input / group size.
    info = comm.CommInfo()
    comm.merge_annotation(info, _op("nccl:_reduce_scatter_base", [[65536, 384]], ["float"]))
    comm.finish_sizes(info, 16)
    assert (info.coll, info.in_bytes, info.out_bytes) == \
        (pb.COLL_REDUCE_SCATTER, 65536 * 384 * 4, 65536 * 384 * 4 // 16)


def test_tensor_lists_without_dtype_are_guessed_and_said():
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("c10d::allreduce_", [[[128, 128]], [], [], [], [], []],
                              ["TensorList", "", "", "", "Scalar", "Scalar"]))
    assert info.in_bytes is None and info.in_elems == 128 * 128
    assert comm.finish_sizes(info, 8) == "collective_dtype_guessed"
    assert info.in_bytes == info.out_bytes == 128 * 128 * 4
    # An unrecorded TensorList (old traces) gives nothing: size unknown.
    info = comm.CommInfo(coll=pb.COLL_ALL_REDUCE)
    comm.merge_c10d(info, _op("c10d::allreduce_", [[], [], [], []], ["TensorList", "", "", "Scalar"]))
    assert comm.finish_sizes(info, 8) == "collective_size_unknown" and info.in_bytes == 0


def test_meta_args_win_and_peers():
    info = comm.CommInfo()
    comm.merge_meta(info, {"Collective name": "_allgather_base", "In msg nelems": 10,
                           "Out msg nelems": 80, "dtype": "BFloat16", "Group size": 8,
                           "Process Group Name": "3", "Process Group Ranks": "[0, 1, 2, ...]",
                           "Global rank start": 0, "Global rank stride": 2}, "kernel_args")
    comm.merge_annotation(info, _op("nccl:all_reduce", [[999]], ["float"]))
    assert (info.coll, info.in_bytes, info.out_bytes, info.dtype) == (pb.COLL_ALL_GATHER, 20, 160, "BFloat16")
    assert info.pg_name == "3" and info.pg_ranks is None          # a truncated list is no list
    assert (info.rank_start, info.rank_stride, info.group_size) == (0, 2, 8)
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("c10d::send", [[[5]], [], [], []], ["TensorList", "", "Scalar", "Scalar"],
                              ["", "", "1", "0"]))
    assert (info.coll, info.peer) == ("send", 1)
    info = comm.CommInfo()
    comm.merge_annotation(info, _op("nccl:recv 1<-0", [[5]], ["float"]))
    assert (info.coll, info.peer, info.in_bytes) == ("recv", 0, 20)


def test_all_to_all_split_sizes():
    # c10d::alltoall_base_(output, input, pg, output_split_sizes, input_split_sizes, ...), as
    # PyTorch 2.13 records it (rows of dim 0, group-rank order).
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("c10d::alltoall_base_", [[4, 3], [3, 3], [], [], [], [], []],
                              ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
                              ["", "", "", "[1, 3]", "[1, 2]", "False", "-1"]))
    assert (info.in_splits, info.out_splits, info.in_bytes, info.out_bytes) == ([1, 2], [1, 3], 36, 48)
    assert comm.split_bytes(info.in_splits, info.in_bytes, 2) == ([12, 24], "")
    assert comm.split_bytes(info.out_splits, info.out_bytes, 2) == ([12, 36], "")
    # _c10d_functional::all_to_all_single(input, output_split_sizes, input_split_sizes, group).
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("_c10d_functional::all_to_all_single", [[6], [], [], []],
                              ["float", "ScalarList", "ScalarList", ""], ["", "[3, 3]", "[5, 1]", "0"]))
    assert (info.in_splits, info.out_splits) == ([5, 1], [3, 3])
    # alltoall_(outputs, inputs, ...): one tensor per peer.
    info = comm.CommInfo()
    comm.merge_c10d(info, _op("c10d::alltoall_", [[[2, 2], [1, 2]], [[3, 2], [4, 2]], [], []],
                              ["TensorList", "TensorList", "", "Scalar"]))
    assert (info.in_splits, info.out_splits, info.in_elems) == ([6, 8], [4, 2], 14)
    # record_param_comms args: empty lists are even splits; truncated lists are said.
    info = comm.CommInfo()
    comm.merge_meta(info, {"Collective name": "all_to_allv", "In split size": "[]",
                           "Out split size": "[]"}, "record_param_comms")
    assert (info.in_splits, info.out_splits, info.splits_truncated) == (None, None, False)
    comm.merge_meta(info, {"In split size": "[1, 2, ...]", "Out split size": "[2, 1]"}, "kernel_args")
    assert (info.in_splits, info.out_splits, info.splits_truncated) == (None, [2, 1], True)


@pytest.mark.parametrize("splits, total, group, want", [
    (None, 40, 2, (None, "")),
    ([1, 3], 40, 2, ([10, 30], "")),
    ([0, 0], 0, 2, ([0, 0], "")),
    ([1, 3], 40, 3, (None, "all_to_all_splits_inconsistent")),   # not one size per member
    ([1, 2], 40, 2, (None, "all_to_all_splits_inconsistent")),   # 40 bytes are not 3 equal rows
    ([0, 0], 8, 2, (None, "all_to_all_splits_inconsistent")),
])
def test_split_bytes(splits, total, group, want):
    assert comm.split_bytes(splits, total, group) == want


@pytest.mark.parametrize("dtype, size", [("Float", 4), ("BFloat16", 2), ("c10::Half", 2),
                                         ("long int", 8), ("Long", 8), ("unsigned char", 1),
                                         ("double", 8), ("Float8_e4m3fn", 1), ("nonsense", None)])
def test_element_sizes(dtype, size):
    assert comm.elem_size(dtype) == size


@pytest.mark.parametrize("name, kc", [
    ("volta_sgemm_128x64_nn", pb.KC_GEMM),
    ("void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 32, true, 1>(float)", pb.KC_NORM),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor>(int)",
     pb.KC_ELEMENTWISE),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>", pb.KC_ATTENTION),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>(...)", pb.KC_REDUCTION),
    ("mystery", pb.KC_OTHER),
])
def test_kernel_classes(name, kc):
    assert kernel_class(name) == kc
