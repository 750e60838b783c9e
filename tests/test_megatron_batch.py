"""Megatron's ``get_batch`` at the start of every micro-batch's forward: the tokens broadcast
over the tensor-parallel group after their sizes, which the host reads back (one device
synchronisation per micro-batch), then inputs, labels and masks built on the device."""

from __future__ import annotations

from collections import Counter

import pytest

torch = pytest.importorskip("torch", reason="the workload needs torch (the trace extra)")

from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import comm_sequence, kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402
from echo_et.workloads.megatron import MAX_DATA_DIM, get_batch  # noqa: E402

SHAPE = dict(layers=2, hidden=32, heads=4, seq=16, micro_batch=2, vocab=96, recompute=True)
#: what get_batch launches on every rank, in order: the sizes' and the tokens' copies to the
#: device, labels and inputs made contiguous, the causal mask (ones, tril, < 0.5), the loss
#: mask and the position ids
BATCH_KERNELS = ["aten::_to_copy", "aten::_to_copy", "aten::clone", "aten::clone", "aten::ones",
                 "aten::tril", "aten::ones", "aten::arange", "aten::lt"]


def _job(layout: ParallelLayout, **kw):
    return trace(build_gpt(GPTConfig.megatron(**SHAPE)), layout,
                 TraceOptions(device="meta", replay=False, warmup_steps=0, **kw)).job


def test_get_batch_gives_megatrons_tensors() -> None:
    text = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(3))
    b = get_batch(text, None, "cpu")
    assert torch.equal(b.tokens, text[:, :-1]) and torch.equal(b.labels, text[:, 1:])
    assert b.tokens.is_contiguous() and b.labels.is_contiguous()
    assert b.loss_mask.dtype == torch.float32 and bool((b.loss_mask == 1).all())
    assert b.attention_mask.shape == (1, 1, 16, 16) and b.attention_mask.dtype == torch.bool
    # True where a query may not look: above the diagonal, as Megatron's (tril < 0.5)
    assert torch.equal(b.attention_mask[0, 0], torch.ones(16, 16, dtype=torch.bool).triu(1))
    assert torch.equal(b.position_ids, torch.arange(16).expand(2, 16))
    assert MAX_DATA_DIM == 5


@pytest.mark.parametrize("tp", [1, 2])
def test_every_micro_batch_forward_begins_with_get_batch(tp: int) -> None:
    layout = ParallelLayout(tp=tp, pp=2, microbatches=3)
    job = _job(layout)
    for rank in range(layout.world_size):
        g = job.graph_of(rank)
        ops = kernel_ops(g)
        where = [(a[0], a[2]) for *_, a in ops]        # (phase, micro-batch)
        starts = [i for i, w in enumerate(where) if w[0] == "forward" and (i == 0 or where[i - 1] != w)]
        assert len(starts) == layout.microbatches, rank    # every stage, every micro-batch
        for i in starts:
            assert [name for name, *_ in ops[i:i + len(BATCH_KERNELS)]] == BATCH_KERNELS, rank
        # the tokens' copy: b x (s + 1) int64
        assert ops[starts[0] + 1][1].startswith("[[34], ") and ops[starts[0] + 1][2].startswith('["long int"')
        # the host waits for the device once per micro-batch forward (the sizes' .cpu())
        syncs = Counter(n.annotations.phase for n in g.nodes if n.kind == pb.KIND_SYNC)
        assert syncs["forward"] == layout.microbatches, rank


def test_the_tokens_come_from_tensor_parallel_rank_0() -> None:
    layout = ParallelLayout(tp=2, pp=1, microbatches=2)
    job = _job(layout, verify="all")
    for rank in range(2):
        seq = comm_sequence(job, rank)
        bcasts = [c for c in seq if c[0] == "coll" and c[1] == pb.COLL_BROADCAST]
        # per micro-batch: the sizes (MAX_DATA_DIM int64), then the tokens (b x (s + 1) int64)
        assert [c[4] for c in bcasts] == [MAX_DATA_DIM * 8, 2 * 17 * 8] * layout.microbatches
        assert all(c[3] == (0, 1) for c in bcasts)
        # the broadcasts come before the first tensor-parallel all-reduce of the forward
        assert seq.index(bcasts[1]) < next(i for i, c in enumerate(seq) if c[1] == pb.COLL_ALL_REDUCE)
    g = job.graph_of(0)
    roots = {n.collective.root for n in g.nodes if n.kind == pb.KIND_COLLECTIVE
             and n.collective.type == pb.COLL_BROADCAST}
    assert roots == {0}


def test_without_tensor_parallelism_nothing_is_broadcast() -> None:
    job = _job(ParallelLayout(tp=1, pp=1, dp=2, microbatches=2))
    assert not [c for c in comm_sequence(job, 0) if c[1] == pb.COLL_BROADCAST]


@pytest.mark.parametrize("pp", [1, 2])
def test_synchronising_timers_wait_for_the_device_at_every_phase_edge(pp: int) -> None:
    """Megatron's timers before 2022 (``sync_timers``): the host waits for the device at the
    start and stop of each micro-batch's forward (and after get_batch), of its backward, and
    before each pipeline exchange (after it, ``_communicate`` always did)."""
    layout = ParallelLayout(tp=2, pp=pp, microbatches=3)

    def syncs(sync_timers: bool) -> list[Counter]:
        job = trace(build_gpt(GPTConfig.megatron(**SHAPE, sync_timers=sync_timers)), layout,
                    TraceOptions(device="meta", warmup_steps=0, verify="stage")).job
        out = []
        for stage in range(pp):
            g = job.graph_of(stage * 2).copy()
            g.expand()
            out.append(Counter(n.annotations.phase for n in g.nodes if n.kind == pb.KIND_SYNC))
        return out

    m = layout.microbatches
    for stage, (off, on) in enumerate(zip(syncs(False), syncs(True), strict=True)):
        assert off["forward"] == m and off["backward"] == 0
        assert on["forward"] == 4 * m and on["backward"] == 2 * m
        exchanges = off[""]      # one sync after each exchange: the stage's p2p calls
        assert (exchanges > 0) is (pp > 1), stage
        assert on[""] == 2 * exchanges
        assert on["optimizer"] == off["optimizer"]


def test_reading_a_value_waits_for_the_compute_stream_not_for_communication_in_flight() -> None:
    """``.item()`` and ``.cpu()`` synchronise the current stream only: an all-gather issued
    with ``async_op`` and not yet waited for keeps running (Megatron-Core's overlapped param
    gather, in flight across get_batch's ``sizes.cpu()``); ``torch.cuda.synchronize()`` waits
    for it too. A collective waited for before the read is waited for by it."""
    from echo_et.trace.direct_graph import COMM, OP, STREAM, SYNC, WAIT, build_graph
    from echo_et.trace.records import CommRecord

    def rec() -> CommRecord:
        return CommRecord(index=0, op="all_gather", group_ranks=(0, 1), group_name="1", group_desc="dp",
                          in_bytes=64, out_bytes=128, dtype="c10::BFloat16")

    def sync_deps(*events) -> set[str]:
        g = build_graph([(OP, "aten::mm", "[]", "[]", ""), *events], lambda r: "dp", graph_id="g", where="t").graph
        by_id = {n.id: n for n in g.nodes}
        syncs = [n for n in g.nodes if n.kind == pb.KIND_SYNC]
        assert len(syncs) == 1
        return {by_id[d.id].name for d in syncs[0].deps}

    gather = rec()
    assert sync_deps((COMM, gather), (SYNC, STREAM)) == {"aten::mm"}
    assert sync_deps((COMM, gather), (SYNC,)) == {"aten::mm", "all_gather"}
    waited = rec()
    assert sync_deps((COMM, waited), (WAIT, waited), (SYNC, STREAM)) == {"aten::mm", "all_gather"}
