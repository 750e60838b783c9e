"""DeepSpeed's pipeline engine (``--pipeline-engine deepspeed``): its TrainSchedule against one
worked out from DeepSpeed's rules, transfers that pair up and never deadlock when each is a
blocking call, the traced Job (partitioned tensors, data loaded on the end stages only, the
closing instructions' order), gradients equal to a one-stage run in real gloo processes, and
each bad input as one line with exit 2."""

from __future__ import annotations

from collections import Counter

import pytest
from typer.testing import CliRunner

from echo_et.cli.main import app

torch = pytest.importorskip("torch", reason="the GPT workload needs torch (pip install 'echo-et[trace]')")

from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.trace.compare import comm_sequence, kernel_ops  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402
from echo_et.workloads.deepspeed_pipe import train_schedule  # noqa: E402

runner = CliRunner()

SHORT = {"recv_act": "Ra", "send_grad": "Sg", "send_act": "Sa", "recv_grad": "Rg", "load": "L",
         "forward": "F", "backward": "B"}


def _compact(stages: int, stage: int, microbatches: int) -> str:
    """One step per bracket; Ra/Sa receive/send an activation, Rg/Sg a gradient, L loads."""
    return " ".join("[" + " ".join(f"{SHORT[op]}{mb}" for op, mb in step) + "]"
                    for step in train_schedule(stages, stage, microbatches))


# 3 stages, 3 micro-batches: 2 x (3 + 3 - 1) = 10 steps. Forwards on the steps of the stage's
# parity (micro-batch step // 2 - stage // 2), backwards on the others (even steps: step // 2 -
# stages + (stage + 1) // 2; odd: step // 2 - stages + 1 + stage // 2); a forward step receives
# then sends the previous step's gradient, a backward step sends the previous step's activation
# then receives; the end stages load before each forward.
HAND = {
    0: "[L0 F0] [Sa0] [L1 F1] [Sa1] [L2 F2] [Sa2 Rg0 B0] [] [Rg1 B1] [] [Rg2 B2]",
    1: "[] [Ra0 F0] [Sa0] [Ra1 F1] [Sa1 Rg0 B0] [Ra2 Sg0 F2] [Sa2 Rg1 B1] [Sg1] [Rg2 B2] [Sg2]",
    2: "[] [] [Ra0 L0 F0] [B0] [Ra1 Sg0 L1 F1] [B1] [Ra2 Sg1 L2 F2] [B2] [Sg2] []",
}


def test_schedule_matches_the_hand_worked_one() -> None:
    for stage, want in HAND.items():
        assert _compact(3, stage, 3) == want, stage


def _ops(stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    return [(op, mb) for step in train_schedule(stages, stage, microbatches) for op, mb in step]


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("microbatches", [1, 2, 3, 7, 16])
def test_every_stage_runs_each_micro_batch_once_in_1f1b_order(stages: int, microbatches: int) -> None:
    for stage in range(stages):
        ops = _ops(stages, stage, microbatches)
        compute = [(op, mb) for op, mb in ops if op in ("forward", "backward")]
        fwd = [mb for op, mb in compute if op == "forward"]
        bwd = [mb for op, mb in compute if op == "backward"]
        assert fwd == bwd == list(range(microbatches))
        # at most stages - stage forwards ahead of the backwards: Megatron's 1F1B order
        ahead = max(sum(1 for o, _ in compute[:i + 1] if o == "forward")
                    - sum(1 for o, _ in compute[:i + 1] if o == "backward") for i in range(len(compute)))
        assert ahead == min(stages - stage, microbatches)
        loads = [mb for op, mb in ops if op == "load"]
        assert loads == (fwd if stage in (0, stages - 1) else [])


@pytest.mark.parametrize("stages", [2, 3, 4, 6])
@pytest.mark.parametrize("microbatches", [1, 2, 5, 9])
def test_blocking_transfers_pair_up_and_never_deadlock(stages: int, microbatches: int) -> None:
    """Each transfer blocks until its peer posts the matching one (NCCL's send/recv): run all
    stages' instruction streams against each other; every one must finish."""
    queues = [_ops(stages, s, microbatches) for s in range(stages)]
    heads = [0] * stages
    peer_op = {"send_act": (1, "recv_act"), "recv_act": (-1, "send_act"),
               "send_grad": (-1, "recv_grad"), "recv_grad": (1, "send_grad")}
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while heads[s] < len(queues[s]):
                op, mb = queues[s][heads[s]]
                if op not in peer_op:
                    heads[s] += 1
                    progress = True
                    continue
                offset, want = peer_op[op]
                p = s + offset
                if heads[p] < len(queues[p]) and queues[p][heads[p]] == (want, mb):
                    heads[s] += 1
                    heads[p] += 1
                    progress = True
                    continue
                break
    assert heads == [len(q) for q in queues]


SHAPE = dict(layers=6, hidden=32, heads=4, seq=16, micro_batch=2, vocab=96, recompute=True)


@pytest.fixture(scope="module")
def jobs():
    layout = ParallelLayout(tp=2, pp=3, dp=2, microbatches=4)
    out = {}
    for engine in ("megatron", "deepspeed"):
        cfg = GPTConfig.megatron(**SHAPE, pipeline_engine=engine)
        out[engine] = trace(build_gpt(cfg), layout, TraceOptions(device="meta", warmup_steps=0, verify="all")).job
    return layout, out


def _stage_rank(layout: ParallelLayout, stage: int) -> int:
    return stage * layout.tp * layout.dp


def test_pipeline_tensors_travel_partitioned_and_one_call_each(jobs) -> None:
    layout, by_engine = jobs
    job = by_engine["deepspeed"]
    m = layout.microbatches
    piece = 16 * 2 * 32 // layout.tp * 2          # s x b x h / tp, float16
    meta = (1 + 3 + 2 + layout.tp + 1) * 8        # ndim, shape, parts, rank, bounds: int64
    middle = comm_sequence(job, _stage_rank(layout, 1))
    p2p = [c for c in middle if c[0] == "p2p"]
    # each activation and gradient: its metadata, then its piece
    assert [c[4] for c in p2p] == [meta, piece] * (4 * m)
    assert Counter(c[1] for c in p2p) == {pb.KIND_SEND: 4 * m, pb.KIND_RECV: 4 * m}
    # rebuilt with an all-gather over TP: the received activation, the received gradient and
    # the stage's own output before its backward
    gathers = [c for c in middle if c[0] == "coll" and c[1] == pb.COLL_ALL_GATHER]
    assert len(gathers) == 3 * m
    # Megatron's link sends the same activation as one call per direction, all-gathered once
    megatron = comm_sequence(by_engine["megatron"], _stage_rank(layout, 1))
    assert len([c for c in megatron if c[0] == "p2p"]) == 4 * m
    assert len([c for c in megatron if c[0] == "coll" and c[1] == pb.COLL_ALL_GATHER]) == 2 * m


def test_only_the_end_stages_load_data_and_the_host_waits_at_each_partitioned_tensor(jobs) -> None:
    """With TP > 1 the host waits for the device wherever DeepSpeed turns a partitioned tensor's
    metadata into a device tensor (``to_meta``: each output and gradient that leaves) or back
    into a list (``from_meta``'s ``tolist()``: each received activation and gradient, and the
    stage's own output rebuilt before its backward); with TP = 1 nothing waits after a transfer."""
    layout, by_engine = jobs
    job = by_engine["deepspeed"]
    m = layout.microbatches
    # (stage, loads data, waits per micro-batch in the forward, in the backward)
    for stage, loads, fwd, bwd in ((0, True, 1, 2), (1, False, 2, 3), (2, True, 1, 1)):
        rank = _stage_rank(layout, stage)
        bcasts = [c for c in comm_sequence(job, rank) if c[0] == "coll" and c[1] == pb.COLL_BROADCAST]
        # get_batch: the sizes and the tokens per micro-batch; then the loss over the pipeline
        assert len(bcasts) == (2 * m if loads else 0) + 1, stage
        syncs = Counter(n.annotations.phase for n in job.graph_of(rank).nodes if n.kind == pb.KIND_SYNC)
        # besides get_batch's sizes and the optimizer's gradient norm
        assert syncs == Counter({"forward": (fwd + loads) * m, "backward": bwd * m, "optimizer": 1}), stage
    cfg = GPTConfig.megatron(**SHAPE, pipeline_engine="deepspeed")
    plain = ParallelLayout(tp=1, pp=3, microbatches=4)
    job = trace(build_gpt(cfg), plain, TraceOptions(device="meta", warmup_steps=0)).job
    for stage, loads in ((0, True), (1, False), (2, True)):
        syncs = Counter(n.annotations.phase for n in job.graph_of(stage).nodes if n.kind == pb.KIND_SYNC)
        assert syncs == Counter({"forward": m if loads else 0, "optimizer": 1}) - Counter(), stage


def test_tied_gradients_are_reduced_before_the_flattened_data_parallel_ones(jobs) -> None:
    layout, by_engine = jobs
    job = by_engine["deepspeed"]
    rank = _stage_rank(layout, 0)
    seq = comm_sequence(job, rank)
    reduces = [c for c in seq if c[0] == "coll" and c[1] == pb.COLL_ALL_REDUCE and c[4] > 64]
    keys = [job.resolve_group(rank, c[2]).ranks for c in reduces[-2:]]
    embd, dp = keys
    assert len(embd) == 2 and _stage_rank(layout, 2) in embd   # first and last stage
    assert len(dp) == layout.dp
    # the data-parallel reduction reads a flattened copy and copies it back per parameter
    ops = [name for name, *_, attrs in kernel_ops(job.graph_of(rank)) if attrs[0] == "optimizer"]
    assert ops[:2] == ["aten::cat", "aten::mul_"]
    assert ops.count("aten::copy_") >= len([p for p in ops if p == "aten::cat"]) * 2



REAL = {"layers": 6, "hidden": 32, "heads": 4, "seq": 8, "micro_batch": 2, "vocab": 64,
        "grad_sync": "after-backward"}


@pytest.mark.parametrize(("tp", "pp", "checkpoints"), [(1, 3, False), (2, 2, False), (2, 2, True)])
def test_real_run_gives_the_gradients_of_one_stage(tmp_path, tp: int, pp: int, checkpoints: bool) -> None:
    """gloo processes run DeepSpeed's schedule for real (with TP 2, its partitioned tensors;
    and with partitioned activation checkpoints, each layer's input gathered back in the
    backward): every blocking send meets its receive, and each parameter's gradient, summed
    over the micro-batches, is the one a single stage of the same TP ranks gives without
    recomputation."""
    from gpt_real_runs import real_grads

    ref = real_grads(tmp_path, tp=tp, **REAL)
    extra = {"recompute": True, "partition_activations": True} if checkpoints else {}
    got = real_grads(tmp_path, tp=tp, pp=pp, pipeline_engine="deepspeed", **REAL, **extra)
    assert got.keys() == ref.keys() and len(ref) > 6 * 8
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-4, atol=1e-6, msg=k)


PREDICT = ["--layers", "4", "--hidden", "256", "--heads", "8", "--seq", "128", "--micro-batch", "1",
           "--global-batch", "8", "--tp", "2", "--pp", "2", "--dp", "2", "--vocab", "1024", "--gpu", "a100",
           "--gpus-per-node", "4"]


def test_predict_records_the_engine_and_prices_its_step(tmp_path) -> None:
    import json

    runs = {}
    for name, extra in (("megatron", []), ("deepspeed", ["--pipeline-engine", "deepspeed"])):
        r = runner.invoke(app, ["predict", *PREDICT, *extra, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["deepspeed"]["prediction"]["pipeline_engine"] == "deepspeed"
    assert "pipeline_engine" not in runs["megatron"]["prediction"]
    assert runs["deepspeed"]["step_time_ns"] != runs["megatron"]["step_time_ns"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--pipeline-engine", "fast"], "error: --pipeline-engine: 'fast' is not one of megatron, deepspeed"),
    (["--pipeline-engine", "deepspeed", "--no-scatter-gather-tensors-in-pipeline"],
     "error: --pipeline-engine: DeepSpeed's engine partitions every pipeline tensor over the TP ranks; "
     "--no-scatter-gather-tensors-in-pipeline is Megatron-LM's"),
    (["--pipeline-engine", "deepspeed", "--grad-sync", "overlap"],
     "DeepSpeed's pipeline engine does not run a gradient sync overlapped with the backward"),
    (["--pipeline-engine", "deepspeed", "--sync-timers"],
     "DeepSpeed's pipeline engine does not run Megatron's synchronising timers"),
])
def test_bad_engine_settings_are_one_line(tmp_path, extra, message) -> None:
    r = runner.invoke(app, ["predict", *PREDICT, *extra, "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
    assert not (tmp_path / "bad").exists()


def test_interleaving_is_megatrons(tmp_path) -> None:
    r = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "8", "--pp", "4", "--microbatches", "4",
                            "--num-layers-per-virtual-pipeline-stage", "1", "--pipeline-engine", "deepspeed",
                            "--device", "meta", "-o", str(tmp_path / "j")])
    assert r.exit_code == 2 and "does not run interleaved pipeline stages" in r.stderr
    assert not (tmp_path / "j").exists()


def test_trace_and_sweep_take_the_engine(tmp_path) -> None:
    import json

    from echo_et.ir import load_job

    r = runner.invoke(app, ["trace", "--workload", "megatron-gpt", "--layers", "4", "--hidden", "64", "--heads", "4",
                            "--seq", "16", "--vocab", "128", "--tp", "2", "--pp", "2", "--microbatches", "2",
                            "--pipeline-engine", "deepspeed", "--device", "meta", "-o", str(tmp_path / "j")])
    assert r.exit_code == 0, r.output
    job = load_job(tmp_path / "j")
    assert "--pipeline-engine deepspeed" in job.manifest.provenance.command
    # re-staging regenerates Megatron's 1F1B, not this engine's: refused in one line
    r = runner.invoke(app, ["scale", str(tmp_path / "j"), "--pp", "4", "-o", str(tmp_path / "restaged")])
    assert r.exit_code == 2 and "traced under deepspeed's pipeline engine" in r.stderr, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "restaged").exists()
    gathers = [n for n in job.graph_of(0).nodes if n.kind == pb.KIND_COLLECTIVE
               and n.collective.type == pb.COLL_ALL_GATHER]
    assert len(gathers) == 2 * 2           # first stage: each received gradient, each own output
    r = runner.invoke(app, ["trace", "--script", "x.py:f", "--pipeline-engine", "deepspeed", "-o", str(tmp_path / "s")])
    assert r.exit_code == 2 and "--pipeline-engine applies to the built-in workloads" in r.stderr
    csv = tmp_path / "rows.csv"
    csv.write_text("layers,hidden,heads,seq,micro_batch,global_batch,tp,pp,dp,vocab\n4,256,8,128,1,8,2,2,2,1024\n")
    r = runner.invoke(app, ["sweep", "--configs", str(csv), "--pipeline-engine", "deepspeed",
                            "-o", str(tmp_path / "sw"), "--json"])
    assert r.exit_code == 0, r.output
    results = json.loads((tmp_path / "sw" / "results.json").read_text())
    assert results["options"]["pipeline_engine"] == "deepspeed" and not results["rows"][0].get("error")
    r = runner.invoke(app, ["sweep", str(tmp_path / "j"), "--dp", "2", "--pipeline-engine", "deepspeed",
                            "-o", str(tmp_path / "lay")])
    assert r.exit_code == 2 and "only applies with --configs" in r.stderr


def test_partitioned_checkpoints_gather_each_layer_input_in_the_backward() -> None:
    """``partition_activations``: each layer keeps 1/TP of its input and all-gathers it over
    the TP group before it runs again in the backward: one all-gather per layer and
    micro-batch, of the layer input's bytes, in the backward."""
    layout = ParallelLayout(tp=2, pp=2, microbatches=3)
    counts = {}
    for partition in (False, True):
        cfg = GPTConfig.megatron(**SHAPE, partition_activations=partition)
        job = trace(build_gpt(cfg), layout, TraceOptions(device="meta", warmup_steps=0, verify="all")).job
        g = job.graph_of(0)
        counts[partition] = Counter(
            (n.annotations.phase, n.collective.out_bytes) for n in g.nodes
            if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_GATHER)
    layer_input = 16 * 2 * 32 * 2                       # s x b x h, float16
    extra = counts[True] - counts[False]
    assert extra == Counter({("backward", layer_input): 3 * 3})   # 3 layers a stage, 3 micro-batches
    with pytest.raises(Exception, match="partitioned activation checkpoints need full recomputation"):
        GPTConfig.megatron(**{**SHAPE, "recompute": False}, partition_activations=True).validate(layout)


def test_predict_and_sweep_take_partitioned_checkpoints(tmp_path) -> None:
    import json

    from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for

    runs = {}
    for name, extra in (("whole", []), ("partitioned", ["--partition-activations"])):
        r = runner.invoke(app, ["predict", *PREDICT, "--recompute", *extra, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert runs["partitioned"]["prediction"]["partition_activations"] is True
    assert "partition_activations" not in runs["whole"]["prediction"]
    # the gathers are more work on the critical path of every stage's backward
    assert runs["partitioned"]["step_time_ns"] > runs["whole"]["step_time_ns"]
    r = runner.invoke(app, ["predict", *PREDICT, "--partition-activations", "-o", str(tmp_path / "bad")])
    assert r.exit_code == 2 and "partitioned activation checkpoints need full recomputation" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()
    row = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "micro_batch": 1, "global_batch": 8,
           "tp": 2, "pp": 2, "dp": 2, "vocab": 1024}
    cfg, _ = workload_for(row, ConfigSweepOptions(recompute=True, partition_activations=True))
    assert cfg.partition_activations


def test_the_gpt_workload_reduces_after_the_schedule_under_the_engine(tmp_path) -> None:
    """The gpt workload's default gradient sync overlaps the backward, which the engine does
    not run: under ``--pipeline-engine deepspeed`` its default is the reduction after the
    schedule, and asking for the overlap is one line."""
    from echo_et.ir import load_job

    base = ["trace", "--workload", "gpt", "--pp", "2", "--tp", "2", "--microbatches", "2", "--device", "meta",
            "--pipeline-engine", "deepspeed"]
    r = runner.invoke(app, [*base, "-o", str(tmp_path / "j")])
    assert r.exit_code == 0, r.output
    assert "--grad-sync after-backward" in load_job(tmp_path / "j").manifest.provenance.command
    r = runner.invoke(app, [*base, "--grad-sync", "overlap", "-o", str(tmp_path / "k")])
    assert r.exit_code == 2 and "does not run a gradient sync overlapped" in r.stderr
    assert not (tmp_path / "k").exists()
