"""Megatron-Core's overlapped data-parallel sync. ``--overlap-grad-reduce``: the gradient sync
overlapped with the last micro-batch's backward, in Megatron-Core's buckets of max(40M, 1M x
dp) parameters (where ``--grad-sync overlap`` is PyTorch DDP's 25 MB), reduce-scattered with
the distributed optimizer. ``--overlap-param-gather``: the distributed optimizer's all-gathers
of the updated weights during the next step's forward, one bucket ahead of the layers. On
trace, predict and sweep --configs."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")

from gpt_real_runs import dp_weights  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from echo_et.cli.main import app  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions, workload_for  # noqa: E402
from echo_et.ir import load_job  # noqa: E402
from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace.compare import ex_situ_comms  # noqa: E402
from echo_et.workloads.gpt_config import megatron_core_bucket_mb  # noqa: E402

runner = CliRunner()
# 8 layers of hidden 1024 and GPT-2's vocabulary: 152M parameters, 3-4 of Megatron-Core's buckets
SHAPE = ["--layers", "8", "--hidden", "1024", "--heads", "16", "--seq", "64", "--dtype", "bfloat16"]


def _predicted(tmp_path, args: list, variants: dict[str, list]) -> dict[str, dict]:
    """Each variant's summary.json: ``predict`` with ``args`` and the variant's own options."""
    runs = {}
    for name, extra in variants.items():
        r = runner.invoke(app, ["predict", *args, *extra, "-o", str(tmp_path / name)])
        assert r.exit_code == 0, r.output
        runs[name] = json.loads((tmp_path / name / "summary.json").read_text())
    return runs


def test_megatron_cores_bucket_is_40m_parameters_or_1m_per_data_parallel_rank() -> None:
    assert megatron_core_bucket_mb(8, "bfloat16") == 40_000_000 * 2 / (1 << 20)
    assert megatron_core_bucket_mb(40, "float16") == megatron_core_bucket_mb(1, "float16")
    assert megatron_core_bucket_mb(64, "float32") == 64_000_000 * 4 / (1 << 20)


def _buckets(tmp_path, dp: int) -> tuple[list[int], str]:
    out = tmp_path / f"dp{dp}"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE, "--overlap-grad-reduce", "--zero", "1",
                              "--dp", str(dp), "--device", "meta", "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    calls = ex_situ_comms(job, 0)
    scattered = [nbytes // 4 for kind, nbytes, group in calls if kind == "reduce_scatter"]   # fp32 elements
    # reduced during the backward: every bucket's reduce-scatter before the optimizer's gathers
    kinds = [kind for kind, _, group in calls if group == "dp" and kind != "all_reduce"]
    assert kinds == ["reduce_scatter"] * len(scattered) + ["all_gather"] * len(scattered)
    return scattered, job.manifest.provenance.command


def test_the_trace_reduces_megatron_cores_buckets(tmp_path) -> None:
    """Each bucket closes at the first parameter that takes it to max(40M, 1M x dp): at dp 2
    every full bucket holds 40M-41M parameters (a layer's largest weight is 4M), at dp 64
    64M-65M, so fewer buckets carry the same 152M gradients; the recorded command reruns it."""
    small, command = _buckets(tmp_path, 2)
    large, _ = _buckets(tmp_path, 64)
    assert sum(small) == pytest.approx(sum(large), rel=1e-4) and sum(small) > 150_000_000
    for sizes, cap in ((small, 40_000_000), (large, 64_000_000)):
        full = [n for n in sizes if n >= cap]
        assert full and all(n < cap + 4_200_000 or n == max(sizes) for n in full)
    assert len(large) < len(small)
    assert "--overlap-grad-reduce" in command and "--bucket-mb" not in command


@pytest.mark.parametrize("extra,split", [([], True), (["--no-align-grad-reduce"], True), (["--zero", "0"], False),
                                         (["--arch", "llama", "--kv-heads", "16"], False)])
def test_the_shared_embedding_is_a_bucket_of_its_own(tmp_path, extra: list, split: bool) -> None:
    """Megatron-Core's DDP gives the word embedding shared by the first and the last stage a
    bucket of its own under the distributed optimizer, so both stages shard it alike; the first
    stage reduces it last, during its last backward. The last stage (one bucket otherwise)
    issues both after the schedule, as Megatron-LM's default --align-grad-reduce has the stages
    after the first do; with --no-align-grad-reduce its copy's goes first, while the rest of the
    backward runs. Not without the distributed optimizer, nor with untied embeddings (Llama)."""
    out = tmp_path / "job"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE, "--overlap-grad-reduce", "--zero", "1",
                              "--dp", "2", "--pp", "2", "--microbatches", "2", "--device", "meta", *extra,
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    word = 50304 * 1024 * 4                  # the padded vocabulary x hidden, fp32 gradients

    def reductions(graph):
        """The gradients' data-parallel reductions (issued in the backward or after the schedule)."""
        return [n for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.group == "dp"
                and n.collective.type in (pb.COLL_REDUCE_SCATTER, pb.COLL_ALL_REDUCE) and n.collective.in_bytes > 1024]

    def last_backward(graph):
        return max(n.id for n in graph.nodes if n.kind == pb.KIND_COMPUTE and n.annotations.phase == "backward")

    last, first = job.graph_of(job.manifest.layout.dp), job.graph_of(0)
    colls = reductions(last)
    if not split:
        assert len(colls) == 1 and colls[0].collective.in_bytes != word
        return
    assert [n.collective.in_bytes == word for n in colls] == [True, False]
    early = "--no-align-grad-reduce" in extra
    assert (colls[0].id < last_backward(last)) == early and colls[1].id > last_backward(last)
    ahead = reductions(first)
    assert ahead[-1].collective.in_bytes == word and all(n.collective.in_bytes != word for n in ahead[:-1])
    assert ahead[0].id < last_backward(first)         # the first stage's buckets as its backward fills them


def test_a_sweep_row_gets_the_bucket_of_its_data_parallel_size() -> None:
    opts = ConfigSweepOptions(overlap_grad_reduce=True, dtype="bfloat16", use_distributed_optimizer=True)
    row = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 1, "global_batch": 64, "tp": 1,
           "pp": 1, "dp": 64}
    cfg, _ = workload_for(row, opts)
    assert cfg.grad_sync == "overlap" and cfg.bucket_mb == megatron_core_bucket_mb(64, "bfloat16")
    assert "overlap_grad_reduce" in opts.to_json() and "overlap_grad_reduce" not in ConfigSweepOptions().to_json()


def test_predict_overlaps_the_reduction_and_records_it(tmp_path) -> None:
    dp8 = [*SHAPE, "--micro-batch", "2", "--global-batch", "32", "--dp", "8", "--use-distributed-optimizer",
           "--gpu", "a100"]
    runs = _predicted(tmp_path, dp8, {"after": [], "overlap": ["--overlap-grad-reduce"]})
    assert runs["overlap"]["prediction"]["overlap_grad_reduce"] is True
    assert "overlap_grad_reduce" not in runs["after"]["prediction"]
    exposed = {k: v["ranks"]["0"]["exposed_comm_ns"] for k, v in runs.items()}
    assert exposed["overlap"] < exposed["after"]


@pytest.mark.parametrize("args, message", [
    (["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--global-batch", "2", "--overlap-grad-reduce",
      "--grad-sync", "after-backward"], "--grad-sync: --overlap-grad-reduce is the overlapped sync in Megatron-Core's"),
    (["trace", "--workload", "gpt", "--overlap-grad-reduce"], "--overlap-grad-reduce is Megatron-Core's overlapped"),
    (["trace", "--workload", "megatron-gpt", "--overlap-grad-reduce", "--bucket-mb", "10"],
     "without --grad-sync or --bucket-mb"),
    (["trace", "--script", "x.py:build", "--overlap-grad-reduce"], "--overlap-grad-reduce applies to the built-in"),
    (["sweep", "fixtures/jobs/ddp-dp4", "--dp", "2", "--overlap-grad-reduce"],
     "--overlap-grad-reduce only applies with --configs"),
    (["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--global-batch", "2", "--dp", "2",
      "--overlap-param-gather", "--overlap-grad-reduce"],
     "--overlap-param-gather: the weights' all-gathers belong to --use-distributed-optimizer"),
    (["trace", "--workload", "megatron-gpt", "--overlap-param-gather", "--grad-sync", "overlap", "--dp", "2"],
     "need Megatron's distributed optimizer (ZeRO stage 1) and its gradient sync overlapped"),
    (["trace", "--script", "x.py:build", "--overlap-param-gather"], "--overlap-param-gather applies to the built-in"),
    (["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--global-batch", "2", "--no-align-grad-reduce"],
     "--no-align-grad-reduce: it changes when --overlap-grad-reduce's collectives are issued"),
    (["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--global-batch", "2", "--overlap-grad-reduce",
      "--no-align-param-gather"], "--no-align-param-gather: it changes when --overlap-param-gather's collectives"),
    (["trace", "--workload", "megatron-gpt", "--no-align-grad-reduce"],
     "reductions not aligned across the stages are Megatron-Core's overlapped gradient sync's"),
    (["trace", "--workload", "megatron-gpt", "--no-align-param-gather"],
     "weight gathers not aligned across the stages are those of Megatron-Core's gathers in the forward"),
    (["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--global-batch", "2", "--overlap-grad-reduce",
      "--overlap-param-gather-with-optimizer-step"],
     "--overlap-param-gather-with-optimizer-step: it changes when --overlap-param-gather's collectives"),
    (["predict", "--layers", "2", "--hidden", "64", "--heads", "4", "--global-batch", "2", "--dp", "2",
      "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
      "--overlap-param-gather-with-optimizer-step"],
     "--overlap-param-gather-with-optimizer-step: it is the interleaved schedule's (Megatron asserts one)"),
    (["trace", "--workload", "megatron-gpt", "--zero", "1", "--dp", "2", "--overlap-grad-reduce",
      "--overlap-param-gather", "--overlap-param-gather-with-optimizer-step"],
     "the first chunk's all-gathers after its optimizer step need Megatron-Core's gathers in the forward and "
     "the interleaved schedule"),
])
def test_what_cannot_overlap_is_one_line(tmp_path, args: list, message: str) -> None:
    res = runner.invoke(app, [*args, "-o", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out").exists()


# -- the weights gathered in the next forward (--overlap-param-gather) ------------------------------
@pytest.mark.parametrize("aligned,chunked", [(False, False), (True, False), (False, True)])
def test_the_next_forward_gathers_what_the_optimizer_updated(tmp_path, aligned: bool, chunked: bool) -> None:
    """Two gloo ranks with ZeRO 1: after the optimizer each rank holds only its own shard
    updated; the next step's first forward gathers the rest, and the weights are then those
    the all-gather after the optimizer gives. Aligned (the interleaved schedule's form), the
    model is in two chunks: the schedule issues the first chunk's gathers, the second chunk's
    first forward issues its own; chunked and not aligned (--no-align-param-gather), each
    chunk's first forward starts its own chain."""
    after_step = dp_weights(tmp_path, zero=1, overlap=True)
    in_forward = dp_weights(tmp_path, zero=1, overlap=True, gather_in_forward=True, align_gather=aligned,
                            chunked=chunked)
    run = "dp-z1-rs1-ov1-g1" + ("-aligned" if aligned else "") + ("-chunked" if chunked else "")
    before = [torch.load(tmp_path / run / f"rank{r}-before.pt") for r in range(2)]
    for r in range(2):
        assert any(not torch.equal(a, b) for a, b in zip(before[r], after_step[r], strict=True))
        for a, b in zip(in_forward[r], after_step[r], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_first_chunks_gathers_after_its_update_give_the_same_weights(tmp_path) -> None:
    """--overlap-param-gather-with-optimizer-step, for real on two gloo ranks with Megatron's
    optimizer: the first chunk's shards updated first and gathered while the second's are, the
    second chunk's gathered in the next forward: the weights are those of the gather after the
    optimizer."""
    after_step = dp_weights(tmp_path, zero=1, overlap=True, megatron_adam=True)
    with_step = dp_weights(tmp_path, zero=1, overlap=True, gather_in_forward=True, align_gather=True,
                           gather_with_step=True, megatron_adam=True)
    for r in range(2):
        for a, b in zip(with_step[r], after_step[r], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_trace_gathers_the_first_chunk_after_its_update(tmp_path) -> None:
    """The traced step: the first chunk's all-gathers issued between its update and the other
    chunk's (two fused Adam kernels), the second chunk's at the schedule's start; no chunk cut
    into buckets, the first stage's first chunk but for its embedding's own."""
    out = tmp_path / "job"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE[:1], "12", *SHAPE[2:],
                              "--overlap-grad-reduce", "--overlap-param-gather", "--zero", "1", "--dp", "2", "--pp",
                              "3", "--microbatches", "6", "--num-layers-per-virtual-pipeline-stage", "2",
                              "--overlap-param-gather-with-optimizer-step", "--device", "meta", "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    assert "--overlap-param-gather-with-optimizer-step" in job.manifest.provenance.command
    for stage in range(3):
        nodes = sorted(job.graph_of(job.manifest.layout.dp * stage).nodes, key=lambda n: n.id)
        gathers = [n for n in nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_GATHER
                   and n.collective.group == "dp"]
        adam = [n.id for n in nodes if n.name == "aten::_fused_adam_"]
        assert len(adam) == 2, stage
        late = [n for n in gathers if n.annotations.phase == "optimizer"]
        early = [n for n in gathers if n.annotations.phase == "forward"]
        assert len(late) == (2 if stage == 0 else 1) and len(early) == (2 if stage == 2 else 1), stage
        assert all(adam[0] < n.id < adam[1] for n in late)


def test_the_trace_gathers_in_the_first_forward(tmp_path) -> None:
    out = tmp_path / "job"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE, "--overlap-grad-reduce",
                              "--overlap-param-gather", "--zero", "1", "--dp", "2", "--microbatches", "2",
                              "--device", "meta", "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    assert "--overlap-param-gather" in job.manifest.provenance.command
    graph = job.graph(job.manifest.bindings[0].graph)
    colls = [n for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.type != pb.COLL_ALL_REDUCE]
    gathers = [n for n in colls if n.collective.type == pb.COLL_ALL_GATHER]
    scatters = [n for n in colls if n.collective.type == pb.COLL_REDUCE_SCATTER]
    # every bucket's weights gathered once, in the first micro-batch's forward, before any
    # gradient is reduced; nothing gathered after the optimizer
    assert len(gathers) == len(scatters) > 2
    assert {(n.annotations.phase, n.annotations.microbatch) for n in gathers} == {("forward", 0)}
    assert max(n.id for n in gathers) < min(n.id for n in scatters)
    assert sorted(n.collective.out_bytes for n in gathers) == sorted(n.collective.in_bytes // 2 for n in scatters)
    # re-staging does not regenerate the waits inside the first forward's layers: refused
    res = runner.invoke(app, ["scale", str(out), "--pp", "2", "-o", str(tmp_path / "restaged")])
    assert res.exit_code == 2 and "re-staging does not regenerate" in res.output, res.output
    # more data-parallel ranks: each gather in the forward takes a smaller shard of the same bucket
    from echo_et.passes import scale

    wider, _ = scale(job, dp=8)
    resized = [n for n in wider.graph_of(0).nodes
               if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_GATHER]
    assert [(n.annotations.phase, n.collective.out_bytes) for n in resized] == [
        (n.annotations.phase, -(-n.collective.out_bytes // 16) * 16) for n in gathers]
    assert all(n.collective.in_bytes * 8 == n.collective.out_bytes for n in resized)


def test_predict_hides_the_gathers_behind_the_forward(tmp_path) -> None:
    dp8 = [*SHAPE[:-4], "--seq", "1024", "--dtype", "bfloat16", "--micro-batch", "2", "--global-batch", "64",
           "--dp", "8", "--use-distributed-optimizer", "--overlap-grad-reduce", "--gpu", "a100",
           "--gpus-per-node", "4", "--inter-bw", "200Gb/s/node"]
    runs = _predicted(tmp_path, dp8, {"after": [], "forward": ["--overlap-param-gather"]})
    assert runs["forward"]["prediction"]["overlap_param_gather"] is True
    rank = {k: v["ranks"]["0"] for k, v in runs.items()}
    assert rank["forward"]["comm_ns"] == rank["after"]["comm_ns"]          # the same calls, moved
    assert rank["forward"]["exposed_comm_ns"] < rank["after"]["exposed_comm_ns"]
    assert runs["forward"]["step_time_ns"] < runs["after"]["step_time_ns"]


def test_megatron_core_buckets_the_first_stages_first_chunk_only(tmp_path) -> None:
    """Megatron-Core turns bucketing off on the pipeline stages after the first and for the
    model chunks after the first: each such chunk's gradients are one reduce-scatter. With the
    interleaved schedule (3 stages of 2 chunks) Megatron-LM aligns the reductions across the
    stages (--align-grad-reduce): a chunk's are issued whole, stage s steps after the chunk's
    last backward on the first stage, the chunks not reached by the schedule's end after it.
    The shared word embedding (tied, on the first stage's first chunk and the last stage's last)
    is a bucket of its own under the distributed optimizer, as Megatron-Core's DDP cuts it."""
    out = tmp_path / "job"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE[:1], "12", *SHAPE[2:],
                              "--overlap-grad-reduce", "--zero", "1", "--dp", "2", "--pp", "3", "--microbatches", "6",
                              "--num-layers-per-virtual-pipeline-stage", "2", "--device", "meta", "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    per_stage = []
    for stage in range(3):
        graph = job.graph_of(job.manifest.layout.dp * stage)
        scatters = [n for n in graph.nodes
                    if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_REDUCE_SCATTER]
        # chunk 1's after backward virtual micro-step 8 + stage (micro-batch 5, 3, 4), chunk 0's
        # after step 11 on the first stage, after the schedule on the others (micro-batch 5)
        mbs = [n.annotations.microbatch for n in scatters]
        assert {n.annotations.phase for n in scatters} == {"backward"}
        chunk1 = 2 if stage == 2 else 1          # the last stage's chunk 1: the embedding, the rest
        assert mbs == [(5, 3, 4)[stage]] * chunk1 + [5] * (len(mbs) - chunk1), stage
        # issued whole after the backward, none while it runs
        last_backward = max(n.id for n in graph.nodes if n.kind == pb.KIND_COMPUTE
                            and n.annotations.phase == "backward")
        assert min(n.id for n in scatters[chunk1:]) > last_backward
        per_stage.append([n.collective.in_bytes // 4 for n in scatters])
    # the first stage: its second chunk whole (2 layers), then its first chunk (2 layers and the
    # positions, under 40M), the word embedding (50304 x 1024, fp32 gradients) last and alone;
    # the last stage: the embedding's copy first (the output layer's gradient comes first)
    assert len(per_stage[0]) == 3 and per_stage[0][0] == per_stage[1][0] == per_stage[1][1]
    assert per_stage[0][1] == per_stage[0][0] + 64 * 1024            # with the positions
    assert per_stage[0][-1] == per_stage[2][0] == 50304 * 1024
    assert [len(s) for s in per_stage[1:]] == [2, 3]


# -- the gathers with the interleaved schedule, aligned across the stages ---------------------------
def test_the_interleaved_schedule_issues_each_chunks_gathers_where_megatron_does() -> None:
    """Megatron's --align-param-gather: chunks 0 and 1 before the schedule; chunk c + 1's when
    virtual micro-step k + stage is chunk c's first micro-batch, so every stage issues it at
    the same time (c x stages virtual micro-steps in)."""
    from echo_et.workloads.pipeline_plan import param_sync_chunk

    def issued(stages, chunks, microbatches):
        return {s: [(k, c) for k in range(microbatches * chunks)
                    if (c := param_sync_chunk(k, stages, s, chunks, microbatches)) is not None]
                for s in range(stages)}

    assert issued(4, 4, 8) == {0: [(4, 2), (8, 3)], 1: [(3, 2), (7, 3)], 2: [(2, 2), (6, 3)], 3: [(1, 2), (5, 3)]}
    assert issued(3, 2, 6) == {0: [], 1: [], 2: []}        # two chunks: both before the schedule


def test_the_interleaved_schedule_issues_each_chunks_reduction_where_megatron_does() -> None:
    """Megatron's --align-grad-reduce: a chunk's after backward virtual micro-step k + stage
    when k is the chunk's last backward micro-batch (the last group's, the last of its stages
    steps); what the schedule does not reach is issued after it."""
    from echo_et.workloads.pipeline_plan import grad_sync_chunk

    def issued(stages, chunks, microbatches):
        return {s: [(k, c) for k in range(microbatches * chunks)
                    if (c := grad_sync_chunk(k, stages, s, chunks, microbatches)) is not None]
                for s in range(stages)}

    assert issued(3, 2, 6) == {0: [(8, 1), (11, 0)], 1: [(9, 1)], 2: [(10, 1)]}
    # 4 stages, 3 chunks, 8 micro-batches: the last group is steps 12-23, chunk 2's last backward
    # step 15, chunk 1's 19, chunk 0's 23; a later stage reaches fewer of them
    assert issued(4, 3, 8) == {0: [(15, 2), (19, 1), (23, 0)], 1: [(16, 2), (20, 1)],
                               2: [(17, 2), (21, 1)], 3: [(18, 2), (22, 1)]}
    assert issued(4, 3, 12)[3] == [(30, 2), (34, 1)]


@pytest.mark.parametrize("zero", [0, 1])
def test_aligned_reductions_give_the_weights_of_the_reduction_after_the_backward(tmp_path, zero) -> None:
    """Two gloo ranks, the model in two chunks: the second chunk's gradients reduced when the
    schedule says, the first's by finish_and_step; the step's weights are those of the
    reduction after the backward, on every rank."""
    after = dp_weights(tmp_path, zero=zero)
    aligned = dp_weights(tmp_path, zero=zero, overlap=True, align_reduce=True)
    for r in range(2):
        for a, b in zip(aligned[r], after[r], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_interleaved_trace_gathers_each_chunk_where_the_schedule_says(tmp_path) -> None:
    out = tmp_path / "job"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE[:1], "12", *SHAPE[2:],
                              "--overlap-grad-reduce", "--overlap-param-gather", "--zero", "1", "--dp", "2", "--pp",
                              "3", "--microbatches", "6", "--num-virtual-stages-per-pipeline-rank", "4",
                              "--device", "meta", "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    for stage in range(3):
        graph = job.graph_of(job.manifest.layout.dp * stage)
        colls = [n for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE]
        gathers = [n for n in colls if n.collective.type == pb.COLL_ALL_GATHER]
        scatters = [n for n in colls if n.collective.type == pb.COLL_REDUCE_SCATTER]
        # one gather per bucket (a chunk past the first stage's first is one bucket), each in
        # the forward: chunks 0 and 1 at the start, chunks 2 and 3 at micro-batch 0 on the first
        # stage, 2 on the second and 1 on the third; none after the optimizer
        # (the shared embedding a bucket of its own: the first stage's chunk 0 is its layer and
        # the positions, then the embedding; the last stage's chunk 3 the embedding's copy, the rest)
        assert len(gathers) == len(scatters) == (5, 4, 5)[stage], stage
        later = (2, 2, 3)[stage]
        assert [(n.annotations.phase, n.annotations.microbatch) for n in gathers] == \
            [("forward", 0)] * (len(gathers) - later) + [("forward", (0, 2, 1)[stage])] * later
        assert max(n.id for n in gathers) < min(n.id for n in scatters)
    # re-staging cannot regenerate them: one line
    res = runner.invoke(app, ["scale", str(out), "--pp", "2", "-o", str(tmp_path / "restaged")])
    assert res.exit_code == 2 and "re-staging does not regenerate" in res.output, res.output


def test_not_aligned_each_chunk_issues_its_own(tmp_path) -> None:
    """--no-align-grad-reduce and --no-align-param-gather with the interleaved schedule: every
    stage reduces each chunk's buckets as the backward of its last micro-batch fills them (not
    at points aligned across the stages), and each chunk's gathers start at its own first
    forward, micro-batch 0 on every stage, as Megatron-Core's pre-hooks issue them."""
    out = tmp_path / "job"
    res = runner.invoke(app, ["trace", "--workload", "megatron-gpt", *SHAPE[:1], "12", *SHAPE[2:],
                              "--overlap-grad-reduce", "--overlap-param-gather", "--zero", "1", "--dp", "2", "--pp",
                              "3", "--microbatches", "6", "--num-virtual-stages-per-pipeline-rank", "4",
                              "--no-align-grad-reduce", "--no-align-param-gather", "--device", "meta", "-o", str(out)])
    assert res.exit_code == 0, res.output
    job = load_job(out)
    assert "--no-align-grad-reduce --no-align-param-gather" in job.manifest.provenance.command
    for stage in range(3):
        graph = job.graph_of(job.manifest.layout.dp * stage)
        colls = [n for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE and n.collective.group == "dp"]
        gathers = [n for n in colls if n.collective.type == pb.COLL_ALL_GATHER]
        scatters = [n for n in colls if n.collective.type == pb.COLL_REDUCE_SCATTER]
        assert len(gathers) == len(scatters) == (5, 4, 5)[stage], stage
        assert {(n.annotations.phase, n.annotations.microbatch) for n in gathers} == {("forward", 0)}
        assert {(n.annotations.phase, n.annotations.microbatch) for n in scatters} == {("backward", 5)}
        last_backward = max(n.id for n in graph.nodes if n.kind == pb.KIND_COMPUTE
                            and n.annotations.phase == "backward")
        assert min(n.id for n in scatters) < last_backward       # the later chunks' during the backward


def test_predict_hides_the_interleaved_gathers_too(tmp_path) -> None:
    args = [*SHAPE[:1], "12", *SHAPE[2:-4], "--seq", "1024", "--dtype", "bfloat16", "--micro-batch", "1",
            "--global-batch", "48", "--pp", "3", "--dp", "4", "--num-layers-per-virtual-pipeline-stage", "1",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--gpu", "a100", "--gpus-per-node", "4",
            "--inter-bw", "200Gb/s/node"]
    runs = _predicted(tmp_path, args, {"after": [], "forward": ["--overlap-param-gather"]})
    rank = {k: v["ranks"]["0"] for k, v in runs.items()}
    # the same calls, moved (into the forward, where they share the links with the pipeline's)
    assert rank["forward"]["comm_ns"] == pytest.approx(rank["after"]["comm_ns"], rel=0.02)
    assert rank["forward"]["exposed_comm_ns"] < rank["after"]["exposed_comm_ns"]
    assert runs["forward"]["step_time_ns"] < runs["after"]["step_time_ns"]


def test_a_sweep_gathers_with_the_step_on_its_interleaved_rows_only() -> None:
    """Megatron asserts an interleaved schedule for --overlap-param-gather-with-optimizer-step:
    a sweep given it applies it to its interleaved rows, and runs its plain rows without."""
    row = {"layers": 12, "hidden": 64, "heads": 4, "seq": 16, "micro_batch": 1, "global_batch": 12, "tp": 1,
           "pp": 3, "dp": 2}
    opts = ConfigSweepOptions(use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True,
                              overlap_param_gather_with_optimizer_step=True)
    assert workload_for(row, opts)[0].overlap_param_gather_with_optimizer_step is False
    assert workload_for({**row, "layers_per_virtual_stage": 2}, opts)[0].overlap_param_gather_with_optimizer_step
