"""Megatron-LM's sequence parallelism (``--sequence-parallel``): the collectives a layer issues
instead of its two all-reduces, what pipeline stages send, the layer norms' gradients reduced
over the TP group, the activations a layer keeps (and the memory bound's count of them),
gradients equal to a run without it in real gloo processes, and each bad input as one line."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app

torch = pytest.importorskip("torch", reason="the GPT workload needs torch (pip install 'echo-et[trace]')")

from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import comm_sequence  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

runner = CliRunner()
SHAPE = dict(layers=4, hidden=32, heads=4, seq=16, micro_batch=2, vocab=96)


@pytest.fixture(scope="module")
def jobs():
    layout = ParallelLayout(tp=2, pp=2, microbatches=3)
    return layout, {sp: trace(build_gpt(GPTConfig.megatron(**SHAPE, sequence_parallel=sp)), layout,
                              TraceOptions(device="meta", warmup_steps=0, verify="all")).job
                    for sp in (False, True)}


def _tp_collectives(job, rank: int) -> Counter:
    return Counter((c[1], c[4]) for c in comm_sequence(job, rank) if c[0] == "coll" and len(c[3]) == 2)


def test_each_layer_gathers_and_scatters_the_sequence_instead_of_all_reducing(jobs) -> None:
    layout, by_sp = jobs
    m, layers = layout.microbatches, SHAPE["layers"] // layout.pp
    rows = 16 // 2 * 2 * 32 * 2                 # s / tp x b x h, float16: what one rank holds
    whole = 2 * rows
    for rank, last in ((0, False), (2, True)):
        plain, sp = _tp_collectives(by_sp[False], rank), _tp_collectives(by_sp[True], rank)
        # without: two all-reduces of the whole activation a layer each way, and the
        # embedding's (first stage) or the logits' input gradient's (last stage); with: none in
        # the layers
        layer_ars = 4 * layers * m
        assert plain[(pb.COLL_ALL_REDUCE, whole)] == layer_ars + m
        assert sp[(pb.COLL_ALL_REDUCE, whole)] == (0 if last else m)     # the embedding's stays
        # forward: QKV and fc1 gather their input, proj and fc2 reduce-scatter their output;
        # backward: QKV and fc1 gather the input again and reduce-scatter its gradient, proj
        # and fc2 gather their output's gradient; the embedding's rows scattered (its backward
        # gathers), the logits' rows gathered (its backward reduce-scatters)
        assert sp[(pb.COLL_ALL_GATHER, rows)] == 6 * layers * m + m
        assert sp[(pb.COLL_REDUCE_SCATTER, whole)] == 4 * layers * m + (m if last else 0)


def test_stages_send_their_rows_and_reduce_the_layer_norms_over_tp(jobs) -> None:
    layout, by_sp = jobs
    job = by_sp[True]
    rows = 16 // 2 * 2 * 32 * 2
    p2p = {c[4] for c in comm_sequence(job, 0) if c[0] == "p2p"}
    assert p2p == {rows}                          # s / tp rows, sent whole (nothing re-split)
    gathers = [c for c in comm_sequence(job, 0) if c[0] == "coll" and c[1] == pb.COLL_ALL_GATHER
               and c[4] != rows]
    assert gathers == []                          # no scatter-gather of the pipeline tensors
    # one all-reduce over TP of the layer norms' and the row-parallel biases' gradients: per
    # layer 2 x (h + h) + 2 x h values, and the final layer norm's 2 h on the last stage
    h, layers = 32, 2
    for rank, extra in ((0, 0), (2, 2 * h)):
        syncs = [c for c in comm_sequence(job, rank) if c[0] == "coll" and c[1] == pb.COLL_ALL_REDUCE
                 and len(c[3]) == 2 and c[4] == 2 * (layers * 6 * h + extra)]
        assert len(syncs) == 1, rank


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_a_layer_keeps_the_bounds_count_of_activations(world_of_two, recompute: str) -> None:
    """With sequence parallelism what the TP ranks otherwise replicate (the layer norms' and
    dropouts' inputs and masks) is kept as s / tp rows: the bound's count (34 s b h / tp with
    selective recomputation) is what the layer saves, within the layer norms' statistics."""
    from echo_et.models.footprint import layer_activation_bytes
    from echo_et.workloads.megatron import checkpoint, megatron_block_class

    s, b, h, a, tp = 64, 2, 128, 8, 2
    cfg = GPTConfig.megatron(layers=1, hidden=h, heads=a, seq=s, micro_batch=b, vocab=96, dtype="float16",
                             recompute=recompute != "none", sequence_parallel=True,
                             recompute_granularity="full" if recompute == "none" else recompute)
    block = megatron_block_class()(cfg, tp, world_of_two, gen=torch.Generator().manual_seed(1), device="cpu",
                                   dtype=torch.float16)
    x = torch.randn(s // tp, b, h, dtype=torch.float16, requires_grad=True)
    layer = (lambda x: checkpoint(block, x)) if cfg.recomputes_layers else block
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in skip:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    saved = sum(seen.values())
    kept, _ = layer_activation_bytes(seq=s, micro_batch=b, hidden=h, heads=a, tp=tp, elem_bytes=2,
                                     recompute=recompute, sequence_parallel=True)
    assert kept <= saved <= kept / 0.99
    plain, _ = layer_activation_bytes(seq=s, micro_batch=b, hidden=h, heads=a, tp=tp, elem_bytes=2,
                                      recompute="selective")
    if recompute == "selective":
        assert kept == 34 * s * b * h // tp < plain


def test_real_run_gives_the_gradients_of_the_run_without_it(tmp_path) -> None:
    """gloo processes run the Megatron GPT with sequence parallelism for real, on one stage
    and on two: each parameter's gradient, summed over the micro-batches and over the TP
    ranks' halves of the sequence, is the one the same TP ranks give without it."""
    from gpt_real_runs import real_grads

    model = {"layers": 4, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64, "dropout": 0.0,
             "dtype": "float32", "megatron": True}
    ref = real_grads(tmp_path, tp=2, **model)
    for pp in (1, 2):
        got = real_grads(tmp_path, tp=2, pp=pp, sequence_parallel=True, **model)
        assert got.keys() == ref.keys() and len(ref) > 4 * 8
        for k in ref:
            torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=f"pp {pp}: {k}")


PREDICT = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "128", "--micro-batch", "2",
           "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--vocab", "1024", "--gpu", "a100",
           "--gpus-per-node", "4"]


def test_predict_and_sweep_take_the_flag(tmp_path) -> None:
    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    runs = {}
    for name, extra in (("plain", []), ("sp", ["--sequence-parallel"])):
        r = runner.invoke(app, ["predict", *PREDICT, *extra, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["sp"]["prediction"]["sequence_parallel"] is True
    assert "sequence_parallel" not in runs["plain"]["prediction"]
    assert runs["sp"]["step_time_ns"] != runs["plain"]["step_time_ns"]
    row = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "micro_batch": 1, "global_batch": 8,
           "tp": 2, "pp": 2, "dp": 2, "vocab": 1024}
    assert workload_for(row, ConfigSweepOptions(sequence_parallel=True))[0].sequence_parallel


@pytest.mark.parametrize(("extra", "message"), [
    (["--seq", "127"], "sequence parallelism needs tp (2) to divide the sequence (127)"),
    (["--pipeline-engine", "deepspeed"], "sequence parallelism is Megatron-LM's"),
    (["--recompute", "--partition-activations"], "sequence parallelism is Megatron-LM's"),
])
def test_bad_settings_are_one_line(tmp_path, extra, message) -> None:
    r = runner.invoke(app, ["predict", *PREDICT, "--sequence-parallel", *extra, "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert not (tmp_path / "bad").exists()


def test_the_gpt_workload_refuses_it(tmp_path) -> None:
    r = runner.invoke(app, ["trace", "--workload", "gpt", "--tp", "2", "--sequence-parallel", "--device", "meta",
                            "-o", str(tmp_path / "j")])
    assert r.exit_code == 2 and "sequence parallelism is Megatron's" in r.stderr
    assert not (tmp_path / "j").exists()


def test_the_memory_bound_counts_the_split_activations() -> None:
    """175B at TP8 x PP16 x DP4, micro-batch 1, selective recomputation on a 40 GB A100:
    refused without sequence parallelism (at least 41.9 GB), admitted with it (20.8 GB: the
    layers' activations split over the 8 TP ranks)."""
    from echo_et.errors import EchoError
    from echo_et.experiments.memory_check import check_memory

    layout = ParallelLayout(tp=8, pp=16, dp=4, microbatches=384)
    cfg = GPTConfig.megatron(layers=96, hidden=12288, heads=96, seq=2048, micro_batch=1, recompute=True,
                             recompute_granularity="selective")
    with pytest.raises(EchoError, match="does not fit"):
        check_memory(cfg, layout, "a100")
    check_memory(cfg.replace(sequence_parallel=True), layout, "a100")
