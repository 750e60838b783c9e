"""The rates of a predicted step (tokens/s, model and hardware FLOPs per GPU, MFU): the FLOPs
count is the Megatron-LM paper's, checked against its formula and against published
throughputs of real runs; predict and sweep carry the rates."""

from __future__ import annotations

import pytest

from echo_et.models.compute import DATASHEETS
from echo_et.workloads.gpt_config import GPTConfig


def _megatron_formulas(b: int, s: int, n: int, h: int, v: int) -> tuple[float, float]:
    """Narayanan et al. 2021, eq. 3 (full recomputation: 4 forwards) and the same with 3
    (``n`` layers)."""
    hardware = 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    model = 72 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))
    return model, hardware


@pytest.mark.parametrize("shape", [(96, 12288, 96, 2048, 1536, 8), (24, 2304, 24, 2048, 512, 1),
                                   (105, 20480, 128, 2048, 1920, 8)])
def test_step_flops_are_the_megatron_lm_papers_count(shape) -> None:
    layers, hidden, heads, seq, batch, tp = shape
    cfg = GPTConfig.megatron(layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=1, recompute=True,
                             vocab=51200)
    model, hardware = cfg.step_flops(batch, tp)
    want_model, want_hardware = _megatron_formulas(batch, seq, layers, hidden, cfg.padded_vocab(tp))
    assert model == pytest.approx(want_model, rel=1e-12)
    assert hardware == pytest.approx(want_hardware, rel=1e-12)
    # no recomputation: nothing runs again; selective: the scores and the context run again
    plain = GPTConfig.megatron(layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=1, vocab=51200)
    assert plain.step_flops(batch, tp) == (model, model)
    sel = GPTConfig.megatron(layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=1, vocab=51200,
                             recompute=True, recompute_granularity="selective")
    assert sel.step_flops(batch, tp) == (model, model + batch * seq * layers * 4 * seq * hidden)


def test_published_runs_give_their_published_throughput() -> None:
    """Megatron-Turing NLG 530B on 2,240 A100 (arXiv 2201.11990): 60.1 s per step of 1,920
    sequences is 126 teraFLOP/s per GPU counted with recomputation; GPT-3 175B on 1,536 A100
    in the Megatron-LM paper (arXiv 2104.04473, table 1): batch 1,536, 153 teraFLOP/s."""
    from echo_et.experiments.throughput import step_throughput

    a100 = DATASHEETS["a100-80gb"]
    mtnlg = GPTConfig.megatron(layers=105, hidden=20480, heads=128, seq=2048, micro_batch=1, recompute=True,
                               vocab=51200, dtype="bfloat16")
    r = step_throughput(mtnlg, 1920, 8, 2240, 60_100_000_000, a100)
    assert r["hardware_tflops_per_gpu"] == pytest.approx(126, abs=0.5)
    assert r["mfu_pct"] == pytest.approx(100 * r["model_tflops_per_gpu"] / 312, rel=1e-3)
    assert r["hfu_pct"] / r["mfu_pct"] == pytest.approx(r["hardware_flops"] / r["model_flops"], rel=1e-3)
    assert (r["math"], r["peak_tflops"]) == ("bf16", 312)
    assert r["tokens_per_s"] == pytest.approx(1920 * 2048 / 60.1, abs=0.1)
    gpt3 = GPTConfig.megatron(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=1, recompute=True,
                              vocab=51200, dtype="float16")
    model, hardware = gpt3.step_flops(1536, 8)
    seconds = hardware / (153e12 * 1536)          # the step the paper's 153 teraFLOP/s stands for
    r = step_throughput(gpt3, 1536, 8, 1536, round(seconds * 1e9), a100)
    assert r["hardware_tflops_per_gpu"] == pytest.approx(153, rel=1e-6)
    assert r["model_tflops_per_gpu"] == pytest.approx(153 * model / hardware, rel=1e-6)
    # fp32 runs against the fp32 peak, or TF32's when the profile runs fp32 GEMMs as TF32
    fp32 = GPTConfig.megatron(layers=2, hidden=1024, heads=8, seq=512, micro_batch=1, dtype="float32")
    assert step_throughput(fp32, 8, 1, 8, 10**9, a100)["peak_tflops"] == 19.5
    assert step_throughput(fp32, 8, 1, 8, 10**9, a100, fp32_matmul="tf32")["peak_tflops"] == 156


def test_a_step_without_time_has_no_rates() -> None:
    from echo_et.errors import EchoError
    from echo_et.experiments.throughput import step_throughput

    cfg = GPTConfig.megatron(layers=2, hidden=1024, heads=8, seq=512, micro_batch=1)
    for step_ns, gpus in ((0, 8), (-5, 8), (10**9, 0)):
        with pytest.raises(EchoError, match="no rates for a step"):
            step_throughput(cfg, 8, 1, gpus, step_ns, DATASHEETS["a100"])
