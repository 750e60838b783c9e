"""Every rule of echo_et.ir.checker fires on a job broken for it, and says where.

The base job is valid (asserted); each test breaks one thing in a copy and expects exactly
that rule, with a message naming the graph and node (or the manifest entry) involved.
"""

from __future__ import annotations

import pytest

from echo_et.errors import CheckError
from echo_et.ir import GraphBuilder, JobBuilder, assert_valid, check_graph, check_job, load_job, pb, save_job
from echo_et.ir.checker import Issue


def make_job(world: int = 2, colls=None, sizes=None) -> object:
    """``world`` ranks, each with its own graph: a CPU op, a kernel, collectives on "dp"
    (the world group) and a send/recv ring on "dp"."""
    colls = colls or [(pb.COLL_ALL_REDUCE, 1024), (pb.COLL_ALL_TO_ALL, 256)]
    jb = JobBuilder("t", world)
    gid = jb.group(range(world), name="0", role="world")
    for r in range(world):
        b = GraphBuilder(f"g{r}")
        cpu = b.stream(pb.STREAM_CPU_THREAD, "cpu")
        gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
        comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
        b.declare_group("dp", world)
        op = b.cpu_op("aten::mm", cpu, duration_ns=100)
        prev = b.compute("gemm", gpu, deps=[(op.id, pb.DEP_LAUNCH)], duration_ns=1000).id
        for i, (ctype, nbytes) in enumerate(colls):
            nb = sizes[r][i] if sizes else nbytes
            prev = b.collective(f"c{i}", comm, coll_type=ctype, group="dp", in_bytes=nb, deps=[prev]).id
        if world > 1:
            prev = b.p2p(True, "send", comm, group="dp", peer=(r + 1) % world, nbytes=64, deps=[prev]).id
            b.p2p(False, "recv", comm, group="dp", peer=(r - 1) % world, nbytes=64, deps=[prev])
        jb.add_graph(b.build())
        jb.bind(r, f"g{r}", {"dp": gid})
    return jb.build()


def by_name(job, rank, name) -> pb.Node:
    return next(n for n in job.graph_of(rank).nodes if n.name == name)


def one_issue(job, rule: str) -> Issue:
    """The only issue of a job broken in one place that other rules cannot see."""
    issues = check_job(job)
    assert [i.rule for i in issues] == [rule], [str(i) for i in issues]
    assert f"[{rule}]" in str(issues[0])
    return issues[0]


def first_issue(job, rule: str) -> Issue:
    """The first issue of a job whose breakage also upsets later, cross-rank rules (a rank
    that loses its graph no longer issues its collectives, ...)."""
    issues = check_job(job)
    assert issues and issues[0].rule == rule, [str(i) for i in issues]
    assert f"[{rule}]" in str(issues[0])
    return issues[0]


def graph_issue(job, graph_id: str, rule: str) -> Issue:
    """The only issue ``check_graph`` finds in one graph."""
    issues = check_graph(job.graph(graph_id))
    assert [i.rule for i in issues] == [rule], [str(i) for i in issues]
    assert f"[{rule}]" in str(issues[0])
    return issues[0]


def names_node(issue: Issue, graph: str, node: pb.Node) -> None:
    assert f"graph {graph}" in issue.where, issue
    assert f"node {node.id} ({node.name})" in issue.where, issue


def test_base_job_is_valid():
    job = make_job()
    assert check_job(job) == []
    assert_valid(job)


# -- graph rules ------------------------------------------------------------------------
def test_unique_ids():
    job = make_job().copy()
    g = job.graph("g0")
    dup = pb.Node()
    dup.CopyFrom(by_name(job, 0, "aten::mm"))
    dup.name = "again"
    g.add(dup)
    issue = one_issue(job, "unique-ids")
    names_node(issue, "g0", dup)


def test_dep_exists():
    job = make_job().copy()
    n = by_name(job, 1, "gemm")
    n.deps.add(id=999)
    issue = one_issue(job, "dep-exists")
    names_node(issue, "g1", n)
    assert "999" in issue.message


def test_acyclic_self_dependency():
    job = make_job().copy()
    n = by_name(job, 0, "c0")
    n.deps.add(id=n.id)
    issue = one_issue(job, "acyclic")
    names_node(issue, "g0", n)


def test_acyclic_names_a_node_on_the_cycle():
    # 3 <-> 4 is the cycle; node 1 (the smallest id left waiting) only sits downstream of it.
    b = GraphBuilder("cyc")
    s = b.stream(pb.STREAM_GPU_COMPUTE, "gpu")
    b.compute("down", s, node_id=1, deps=[3])
    b.compute("free", s, node_id=2)
    b.compute("a", s, node_id=3, deps=[4])
    b.compute("b", s, node_id=4, deps=[3])
    issues = check_graph(b.build())
    assert [i.rule for i in issues] == ["acyclic"]
    assert issues[0].where in ("graph cyc node 3 (a)", "graph cyc node 4 (b)"), issues[0]


def test_stream_declared():
    job = make_job().copy()
    n = by_name(job, 0, "gemm")
    n.stream = 42
    names_node(one_issue(job, "stream-declared"), "g0", n)


@pytest.mark.parametrize("name", ["c1", "send"])
def test_payload_kind(name):
    job = make_job().copy()
    n = by_name(job, 0, name)
    n.compute.op = "wrong payload"   # replaces the collective / p2p payload (oneof)
    names_node(graph_issue(job, "g0", "payload-kind"), "g0", n)
    assert first_issue(job, "payload-kind")


@pytest.mark.parametrize("field", ["duration_ns", "start_ns"])
def test_duration(field):
    job = make_job().copy()
    n = by_name(job, 1, "gemm")
    setattr(n, field, -5)
    names_node(one_issue(job, "duration"), "g1", n)


def test_collective_seq():
    job = make_job().copy()
    n = by_name(job, 0, "c1")
    n.collective.seq = 7
    names_node(one_issue(job, "collective-seq"), "g0", n)
    n.collective.seq = 0   # a duplicate: the second one is named
    names_node(one_issue(job, "collective-seq"), "g0", n)


def test_check_graph_alone_names_the_source():
    job = make_job().copy()
    g = job.graph("g0")
    g.nodes[0].stream = 9
    issues = check_graph(g, source="some/file.graph")
    assert [i.rule for i in issues] == ["stream-declared"]
    assert str(issues[0]).startswith("some/file.graph graph g0 node")


# -- job rules --------------------------------------------------------------------------
def test_world_size_missing_rank():
    job = make_job().copy()
    job.manifest.world_size = 3
    job.manifest.groups[0].ranks.append(2)
    issue = first_issue(job, "world-size")
    assert "missing ranks [2]" in issue.message


def test_world_size_duplicate_binding():
    job = make_job().copy()
    job.manifest.bindings.add().CopyFrom(job.manifest.bindings[1])
    job.invalidate()
    issues = check_job(job)
    assert "world-size" in {i.rule for i in issues}
    assert any("duplicate" in i.message for i in issues if i.rule == "world-size")


def test_binding_graph():
    job = make_job().copy()
    job.manifest.bindings[1].graph = "nope"
    job.invalidate()
    issue = first_issue(job, "binding-graph")
    assert "rank 1" in issue.where and "'nope'" in issue.message


@pytest.mark.parametrize("breakage", ["id0", "dup-rank", "out-of-world"])
def test_group_defined(breakage):
    job = make_job().copy()
    g = job.manifest.groups.add(id=2, name="extra", ranks=[0, 1])
    if breakage == "id0":
        g.id = 0
    elif breakage == "dup-rank":
        g.ranks[:] = [1, 1]
    else:
        g.ranks[:] = [0, 5]
    job.invalidate()
    issue = one_issue(job, "group-defined")
    assert "manifest" in issue.where


def test_group_bound_key_not_bound():
    job = make_job().copy()
    del job.manifest.bindings[0].groups["dp"]
    job.invalidate()
    issues = check_job(job)
    assert issues and issues[0].rule == "group-bound"
    assert "'dp'" in issues[0].message and "rank 0" in issues[0].where


def test_group_bound_undefined_group():
    job = make_job().copy()
    job.manifest.bindings[1].groups["dp"] = 9
    job.invalidate()
    issues = check_job(job)
    assert issues and issues[0].rule == "group-bound" and "undefined group 9" in issues[0].message


def test_group_bound_unused_key_to_an_undefined_group():
    # found by the hostile campaign (seed 1209): a key no graph uses, bound to a group the job
    # does not define, passed check and was a KeyError traceback in simulate
    job = make_job().copy()
    job.manifest.bindings[1].groups["xp"] = 40
    job.invalidate()
    issues = check_job(job)
    assert [i.rule for i in issues] == ["group-bound"]
    assert "'xp'" in issues[0].message and "undefined group 40" in issues[0].message
    job.manifest.bindings[1].groups["xp"] = job.manifest.bindings[1].groups["dp"]   # a defined one: fine
    job.invalidate()
    assert check_job(job) == []


def test_group_bound_rank_not_member():
    job = make_job().copy()
    other = job.manifest.groups.add(id=2, name="only0", ranks=[0])
    job.manifest.bindings[1].groups["dp"] = other.id
    job.invalidate()
    issues = check_job(job)
    assert issues[0].rule == "group-bound"
    assert "does not contain rank 1" in issues[0].message


def test_group_size():
    job = make_job().copy()
    job.graph("g1").header.group_sizes["dp"] = 3
    issue = one_issue(job, "group-size")
    assert "rank 1" in issue.where and "size 3" in issue.message


def test_collective_sequence_type_mismatch():
    job = make_job().copy()
    n = by_name(job, 1, "c0")
    n.collective.type = pb.COLL_BROADCAST
    issue = one_issue(job, "collective-sequence")
    names_node(issue, "g1", n)
    assert "broadcast" in issue.message and "all_reduce" in issue.message


@pytest.mark.parametrize("ctype", [pb.COLL_ALL_REDUCE, pb.COLL_ALL_GATHER, pb.COLL_REDUCE_SCATTER,
                                   pb.COLL_BROADCAST])
def test_collective_sequence_size_mismatch_for_equal_size_collectives(ctype):
    job = make_job(colls=[(ctype, 100)], sizes=[[100], [200]])
    issue = one_issue(job, "collective-sequence")
    names_node(issue, "g1", by_name(job, 1, "c0"))
    assert "200 B" in issue.message and "100 B" in issue.message


@pytest.mark.parametrize("ctype", [pb.COLL_ALL_TO_ALL, pb.COLL_GATHER, pb.COLL_SCATTER, pb.COLL_REDUCE,
                                   pb.COLL_BARRIER])
def test_collective_sequence_ignores_sizes_of_uneven_collectives(ctype):
    # Real all-to-all calls carry different sizes per rank (uneven splits).
    job = make_job(world=4, colls=[(ctype, 1)], sizes=[[10], [20], [30], [40]])
    assert check_job(job) == []


def test_collective_sequence_count_mismatch():
    job = make_job().copy()
    g = job.graph("g1")
    last = by_name(job, 1, "c1")
    send = by_name(job, 1, "send")
    del send.deps[:]
    g.nodes.remove(last)
    issues = check_job(job)
    assert [i.rule for i in issues] == ["collective-sequence"]
    assert "issues 1 collectives" in issues[0].message and "rank 1" in issues[0].where


def test_p2p_peer_outside_group():
    job = make_job().copy()
    n = by_name(job, 0, "send")
    n.p2p.peer = 5
    issues = check_job(job)
    assert "p2p-match" in {i.rule for i in issues}
    bad = next(i for i in issues if "outside group" in i.message)
    assert "graph g0" in bad.where and f"node {n.id}" in bad.where


def test_p2p_count_mismatch():
    job = make_job().copy()
    g = job.graph("g1")
    recv = by_name(job, 1, "recv")
    g.nodes.remove(recv)
    issue = one_issue(job, "p2p-match")
    assert "1 sends from rank 0 to rank 1 but 0 recvs" in issue.message
    names_node(issue, "g0", by_name(job, 0, "send"))


def test_p2p_bytes_mismatch():
    job = make_job().copy()
    recv = by_name(job, 1, "recv")
    recv.p2p.bytes = 65
    issue = one_issue(job, "p2p-match")
    names_node(issue, "g1", recv)
    assert "65 B" in issue.message and "64 B" in issue.message


def test_messages_name_the_file(tmp_path):
    job = make_job().copy()
    by_name(job, 1, "gemm").stream = 42
    save_job(job, tmp_path / "job")
    loaded = load_job(tmp_path / "job")
    issues = check_job(loaded)
    assert str(issues[0]).startswith(f"{tmp_path / 'job'} graph g1 node ")
    with pytest.raises(CheckError, match=r"\[stream-declared\]"):
        assert_valid(loaded)


def test_limit_caps_the_issue_list():
    job = make_job().copy()
    for n in job.graph("g0").nodes:
        n.stream = 77
    assert len(check_job(job, limit=2)) == 2


# -- the recorded cluster (manifest `hardware`) --------------------------------------------------------
def _edited(tmp_path, edit) -> object:
    """make_job(4) saved, its manifest.pb edited by hand (parsed, changed, written back), loaded."""
    save_job(make_job(4), tmp_path / "job")
    path = tmp_path / "job" / "manifest.pb"
    m = pb.JobManifest()
    m.ParseFromString(path.read_bytes())
    edit(m.hardware)
    path.write_bytes(m.SerializeToString())
    return load_job(tmp_path / "job")


@pytest.mark.parametrize("gpn, ok", [(0, True), (1, True), (2, True), (4, True), (8, True), (3, False)])
def test_node_fill_of_the_recorded_gpus_per_node(tmp_path, gpn, ok):
    """4 ranks on the recorded nodes: 0 (unknown), whole nodes of 1, 2 or 4, or part of one
    node of 8; nodes of 3 would leave one partly filled, the rule every verb holds
    --gpus-per-node to, and `check` says so naming the manifest."""
    job = _edited(tmp_path, lambda h: setattr(h, "gpus_per_node", gpn))
    if ok:
        assert check_job(job) == []
        return
    issue = one_issue(job, "node-fill")
    assert issue.where == f"{tmp_path / 'job'} manifest"
    assert issue.message == ("hardware.gpus_per_node 3: world size 4 is not a multiple of 3 GPUs per node (nodes "
                             "would be partly filled: 1 full and one of 1); give a G that divides 4, or one >= 4")


@pytest.mark.parametrize("edit, needle", [
    (lambda h: setattr(h, "nics_per_node", 5000), "nics per node 5000 is beyond 1024"),
    (lambda h: setattr(h, "gpus_per_node", 5000), "gpus per node 5000 is beyond 1024"),
    (lambda h: setattr(h, "intra_node_bw_gbps", -150.0), "intra_node_bw_gbps = -150.0 is neither 0"),
    (lambda h: setattr(h, "inter_node_bw_gbps", float("inf")), "inter_node_bw_gbps = inf is neither 0"),
    (lambda h: setattr(h, "gpu_name", "A100\nerror: injected"), "is not a name of at most 256 printable"),
    (lambda h: setattr(h, "gpu_name", "A" * 257), "is not a name of at most 256 printable"),
])
def test_the_recorded_cluster_is_well_typed(tmp_path, edit, needle):
    issue = one_issue(_edited(tmp_path, edit), "hardware")
    assert needle in issue.message


def test_recorded_cluster_facts_in_range_are_valid(tmp_path):
    def edit(h):
        h.gpu_name, h.gpus_per_node, h.nics_per_node = "NVIDIA H800", 4, 4
        h.intra_node_bw_gbps, h.inter_node_bw_gbps = 200.0, 50.0
    assert check_job(_edited(tmp_path, edit)) == []


def test_check_cli_reports_the_node_fill_of_a_hand_edited_manifest(tmp_path):
    from typer.testing import CliRunner

    from echo_et.cli.main import app

    _edited(tmp_path, lambda h: setattr(h, "gpus_per_node", 3))
    res = CliRunner().invoke(app, ["check", str(tmp_path / "job")])
    assert res.exit_code == 1
    assert "[node-fill] hardware.gpus_per_node 3: world size 4 is not a multiple of 3" in res.output
    res = CliRunner().invoke(app, ["simulate", str(tmp_path / "job")])       # every verb relies on check
    assert res.exit_code == 2 and "[node-fill]" in res.stderr
