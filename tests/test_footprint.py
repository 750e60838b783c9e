"""A configuration that cannot fit its GPU's memory is that row's one-line error naming the
constraint (``echo_et.models.footprint``: a lower bound, so nothing that ran is refused)."""

from __future__ import annotations

import pytest

from conftest import saved_activation_bytes
from echo_et.errors import EchoError
from echo_et.models.footprint import (
    STATE_BYTES_PER_PARAM,
    check_fits,
    layer_activation_bytes,
    megatron_min_bytes,
    stage_parameters,
)

GPT175B = dict(layers=96, hidden=12288, ffn=4 * 12288, vocab=51200, seq=2048, micro_batch=1, heads=96)


def test_stage_parameters_add_up_to_the_model() -> None:
    # one rank of TP1 PP1 holds the whole model: 12 l h^2 + the embedding, twice (tied copy)
    p = stage_parameters(layers=96, hidden=12288, ffn=4 * 12288, vocab=51200, seq=2048, tp=1, pp=1, stage=0)
    assert 174e9 < p - 51200 * 12288 < 176e9
    # TP8 x PP16: the middle-free split keeps about 1/128 of the layers' weights
    mid = stage_parameters(**{k: v for k, v in GPT175B.items() if k not in ("micro_batch", "heads")}, tp=8, pp=16,
                           stage=5)
    assert 1.35e9 < mid < 1.45e9


def test_175b_on_one_gpu_is_refused_with_its_numbers() -> None:
    with pytest.raises(EchoError, match=r"does not fit the GPU's memory: each rank needs at least 2\d{3}\.\d GB "
                                        r"\(weights, gradients and Adam states .* GB\), a100 has 80 GB"):
        check_fits(80.0, "a100", **GPT175B, tp=1, pp=1, microbatches=8, elem_bytes=2)
    # the paper's layout (TP8 x PP16) fits
    check_fits(80.0, "a100", **GPT175B, tp=8, pp=16, microbatches=64, elem_bytes=2)
    total, state, act = megatron_min_bytes(**GPT175B, tp=8, pp=16, microbatches=64, elem_bytes=2)
    assert total == state + act and state % STATE_BYTES_PER_PARAM == 0
    # the first stage holds pp micro-batches' layer inputs (16 x 6 layers x s x h x 2 bytes) and
    # one layer's recomputed forward (Korthikanti et al.: 10 + 24 / t bytes of s b h outside the
    # attention, 5 a s^2 b / t in it, less the input already counted)
    s, h, a = 2048, 12288, 96
    one_layer = s * h * (10 + 24 // 8) + 5 * a * s * s // 8 - 2 * s * h // 8
    assert act == 16 * 6 * s * h * 2 // 8 + one_layer      # the inputs partitioned over the 8 TP ranks


def test_sweep_row_that_does_not_fit_is_its_error() -> None:
    pytest.importorskip("torch", reason="the sweep traces on the meta device (pip install -e '.[dev]')")
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import predict_row

    row = dict(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=1, global_batch=8, tp=1, pp=1, dp=1)
    got = predict_row(row, ConfigSweepOptions(recompute=True))
    assert got["predicted_ms"] is None
    assert got["error"].startswith("layout dp=1 tp=1 pp=1 microbatches=8: does not fit the GPU's memory")
    assert "\n" not in got["error"] and "A100-SXM4-40GB has 40 GB" in got["error"]


GPT39B = dict(layers=48, hidden=8192, ffn=4 * 8192, vocab=51200, seq=2048, micro_batch=1, heads=64)


def test_adam_states_are_counted_sharded_over_data_parallel_ranks() -> None:
    """Megatron-DeepSpeed (ZeRO stage 1) and Megatron-LM (``--use-distributed-optimizer``)
    shard Adam's fp32 master weights and moments over the data-parallel ranks, so the least a
    rank holds is 4 + 12 / dp bytes per parameter (16-bit model; fp32: 8 + 8 / dp): a 39B
    model at TP2 x PP8 x DP32 runs on a 40 GB A100 that way, and is not refused, while the
    same layout at DP1 (nothing to shard over) still is."""
    from echo_et.models.footprint import state_bytes_per_param

    assert state_bytes_per_param(2, 1) == STATE_BYTES_PER_PARAM == state_bytes_per_param(4, 1)
    assert state_bytes_per_param(2, 4) == 4 + 3 and state_bytes_per_param(4, 8) == 8 + 1
    params = stage_parameters(**{k: v for k, v in GPT39B.items() if k not in ("micro_batch", "heads")}, tp=2, pp=8,
                              stage=0)
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
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    row = dict(layers=48, hidden=8192, heads=64, seq=2048, micro_batch=1, global_batch=1536, tp=2, pp=8, dp=32)
    workload_for(row, ConfigSweepOptions(recompute=True))          # fits sharded
    with pytest.raises(EchoError, match="does not fit the GPU's memory"):
        workload_for({**row, "dp": 1, "global_batch": 48}, ConfigSweepOptions(recompute=True))


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("dropout", [0.1, 0.0])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_counts_are_what_a_megatron_layer_saves(request, tp: int, dropout: float, recompute: str) -> None:
    """The bound's activations per layer and micro-batch (Korthikanti et al.'s counts) are
    what the ``megatron-gpt`` layer keeps for its backward at each granularity, at tp 1 and
    tp 2: no more (a lower bound), and no less than 99.5 % of it with dropout (the rest is the
    layer norms' statistics). Without dropout the workload still keeps two all-true masks
    that the bound does not count. Each transient is what recomputation takes off the kept."""
    torch = pytest.importorskip("torch", reason="the workload's layer needs torch (pip install -e '.[dev]')")
    from echo_et.models.footprint import layer_activation_bytes
    from echo_et.workloads import GPTConfig
    from echo_et.workloads.megatron import checkpoint, megatron_block_class

    group = request.getfixturevalue("world_of_one" if tp == 1 else "world_of_two")
    s, b, h, a = 64, 2, 128, 8         # fp16, b x a / tp a multiple of 4: Megatron's fused softmax
    cfg = GPTConfig.megatron(layers=1, hidden=h, heads=a, seq=s, micro_batch=b, vocab=96, dtype="float16",
                             dropout=dropout, recompute=recompute != "none",
                             recompute_granularity="full" if recompute == "none" else recompute)
    block = megatron_block_class()(cfg, tp, group, gen=torch.Generator().manual_seed(1), device="cpu",
                                   dtype=torch.float16)
    assert block.fused_softmax
    x = torch.randn(s, b, h, dtype=torch.float16, requires_grad=True)
    layer = (lambda x: checkpoint(block, x)) if cfg.recomputes_layers else block
    saved = saved_activation_bytes(layer, x, exclude=list(block.parameters()))
    count = {lvl: layer_activation_bytes(seq=s, micro_batch=b, hidden=h, heads=a, tp=tp, elem_bytes=2,
                                         recompute=lvl, dropout=dropout > 0) for lvl in ("none", "selective", "full")}
    kept, transient = count[recompute]
    masks = 0 if dropout else 2 * s * b * h        # bias_dropout_add keeps an all-true mask at p = 0
    # with full recomputation the bound splits the checkpointed input over the TP ranks (as
    # Megatron-DeepSpeed's partitioned checkpoints and sequence parallelism hold it); the
    # workload keeps it whole
    whole = kept * tp if recompute == "full" else kept
    assert kept <= saved and whole <= saved <= whole / 0.995 + masks
    assert kept + transient == count["none"][0]


def test_the_last_stage_holds_the_loss_softmax_in_fp32(world_of_two) -> None:
    """The vocabulary-parallel cross-entropy saves its fp32 softmax over the rank's slice of the
    vocabulary for its backward (4 s b V / tp bytes), which the bound counts on the last stage."""
    torch = pytest.importorskip("torch", reason="the workload's loss needs torch (pip install -e '.[dev]')")
    from echo_et.models.footprint import layer_activation_bytes
    from echo_et.workloads.tensor_parallel import vocab_parallel_cross_entropy

    s, b, vocab, tp = 32, 2, 256, 2
    logits = torch.randn(s, b, vocab // tp, dtype=torch.float16, requires_grad=True)
    target = torch.randint(0, vocab, (s, b))
    saved = saved_activation_bytes(vocab_parallel_cross_entropy, logits, target, world_of_two, 0, vocab // tp,
                                    exclude=[])
    softmax = 4 * s * b * vocab // tp
    assert softmax <= saved <= softmax + 9 * s * b          # + the int64 local targets and the bool mask
    # a last stage whose loss softmax outweighs a layer's recomputation holds it on top of
    # its one micro-batch in flight
    shape = dict(layers=2, hidden=64, ffn=256, vocab=vocab, seq=s, micro_batch=b, tp=tp, pp=2, microbatches=4,
                 elem_bytes=2, heads=4)
    kept, transient = layer_activation_bytes(seq=s, micro_batch=b, hidden=64, heads=4, tp=tp, elem_bytes=2,
                                             recompute="full")
    big = 100 * vocab
    assert 4 * s * b * big // tp > transient
    last = megatron_min_bytes(**{**shape, "vocab": big})      # the last stage needs most
    assert last[2] == 1 * 1 * kept + 4 * s * b * big // tp
    first = megatron_min_bytes(**{**shape, "vocab": 64})             # the first: pp micro-batches in flight
    assert first[2] == 2 * 1 * kept + transient


@pytest.mark.parametrize(("recompute", "refused"), [("full", 0), ("selective", 0), ("none", 3)])
def test_vtrain_rows_fit_with_recomputation_and_three_would_not_without(recompute: str, refused: int) -> None:
    """vTrain's 1,440 runs on 40 GB A100s all fit the bound with full or selective
    recomputation; without it the three largest (TP1, hidden 2048, micro-batch 8, PP 1-2)
    would need more than 40 GB: the memory side of reading the runs as recomputing."""
    pytest.importorskip("torch", reason="the workload's configuration lives with the tracer (pip install -e '.[dev]')")
    from conftest import shared_path
    from echo_et.experiments.config_csv import read_configs
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    rows = read_configs(shared_path("measurements/vtrain-a100/data/ground_truth_single.csv"))
    opts = ConfigSweepOptions(recompute=recompute != "none", recompute_granularity=recompute.replace("none", "full"))
    errors = []
    for r in rows:
        try:
            workload_for(r, opts)
        except EchoError as e:
            errors.append((r, str(e)))
    assert len(errors) == refused
    for r, e in errors:
        assert (r["tp"], r["hidden"], r["micro_batch"]) == (1, 2048, 8) and "activations with no recomputation" in e


def test_refusal_names_what_would_fit_keeping_the_layout() -> None:
    """A refusal says which change is enough with the same layout: recomputing whole layers
    (the 175B model at TP8 x PP16 with selective recomputation on a 40 GB A100, which keeps
    31.7 GB of activations), the same GPU with more memory, both, or neither."""
    from echo_et.experiments.memory_check import what_fits
    from echo_et.models.compute import DATASHEETS

    a100, a100_80 = DATASHEETS["a100"], DATASHEETS["a100-80gb"]
    shape = dict(**GPT175B, tp=8, pp=16, microbatches=128, elem_bytes=2, dp=4, recompute="selective")
    with pytest.raises(EchoError, match=r"activations with selective recomputation 31\.7 GB"):
        check_fits(a100.memory_gb, a100.name, **shape)
    full = megatron_min_bytes(**{**shape, "recompute": "full"})[0]
    assert what_fits(shape, a100) == (f"; with full recomputation it needs at least {full / 1e9:.1f} GB"
                                      "; A100-SXM4-80GB (a100-80gb, 80 GB) holds it")
    # nothing larger than 80 GB (what_fits is asked only of a refused row)
    assert what_fits(shape, a100_80) == f"; with full recomputation it needs at least {full / 1e9:.1f} GB"
    assert "recomputation" not in what_fits({**shape, "recompute": "full"}, a100)
    # the whole model on one GPU: no layout-keeping change is enough
    assert what_fits(dict(**GPT175B, tp=1, pp=1, microbatches=8, elem_bytes=2), a100) == ""
    # variants are matched by name without the memory size: V100 SXM2 16 -> 32 GB, not the PCIe boards
    v100 = DATASHEETS["v100-16gb"]
    small = dict(layers=24, hidden=2048, ffn=8192, vocab=51200, seq=1024, micro_batch=4, heads=16, tp=1, pp=1,
                 microbatches=4, elem_bytes=2)
    assert megatron_min_bytes(**small)[0] > 16e9
    assert what_fits(small, v100) == "; Tesla V100-SXM2-32GB (v100, 32 GB) holds it"


def test_sweep_row_refusal_carries_the_hint() -> None:
    pytest.importorskip("torch", reason="the sweep traces on the meta device (pip install -e '.[dev]')")
    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import predict_row

    row = dict(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=1, global_batch=512, tp=8, pp=16, dp=4)
    got = predict_row(row, ConfigSweepOptions(recompute=True, recompute_granularity="selective"))
    assert got["predicted_ms"] is None and "\n" not in got["error"]
    assert got["error"].endswith("A100-SXM4-40GB has 40 GB; with full recomputation it needs at least 11.4 GB; "
                                 "A100-SXM4-80GB (a100-80gb, 80 GB) holds it"), got["error"]


def test_full_recomputation_counts_the_checkpointed_inputs_partitioned_over_tp() -> None:
    """Megatron-DeepSpeed partitions the checkpointed layer inputs over the model-parallel
    ranks (``--partition-activations``) and Megatron-LM's sequence parallelism splits them,
    so the bound holds e s b h / tp of them: a 39B model at TP8 x PP16 x DP4 and micro-batch
    24 keeps 16 micro-batches x 3 layers of them on its first stage, 4.8 GB partitioned (38.7 GB
    whole, which a 40 GB A100 would refuse), and is not refused."""
    shape = dict(**{**GPT39B, "micro_batch": 24}, tp=8, pp=16, microbatches=16, elem_bytes=2, dp=4)
    kept, _ = layer_activation_bytes(seq=2048, micro_batch=24, hidden=8192, heads=64, tp=8, elem_bytes=2,
                                     recompute="full")
    assert kept == 2 * 2048 * 24 * 8192 // 8
    assert 16 * 3 * kept * 8 == pytest.approx(38.7e9, rel=2e-3)
    check_fits(40.0, "A100-SXM4-40GB", **shape)
    # the same layout with selective recomputation keeps every layer's (10 + 24 / 8) s b h
    with pytest.raises(EchoError, match="with selective recomputation"):
        check_fits(80.0, "A100-SXM4-80GB", **shape, recompute="selective")


def test_the_interleaved_schedule_keeps_the_chunk_forwards_its_warm_up_runs() -> None:
    """Megatron's interleaved schedule keeps more activations than 1F1B: stage s holds the
    chunk forwards of its warm-up and the first steady one before its first backward. The
    bound counts exactly the most forwards the schedule (workloads.pipeline_plan) has waiting for
    their backward, and refuses an interleaved layout the plain one fits."""
    from echo_et.workloads.pipeline_plan import interleaved_schedule

    def most_waiting(stages: int, stage: int, chunks: int, mbs: int, group: int = 0) -> int:
        waiting = most = 0
        for item in interleaved_schedule(stages, stage, chunks, mbs, group):
            waiting += {"forward": 1, "backward": -1}.get(item[0], 0)
            most = max(most, waiting)
        return most

    shape = dict(layers=32, hidden=4096, ffn=16384, vocab=50304, seq=2048, micro_batch=1, tp=1, elem_bytes=2,
                 heads=32, recompute="none")
    kept = layer_activation_bytes(**{k: shape[k] for k in ("seq", "micro_batch", "hidden", "heads", "tp",
                                                           "elem_bytes", "recompute", "ffn")})[0]
    for pp, chunks, mbs, group in ((4, 2, 16, 0), (4, 4, 8, 0), (8, 2, 8, 0), (4, 2, 4, 0), (4, 2, 10, 5),
                                   (4, 2, 10, 6)):        # and micro-batch groups larger than pp
        plain = megatron_min_bytes(**shape, pp=pp, microbatches=mbs)
        inter = megatron_min_bytes(**shape, pp=pp, microbatches=mbs, chunks=chunks, microbatch_group=group)
        layers_held = most_waiting(pp, 0, chunks, mbs, group) * (32 // pp // chunks)      # on the first stage
        assert inter[2] - plain[2] == (layers_held - min(pp, mbs) * (32 // pp)) * kept, (pp, chunks, mbs, group)
        assert inter[1] == plain[1]                                          # the same weights
    # the first stage, 4 stages of 2 chunks: 11 chunk forwards of 4 layers = 1.375 x 1F1B's 32 layers
    assert most_waiting(4, 0, 2, 16) == 11
    with pytest.raises(EchoError, match="does not fit"):
        check_fits(70, "A100", **shape, pp=4, microbatches=16, chunks=2)   # 71.3 GB
    check_fits(70, "A100", **shape, pp=4, microbatches=16)                  # 59.8 GB
