"""Communication kernels of any library are communication, never compute: one test per family,
with kernel names as they appear in the libraries' public sources (demangled the way Kineto
writes them). The source of each name is noted beside it.

The end-to-end test puts one kernel of each family in a Kineto trace and checks the Job:
every one is a ``comm_unknown`` node counted per library in the summary, and ``simulate``
states that it kept their measured time.
"""

from __future__ import annotations

import json

import pytest
from test_kineto_graph import cpu, gpu, rt, write
from typer.testing import CliRunner

from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.converters.kineto.comm_kernels import comm_kernel
from echo_et.ir import check_job, pb
from echo_et.ir.summary import summarize

# deepseek-ai/DeepEP csrc/kernels/intranode.cu, internode.cu, internode_ll.cu (namespace
# deep_ep::intranode / internode / internode_ll): notify_dispatch, dispatch, cached_notify_combine,
# combine, clean_low_latency_buffer.
DEEP_EP = [
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int const*, int*, int, int, int, "
     "bool const*, int*, int*, int, int, void**, int**, int)", "ep_notify"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, "
     "int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, "
     "int, int, int, int, void**, int, int, int)", "ep_dispatch"),
    ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int)", "ep_notify"),
    ("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, int4 const*, "
     "float const*, int const*, int const*, int const*, int const*, int, int, int, int, void**, int, int, int)",
     "ep_combine"),
    ("void deep_ep::internode::notify_dispatch<false, 2>(int const*, int*, int, int const*, int*, int const*, "
     "int*, int, bool const*, int, int, int, int, int, int*, int*, int*, int*, void*, int, void**, int, int**, "
     "int, nvshmem_team_t)", "ep_notify"),
    ("void deep_ep::internode_ll::dispatch<false, false, 7168>(void*, float*, int*, long*, int*, int*, void*, "
     "int*, void*, int*, void const*, long const*, int*, int*, int, int, int, int, int, int, int, int, int)",
     "ep_dispatch"),
    ("void deep_ep::internode_ll::clean_low_latency_buffer<128>(int*, int, int*, int)", "ep_notify"),
]
# Forks keep the kernels in other namespaces: PaddlePaddle (paddle/fluid/distributed/collective/
# deep_ep, namespace deep_ep), MagiAttention's grpcoll (namespace magi_attn_comm::grpcoll::intranode).
EP_OTHER_NAMESPACES = [
    ("void magi_attn_comm::grpcoll::intranode::notify_dispatch<8>(int const*, int*, int const*, int*, int, "
     "int, int, bool const*, int*, int*, int, int, void**, int**, int)", "magi_attn_comm", "ep_notify"),
    ("void intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*)", "ep", "ep_dispatch"),
    ("void internode::combine<__nv_bfloat16, 2, 7168>(int4*, float*, bool const*)", "ep", "ep_combine"),
]
# NVSHMEM: nvshmemi_transfer_rma_p (a kernel name as launched by NVSHMEM, seen in public
# NVBit scripts); nvshmemi_call_barrier_on_stream_kernel (NVSHMEM's barrier_cpu.h); PyTorch's
# symm_mem nvshmem_extension.cu kernels take nvshmem teams.
NVSHMEM = [
    "void nvshmemi_transfer_rma_p<int>(void*, int, int)",
    "void barrier_on_stream_kernel_threadgroup<(threadgroup_t)3>(nvshmem_team_t, int)",
    "nvshmemi_proxy_quiet_entrypoint",
]
# microsoft/mscclpp apps/nccl/src/allreduce.hpp: allreduceAllPairs, allreduce7, allreduce8 over
# mscclpp::DeviceHandle<mscclpp::MemoryChannel>.
MSCCLPP = [
    "void allreduce7<(Op)0, __half>(__half*, __half*, __half*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, "
    "unsigned long, unsigned long, int, int, int, unsigned long, unsigned int*, unsigned int)",
    "void allreduceAllPairs<(Op)0, float>(float*, float*, float*, mscclpp::DeviceHandle<mscclpp::MemoryChannel>*, "
    "unsigned long, unsigned long, int, int, int, unsigned long, unsigned int*, unsigned int)",
]
# Custom all-reduce: vLLM csrc/custom_all_reduce.cuh (vllm::cross_device_reduce_1stage/2stage);
# SGLang sgl-kernel (sglang::cross_device_reduce_1stage); TensorRT-LLM customAllReduceKernels.cu
# (oneShotAllReduceKernel, twoShotAllReduceKernel); PyTorch symmetric memory
# (c10d::symmetric_memory::one_shot_all_reduce_kernel, multimem_all_reduce_kernel).
CUSTOM_AR = [
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, "
     "vllm::Signal*, __nv_bfloat16*, int, int)", "vllm"),
    ("void vllm::cross_device_reduce_2stage<float, 4>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
     "float*, int, int)", "vllm"),
    ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, "
     "sglang::Signal*, __nv_bfloat16*, int, int)", "sglang"),
    ("void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8, true, false>"
     "(tensorrt_llm::kernels::AllReduceParams)", "tensorrt_llm"),
    ("void tensorrt_llm::kernels::twoShotAllReduceKernel<float, 4, false>(tensorrt_llm::kernels::AllReduceParams)",
     "tensorrt_llm"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, "
     "unsigned long, unsigned long, c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
     "torch_symm_mem"),
    ("void c10d::symmetric_memory::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
     "unsigned int**, unsigned long, unsigned long)", "torch_symm_mem"),
]
# RCCL on AMD: one generic kernel per launch, ncclDevKernel_Generic(ncclDevComm*, channelMasks,
# ncclWork*) (ROCm/roctracer issue #101); NCCL names for comparison (NVIDIA/nccl issue #739).
RCCL = ["ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)",
        "ncclDevKernel_Generic_4(ncclDevComm*, channelMasks, ncclWork*)"]
NCCL = ["ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"]
# Look-alikes that are compute: DeepEP's layout kernel counts tokens locally; ATen's reductions
# and scatter/gather indexing kernels.
COMPUTE = [
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, "
    "int, int)",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, "
    "unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::"
    "sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, "
    "float, 4>)",
    "void at::native::_scatter_gather_elementwise_kernel<128, 8, at::native::_cuda_scatter_gather_internal_kernel"
    "<true, float>::operator()(at::TensorIterator&, long, long, long, at::native::ReduceAdd const&)::{lambda(int)#1}"
    ">(int, at::native::_cuda_scatter_gather_internal_kernel<true, float>::operator()(at::TensorIterator&, long, "
    "long, long, at::native::ReduceAdd const&)::{lambda(int)#1})",
    "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(cutlass_80_"
    "tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8::Params)",
    "void dispatch_kernel_impl<float>(float*, int)",
]


@pytest.mark.parametrize("name,family", DEEP_EP)
def test_deep_ep_dispatch_combine_notify(name, family):
    k = comm_kernel(name)
    assert k is not None and k.library == "deep_ep" and k.family == family, k


@pytest.mark.parametrize("name,library,family", EP_OTHER_NAMESPACES)
def test_ep_dispatch_combine_in_any_namespace(name, library, family):
    k = comm_kernel(name)
    assert k is not None and (k.library, k.family) == (library, family), k


@pytest.mark.parametrize("name", NVSHMEM)
def test_nvshmem_kernels(name):
    k = comm_kernel(name)
    assert k is not None and k.library == "nvshmem", k


@pytest.mark.parametrize("name", MSCCLPP)
def test_mscclpp_kernels(name):
    k = comm_kernel(name)
    assert k is not None and k.library == "mscclpp" and k.coll == pb.COLL_ALL_REDUCE, k


@pytest.mark.parametrize("name,library", CUSTOM_AR)
def test_custom_all_reduce_kernels(name, library):
    k = comm_kernel(name)
    assert k is not None and k.library == library and k.coll == pb.COLL_ALL_REDUCE, k


@pytest.mark.parametrize("name", RCCL)
def test_rccl_generic_kernel(name):
    k = comm_kernel(name)
    assert k is not None and k.library == "rccl", k


@pytest.mark.parametrize("name", NCCL)
def test_nccl_kernels(name):
    k = comm_kernel(name)
    assert k is not None and k.library == "nccl", k


@pytest.mark.parametrize("name", COMPUTE)
def test_look_alikes_stay_compute(name):
    assert comm_kernel(name) is None


def test_a_kernel_taking_peer_handles_is_communication():
    # An unknown library's kernel whose name says nothing, but whose parameters are peers' buffers.
    k = comm_kernel("void mylib::exchange_tokens<8>(int**, int const*, RankSignals, int)")
    assert k is not None and k.library == "mylib"


def test_moe_trace_family_end_to_end(tmp_path):
    """Every family in one trace: comm_unknown nodes (never compute), counted per library in the
    summary; simulate keeps their measured time and says so."""
    names = [n for n, _ in DEEP_EP[:4]] + [NVSHMEM[0], MSCCLPP[0], CUSTOM_AR[0][0], CUSTOM_AR[3][0],
                                           EP_OTHER_NAMESPACES[0][0]]
    evs = [cpu("ProfilerStep#1", 100, 100 + 40 * len(names) + 100, cat="user_annotation", **{"Ev Idx": 0}),
           cpu("aten::mm", 110, 20, **{"Ev Idx": 1}), rt("cudaLaunchKernel", 112, 2, 1),
           gpu("void gemm_kernel<float>(float*)", 115, 10, 1, 7)]
    for i, name in enumerate(names):
        t = 150 + 40 * i
        evs += [rt("cudaLaunchKernel", t, 2, 100 + i), gpu(name, t + 5, 20, 100 + i, 9)]
    evs.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                "tid": "PyTorch Profiler", "ts": 0, "dur": 10_000})
    p = write(tmp_path, evs, world_size=1, rank=0, pg_config=[])
    job = read([p], "kineto", ReadOptions())
    assert check_job(job) == []
    g = job.graph(job.graph_ids()[0])
    by = {n.name: n for n in g.nodes}
    for name in names:
        assert by[name].kind == pb.KIND_COMM_UNKNOWN, name
    libs = summarize(job)["comm_libraries"]
    assert libs == {"deep_ep": 4, "magi_attn_comm": 1, "mscclpp": 1, "nvshmem": 1, "tensorrt_llm": 1, "vllm": 1}
    out = tmp_path / "job"
    runner = CliRunner()
    r = runner.invoke(app, ["convert", str(p), "-o", str(out)])
    assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, ["simulate", str(out), "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["diagnostics"]["comm_kept_at_measured_time"] == libs
    r = runner.invoke(app, ["simulate", str(out)])
    assert "kept at measured time" in r.stdout and "deep_ep=4" in r.stdout
    r = runner.invoke(app, ["inspect", str(out)])
    assert "deep_ep=4" in r.stdout
