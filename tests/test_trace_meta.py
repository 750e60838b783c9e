"""Meta-device tracing: the graph of every rank equals what a full CPU trace gives.

A CPU trace runs every operator for real under the profiler; a meta-device trace runs nothing
(no memory, no time), records dispatch-level operators through a TorchDispatchMode and
records each repeated layer and micro-batch once (echo_et.trace.direct). For a small model
both must give, on every rank, the same kernel-level operators (name, argument shapes and
types, annotations), in the same order, and the same collectives and send/recv.

One known difference, by design of the recorder: with a dispatch mode active the autograd
engine sums two gradient contributions out of place (``aten::add``) where a plain run does it
in place (``aten::add_``); both read two tensors and write one. The comparison maps one to
the other and nothing else.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="meta-device tracing needs torch (the trace extra)")

from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import comm_ops, kernel_ops  # noqa: E402
from echo_et.trace.identity import structure_hash  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

SMALL = dict(layers=4, hidden=32, heads=4, seq=16, micro_batch=2, vocab=100, vocab_multiple=8,
             dtype="float32")


def _norm(ops):
    return [("aten::add" if o[0] == "aten::add_" else o[0], *o[1:]) for o in ops]


def _assert_same_ranks(cfg: GPTConfig, layout: ParallelLayout) -> None:
    opts = dict(verify="all", warmup_steps=0)
    cpu = trace(build_gpt(cfg), layout, TraceOptions(device="cpu", **opts)).job
    meta = trace(build_gpt(cfg), layout, TraceOptions(device="meta", **opts)).job
    replayed = 0
    for r in range(layout.world_size):
        g_cpu, g_meta = cpu.graph_of(r), meta.graph_of(r)
        a, b = _norm(kernel_ops(g_cpu)), _norm(kernel_ops(g_meta))
        assert len(a) > 50
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                     min(len(a), len(b)))
        assert a == b, f"rank {r}: operators differ from op {first} on"
        assert comm_ops(g_cpu) == comm_ops(g_meta), f"rank {r}: communication differs"
        replayed += int(g_meta.header.attrs.get("trace.regions_replayed", "0"))
        replayed += int(g_meta.header.attrs.get("trace.units_replayed", "0"))
    assert replayed > 0, "the meta trace recorded nothing once: the test would not cover replay"


@pytest.mark.parametrize("granularity", ["selective", "full"])
def test_megatron_gpt_meta_equals_cpu_on_every_rank(granularity: str) -> None:
    """Megatron flavour (tied embeddings + their all-reduce, one DP all-reduce after the
    backward, master weights, fused kernels) with activation recomputation at either
    granularity, tp2 x pp2 x dp2."""
    cfg = GPTConfig.megatron(**SMALL, recompute=True, recompute_granularity=granularity)
    _assert_same_ranks(cfg, ParallelLayout(dp=2, tp=2, pp=2, microbatches=3))


def test_overlapped_grad_sync_meta_equals_cpu() -> None:
    """Megatron layers without recomputation, but DDP-style bucketed all-reduces issued from
    gradient hooks during the last micro-batch's backward, untied head, torch Adam."""
    cfg = GPTConfig(**SMALL, attention="megatron", bucket_mb=0.001)
    _assert_same_ranks(cfg, ParallelLayout(dp=2, tp=1, pp=2, microbatches=4))


def _meta(cfg: GPTConfig, layout: ParallelLayout, **kw):
    return trace(build_gpt(cfg), layout, TraceOptions(device="meta", **kw))


def test_replay_changes_nothing_and_warmup_is_not_needed_for_megatron() -> None:
    cfg = GPTConfig.megatron(**SMALL, recompute=True)
    lay = ParallelLayout(dp=1, tp=2, pp=2, microbatches=4)
    full = _meta(cfg, lay, replay=False, warmup_steps=1).job
    fast = _meta(cfg, lay, replay=True, warmup_steps=0, verify="stage").job
    for r in range(lay.world_size):
        assert not full.graph_of(r).has_repeats
        expanded = fast.graph_of(r).copy()
        expanded.expand()     # replayed regions are repeat blocks; what they mean is the same
        assert structure_hash(full.graph_of(r)) == structure_hash(expanded)
    assert int(fast.graph_of(0).header.attrs["trace.regions_replayed"]) >= 3
    assert fast.graph_of(0).has_repeats


def test_meta_graph_shape_host_and_groups() -> None:
    """Device streams plus the issuing host; pipeline exchanges block the host; the shared
    embedding's all-reduce runs on the derived "embd" group of first and last stage."""
    cfg = GPTConfig.megatron(**SMALL)
    lay = ParallelLayout(dp=2, tp=1, pp=2, microbatches=2)
    job = _meta(cfg, lay, verify="stage", warmup_steps=0).job
    g = job.graph_of(0)
    assert g.header.attrs["trace.timing"] == "untimed"
    by_id = {n.id: n for n in g.nodes}
    computes = [n for n in g.nodes if n.kind == pb.KIND_COMPUTE]
    assert computes and all(n.duration_ns == 0 and n.start_ns == 0 for n in g.nodes)
    for n in computes:
        launches = [by_id[d.id] for d in n.deps if d.kind == pb.DEP_LAUNCH]
        assert len(launches) == 1 and launches[0].kind == pb.KIND_LAUNCH
        assert launches[0].cpu.op == n.compute.op
    syncs = [n for n in g.nodes if n.kind == pb.KIND_SYNC]
    assert len(syncs) >= 2   # after the pipeline exchanges, and the gradient norm's .item()
    assert "embd" in g.header.group_sizes and "mp" in g.header.group_sizes
    embd = job.resolve_group(0, "embd")
    assert list(embd.ranks) == [0, 2]
    assert "embd" not in job.binding(1).groups or list(job.resolve_group(1, "embd").ranks) == [1, 3]
    # the vocabulary is padded to a multiple of 8 x tp: 104 rows
    emb = [n for n in computes if n.compute.op == "aten::embedding"]
    assert emb and emb[0].compute.shapes.startswith("[[104, 32]")


def test_full_size_model_traces_without_memory() -> None:
    """A layer of GPT-175B's width on the meta device: shapes kept, nothing allocated."""
    cfg = GPTConfig.megatron(layers=2, hidden=12288, heads=96, seq=2048, micro_batch=1)
    res = _meta(cfg, ParallelLayout(dp=1, tp=8, pp=1, microbatches=2), verify="stage",
                warmup_steps=0)
    g = res.job.graph_of(0)
    mms = [n.compute.shapes for n in g.nodes if n.kind == pb.KIND_COMPUTE and n.compute.op == "aten::mm"]
    assert "[[2048, 12288], [12288, 6144]]" in mms   # MLP in: hidden x 4*hidden/tp
    assert res.peak_memory_bytes == {0: 0}
