"""Exports stream a graph with repeat blocks node by node (issue 22): the Chakra and ASTRA-sim
files of a traced megatron-gpt Job with repeat blocks equal, byte for byte, those of the same
Job expanded (planned the old way, whole graph at once), and the Job given to the export
keeps its blocks (nothing expanded it in memory)."""

from __future__ import annotations

import pytest

from echo_et.ir import GraphBuilder, pb

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install -e '.[dev]')")

from echo_et.converters import chakra, chrome  # noqa: E402
from echo_et.converters.astra_sim import ExportOptions  # noqa: E402
from echo_et.converters.astra_sim import writer as astra_writer  # noqa: E402
from echo_et.converters.astra_sim.plan import plan_graph  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions  # noqa: E402
from echo_et.experiments.config_sweep import models_for  # noqa: E402
from echo_et.passes import retime_compute  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

# The brief's job (echo-et trace --workload megatron-gpt --layers 4 --hidden 256 --heads 4
# --seq 128 --micro-batch 1 --global-batch 16 --tp 2 --pp 2 --dp 1 --recompute) and an odd
# micro-batch count on a deeper pipeline with data parallelism.
LAYOUTS = [
    (dict(layers=4, hidden=256, heads=4, seq=128, micro_batch=1, vocab=128), ParallelLayout(dp=1, tp=2, pp=2,
                                                                                          microbatches=16)),
    (dict(layers=4, hidden=64, heads=4, seq=32, micro_batch=2, vocab=128), ParallelLayout(dp=2, tp=1, pp=4,
                                                                                         microbatches=7)),
]


def _expanded(job):
    out = job.copy()
    for g in out.graphs():
        g.expand()
    return out


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda p: p[1].describe())
def jobs(request):
    shape, lay = request.param
    cfg = GPTConfig.megatron(**shape, recompute=True)
    job = trace(build_gpt(cfg), lay, TraceOptions(device="meta", warmup_steps=0, verify="stage")).job
    compute, _, _ = models_for(ConfigSweepOptions())
    timed, _ = retime_compute(job, compute)   # durations, as `--gpu` gives them
    assert any(g.has_repeats for g in timed.graphs())
    return timed


def _plan_fields(plan):
    return [(pn.index, pn.role, pn.lane, pn.name, pn.start_ns, pn.end_ns, pn.deps, pn.label,
             pn.node.SerializeToString(deterministic=True) if pn.node is not None else b"")
            for pn in plan.nodes]


def test_streamed_plans_equal_the_plans_of_the_expanded_graphs(jobs) -> None:
    flat = _expanded(jobs)
    for gid in jobs.graph_ids():
        g = jobs.graph(gid)
        ranks = jobs.ranks_of_graph()[gid]
        b = jobs.binding(ranks[0])
        sizes = {key: len(jobs.group(pg).ranks) for key, pg in b.groups.items()}
        streamed = plan_graph(g, sizes, stream=True)
        whole = plan_graph(flat.graph(gid), sizes)
        assert streamed.streamed and not whole.streamed
        assert _plan_fields(streamed) == _plan_fields(whole)
        assert (streamed.mapped, streamed.dropped, streamed.stats) == (whole.mapped, whole.dropped, whole.stats)
        assert (streamed.coll_groups, streamed.has_all_to_all, streamed.origin_ns, streamed.host_cpu) == \
            (whole.coll_groups, whole.has_all_to_all, whole.origin_ns, whole.host_cpu)
        assert g.has_repeats   # planning streamed it: the graph is still compact


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_astra_sim_export_streams_and_equals_the_expanded_export(jobs, tmp_path, monkeypatch) -> None:
    a = astra_writer.ExportPlan(jobs, ExportOptions()).write(tmp_path / "compact")
    compact_graphs = [g.has_repeats for g in jobs.graphs()]
    # The expanded Job, planned the old way: each graph whole, then written rank by rank.
    real = astra_writer.plan_graph

    def whole(*args, **kw):
        kw["stream"] = False
        return real(*args, **kw)

    monkeypatch.setattr(astra_writer, "plan_graph", whole)
    b = astra_writer.ExportPlan(_expanded(jobs), ExportOptions()).write(tmp_path / "expanded")
    fa, fb = _files(tmp_path / "compact"), _files(tmp_path / "expanded")
    assert fa and fa.keys() == fb.keys()
    for name in fa:
        assert fa[name] == fb[name].replace(b"/expanded", b"/compact"), name
    for r in (a, b):
        for k in ("output", "workload_prefix", "command"):
            r.pop(k)
    assert a == b
    assert compact_graphs == [g.has_repeats for g in jobs.graphs()] and any(compact_graphs)


def test_chakra_export_streams_and_equals_the_expanded_export(jobs, tmp_path) -> None:
    a = chakra.write(jobs, tmp_path / "compact" / "t")
    assert any(g.has_repeats for g in jobs.graphs())   # streamed: not expanded in place
    b = chakra.write(_expanded(jobs), tmp_path / "expanded" / "t")
    fa, fb = _files(tmp_path / "compact"), _files(tmp_path / "expanded")
    assert fa and fa == fb
    assert (a["nodes"], a["bytes"], a["lossy"]) == (b["nodes"], b["bytes"], b["lossy"])


def _with_times(job):
    """The Job with every stored node started at its id's microsecond and each copy shifted
    by its instance's place: a timed step, to order by time as well as by duration."""
    out = job.copy()
    for g in out.graphs():
        for n in g.stored_nodes:
            n.start_ns = n.id * 1000 + n.id % 7
        for b in g.header.repeats:
            for k, inst in enumerate(b.instances):
                inst.time_offset_ns = (k + 1) * 3_000_001
    return out


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "timed"])
@pytest.mark.parametrize("dest", ["tl", "t.json", "t.json.gz"])
def test_chrome_export_streams_and_equals_the_expanded_export(jobs, tmp_path, timed, dest) -> None:
    job = _with_times(jobs) if timed else jobs
    meta = {"world_size": job.world_size, "source_format": job.manifest.provenance.source_format}
    compact = [g.has_repeats for g in job.graphs()]
    a = chrome.write(job, tmp_path / "compact" / dest)
    assert compact == [g.has_repeats for g in job.graphs()] and any(compact)   # streamed: not expanded in place
    flat = _expanded(job)
    b = chrome.write_timeline_whole(chrome.job_timeline(flat), tmp_path / "expanded" / dest, job=flat,
                                    metadata=meta)
    fa, fb = _files(tmp_path / "compact"), _files(tmp_path / "expanded")
    assert fa and fa == fb
    assert {**a, "output": ""} == {**b, "output": ""} and a["events"] == sum(len(g) for g in flat.graphs()
                                                                             for _ in flat.ranks_of_graph()[g.id])


def test_expanded_ids_are_the_expansion_s_ids(jobs) -> None:
    for g in jobs.graphs():
        want = {n.id for n in g.iter_nodes()}
        ids = g.expanded_ids()
        assert all(i in ids for i in want)
        probe = set(range(0, max(want) + 3)) - want
        assert not any(i in ids for i in probe)


def _two_kernels(dep_forward: bool, timed: bool):
    b = GraphBuilder("g0")
    gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
    other = b.stream(pb.STREAM_GPU_COMPUTE, "gpu2", device=0)
    b.graph.new_node(id=1, name="a", kind=pb.KIND_COMPUTE, stream=gpu, duration_ns=1000,
                     start_ns=5000 if timed else 0)
    b.graph.new_node(id=2, name="b", kind=pb.KIND_COMPUTE, stream=other, duration_ns=1000)
    g = b.build()
    if dep_forward:
        g.stored_nodes[0].deps.add(id=2, kind=pb.DEP_DATA)
    return g


@pytest.mark.parametrize("forward,timed", [(True, False), (False, True)])
def test_graphs_that_need_the_whole_graph_are_planned_whole(forward, timed) -> None:
    """A dependency that points forward needs a topological sort, a measured timeline is cut
    across every stream: neither is streamed."""
    g = _two_kernels(forward, timed)
    assert g.deps_point_back() is not forward and g.starts_uniform() is not timed
    p = plan_graph(g, {}, stream=True)
    assert not p.streamed
    # node 2 first: node 1 depends on it, or started later
    assert [pn.node.id for pn in p.nodes if pn.node is not None] == [2, 1]


def test_an_untimed_graph_with_backward_deps_is_streamed() -> None:
    g = _two_kernels(False, False)
    p = plan_graph(g, {}, stream=True)
    assert p.streamed
    assert _plan_fields(p) == _plan_fields(plan_graph(g, {}))


def test_scaling_dp_keeps_the_blocks_and_equals_scaling_the_expanded_job(jobs) -> None:
    """``scale --dp`` without ZeRO only resizes collectives, which a copy takes from its body
    node: the blocks stay, and the expansion equals the expanded Job scaled."""
    from echo_et.passes.scale import scale

    lay = jobs.manifest.layout
    if lay.dp == 1:   # a training Job with one replica has nothing to grow (test_passes_scale)
        with pytest.raises(EchoError, match="one data-parallel replica"):
            scale(jobs, dp=2)
        return
    new_dp = lay.dp * 2
    a, ra = scale(jobs, dp=new_dp)
    b, rb = scale(_expanded(jobs), dp=new_dp)
    assert any(g.has_repeats for g in a.graphs())
    assert ra.to_json() == rb.to_json()
    assert any(dict(a.graph(gid).header.group_sizes) != dict(jobs.graph(gid).header.group_sizes)
               for gid in a.graph_ids())   # the data-parallel groups grew
    assert a.graph_ids() == b.graph_ids()
    for gid in a.graph_ids():
        assert dict(a.graph(gid).header.group_sizes) == dict(b.graph(gid).header.group_sizes)
        assert [n.SerializeToString(deterministic=True) for n in a.graph(gid).iter_nodes()] == \
            [n.SerializeToString(deterministic=True) for n in b.graph(gid).nodes]
