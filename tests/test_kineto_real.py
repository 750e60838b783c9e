"""The Kineto reader on real traces, through ``echo-et convert``; every expected value is read
from the trace files themselves (tests/kineto_facts.py), never from converter output."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import kineto_facts as facts
import pytest
from typer.testing import CliRunner

from conftest import FIXTURES, shared_path, unpack
from echo_et.cli.main import app
from echo_et.ir import check_job, load_job, pb
from echo_et.ir.schema import collective_name

HTA = "traces/HolisticTraceAnalysis/tests/data"


@pytest.fixture(scope="module", autouse=True)
def _forget_documents():
    yield
    facts.forget()
PARAM = "traces/param/et_replay/tests/inputs"
_CACHE: dict[str, tuple[object, dict]] = {}


@pytest.fixture(scope="module")
def outdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kineto_jobs")


def convert(outdir: Path, key: str, inputs: list[Path], *extra: str):
    """(Job, convert --json summary) for ``inputs``, converted once per module by the CLI."""
    if key not in _CACHE:
        out = outdir / key
        res = CliRunner().invoke(app, ["convert", *map(str, inputs), "-o", str(out), "--json",
                                       *extra])
        assert res.exit_code == 0, res.output
        summary = json.loads(res.stdout)
        job = load_job(out)
        assert check_job(job) == []
        _CACHE[key] = (job, summary)
    return _CACHE[key]


def nodes(graph, kind):
    return [n for n in graph.nodes if n.kind == kind]


def colls(graph):
    return sorted(nodes(graph, pb.KIND_COLLECTIVE), key=lambda n: (n.collective.group, n.collective.seq))


# -- DLRM: 8 ranks of one job ----------------------------------------------------------------
@pytest.fixture(scope="module")
def dlrm_dir(tmp_path_factory) -> Path:
    d = unpack(shared_path(f"{PARAM}/dlrm_kineto.tar.gz"), tmp_path_factory.mktemp("dlrm"))
    return d / "dlrm_kineto"


def test_dlrm_eight_ranks_pass_check_with_the_files_collectives(outdir, dlrm_dir):
    job, summary = convert(outdir, "dlrm", [dlrm_dir])
    files = sorted(dlrm_dir.glob("*.json"))
    assert job.world_size == len(files) == 8 and summary["ranks"] == 8
    for f in files:
        doc = facts.load(f)
        rank = doc["distributedInfo"]["rank"]
        (step,) = facts.steps(doc)
        assert job.manifest.step == step
        win = facts.window(doc, step)
        kernels = facts.nccl_kernels_launched_in(doc, win)
        graph = job.graph_of(rank)
        got = Counter(collective_name(n.collective.type) for n in colls(graph))
        # SendRecv kernels run the all-to-alls; the README promises 5 + 3 per rank.
        assert got == {"all_to_all": sum("SendRecv" in k["name"] for k in kernels),
                       "all_reduce": sum("AllReduce" in k["name"] for k in kernels)}
        assert got == {"all_to_all": 5, "all_reduce": 3}
        # All-reduce sizes: the nccl:all_reduce annotations' input dims, in issue order.
        ann = sorted((e for e in facts.events(doc) if e["name"] == "nccl:all_reduce"
                      and win[0] <= e["ts"] < win[1]), key=lambda e: e["ts"])
        want = [facts.nelems(e["args"]["Input Dims"][0]) * 4 for e in ann]
        ar = [n.collective.in_bytes for n in colls(graph)
              if n.collective.type == pb.COLL_ALL_REDUCE]
        assert ar == want and all(b > 0 for b in ar)
        assert job.binding(rank).measured_step_ns == facts.steps(doc)[step]["dur"] * 1000
        # Every collective waits for its launch call, on the host thread that issued it.
        for n in colls(graph):
            launch = [d.id for d in n.deps if d.kind == pb.DEP_LAUNCH]
            assert len(launch) == 1
            assert graph.node(launch[0]).kind == pb.KIND_LAUNCH
    assert [g.ranks for g in job.manifest.groups] == [list(range(8))]


def test_dlrm_collectives_end_together_on_the_job_clock(outdir, dlrm_dir):
    """The README: kernel end times of a collective agree across ranks within a few us. They
    do only if every rank's clock offset is right."""
    job, _ = convert(outdir, "dlrm", [dlrm_dir])
    ends: dict[int, list[int]] = {}
    for b in job.manifest.bindings:
        for n in colls(job.graph(b.graph)):
            ends.setdefault(n.collective.seq, []).append(
                b.clock_offset_ns + n.start_ns + n.duration_ns)
    assert len(ends) == 8
    for seq, e in ends.items():
        assert max(e) - min(e) < 20_000, (seq, e)      # 20 us
    assert min(b.clock_offset_ns for b in job.manifest.bindings) == 0


def test_dlrm_gpu_ops_and_launches_match_the_file(outdir, dlrm_dir):
    job, _ = convert(outdir, "dlrm", [dlrm_dir])
    f = next(p for p in dlrm_dir.glob("*.json") if p.name.startswith("worker0"))
    doc = facts.load(f)
    win = facts.window(doc, job.manifest.step)
    graph = job.graph_of(0)
    launched = facts.gpu_ops_launched_in(doc, win)
    kernels = [e for e in launched if e["cat"] == "kernel"]
    n_coll = len(nodes(graph, pb.KIND_COLLECTIVE))
    assert len(nodes(graph, pb.KIND_COMPUTE)) + n_coll == len(kernels)
    assert len(nodes(graph, pb.KIND_MEMCPY)) == sum(e["cat"] == "gpu_memcpy" for e in launched)
    assert sum(n.memcpy.bytes for n in nodes(graph, pb.KIND_MEMCPY)) == \
        sum(e["args"]["bytes"] for e in launched if e["cat"] == "gpu_memcpy")
    # Kernels keep their stream; the NCCL stream is a comm stream.
    streams = {s.id: s for s in graph.header.streams}
    nccl_streams = {k["args"]["stream"] for k in kernels if k["name"].startswith("nccl")}
    comm = {s.native_id for s in streams.values() if s.kind == pb.STREAM_GPU_COMM}
    assert comm == nccl_streams
    # Ids ascend in start order on every GPU stream.
    for sid, s in streams.items():
        if s.kind in (pb.STREAM_GPU_COMPUTE, pb.STREAM_GPU_COMM, pb.STREAM_GPU_COPY):
            seq = sorted((n.id, n.start_ns) for n in graph.nodes if n.stream == sid)
            assert [t for _, t in seq] == sorted(t for _, t in seq)
    # Host ops keep Ev Idx as their record-function id, shapes as JSON.
    ops = {e["args"]["Ev Idx"]: e for e in facts.events(doc)
           if e["cat"] in facts.CPU_CATS and win[0] <= e["ts"] < win[1]}
    cpu = nodes(graph, pb.KIND_CPU_OP)
    assert len(cpu) == len(ops)
    for n in cpu[:200]:
        e = ops[n.cpu.rf_id]
        assert e["name"] == n.name and n.attrs["rf_id_source"] == "ev_idx"
        if "Input Dims" in e["args"]:
            assert json.loads(n.cpu.shapes) == e["args"]["Input Dims"]


def test_dlrm_event_waits_of_the_collectives(outdir, dlrm_dir):
    """No cudaEventRecord is in these files, only cudaStreamWaitEvent. Per collective, c10d
    waits once before the NCCL call (the NCCL stream waits for the compute stream) and NCCL
    waits three times inside its ``nccl:*`` call (for its internal streams, which run nothing
    the trace shows): the first becomes the collective's one DEP_SYNC, on compute work that
    ended before it started; the others no dependency at all."""
    job, summary = convert(outdir, "dlrm", [dlrm_dir])
    inside_total = 0
    for f in sorted(dlrm_dir.glob("*.json")):
        doc = facts.load(f)
        win = facts.window(doc, job.manifest.step)
        evs = facts.events(doc)
        assert not [e for e in evs if e["name"] == "cudaEventRecord"]
        waits = [e for e in evs if e["name"] == "cudaStreamWaitEvent" and win[0] <= e["ts"] < win[1]]
        calls = [e for e in evs if e["name"].startswith("nccl:")]
        c10d = [e for e in evs if e["name"].startswith("c10d::") and e["name"] != "c10d::wait"]

        def within(w, ops):
            return any(o["tid"] == w["tid"] and o["ts"] <= w["ts"] <= o["ts"] + o["dur"] for o in ops)

        inside = [w for w in waits if within(w, calls)]
        before = [w for w in waits if within(w, c10d) and not within(w, calls)]
        inside_total += len(inside)
        graph = job.graph_of(doc["distributedInfo"]["rank"])
        streams = {s.id: s.kind for s in graph.header.streams}
        cs = colls(graph)
        assert len(before) == len(cs) and len(inside) == 3 * len(cs)
        for n in cs:
            (d,) = deps_of(n, pb.DEP_SYNC)
            waited = graph.node(d)
            assert streams[waited.stream] != pb.STREAM_GPU_COMM
            assert waited.start_ns + waited.duration_ns <= n.start_ns
    assert summary["dropped"]["event_wait_inside_comm_library"] == inside_total


def deps_of(n, kind) -> list[int]:
    return [d.id for d in n.deps if d.kind == kind]


# -- modern metadata: HTA nccl_data ----------------------------------------------------------
def test_nccl_data_collectives_from_kernel_args(outdir):
    path = shared_path(f"{HTA}/nccl_parser_config/nccl_data.json.gz")
    job, summary = convert(outdir, "nccl", [path])
    doc = facts.load(path)
    last = max(facts.steps(doc))
    assert job.manifest.step == last
    win = facts.window(doc, last)
    kernels = facts.nccl_kernels_launched_in(doc, win)
    size = {"Float": 4, "Long": 8}            # bytes of the C types these dtypes name
    want = [({"allreduce": "all_reduce", "broadcast": "broadcast"}[k["args"]["Collective name"]],
             k["args"]["In msg nelems"] * size[k["args"]["dtype"]],
             k["args"]["Out msg nelems"] * size[k["args"]["dtype"]], k["args"]["dtype"])
            for k in kernels]
    got = [(collective_name(n.collective.type), n.collective.in_bytes, n.collective.out_bytes,
            n.collective.dtype)
           for n in sorted(nodes(job.graph_of(0), pb.KIND_COLLECTIVE), key=lambda n: n.start_ns)]
    assert got == want and len(got) > 0
    # The group comes from the trace: pg_config's default group of 2 ranks. Rank 1 was not
    # traced; it runs the same program, so the Job binds it to rank 0's graph.
    pg = doc["distributedInfo"]["pg_config"][0]
    assert [(g.name, g.desc, list(g.ranks)) for g in job.manifest.groups] == \
        [(pg["pg_name"], pg["pg_desc"], pg["ranks"])]
    assert job.world_size == doc["distributedInfo"]["world_size"]
    assert job.manifest.attrs["kineto.partial"] == "replicated"
    assert summary["dropped"]["untraced_ranks_copied"] == 1
    assert job.binding(1).graph == job.binding(0).graph and job.binding(1).measured_step_ns == 0
    for n in nodes(job.graph_of(0), pb.KIND_COLLECTIVE):
        assert n.collective.algorithm == "ring_ll"
        assert "group_guess" not in n.attrs and "kernel_args" in n.attrs["comm_source"]


def test_nccl_data_record_function_ids(outdir):
    path = shared_path(f"{HTA}/nccl_parser_config/nccl_data.json.gz")
    job, _ = convert(outdir, "nccl", [path])
    doc = facts.load(path)
    win = facts.window(doc, job.manifest.step)
    by_rf = {e["args"]["Record function id"]: e for e in facts.events(doc)
             if e["cat"] in facts.CPU_CATS and win[0] <= e["ts"] < win[1]}
    cpu = nodes(job.graph_of(0), pb.KIND_CPU_OP)
    assert len(cpu) == len(by_rf)
    for n in cpu:
        assert by_rf[n.cpu.rf_id]["name"] == n.name
        assert n.attrs["rf_id_source"] == "record_function_id"
    assert job.graph_of(0).header.attrs["kineto.rf_id_source"] == "record_function_id"


def test_nccl_data_step_option(outdir):
    path = shared_path(f"{HTA}/nccl_parser_config/nccl_data.json.gz")
    steps = facts.steps(facts.load(path, exact=True))
    first = min(steps)
    job, _ = convert(outdir, "nccl_first", [path], "--step", str(first))
    assert job.manifest.step == first
    assert job.binding(0).measured_step_ns == steps[first]["dur"] * 1000


# -- varied collectives, 5 steps -------------------------------------------------------------
def test_negative_queue_collective_types_and_sizes(outdir):
    path = shared_path(f"{HTA}/negative_queue_length_values_check/rank0.json.gz")
    job, summary = convert(outdir, "negq", [path])
    doc = facts.load(path)
    all_steps = facts.steps(doc)
    assert len(all_steps) == 5 and job.manifest.step == max(all_steps)
    win = facts.window(doc, job.manifest.step)
    # Expected: each NCCL kernel launched in the step takes the type of its nccl:* op.
    rt = facts.runtime_by_corr(doc)
    anns = [e for e in facts.events(doc) if e["name"].startswith("nccl:")]
    size = {"float": 4, "long": 8, "int": 4}   # bytes of the C types these dtypes name
    want = []
    under = set()
    for k in facts.nccl_kernels_launched_in(doc, win):
        launch = rt[k["args"]["correlation"]]
        ann = facts.enclosing({"traceEvents": anns}, launch, "nccl:")
        under.add(id(ann))
        want.append((ann["name"], facts.nelems(ann["args"]["Input Dims"][0])
                      * size[ann["args"]["Input type"][0]]))
    words = {"nccl:all_to_all": "all_to_all", "nccl:_reduce_scatter_base": "reduce_scatter",
             "nccl:_all_gather_base": "all_gather", "nccl:all_reduce": "all_reduce"}
    got = sorted((collective_name(n.collective.type), n.collective.in_bytes)
                 for n in nodes(job.graph_of(0), pb.KIND_COLLECTIVE))
    assert got == sorted((words[a], b) for a, b in want)
    assert {t for t, _ in got} == set(words.values())
    # nccl:* ops in the step that launched no kernel (zero-size all-to-alls) are counted.
    idle = [e for e in anns if win[0] <= e["ts"] < win[1] and id(e) not in under]
    assert summary["dropped"].get("collective_op_without_kernel", 0) == len(idle) > 0


# -- old kernel names ------------------------------------------------------------------------
def test_control_kernel_names_alone(outdir, tmp_path):
    """The 2022 trace with old ``ncclKernel_*(ncclWorkElem)`` names, with every host comm op
    removed: only the kernel names are left to go by."""
    path = shared_path(f"{HTA}/trace_diff/control/control.json.gz")
    doc = facts.load(path, fresh=True)
    # Keep the last step (and what runs after it), to keep the test quick.
    last = max(facts.steps(doc))
    w0, w1 = facts.window(doc, last)
    doc["traceEvents"] = [
        e for e in doc["traceEvents"]
        if not str(e.get("name", "")).startswith(("nccl:", "c10d::", "record_param_comms"))
        and (e.get("ph") != "X" or e.get("cat") == "Trace" or w0 <= e["ts"] < w1 + (w1 - w0))]
    bare = tmp_path / "rank3.json"
    bare.write_text(json.dumps(doc))
    job, summary = convert(outdir, "control_bare", [bare])
    win = facts.window(doc, job.manifest.step)
    kernels = facts.nccl_kernels_launched_in(doc, win)
    assert kernels and all(k["name"].endswith("(ncclWorkElem)") for k in kernels)
    graph = job.graph_of(3)
    ar = nodes(graph, pb.KIND_COLLECTIVE)
    assert len(ar) == sum("AllReduce" in k["name"] for k in kernels) > 0
    assert all(n.collective.type == pb.COLL_ALL_REDUCE and n.collective.dtype == "float"
               and n.collective.algorithm == "ring_ll" and n.attrs["comm_source"] == "kernel_name"
               for n in ar)
    # SendRecv alone says neither the collective nor the peer: communication, type unknown.
    unknown = nodes(graph, pb.KIND_COMM_UNKNOWN)
    assert len(unknown) == sum("SendRecv" in k["name"] for k in kernels) > 0
    assert summary["dropped"]["comm_type_unknown"] == len(unknown)
    assert summary["dropped"]["collective_size_unknown"] == len(ar)


# -- HIP, CPU only, smallest pair, partial jobs, big trace -----------------------------------
def test_amd_hip_trace(outdir):
    (path,) = sorted(shared_path(f"{HTA}/amd_trace").glob("*.json.gz"))
    job, _ = convert(outdir, "amd", [path])
    doc = facts.load(path)
    st = facts.steps(doc)
    # The last step only holds what ran after the last prof.step(): it is not complete.
    host_ops = {n: sum(1 for e in facts.events(doc) if e["cat"] in facts.CPU_CATS
                       and e["ts"] >= st[n]["ts"] and e["ts"] < st[n]["ts"] + st[n]["dur"])
                for n in st}
    assert host_ops[max(st)] * 2 < host_ops[min(st)] and job.manifest.step == min(st)
    win = facts.window(doc, min(st))
    rt = facts.runtime_by_corr(doc)
    kernels = [k for k in facts.events(doc) if k["cat"] == "kernel"
               and win[0] <= rt[k["args"]["correlation"]]["ts"] < win[1]]
    graph = job.graph_of(0)
    comp = nodes(graph, pb.KIND_COMPUTE)
    assert len(comp) == len(kernels) > 0
    launches = {graph.node(d.id).name for n in comp for d in n.deps if d.kind == pb.DEP_LAUNCH}
    assert launches == {rt[k["args"]["correlation"]]["name"] for k in kernels}
    assert all(name.startswith("hip") for name in launches)
    memcpy = nodes(graph, pb.KIND_MEMCPY)
    copies = [e for e in facts.events(doc) if e["cat"] == "gpu_memcpy"
              and win[0] <= rt[e["args"]["correlation"]]["ts"] < win[1]]
    assert sorted(n.memcpy.bytes for n in memcpy) == \
        sorted(int(rt[e["args"]["correlation"]]["args"]["size"]) for e in copies)


def test_cpu_only_gloo_annotations_become_host_collectives(outdir):
    (path,) = sorted(shared_path(f"{HTA}/cpu_only").glob("*.json.gz"))
    job, _ = convert(outdir, "cpu_only", [path])
    doc = facts.load(path)
    info = doc["distributedInfo"]
    win = facts.window(doc, job.manifest.step)
    gloo = [e for e in facts.events(doc) if e["name"].startswith("gloo:") and win[0] <= e["ts"] < win[1]]
    graph = job.graph_of(info["rank"])
    got = nodes(graph, pb.KIND_COLLECTIVE)
    assert sorted(n.collective.in_bytes for n in got) == \
        sorted(facts.nelems(e["args"]["Input Dims"][0]) * 4 for e in gloo)
    assert all(n.collective.type == pb.COLL_ALL_REDUCE for n in got)
    kinds = {s.id: s for s in graph.header.streams}
    assert all(kinds[n.stream].name.startswith("host-comm:") and kinds[n.stream].kind ==
               pb.STREAM_CPU_THREAD for n in got)
    assert job.world_size == info["world_size"]       # one traced rank stands for the world


def test_simple_add_is_taken_whole(outdir):
    path = shared_path(f"{HTA}/execution_trace/benchmark_simple_add_trace.json.gz")
    job, _ = convert(outdir, "simple_add", [path])
    doc = facts.load(path)
    assert not facts.steps(doc) and job.manifest.step == -1
    graph = job.graph_of(0)
    kernels = [e for e in facts.events(doc) if e["cat"] == "kernel"]
    assert len(nodes(graph, pb.KIND_COMPUTE)) == len(kernels)
    cpu = [e for e in facts.events(doc) if e["cat"] in facts.CPU_CATS]
    assert len(nodes(graph, pb.KIND_CPU_OP)) == len(cpu)
    span = max(e["ts"] + e["dur"] for e in cpu + kernels) - min(e["ts"] for e in cpu + kernels)
    assert job.binding(0).measured_step_ns >= span * 1000 - 1000


def test_trace_filter_partial_job(outdir):
    paths = [shared_path(f"{HTA}/trace_filter/sampled_rank-{r}.json.gz") for r in (0, 1)]
    job, summary = convert(outdir, "sampled", paths)
    docs = [facts.load(p) for p in paths]
    world = docs[0]["distributedInfo"]["world_size"]
    assert job.world_size == 2 and job.manifest.attrs["kineto.partial"] == "renumbered"
    assert job.manifest.attrs["kineto.original_world_size"] == str(world)
    assert summary["dropped"]["ranks_not_traced"] == world - 2
    for r, doc in enumerate(docs):
        win = facts.window(doc, job.manifest.step)
        assert len(nodes(job.graph_of(r), pb.KIND_COLLECTIVE)) == \
            len(facts.nccl_kernels_launched_in(doc, win))
        assert job.graph_of(r).header.attrs["kineto.rank"] == str(doc["distributedInfo"]["rank"])


@pytest.mark.parametrize("name", ["gloo3", "fake64"])
def test_own_fixtures(outdir, name):
    paths = sorted((FIXTURES / "kineto" / name).glob("*.json.gz"))
    job, _ = convert(outdir, name, paths)
    for p in paths:
        doc = facts.load(p)
        info = doc["distributedInfo"]
        win = facts.window(doc, job.manifest.step)
        issued = [e for e in facts.events(doc) if e["name"].startswith("c10d::")
                  and e["tid"] == e["pid"] and win[0] <= e["ts"] < win[1]]
        graph = job.graph_of(info["rank"])
        comm = nodes(graph, pb.KIND_COLLECTIVE) + nodes(graph, pb.KIND_SEND) + nodes(graph, pb.KIND_RECV)
        assert len(comm) == len(issued) > 0
        assert job.world_size == info["world_size"]
        mine = {pg["pg_name"]: pg["ranks"] for pg in info["pg_config"]}
        for n in nodes(graph, pb.KIND_COLLECTIVE):
            group = job.resolve_group(info["rank"], n.collective.group)
            if n.collective.group in mine and name == "gloo3":
                assert list(group.ranks) == mine[n.collective.group]
        for e in issued:
            if e["name"] == "c10d::_allgather_base_":
                out, inp = e["args"]["Input Dims"][:2]
                (ag,) = [n for n in nodes(graph, pb.KIND_COLLECTIVE)
                         if n.collective.type == pb.COLL_ALL_GATHER]
                assert (ag.collective.in_bytes, ag.collective.out_bytes) == \
                    (facts.nelems(inp) * 4, facts.nelems(out) * 4)


def test_gloo3_subgroup_and_point_to_point(outdir):
    paths = sorted((FIXTURES / "kineto" / "gloo3").glob("*.json.gz"))
    job, _ = convert(outdir, "gloo3", paths)
    sub = [pg for pg in facts.load(paths[0])["distributedInfo"]["pg_config"] if pg["pg_size"] < 3]
    assert len(sub) == 1
    members = sub[0]["ranks"]
    for r in range(job.world_size):
        keys = {n.collective.group for n in nodes(job.graph_of(r), pb.KIND_COLLECTIVE)}
        assert (sub[0]["pg_name"] in keys) == (r in members)
    (send,) = nodes(job.graph_of(0), pb.KIND_SEND)
    (recv,) = nodes(job.graph_of(1), pb.KIND_RECV)
    assert send.p2p.bytes == recv.p2p.bytes == 5 * 4
    assert job.resolve_group(0, send.p2p.group).ranks[send.p2p.peer] == 1


# -- every input: no dependency the measured times contradict ---------------------------------
def _inputs(key: str, request) -> list[Path]:
    if key == "dlrm":
        return [request.getfixturevalue("dlrm_dir")]
    if key in ("gloo3", "fake64"):
        return sorted((FIXTURES / "kineto" / key).glob("*.json.gz"))
    rel = {"nccl": "nccl_parser_config/nccl_data.json.gz",
           "negq": "negative_queue_length_values_check/rank0.json.gz",
           "control": "trace_diff/control/control.json.gz",
           "simple_add": "execution_trace/benchmark_simple_add_trace.json.gz"}.get(key)
    if rel is not None:
        return [shared_path(f"{HTA}/{rel}")]
    if key == "sampled":
        return [shared_path(f"{HTA}/trace_filter/sampled_rank-{r}.json.gz") for r in (0, 1)]
    folder = {"ns": "ns_resolution_trace", "amd": "amd_trace", "cpu_only": "cpu_only",
              "df_index": "df_index_resolver"}[key]
    return sorted(shared_path(f"{HTA}/{folder}").glob("*.json.gz"))


@pytest.mark.parametrize("key", ["dlrm", "nccl", "negq", "control", "ns", "amd", "cpu_only",
                                 "df_index", "simple_add", "sampled", "gloo3", "fake64"])
def test_no_sync_dependency_contradicts_the_measured_times(outdir, request, key):
    """Every DEP_SYNC edge holds on the rank's measured clock (1 us tolerance): a GPU op (or
    host call) that waits starts after what it waits for ended; a host sync, which blocks
    until then, returns after it. Pairings the times contradict are dropped and counted."""
    job, _ = convert(outdir, key, _inputs(key, request))
    checked = 0
    for b in job.manifest.bindings:
        graph = job.graph(b.graph)
        by_id = {n.id: n for n in graph.nodes}
        for n in graph.nodes:
            t = n.start_ns + (n.duration_ns if n.kind == pb.KIND_SYNC else 0)
            for d in deps_of(n, pb.DEP_SYNC):
                waited = by_id[d]
                assert t >= waited.start_ns + waited.duration_ns - 1000, (b.rank, n.id, n.name, d)
                checked += 1
    if key in ("dlrm", "nccl", "negq", "control", "df_index"):
        assert checked > 0     # these traces have cross-stream waits and host syncs
    # Host communication streams run one exchange at a time, in id order.
    for b in job.manifest.bindings:
        graph = job.graph(b.graph)
        for s in graph.header.streams:
            if s.name.startswith("host-comm:"):
                on = sorted((n for n in graph.nodes if n.stream == s.id), key=lambda n: n.id)
                assert all(x.start_ns + x.duration_ns <= y.start_ns for x, y in zip(on, on[1:], strict=False))
