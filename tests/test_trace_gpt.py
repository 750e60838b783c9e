"""Ex-situ traces of the built-in GPT: the communication each layout implies, annotations,
memory, and the Job the tracer assembles."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")

from echo_et.ir import check_job  # noqa: E402
from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace.compare import ex_situ_comms  # noqa: E402
from echo_et.trace.layout import ParallelLayout  # noqa: E402
from echo_et.trace.session import TraceOutOfMemory  # noqa: E402
from echo_et.trace.tracer import TraceOptions, trace  # noqa: E402
from echo_et.workloads import GPTConfig, Workload  # noqa: E402

CFG = GPTConfig(layers=2, hidden=32, heads=4, seq=16, micro_batch=2, vocab=64)
F32 = 4


def _trace(layout: ParallelLayout, cfg: GPTConfig = CFG, **opts):
    wl = Workload(gpt=cfg)
    wl.validate(layout)
    return trace(wl.build_fn(), layout, TraceOptions(**opts))


def _params(cfg: GPTConfig) -> int:
    """Parameters of the unsplit model, counted layer by layer from the configuration."""
    h, f = cfg.hidden, cfg.hidden * cfg.ffn_mult
    ln = 2 * h
    block = ln + (h * 3 * h + 3 * h) + (h * h + h) + ln + (h * f + f) + (f * h + h)
    return cfg.vocab * h + cfg.seq * h + cfg.layers * block + ln + (h * cfg.vocab + cfg.vocab)


@pytest.fixture(scope="module")
def tp_job():
    return _trace(ParallelLayout(tp=2, microbatches=2))


def test_tensor_parallel_all_reduces(tp_job):
    job = tp_job.job
    assert check_job(job) == []
    assert job.world_size == 2 and tp_job.graphs == 1 and tp_job.traced_ranks == [0, 1]
    L, M = CFG.layers, 2
    act = CFG.micro_batch * CFG.seq * CFG.hidden * F32
    tok = CFG.micro_batch * CFG.seq * F32
    for rank in (0, 1):
        comms = ex_situ_comms(job, rank)
        assert {c[0] for c in comms} == {"all_reduce"} and {c[2] for c in comms} == {"tp"}
        sizes = Counter(c[1] for c in comms)
        # forward: embedding + 2 row-parallel per layer; backward: 2 column-parallel inputs
        # per layer + the output projection's input
        assert sizes[act] == M * (1 + 2 * L + 2 * L + 1)
        # vocab-parallel cross-entropy: max, target logit, sum of exponentials per token
        assert sizes[tok] == M * 3
        assert sum(sizes.values()) == M * (4 * L + 5)


def test_annotations_cover_phases_layers_and_microbatches(tp_job):
    g = tp_job.job.graph_of(0)
    seen = Counter()
    for n in g.nodes:
        a = n.annotations
        if a.phase in ("forward", "backward") and a.HasField("layer"):
            seen[(a.phase, a.layer, a.microbatch)] += 1
    for phase in ("forward", "backward"):
        for layer in range(CFG.layers):
            for mb in range(2):
                assert seen[(phase, layer, mb)] > 10
    assert any(n.annotations.phase == "optimizer" for n in g.nodes)
    assert not [n for n in g.nodes if n.name.startswith("echo:")]


def test_pipeline_1f1b_point_to_point():
    res = _trace(ParallelLayout(pp=2, microbatches=3))
    job = res.job
    assert check_job(job) == []
    assert res.graphs == 2 and res.traced_ranks == [0, 1]
    act = CFG.micro_batch * CFG.seq * CFG.hidden * F32
    first, last = ex_situ_comms(job, 0), ex_situ_comms(job, 1)
    assert Counter(first) == {("send", act, "pp"): 3, ("recv", act, "pp"): 3}
    assert Counter(last) == Counter({("recv", act, "pp"): 3, ("send", act, "pp"): 3})
    # 1F1B on 2 stages: stage 0 sends two activations before its first gradient arrives
    assert [c[0] for c in first[:3]] == ["send", "send", "recv"]
    assert first[-1][0] == "recv" and last[0][0] == "recv" and last[-1][0] == "send"
    # activations travel in the forward phase of their micro-batch, gradients in the backward
    p2p = [n for n in job.graph_of(0).nodes if n.kind in (pb.KIND_SEND, pb.KIND_RECV)]
    assert sorted((n.kind, n.annotations.phase, n.annotations.microbatch) for n in p2p) == sorted(
        [(pb.KIND_SEND, "forward", mb) for mb in range(3)]
        + [(pb.KIND_RECV, "backward", mb) for mb in range(3)])
    layers = {n.annotations.layer for n in job.graph_of(1).nodes if n.annotations.HasField("layer")}
    assert layers == {1}   # stage 1 holds the second of the two layers
    stages = {n.annotations.stage for n in job.graph_of(1).nodes if n.annotations.HasField("stage")}
    assert stages == {1}


@pytest.mark.parametrize("scatter_gather", [True, False])
def test_megatron_pipeline_sends_a_tp_slice_and_gathers_it(scatter_gather):
    """megatron-gpt at TP2 x PP2: as Megatron's --scatter-gather-tensors-in-pipeline (its
    default), each TP rank sends 1/TP of every activation and gradient to the same TP rank of
    the next stage, and every received one is all-gathered in the receiving stage's TP group
    right after it arrives, in the phase and micro-batch of what it carries; with
    --no-scatter-gather-tensors-in-pipeline every TP rank sends it whole and nothing is
    gathered."""
    tp, m = 2, 3
    cfg = GPTConfig.megatron(layers=2, hidden=32, heads=4, seq=16, micro_batch=2, vocab=64,
                             scatter_gather_tensors_in_pipeline=scatter_gather)
    res = _trace(ParallelLayout(tp=tp, pp=2, microbatches=m), cfg, device="meta", warmup_steps=0)
    job = res.job
    assert check_job(job) == []
    act = cfg.seq * cfg.micro_batch * cfg.hidden * 2                  # float16 [s, b, h]
    sent = act // tp if scatter_gather else act
    for rank in range(4):
        comms = ex_situ_comms(job, rank)
        p2p = Counter(c for c in comms if c[0] in ("send", "recv"))
        assert p2p == {("send", sent, "pp"): m, ("recv", sent, "pp"): m}, rank
        gathers = [c for c in comms if c[0] == "all_gather"]
        assert gathers == ([("all_gather", act // tp, "tp")] * m if scatter_gather else []), rank
        nodes = sorted(job.graph_of(rank).nodes, key=lambda n: (n.start_ns, n.id))
        for i, n in enumerate(nodes):
            if n.kind != pb.KIND_RECV:
                continue
            after = [x for x in nodes[i + 1:] if x.kind == pb.KIND_COLLECTIVE][0]
            if scatter_gather:   # the next collective is the gather of what arrived
                assert (after.collective.type, after.collective.in_bytes, after.collective.out_bytes) == \
                    (pb.COLL_ALL_GATHER, sent, act)
                assert (after.annotations.phase, after.annotations.microbatch) == \
                    (n.annotations.phase, n.annotations.microbatch)
            else:
                assert after.collective.type != pb.COLL_ALL_GATHER


def test_data_parallel_bucket_all_reduce_overlaps_the_last_backward():
    cfg = GPTConfig(layers=1, hidden=32, heads=4, seq=16, micro_batch=2, vocab=64)
    res = _trace(ParallelLayout(dp=2, microbatches=2), cfg)
    job = res.job
    assert check_job(job) == [] and res.graphs == 1
    nbytes = -(-_params(cfg) // 2) * 2 * F32     # padded to a multiple of dp
    assert ex_situ_comms(job, 1) == [("all_reduce", nbytes, "dp")]
    g = job.graph_of(0)
    (coll,) = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert (coll.annotations.phase, coll.annotations.microbatch) == ("backward", 1)
    (wait,) = [n for n in g.nodes if n.name == "wait:all_reduce"]
    assert wait.annotations.phase == "optimizer"
    # parameters, gradients and Adam's two moments are all alive at the peak
    assert all(b >= 4 * _params(cfg) * F32 for b in res.peak_memory_bytes.values())


def test_zero1_reduce_scatter_and_all_gather():
    cfg = GPTConfig(layers=1, hidden=32, heads=4, seq=16, micro_batch=2, vocab=64)
    res = _trace(ParallelLayout(dp=2, microbatches=1, zero=1), cfg)
    assert check_job(res.job) == []
    padded = -(-_params(cfg) // 2) * 2 * F32
    g = res.job.graph_of(1)
    colls = [n.collective for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert [(c.type, c.in_bytes, c.out_bytes, c.group) for c in colls] == [
        (pb.COLL_REDUCE_SCATTER, padded, padded // 2, "dp"),
        (pb.COLL_ALL_GATHER, padded // 2, padded, "dp")]
    assert res.job.manifest.layout.zero_stage == 1


def test_job_manifest_binds_every_rank_to_its_groups():
    res = _trace(ParallelLayout(dp=2, tp=2, pp=2), GPTConfig(layers=2, hidden=16, heads=2,
                                                             seq=8, micro_batch=1, vocab=32))
    job = res.job
    m = job.manifest
    assert (m.layout.dp, m.layout.tp, m.layout.pp, m.layout.source) == (2, 2, 2, "traced")
    assert m.provenance.source_format == "ex-situ"
    # one graph per pipeline stage, proven by tracing both ends of each stage
    assert res.graphs == 2 and res.traced_ranks == [0, 3, 4, 7]
    assert {b.rank: b.graph for b in m.bindings} == {r: "rank0" if r < 4 else "rank4"
                                                     for r in range(8)}
    for rank in range(8):
        for role in ("tp", "dp", "pp"):
            pg = job.resolve_group(rank, role)
            assert rank in pg.ranks and pg.desc == role
    assert sorted(job.resolve_group(6, "dp").ranks) == [4, 6]
    assert check_job(job) == []


def test_out_of_memory_names_layout_and_rank():
    with pytest.raises(TraceOutOfMemory, match=r"layout dp=1 tp=1 pp=1 microbatches=1, rank 0: "
                                               r"out of memory"):
        _trace(ParallelLayout(), GPTConfig(layers=1, hidden=16, heads=2, seq=8, micro_batch=1,
                                           vocab=32), memory_limit_bytes=10_000)
