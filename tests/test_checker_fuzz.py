"""Property tests for the checker: it never crashes on arbitrary small jobs, passes every
acyclic well-formed one, and catches injected cycles and dangling dependencies."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_et.ir import GraphBuilder, Issue, JobBuilder, check_job, pb

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KINDS = [pb.KIND_COMPUTE, pb.KIND_CPU_OP, pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV,
         pb.KIND_MEMCPY, pb.KIND_UNKNOWN]
COLLS = [pb.COLL_ALL_REDUCE, pb.COLL_ALL_GATHER, pb.COLL_ALL_TO_ALL, pb.COLL_BROADCAST, pb.COLL_UNKNOWN]

node_spec = st.tuples(
    st.sampled_from(KINDS),
    st.lists(st.integers(min_value=0, max_value=14), max_size=4),   # deps: any id, even absent
    st.integers(min_value=0, max_value=3),                            # stream (0..2 declared)
    st.sampled_from(["a", "b"]),                                      # group key
    st.integers(min_value=0, max_value=3),                            # peer
    st.integers(min_value=-2, max_value=2048),                        # bytes / duration
    st.sampled_from(COLLS),
)


def build_arbitrary(world: int, graphs: list[list[tuple]], group_ranks: list[list[int]], bind_keys: bool):
    jb = JobBuilder("fuzz", world)
    gids = [jb.group(r, name=f"g{i}") for i, r in enumerate(group_ranks)]
    for gi, spec in enumerate(graphs):
        b = GraphBuilder(f"g{gi}")
        for k in range(3):
            b.stream(pb.STREAM_GPU_COMPUTE, f"s{k}")
        for i, (kind, deps, stream, key, peer, size, coll) in enumerate(spec, start=1):
            if kind == pb.KIND_COLLECTIVE:
                n = b.collective(f"n{i}", stream, coll_type=coll, group=key, in_bytes=abs(size), deps=deps)
            elif kind in (pb.KIND_SEND, pb.KIND_RECV):
                n = b.p2p(kind == pb.KIND_SEND, f"n{i}", stream, group=key, peer=peer, nbytes=abs(size),
                          deps=deps)
            else:
                n = b.node(kind, f"n{i}", stream, deps=deps)
            n.duration_ns = size
        jb.add_graph(b.build())
    for r in range(world):
        groups = {"a": gids[0], "b": gids[-1]} if bind_keys else {}
        jb.bind(r, f"g{r % len(graphs)}", groups)
    return jb.build()


@FAST
@given(
    world=st.integers(min_value=1, max_value=3),
    graphs=st.lists(st.lists(node_spec, max_size=10), min_size=1, max_size=3),
    group_ranks=st.lists(st.lists(st.integers(min_value=0, max_value=4), max_size=4), min_size=1, max_size=3),
    bind_keys=st.booleans(),
)
def test_checker_never_crashes(world, graphs, group_ranks, bind_keys):
    job = build_arbitrary(world, graphs, group_ranks, bind_keys)
    issues = check_job(job)
    assert all(isinstance(i, Issue) and f"[{i.rule}]" in str(i) for i in issues)


def random_dag(draw_deps: list[list[int]], colls: list[int]):
    """A one-graph job over ``world`` ranks: node i depends only on smaller ids."""
    b = GraphBuilder("dag")
    cpu = b.stream(pb.STREAM_CPU_THREAD, "cpu")
    gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
    comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    for i, deps in enumerate(draw_deps, start=1):
        valid = sorted({d % i for d in deps if i > 1 and d % i >= 1})
        if i - 1 < len(colls):
            b.collective(f"c{i}", comm, coll_type=colls[i - 1], group="w", in_bytes=64 * i, deps=valid)
        elif i % 2:
            b.compute(f"k{i}", gpu, deps=valid, duration_ns=i)
        else:
            # Host ops one after another: a host thread nests ops by their measured times,
            # so all-zero starts would put every op inside the first (stream-order).
            b.cpu_op(f"op{i}", cpu, deps=valid, duration_ns=i, start_ns=100 * i)
    return b


dags = st.lists(st.lists(st.integers(min_value=0, max_value=50), max_size=4), min_size=1, max_size=25)


def dag_job(deps, colls, world):
    b = random_dag(deps, colls)
    b.declare_group("w", world)
    jb = JobBuilder("dag", world)
    gid = jb.group(range(world), name="0")
    jb.add_graph(b.build())
    for r in range(world):
        jb.bind(r, "dag", {"w": gid})
    return jb.build()


@FAST
@given(deps=dags, colls=st.lists(st.sampled_from(COLLS), max_size=5), world=st.integers(1, 4))
def test_acyclic_well_formed_jobs_pass(deps, colls, world):
    assert check_job(dag_job(deps, colls, world)) == []


@FAST
@given(deps=dags, data=st.data())
def test_injected_cycle_is_caught(deps, data):
    job = dag_job(deps, [], 1)
    nodes = job.graph("dag").nodes
    i = data.draw(st.integers(0, len(nodes) - 1))
    j = data.draw(st.integers(0, len(nodes) - 1))
    lo, hi = sorted((nodes[i], nodes[j]), key=lambda n: n.id)
    # hi already may (or may not) wait on lo; make lo wait on hi and hi on lo: a cycle.
    lo.deps.add(id=hi.id)
    hi.deps.add(id=lo.id)
    rules = {i.rule for i in check_job(job)}
    assert "acyclic" in rules


@FAST
@given(deps=dags, data=st.data())
def test_dangling_dependency_is_caught(deps, data):
    job = dag_job(deps, [], 1)
    nodes = job.graph("dag").nodes
    victim = nodes[data.draw(st.integers(0, len(nodes) - 1))]
    missing = max(n.id for n in nodes) + data.draw(st.integers(1, 1000))
    victim.deps.add(id=missing)
    issues = check_job(job)
    assert [i.rule for i in issues] == ["dep-exists"]
    assert f"node {victim.id} " in issues[0].where and str(missing) in issues[0].message


# -- the one-pass common case agrees with the rule-by-rule check -----------------------------------
host_spec = st.tuples(
    st.sampled_from([pb.KIND_CPU_OP, pb.KIND_SYNC, pb.KIND_LAUNCH, pb.KIND_COMPUTE, pb.KIND_COLLECTIVE]),
    st.lists(st.tuples(st.integers(0, 14), st.sampled_from([pb.DEP_DATA, pb.DEP_CONTROL, pb.DEP_LAUNCH,
                                                             pb.DEP_SYNC])), max_size=3),
    st.integers(0, 3),                          # stream (0..2 declared)
    st.integers(-5, 400), st.integers(-5, 300),  # start, duration
    st.integers(-3, 3),                         # id shift: out of order, duplicate ids
)


def _issues_both_ways(job):
    from unittest import mock

    from echo_et.ir import checker

    fast = check_job(job)
    with mock.patch.object(checker, "_graph_rules_hold", lambda *a: None):
        slow = check_job(job)
    return fast, slow


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.lists(host_spec, min_size=1, max_size=12), earlier_only=st.booleans(),
       shift=st.booleans(), world=st.integers(1, 2))
def test_one_pass_check_agrees_with_rule_by_rule(spec, earlier_only, shift, world):
    b = GraphBuilder("g")
    for k in range(3):
        b.stream(pb.STREAM_CPU_THREAD if k < 2 else pb.STREAM_GPU_COMPUTE, f"s{k}")
    nid = 0
    for i, (kind, deps, stream, start, dur, dshift) in enumerate(spec, start=1):
        nid = max(1, nid + 1 + (dshift if shift else 0))
        if earlier_only:
            deps = [(d % i, k) for d, k in deps if i > 1 and d % i >= 1]
        if kind == pb.KIND_COLLECTIVE:
            n = b.collective(f"n{i}", stream, coll_type=pb.COLL_ALL_REDUCE, group="w", in_bytes=8,
                             deps=deps, node_id=nid)
        else:
            n = b.node(kind, f"n{i}", stream, deps=deps, node_id=nid)
        n.start_ns, n.duration_ns = start, dur
        if kind in (pb.KIND_CPU_OP, pb.KIND_SYNC, pb.KIND_LAUNCH) and i % 3 == 0:
            n.cpu.op = "x"
    b.declare_group("w", world)
    jb = JobBuilder("g", world)
    gid = jb.group(range(world), name="0")
    jb.add_graph(b.build())
    for r in range(world):
        jb.bind(r, "g", {"w": gid})
    fast, slow = _issues_both_ways(jb.build())
    assert fast == slow


def test_one_pass_check_is_taken_and_agrees_on_real_jobs():
    from conftest import FIXTURES
    from echo_et.converters import read
    from echo_et.ir import checker

    for paths in (sorted((FIXTURES / "traces" / "ddp_gloo4").glob("*.et.json.gz")),
                  sorted((FIXTURES / "traces" / "ddp_gloo4").glob("*.kineto.json.gz")),
                  sorted((FIXTURES / "kineto" / "gloo3").glob("*.json*"))):
        job = read(paths)
        for gid in job.graph_ids():
            assert checker._graph_rules_hold(job.graph(gid), "", checker.IssueCollector(100)) is not None
        fast, slow = _issues_both_ways(job)
        assert fast == slow == []


def test_one_pass_check_still_runs_stream_order():
    """A host op that waits for the end of the op it runs inside: the one-pass path takes the
    graph (ids in order, deps on earlier nodes) and still reports the stream-order issue."""
    from echo_et.ir import checker

    b = GraphBuilder("g")
    t = b.stream(pb.STREAM_CPU_THREAD, "t")
    outer = b.cpu_op("outer", t, start_ns=0, duration_ns=100)
    b.cpu_op("inner", t, start_ns=10, duration_ns=5, deps=[(outer.id, pb.DEP_DATA)])
    jb = JobBuilder("g", 1)
    jb.add_graph(b.build())
    jb.bind(0, "g", {})
    job = jb.build()
    assert checker._graph_rules_hold(job.graph("g"), "", checker.IssueCollector(100)) is not None
    fast, slow = _issues_both_ways(job)
    assert fast == slow and [i.rule for i in fast] == ["stream-order"]
