"""Re-staging (``scale --pp``) a megatron-gpt Job: its embedding and model-parallel groups,
its per-micro-batch loss averaging, Megatron's local DDP (one buffer reduced after the
whole schedule), the device sync after each pipeline transfer, and an untimed graph kept
untimed. Each re-staged Job is checked against the Job traced at the target layout."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")

from echo_et.errors import EchoError  # noqa: E402
from echo_et.ir import check_job  # noqa: E402
from echo_et.ir.schema import pb  # noqa: E402
from echo_et.models.comm import CommModel  # noqa: E402
from echo_et.models.compute import ComputeModel  # noqa: E402
from echo_et.passes import retime_compute, scale  # noqa: E402
from echo_et.passes.mesh import Mesh  # noqa: E402
from echo_et.passes.pipeline import restaged_group  # noqa: E402
from echo_et.sim import simulate  # noqa: E402
from echo_et.trace.compare import comm_sequence  # noqa: E402
from echo_et.trace.layout import ParallelLayout  # noqa: E402
from echo_et.trace.tracer import TraceOptions, trace  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

SHAPE = dict(layers=4, hidden=64, heads=4, seq=32, micro_batch=1, vocab=512)
MICRO = 4


@pytest.fixture(scope="module")
def traced():
    cache: dict[tuple, object] = {}

    def get(tp: int, pp: int, dp: int, device: str = "meta", workload: str = "megatron-gpt", zero: int = 0,
            **options):
        key = (tp, pp, dp, device, workload, zero, tuple(sorted(options.items())))
        if key not in cache:
            cfg = (GPTConfig.megatron(**SHAPE, **options) if workload == "megatron-gpt"
                   else GPTConfig(**SHAPE, **options))
            # measured on CPU: three steps, each operator's shortest time kept (a busy machine
            # stretches one trace's operators, not the other's)
            opts = (TraceOptions(device=device, warmup_steps=0) if device == "meta"
                    else TraceOptions(device=device, warmup_steps=1, measured_steps=3))
            cache[key] = trace(build_gpt(cfg), ParallelLayout(tp=tp, pp=pp, dp=dp, microbatches=MICRO, zero=zero),
                               opts, workload_attrs=cfg.to_json()).job
        return cache[key]

    return get


CASES = [((2, 2, 2), 4), ((2, 2, 2), 1), ((2, 4, 1), 2), ((1, 2, 2), 4)]


def _groups(job, rank: int) -> dict[str, tuple[int, ...]]:
    return {k: tuple(job.group(g).ranks) for k, g in job.binding(rank).groups.items()}


@pytest.mark.parametrize(("layout", "pp"), CASES)
def test_restaged_megatron_job_issues_what_tracing_at_the_target_issues(traced, layout, pp) -> None:
    """Every rank's collectives and transfers (type, group members, bytes, peer) and group
    bindings are those of the Job traced at the target depth: the embedding all-reduce only
    between the two ends (none at one stage), the model-parallel group over every tp and pp
    rank, each micro-batch's loss averaged over the replicas, and one data-parallel buffer
    per stage (the tied embedding's gradient counted once when both ends are one stage)."""
    tp, old_pp, dp = layout
    restaged, _ = scale(traced(tp, old_pp, dp), pp=pp)
    direct = traced(tp, pp, dp)
    assert check_job(restaged) == [] and restaged.world_size == direct.world_size
    for r in range(direct.world_size):
        assert comm_sequence(restaged, r) == comm_sequence(direct, r), r
        assert _groups(restaged, r) == _groups(direct, r), r


@pytest.mark.parametrize(("layout", "pp", "workload"), [*((c, p, "megatron-gpt") for c, p in CASES[:3]),
                                                        ((2, 2, 2), 4, "gpt"), ((2, 4, 2), 2, "gpt")])
def test_restaged_meta_job_predicts_what_the_traced_one_does(traced, layout, pp, workload) -> None:
    """Predicted on an A100 the re-staged Job's step is within 3 % of the traced one's: its
    graphs stay untimed (priced by the models, not by gaps), keep the host launches of the
    meta-device trace, wait for the device after each transfer as Megatron does (only the
    device streams wait otherwise), and carry the optimizer to the stage's parameters.
    (Before, a re-staged megatron-gpt Job was refused, and a gpt one lost all of this: this
    host-bound step predicted 2.5x fast, or deadlocked.)"""
    tp, old_pp, dp = layout
    restaged, _ = scale(traced(tp, old_pp, dp, workload=workload), pp=pp)
    direct = traced(tp, pp, dp, workload=workload)
    for r in range(direct.world_size):
        assert comm_sequence(restaged, r) == comm_sequence(direct, r), r
    for gid in restaged.graph_ids():
        assert restaged.graph(gid).header.attrs.get("trace.timing") == "untimed"
    model, comm = ComputeModel.preset("a100"), CommModel.preset("a100-ib")
    times = [simulate(retime_compute(job, model)[0], "predict", comm_model=comm).step_time_ns
             for job in (restaged, direct)]
    assert abs(times[0] / times[1] - 1) < 0.03, times
    # the optimizer's work follows the stage's parameters (its kernels scaled by their bytes:
    # the per-kernel overhead of a loop over tiny parameters makes it only roughly right)
    opt = [sum(n.duration_ns for n in j.graph_of(0).nodes
               if n.annotations.phase == "optimizer" and n.kind == pb.KIND_COMPUTE)
           for j in (retime_compute(restaged, model)[0], retime_compute(direct, model)[0])]
    assert abs(opt[0] / opt[1] - 1) < 0.2, opt
    # the host's issue time: every launch kept, the optimizer's scaled to its number of calls
    host = [sum(n.duration_ns for n in retime_compute(j, model)[0].graph_of(0).nodes if n.kind == pb.KIND_LAUNCH)
            for j in (restaged, direct)]
    assert abs(host[0] / host[1] - 1) < 0.05, host


def test_restaging_keeps_megatron_cores_buckets_on_the_first_stage_only(traced) -> None:
    """Megatron-Core's overlapped sync (``--overlap-grad-reduce``) buckets the first stage's
    gradients and reduces every other stage's in one call: re-staged from 2 to 4 stages, each
    later stage's data-parallel calls are tracing's, and the first stage's as many, of the same
    bytes (its bucket edges are placed from the old stages' accumulations, as for any
    overlapped sync)."""
    options = {"overlap_grad_reduce": True, "grad_sync": "overlap", "bucket_mb": 0.002}
    restaged, _ = scale(traced(2, 2, 2, **options), pp=4)
    direct = traced(2, 4, 2, **options)
    for r in range(direct.world_size):
        calls = [[c for c in comm_sequence(job, r) if c[2] == "dp"] for job in (restaged, direct)]
        if r < 4:       # the first stage: its buckets
            assert len(calls[0]) == len(calls[1]) == 6
            assert sum(c[4] for c in calls[0]) == sum(c[4] for c in calls[1])
        else:
            assert calls[0] == calls[1], r
            assert sum(c[4] > 1000 for c in calls[0]) == 1


@pytest.mark.parametrize("options", [{"zero": 1}, {"recompute": True}, {"grad_sync": "overlap"},
                                     {"sync_timers": True}, {"dtype": "bfloat16"},
                                     {"recompute": True, "partition_activations": True},
                                     {"sequence_parallel": True}, {"sequence_parallel": True, "zero": 1},
                                     {"arch": "llama", "kv_heads": 2, "flash_attention": True},
                                     {"arch": "llama", "sequence_parallel": True},
                                     {"dtype": "bfloat16", "gradient_accumulation_fusion": True}])
def test_restaging_matches_tracing_with_megatrons_settings(traced, options) -> None:
    """The distributed optimizer (ZeRO-1: the gradient norm over the world), recomputation,
    overlapped DDP, synchronising timers, bf16 (gradients in fp32), partitioned checkpoints,
    sequence parallelism (its norms' all-reduce sized for the stage's layers), the llama
    layer (no embedding all-reduce: its output layer is its own) and gradient-accumulation
    fusion (weights accumulated by their GEMM, not an add): every rank's calls and groups
    are those of tracing at the target depth."""
    for old_pp, pp in ((2, 4), (2, 1)):
        restaged, _ = scale(traced(2, old_pp, 2, **options), pp=pp)
        direct = traced(2, pp, 2, **options)
        for r in range(direct.world_size):
            assert comm_sequence(restaged, r) == comm_sequence(direct, r), (pp, r)
            assert _groups(restaged, r) == _groups(direct, r), (pp, r)


def _busiest_rank_work_ns(job) -> int:
    """The most measured time any rank's nodes add up to (streams and threads summed)."""
    return max(sum(n.duration_ns for n in job.graph_of(r).nodes) for r in range(job.world_size))


def test_restaging_a_cpu_traced_megatron_job_matches_tracing(traced) -> None:
    """Measured (CPU, gloo) traces: re-staged from PP2 to PP4, every rank issues what the
    Job traced at PP4 issues, and the replayed step, per unit of the measured work it
    replays, is in the same range as the traced Job's: no wait or transfer was lost or
    invented. (The two traces are two runs: a machine busy with other tests stretched one
    run's operators 1.4-3x against the other's, so the steps themselves are not compared.)"""
    restaged, _ = scale(traced(2, 2, 2, "cpu"), pp=4)
    direct = traced(2, 4, 2, "cpu")
    for r in range(direct.world_size):
        assert comm_sequence(restaged, r) == comm_sequence(direct, r), r
    shares = [simulate(job, "replay").step_time_ns / _busiest_rank_work_ns(job) for job in (restaged, direct)]
    assert 0.5 < shares[0] / shares[1] < 2.0, shares


def test_restaging_a_timed_job_drops_the_embedding_sync_and_its_host_time(traced) -> None:
    """A CPU-traced (timed) TP1 x PP2 Job re-staged to one stage: the embedding all-reduce
    goes with the host operator that issued it and the wait on it, and the host time they
    took is taken out of the optimizer's timeline rather than left as a gap."""
    job = traced(1, 2, 1, "cpu")
    restaged, _ = scale(job, pp=1)
    g = restaged.graph_of(0)
    colls = [n for n in g.nodes if n.kind == pb.KIND_COLLECTIVE]
    assert colls and not any(n.collective.group == "embd" for n in colls)
    issued = sum(1 for n in g.nodes if n.name.startswith("issue:all_reduce"))
    assert issued == sum(1 for n in colls if n.collective.type == pb.COLL_ALL_REDUCE)
    waits = [n for n in g.nodes if n.kind == pb.KIND_SYNC and n.name.startswith("wait:")]
    assert all(any(d.id in {c.id for c in colls} for d in n.deps) for n in waits)


def _node(nid: int, start: int, dur: int, *, kind=pb.KIND_CPU_OP, name="op", stream=0, deps=(), group=""):
    n = pb.Node(id=nid, kind=kind, name=name, stream=stream, start_ns=start, duration_ns=dur)
    for d, k in deps:
        n.deps.add(id=d, kind=k)
    if group:
        n.collective.group = group
    return n


def test_dropping_a_collective_takes_its_issue_nesting_and_wait_and_closes_the_gap() -> None:
    from echo_et.passes.stage_write import _close_host_gaps, _collectives_on

    host, gpu = 0, 1
    step = _node(1, 0, 100, name="optimizer step")
    before = _node(2, 0, 10, deps=[(1, pb.DEP_CONTROL)])
    issue = _node(3, 10, 20, name="issue:all_reduce", deps=[(1, pb.DEP_CONTROL)])
    launch = _node(4, 12, 5, kind=pb.KIND_LAUNCH, name="launch", deps=[(3, pb.DEP_CONTROL)])
    coll = _node(5, 40, 30, kind=pb.KIND_COLLECTIVE, name="all_reduce", stream=gpu,
                 deps=[(3, pb.DEP_DATA)], group="embd")
    wait = _node(6, 30, 15, kind=pb.KIND_SYNC, name="wait:all_reduce", deps=[(5, pb.DEP_SYNC)])
    after = _node(7, 45, 10, deps=[(1, pb.DEP_CONTROL)])
    kernel = _node(8, 60, 10, kind=pb.KIND_COMPUTE, stream=gpu, deps=[(7, pb.DEP_LAUNCH), (5, pb.DEP_SYNC)])
    other = _node(9, 80, 5, kind=pb.KIND_SYNC, name="sync", deps=[(5, pb.DEP_SYNC), (8, pb.DEP_SYNC)])
    nodes = [step, before, issue, launch, coll, wait, after, kernel, other]
    dropped = _collectives_on(nodes, frozenset({"embd"}))
    assert dropped == {3, 4, 5, 6}                     # not the sync that waits on more
    assert _collectives_on(nodes, frozenset({"mp"})) == frozenset()
    streams = {host: pb.Stream(id=host, kind=pb.STREAM_CPU_THREAD), gpu: pb.Stream(id=gpu, kind=pb.STREAM_GPU_COMPUTE)}
    kept = _close_host_gaps([n for n in nodes if n.id not in dropped], [n for n in nodes if n.id in dropped], streams)
    by_id = {n.id: n for n in kept}
    # the host time of the issue (10-30) and of the wait (30-45) is gone: 35 ns
    assert (by_id[1].start_ns, by_id[1].duration_ns) == (0, 65)
    assert by_id[7].start_ns == 10 and by_id[8].start_ns == 25 and by_id[9].start_ns == 45
    assert by_id[2].start_ns == 0 and nodes[6].start_ns == 45   # the inputs are not modified


def test_derived_groups_at_a_new_depth() -> None:
    mesh = Mesh(tp=2, dp=2, pp=4)
    r = mesh.rank({"tp": 1, "dp": 1, "pp": 0})
    assert restaged_group(mesh, "embd", r) == [r, mesh.rank({"tp": 1, "dp": 1, "pp": 3})]
    assert restaged_group(mesh, "embd", mesh.rank({"tp": 1, "dp": 1, "pp": 2})) is None   # a middle stage
    assert restaged_group(Mesh(tp=2, dp=2, pp=1), "embd", 3) is None                     # one stage
    assert restaged_group(mesh, "mp", r) == sorted(mesh.rank({"tp": t, "dp": 1, "pp": s})
                                                   for t in range(2) for s in range(4))
    assert restaged_group(Mesh(tp=1, dp=4, pp=1), "mp", 2) is None
    assert restaged_group(mesh, "world", 5) == list(range(16))


def test_a_group_of_another_role_is_still_refused_in_one_line(traced) -> None:
    job = traced(2, 2, 2).copy()
    g = job.manifest.groups.add(id=99, name="odd", desc="odd", ranks=[0, 3], role=pb.ROLE_CUSTOM)
    job.manifest.bindings[0].groups["odd"] = g.id
    job.invalidate()
    with pytest.raises(EchoError, match="group key 'odd'.*cannot re-derive") as e:
        scale(job, pp=4)
    assert "\n" not in str(e.value)


def test_a_sweep_row_whose_layout_does_not_fit_the_gpu_is_that_rows_error() -> None:
    """A megatron-gpt Job traced for an A100 40 GB and swept over the pipeline depth: the
    depth at which its weights, gradients and Adam states do not fit is the row's one-line
    error naming what would fit (as predict and the configuration sweep say), not a step."""
    from echo_et.experiments.sweep import SweepSpec, run_point

    cfg = GPTConfig.megatron(layers=32, hidden=8192, heads=64, seq=2048, micro_batch=1, recompute=True)
    job = trace(build_gpt(cfg), ParallelLayout(tp=8, pp=2, microbatches=4),
                TraceOptions(device="meta", warmup_steps=0), workload_attrs={"workload": "megatron-gpt",
                                                                             **cfg.to_json()}).job
    job.manifest.hardware.gpu_name = "NVIDIA A100-SXM4-40GB"
    spec = SweepSpec(dp=[1], pp=[1, 2], preset="a100-ib")
    one, two = (run_point(job, {"dp": 1, "pp": pp, "microbatches": None}, spec) for pp in (1, 2))
    assert "does not fit the GPU's memory" in one["error"] and "a100-80gb" in one["error"]
    assert "\n" not in one["error"]
    assert "error" not in two and two["step_time_ns"] > 0
