"""A configuration that cannot fit its GPU's memory is that row's one-line error naming the
constraint (``echo_et.models.footprint``: a lower bound, so nothing that ran is refused)."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.models.footprint import STATE_BYTES_PER_PARAM, check_fits, megatron_min_bytes, stage_parameters

GPT175B = dict(layers=96, hidden=12288, ffn=4 * 12288, vocab=51200, seq=2048, micro_batch=1)


def test_stage_parameters_add_up_to_the_model() -> None:
    # one rank of TP1 PP1 holds the whole model: 12 l h^2 + the embedding, twice (tied copy)
    p = stage_parameters(layers=96, hidden=12288, ffn=4 * 12288, vocab=51200, seq=2048, tp=1, pp=1, stage=0)
    assert 174e9 < p - 51200 * 12288 < 176e9
    # TP8 x PP16: the middle-free split keeps about 1/128 of the layers' weights
    mid = stage_parameters(**{k: v for k, v in GPT175B.items() if k != "micro_batch"}, tp=8, pp=16, stage=5)
    assert 1.35e9 < mid < 1.45e9


def test_175b_on_one_gpu_is_refused_with_its_numbers() -> None:
    with pytest.raises(EchoError, match=r"does not fit the GPU's memory: each rank needs at least 2\d{3}\.\d GB "
                                        r"\(weights, gradients and Adam states .* GB\), a100 has 80 GB"):
        check_fits(80.0, "a100", **GPT175B, tp=1, pp=1, microbatches=8, elem_bytes=2)
    # the paper's layout (TP8 x PP16) fits
    check_fits(80.0, "a100", **GPT175B, tp=8, pp=16, microbatches=64, elem_bytes=2)
    total, state, act = megatron_min_bytes(**GPT175B, tp=8, pp=16, microbatches=64, elem_bytes=2)
    assert total == state + act and state % STATE_BYTES_PER_PARAM == 0
    # the first stage holds pp micro-batches' layer inputs: 16 x 6 layers x s x h x 2 bytes
    assert act == 16 * 6 * 2048 * 12288 * 2


def test_sweep_row_that_does_not_fit_is_its_error() -> None:
    pytest.importorskip("torch", reason="the sweep traces on the meta device (pip install -e '.[dev]')")
    from echo_et.experiments.config_sweep import ConfigSweepOptions, predict_row

    row = dict(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=1, global_batch=8, tp=1, pp=1, dp=1)
    got = predict_row(row, ConfigSweepOptions(recompute=True))
    assert got["predicted_ms"] is None
    assert got["error"].startswith("layout dp=1 tp=1 pp=1 microbatches=8: does not fit the GPU's memory")
    assert "\n" not in got["error"] and "A100-SXM4-40GB has 40 GB" in got["error"]


def test_no_measured_vtrain_row_is_refused() -> None:
    # the bound is a lower bound: every configuration vTrain ran on a 40 GB A100 fits it
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    from conftest import shared_path
    from echo_et.experiments.config_sweep import ConfigSweepOptions, read_configs, workload_for

    rows = read_configs(shared_path("measurements/vtrain-a100/data/ground_truth_single.csv"))
    opts = ConfigSweepOptions(recompute=True)
    for r in rows:
        workload_for(r, opts)
    assert len(rows) == 1440


GPT39B = dict(layers=48, hidden=8192, ffn=4 * 8192, vocab=51200, seq=2048, micro_batch=1)


def test_adam_states_are_counted_sharded_over_data_parallel_ranks() -> None:
    """Megatron-DeepSpeed (ZeRO stage 1) and Megatron-LM (``--use-distributed-optimizer``)
    shard Adam's fp32 master weights and moments over the data-parallel ranks, so the least a
    rank holds is 4 + 12 / dp bytes per parameter (16-bit model; fp32: 8 + 8 / dp): a 39B
    model at TP2 x PP8 x DP32 runs on a 40 GB A100 that way, and is not refused, while the
    same layout at DP1 (nothing to shard over) still is."""
    from echo_et.models.footprint import state_bytes_per_param

    assert state_bytes_per_param(2, 1) == STATE_BYTES_PER_PARAM == state_bytes_per_param(4, 1)
    assert state_bytes_per_param(2, 4) == 4 + 3 and state_bytes_per_param(4, 8) == 8 + 1
    params = stage_parameters(**{k: v for k, v in GPT39B.items() if k != "micro_batch"}, tp=2, pp=8, stage=0)
    shape = dict(**GPT39B, tp=2, pp=8, microbatches=48, elem_bytes=2)
    total, state, act = megatron_min_bytes(**shape, dp=32)
    assert state == int((4 + 12 / 32) * params) and total == state + act
    check_fits(40.0, "A100-SXM4-40GB", **shape, dp=32)
    with pytest.raises(EchoError, match=r"weights, gradients and Adam states 4\d\.\d GB"):
        check_fits(40.0, "A100-SXM4-40GB", **shape, dp=1)
    # what is sharded over many ranks still does not fit when the weights alone do not
    with pytest.raises(EchoError, match=r"Adam's sharded over 64 data-parallel ranks"):
        check_fits(40.0, "A100-SXM4-40GB", **GPT175B, tp=1, pp=1, microbatches=8, elem_bytes=2, dp=64)


def test_sweep_row_is_checked_with_its_data_parallel_degree() -> None:
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    from echo_et.experiments.config_sweep import ConfigSweepOptions, workload_for

    row = dict(layers=48, hidden=8192, heads=64, seq=2048, micro_batch=1, global_batch=1536, tp=2, pp=8, dp=32)
    workload_for(row, ConfigSweepOptions(recompute=True))          # fits sharded
    with pytest.raises(EchoError, match="does not fit the GPU's memory"):
        workload_for({**row, "dp": 1, "global_batch": 48}, ConfigSweepOptions(recompute=True))
