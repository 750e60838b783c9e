"""Property tests for repeat blocks on arbitrary small graphs: the checker never crashes on
any blocks; what it accepts in compact form it accepts expanded (the compact proofs agree
with the rule-by-rule check on the expansion); and a prediction that places the blocks in
closed form equals the one on the expansion, or both refuse the Job with the same error."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_checker_fuzz import build_arbitrary, node_spec

from echo_et.errors import EchoError
from echo_et.ir import check_job, pb
from echo_et.models.comm import CommModel
from echo_et.models.slowdown import default_model
from echo_et.sim import SimOptions, simulate

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

instance_spec = st.tuples(
    st.integers(min_value=-2, max_value=40),                               # id offset
    st.dictionaries(st.sampled_from(["a", "b", "b/0/send", "a/1/recv", "zz"]),
                    st.integers(min_value=-2, max_value=3), max_size=2),  # seq offsets
    st.dictionaries(st.sampled_from(["layer", "microbatch", "stage", "phase"]),
                    st.integers(min_value=-1, max_value=2), max_size=2),  # annotation deltas
    st.lists(st.tuples(st.integers(min_value=0, max_value=14), st.integers(min_value=0, max_value=80),
                       st.sampled_from([pb.DEP_DATA, pb.DEP_LAUNCH, pb.DEP_SYNC])), max_size=3),
)
block_spec = st.tuples(st.integers(min_value=0, max_value=12), st.integers(min_value=0, max_value=6),
                       st.lists(instance_spec, max_size=4))


def with_blocks(job, blocks):
    g = job.graph(job.graph_ids()[0])
    g.header.attrs["trace.timing"] = "untimed"
    for k, (first, length, insts) in enumerate(blocks, start=1):
        b = g.header.repeats.add(id=k, name=f"b{k}", first_node=first, last_node=first + length)
        for off, seqs, deltas, deps in insts:
            i = b.instances.add(id_offset=max(0, off))
            for key, v in seqs.items():
                i.seq_offsets[key] = v
            for key, v in deltas.items():
                i.annotation_deltas[key] = v
            for node, dep, kind in deps:
                i.deps.add(node=node, id=dep, kind=kind)
    return job


def _predict(job, repeats: bool):
    try:
        r = simulate(job.copy(), "predict", options=SimOptions(check=False, repeats=repeats, gpus_per_node=8),
                     comm_model=CommModel.preset_for_gpu("a100"), slowdown_model=default_model())
    except EchoError as e:
        return ("error", str(e).split(":")[0])
    out = r.to_json()
    out.pop("events")
    return out


@FAST
@given(
    world=st.integers(min_value=1, max_value=2),
    spec=st.lists(node_spec, min_size=1, max_size=12),
    blocks=st.lists(block_spec, max_size=2),
)
def test_blocks_on_arbitrary_graphs(world, spec, blocks):
    job = with_blocks(build_arbitrary(world, [spec], [list(range(world))], True), blocks)
    issues = check_job(job)                     # never raises
    if issues:
        return
    flat = job.copy()
    for g in flat.graphs():
        g.expand()
    assert check_job(flat) == [], "the compact proofs accepted what the expanded check refuses"
    assert _predict(job, True) == _predict(flat, True) == _predict(job, False)


# -- generated compact graphs that are valid by construction -------------------------------------
op_spec = st.tuples(st.sampled_from(["compute", "coll", "launch"]), st.sampled_from(["prev", "outside", "none"]),
                    st.integers(min_value=0, max_value=5000), st.sampled_from(["a", "b"]))
gap_spec = st.lists(st.tuples(st.sampled_from(["compute", "coll", "launch"]), st.integers(min_value=0, max_value=5000),
                              st.sampled_from(["a", "b"])), max_size=3)


def _twin_jobs(world: int, prefix: list, body: list, gaps: list):
    """The same step twice: flat, and with the body stored once and its other runs as
    instances of a repeat block (built like the tracer builds them)."""
    from echo_et.ir import GraphBuilder, JobBuilder

    def node(g, streams, nid, kind, dur, key, deps, mb):
        s = streams[kind]
        k = {"compute": pb.KIND_COMPUTE, "coll": pb.KIND_COLLECTIVE, "launch": pb.KIND_LAUNCH}[kind]
        # an untimed host thread nests by duration: a launch takes no time here
        n = g.stored_nodes.add(id=nid, name=f"{kind}-{key}", kind=k, stream=s,
                               duration_ns=0 if kind == "launch" else dur)
        if kind == "coll":
            n.collective.type = pb.COLL_ALL_REDUCE
            n.collective.group = key
            n.collective.in_bytes = n.collective.out_bytes = 1 << 20
        if mb is not None:
            n.annotations.microbatch = mb
        for d, dk in deps:
            n.deps.add(id=d, kind=dk)
        return n

    graphs = []
    for compact in (False, True):
        b = GraphBuilder("g0")
        streams = {"launch": b.stream(pb.STREAM_CPU_THREAD, "host"),
                   "compute": b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0),
                   "coll": b.stream(pb.STREAM_GPU_COMM, "comm", device=0)}
        for key in ("a", "b"):
            b.declare_group(key, world)
        g = b.graph
        g.header.attrs["trace.timing"] = "untimed"
        nid, seq = 0, {"a": 0, "b": 0}
        block = None
        seq0: dict[str, int] = {}
        body_first = 0

        nid = _skeleton(node, g, streams, seq, nid, prefix)
        for o in range(len(gaps) + 1):
            base = nid
            if o == 0:
                body_first, seq0 = base + 1, dict(seq)
            inst = None
            if compact and o > 0:
                if block is None:
                    block = g.header.repeats.add(id=1, name="mb", first_node=body_first,
                                                 last_node=body_first + len(body) - 1)
                inst = block.instances.add(id_offset=base + 1 - body_first)
                for key in ("a", "b"):
                    if any(op[0] == "coll" and op[3] == key for op in body) and seq[key] != seq0[key]:
                        inst.seq_offsets[key] = seq[key] - seq0[key]
                if o:
                    inst.annotation_deltas["microbatch"] = o
            for j, (kind, dep, dur, key) in enumerate(body):
                nid += 1
                deps = []
                if dep == "prev" and j > 0:
                    deps = [(nid - 1, pb.DEP_DATA)]
                elif dep == "outside" and base >= 1:
                    deps = [(base, pb.DEP_SYNC)]
                if inst is not None:
                    for d, dk in deps:
                        if d <= base:
                            inst.deps.add(node=body_first + j, id=d, kind=dk)
                    if kind == "coll":
                        seq[key] += 1
                    continue
                n = node(g, streams, nid, kind, dur, key, deps, o)
                if kind == "coll":
                    n.collective.seq = seq[key]
                    seq[key] += 1
            if o < len(gaps):
                nid = _skeleton(node, g, streams, seq, nid, gaps[o])
        graphs.append(b.build())
    jobs = []
    for graph in graphs:
        jb = JobBuilder("twins", world)
        ga = jb.group(list(range(world)), name="a")
        gb = jb.group(list(range(world)), name="b")
        jb.add_graph(graph)
        for r in range(world):
            jb.bind(r, "g0", {"a": ga, "b": gb})
        jobs.append(jb.build())
    return jobs


def _skeleton(node, g, streams, seq: dict[str, int], nid: int, ops: list) -> int:
    """Nodes outside the block, each after the one before; returns the last id."""
    for kind, dur, key in ops:
        nid += 1
        n = node(g, streams, nid, kind, dur, key, [(nid - 1, pb.DEP_DATA)] if nid > 1 else [], None)
        if kind == "coll":
            n.collective.seq = seq[key]
            seq[key] += 1
    return nid


@FAST
@given(
    world=st.integers(min_value=1, max_value=2),
    prefix=gap_spec,
    body=st.lists(op_spec, min_size=1, max_size=6),
    gaps=st.lists(gap_spec, min_size=1, max_size=4),
)
def test_generated_blocks_expand_check_and_predict_like_the_flat_step(world, prefix, body, gaps):
    flat, compact = _twin_jobs(world, prefix, body, gaps)
    assert check_job(flat) == [] and check_job(compact) == []
    g = compact.graph("g0")
    assert g.has_repeats
    assert [n.SerializeToString(deterministic=True) for n in g.iter_nodes()] == \
        [n.SerializeToString(deterministic=True) for n in flat.graph("g0").nodes]
    placed, expanded, plain = _predict(compact, True), _predict(compact, False), _predict(flat, True)
    assert placed == expanded == plain


# -- the checker's findings on a compact graph are those on its expansion ----------------------
# A graph with consistent blocks that the compact proofs do not take is checked rule by rule
# on its streamed expansion (never expanded in memory): every finding, word for word, must be
# what the same rules find on the expanded graph, broken graphs included.
def _consistent(job) -> bool:
    from echo_et.ir.repeats import repeat_problems

    g = job.graph(job.graph_ids()[0])
    return g.has_repeats and not repeat_problems(g.header, g.stored_nodes, g.bodies())


@FAST
@given(
    world=st.integers(min_value=1, max_value=2),
    spec=st.lists(node_spec, min_size=1, max_size=12),
    blocks=st.lists(block_spec, min_size=1, max_size=2),
)
def test_findings_on_compact_graphs_are_those_of_the_expansion(world, spec, blocks):
    job = with_blocks(build_arbitrary(world, [spec], [list(range(world))], True), blocks)
    if not _consistent(job):
        return
    flat = job.copy()
    for g in flat.graphs():
        g.expand()
    assert [str(i) for i in check_job(job)] == [str(i) for i in check_job(flat)]
    assert job.graph(job.graph_ids()[0]).has_repeats   # checked without expanding it


def test_findings_come_out_in_the_same_order_when_a_body_holds_a_later_send():
    """Found by the test above (CI, 2026-12-05): a send inside a block body (peer 1) and one
    before it (peer 2), both outside a one-rank group. The compact walk classifies the body
    first, the expanded one meets the earlier send first; the findings are reported in the
    order of their (group, peer, direction), whatever the walk."""
    plain = (1, [], 0, "a", 0, 0, 1)
    spec = [plain] * 4 + [(3, [], 0, "a", 2, 0, 1)] + [plain] * 3 + [(3, [], 0, "a", 1, 0, 1)] + [plain] * 3
    job = with_blocks(build_arbitrary(1, [spec], [[0]], True), [(6, 3, [(7, {}, {}, [])])])
    assert _consistent(job)
    flat = job.copy()
    for g in flat.graphs():
        g.expand()
    found = [str(i) for i in check_job(job)]
    assert len(found) == 2 and found == [str(i) for i in check_job(flat)]
