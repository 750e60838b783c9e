"""Ex-situ equals in-situ: the same GPT at TP2 x PP2 x DP2 run for real on 8 local gloo
processes under torch.profiler, converted with the Kineto reader, against the ex-situ Job."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")

from echo_et.converters import ReadOptions, read  # noqa: E402
from echo_et.ir import check_job  # noqa: E402
from echo_et.trace.compare import (  # noqa: E402
    ex_situ_comms,
    ex_situ_ops,
    in_situ_comms,
    in_situ_ops,
)
from echo_et.trace.insitu import run_in_situ  # noqa: E402
from echo_et.trace.layout import ParallelLayout  # noqa: E402
from echo_et.trace.tracer import TraceOptions, trace  # noqa: E402
from echo_et.workloads import GPTConfig, Workload  # noqa: E402

GPT = GPTConfig(layers=2, hidden=32, heads=4, seq=16, micro_batch=2, vocab=64)
WORKLOAD = Workload(gpt=GPT)


@pytest.mark.parametrize("zero", [0, 1])
def test_ex_situ_equals_in_situ(tmp_path, zero):
    _ex_situ_equals_in_situ(tmp_path, WORKLOAD, zero)


def test_scatter_gather_pipeline_ex_situ_equals_in_situ(tmp_path):
    """Megatron's scatter/gather of pipeline tensors run for real: 1/tp sends, and an
    all-gather in the TP group after every receive, as the ex-situ Job says."""
    _ex_situ_equals_in_situ(tmp_path, Workload(gpt=GPT.replace(scatter_gather_tensors_in_pipeline=True)), 0)


def _ex_situ_equals_in_situ(tmp_path, workload: Workload, zero: int) -> None:
    layout = ParallelLayout(dp=2, tp=2, pp=2, microbatches=2, zero=zero)
    paths = run_in_situ(workload, layout, tmp_path / "in-situ")
    real = read(paths, "kineto", ReadOptions())
    assert real.world_size == 8

    ex = trace(workload.build_fn(), layout, TraceOptions()).job
    assert check_job(ex) == []
    assert ex.world_size == 8 and len(ex.graph_ids()) == 2

    for rank in range(8):
        want = in_situ_comms(real.graph_of(rank))
        got = ex_situ_comms(ex, rank)
        assert want, f"rank {rank}: the real run shows no communication"
        assert all(b > 0 and g in ("tp", "dp", "pp") for _, b, g in want)
        assert got == want, f"rank {rank}: communication differs"
        assert ex_situ_ops(ex.graph_of(rank)) == in_situ_ops(real.graph_of(rank)), \
            f"rank {rank}: host op counts differ"
    # what each layout implies, seen in the real run: ZeRO-1 reduce-scatters and gathers
    # gradients and parameters over dp, ZeRO-0 all-reduces them
    dp_types = {t for t, _, g in in_situ_comms(real.graph_of(0)) if g == "dp"}
    assert dp_types == ({"reduce_scatter", "all_gather"} if zero else {"all_reduce"})


@pytest.mark.parametrize("dtype, zero", [("float32", 0), ("bfloat16", 1)])
def test_megatron_three_stages_ex_situ_equals_in_situ(tmp_path, dtype, zero):
    """megatron-gpt over three pipeline stages run for real: the tied embedding's group
    exists only on the first and last stage and "mp" has the ranks of "pp" at tp 1, which
    hung the real processes' group creation until every rank made every group in one order
    (``RankContext.all_groups``). With bfloat16 and the distributed optimizer, the fp32
    gradients are reduce-scattered and the 16-bit weights all-gathered for real, as the
    ex-situ Job says."""
    cfg = GPTConfig.megatron(layers=3, hidden=32, heads=4, seq=16, micro_batch=1, vocab=64, dtype=dtype,
                             dropout=0.0)
    real, groups = _megatron_comms_match(tmp_path, cfg, ParallelLayout(dp=2, pp=3, microbatches=3, zero=zero))
    assert {"embd", "pp", "dp"} <= groups
    dp = {(t, b) for t, b, g in in_situ_comms(real.graph_of(0)) if g == "dp" and b > 4}
    assert {t for t, _ in dp} == ({"reduce_scatter", "all_gather"} if zero else {"all_reduce"})


@pytest.mark.parametrize("comm_type", ["p2p", "allgather", "a2a"])
def test_context_parallel_ex_situ_equals_in_situ(tmp_path, comm_type):
    """megatron-gpt with context parallelism (PP2 x CP2) run for real on 4 gloo processes: the
    ring's sends and receives (or the all-gathers and reduce-scatters, or the all-to-alls) in
    the cp group, the loss all-reduce over cp and the gradients reduced over dp x cp are, rank
    by rank and in order, what the ex-situ Job says."""
    cfg = GPTConfig.megatron(layers=2, hidden=32, heads=4, seq=16, micro_batch=1, vocab=64, dtype="float32",
                             dropout=0.0, flash_attention=True, cp_comm_type=comm_type)
    _, groups = _megatron_comms_match(tmp_path, cfg, ParallelLayout(pp=2, cp=2, microbatches=2))
    assert {"cp", "dp_cp", "pp"} <= groups


def _megatron_comms_match(tmp_path, cfg: GPTConfig, layout: ParallelLayout):
    """``cfg`` run for real at ``layout`` and traced ex-situ: every rank's communication is the
    same, in order. Returns the real run's Job and the group roles its ranks used."""
    workload = Workload(gpt=cfg)
    real = read(run_in_situ(workload, layout, tmp_path / "in-situ"), "kineto", ReadOptions())
    ex = trace(workload.build_fn(), layout, TraceOptions()).job
    assert check_job(ex) == []
    for rank in range(layout.world_size):
        want = in_situ_comms(real.graph_of(rank))
        assert ex_situ_comms(ex, rank) == want, f"rank {rank}: communication differs"
    return real, {g for r in range(layout.world_size) for _, _, g in in_situ_comms(real.graph_of(r))}
