"""Several measured steps combined into one (``echo-et trace --steps K``): every piece of the
timeline keeps the shortest time it had, nesting and order are kept, and a workload whose
steps differ is refused."""

from __future__ import annotations

import json
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echo_et.errors import EchoError
from echo_et.ir import Graph, GraphBuilder
from echo_et.ir.schema import pb
from echo_et.trace.steps import fastest_per_op, step_span_ns


def one_step(a: int, b: int, selfs: tuple[int, int, int], gap: int, q: int) -> Graph:
    """Host thread: P encloses A then B (P's own time: before A, between, after B), then a
    gap, then Q; a GPU kernel K launched by Q runs after it on its own stream."""
    g = GraphBuilder("rank0")
    cpu = g.stream(pb.STREAM_CPU_THREAD, "main")
    gpu = g.stream(pb.STREAM_GPU_COMPUTE, "compute", device=0)
    s0, s1, s2 = selfs
    a0 = s0
    b0 = a0 + a + s1
    p_end = b0 + b + s2
    p = g.cpu_op("P", cpu, start_ns=0, duration_ns=p_end)
    g.cpu_op("A", cpu, start_ns=a0, duration_ns=a, deps=[(p.id, pb.DEP_CONTROL)])
    g.cpu_op("B", cpu, start_ns=b0, duration_ns=b, deps=[(p.id, pb.DEP_CONTROL)])
    qn = g.cpu_op("Q", cpu, start_ns=p_end + gap, duration_ns=q)
    g.compute("K", gpu, start_ns=p_end + gap + q, duration_ns=7, deps=[(qn.id, pb.DEP_LAUNCH)])
    return g.build()


def _by_name(graph: Graph) -> dict[str, pb.Node]:
    return {n.name: n for n in graph.nodes}


def _assert_well_formed(graph: Graph) -> None:
    n = _by_name(graph)
    p, a, b, q, k = (n[x] for x in "PABQK")
    end = lambda x: x.start_ns + x.duration_ns  # noqa: E731
    assert p.start_ns <= a.start_ns <= end(a) <= b.start_ns <= end(b) <= end(p) <= q.start_ns
    assert end(q) <= k.start_ns


def test_each_piece_keeps_its_shortest_time() -> None:
    slow = one_step(30, 40, (10, 10, 10), 20, 50)
    fast = one_step(35, 20, (4, 4, 4), 25, 45)     # faster overall, yet A and the gap are not
    out = fastest_per_op([slow, fast])
    n = _by_name(out)
    assert n["A"].duration_ns == 30 and n["B"].duration_ns == 20 and n["Q"].duration_ns == 45
    assert n["P"].duration_ns == 30 + 20 + 12                  # children + shortest own time
    assert n["Q"].start_ns - (n["P"].start_ns + n["P"].duration_ns) == 20   # shortest gap
    assert n["K"].duration_ns == 7
    _assert_well_formed(out)
    assert step_span_ns(out) == (30 + 20 + 12) + 20 + 45 + 7
    assert step_span_ns(out) < min(step_span_ns(slow), step_span_ns(fast))
    # the inputs are left as they were
    assert _by_name(fast)["A"].duration_ns == 35 and _by_name(slow)["P"].duration_ns == 100


def test_own_time_is_taken_from_each_stretch_in_proportion() -> None:
    ref = one_step(10, 10, (40, 20, 20), 0, 10)       # own time 80: stretches 40, 20, 20
    other = one_step(10, 10, (30, 30, 60), 0, 10)     # own time 120 (slower in total)
    lean = one_step(12, 12, (5, 5, 10), 0, 10)        # own time 20, but A and B are slower
    out = fastest_per_op([ref, other, lean])
    n = _by_name(out)
    # reference = the fastest step (lean); own time 20 is already the least: kept as is
    assert n["A"].start_ns == 5 and n["B"].start_ns == 5 + 10 + 5
    out2 = fastest_per_op([ref, one_step(10, 10, (10, 10, 20), 0, 100)])   # ref is faster
    n2 = _by_name(out2)
    # ref's own time 80 -> 40 (the least): 40 saved as 20, 10, 10 over stretches 40, 20, 20
    assert n2["A"].start_ns == 20 and n2["B"].start_ns == 20 + 10 + 10
    assert n2["P"].duration_ns == 10 + 10 + 40
    _assert_well_formed(out2)


def test_one_step_is_returned_unchanged() -> None:
    g = one_step(3, 4, (1, 2, 3), 5, 6)
    out = fastest_per_op([g])
    assert out is not g
    assert [(n.name, n.start_ns, n.duration_ns) for n in out.nodes] == \
        [(n.name, n.start_ns, n.duration_ns) for n in g.nodes]


def test_steps_that_run_different_operators_are_refused() -> None:
    a = one_step(3, 4, (1, 2, 3), 5, 6)
    b = one_step(3, 4, (1, 2, 3), 5, 6)
    b.nodes[2].name = "C"
    with pytest.raises(EchoError, match=r"^rank 0: measured step 2 runs different operators "
                                        r"from step 1 \(5 vs 5 nodes, first difference at node 2\)"):
        fastest_per_op([a, b], where="rank 0")
    c = one_step(3, 4, (1, 2, 3), 5, 6)
    c.nodes.pop()
    with pytest.raises(EchoError, match="not repeatable"):
        fastest_per_op([a, c])
    with pytest.raises(EchoError, match="no measured step"):
        fastest_per_op([])


durations = st.integers(min_value=0, max_value=10_000)
steps = st.tuples(durations, durations, st.tuples(durations, durations, durations), durations,
                  durations)


@settings(max_examples=150, deadline=None)
@given(st.lists(steps, min_size=2, max_size=5))
def test_combined_step_is_the_sum_of_the_shortest_pieces(params) -> None:
    graphs = [one_step(*p) for p in params]
    out = fastest_per_op(graphs)
    _assert_well_formed(out)
    best = (min(p[0] for p in params) + min(p[1] for p in params)
            + min(sum(p[2]) for p in params) + min(p[3] for p in params)
            + min(p[4] for p in params) + 7)
    # own time is split over three stretches in whole ns: at most 2 ns may stay unsaved
    assert best <= step_span_ns(out) <= best + 2
    assert step_span_ns(out) <= min(step_span_ns(g) for g in graphs)


def two_streams(host: list[int], other: list[tuple[int, int]]) -> Graph:
    """Top-level host operators back to back with gaps (``host``: gap, duration, ...) and
    operators of another stream at given (start, duration), overlapping them anywhere."""
    g = GraphBuilder("rank0")
    cpu = g.stream(pb.STREAM_CPU_THREAD, "main")
    comm = g.stream(pb.STREAM_GPU_COMM, "comm", device=0)
    t = 0
    for k in range(0, len(host), 2):
        t += host[k]
        g.cpu_op(f"h{k}", cpu, start_ns=t, duration_ns=host[k + 1])
        t += host[k + 1]
    for k, (start, dur) in enumerate(other):
        g.node(pb.KIND_SYNC, f"w{k}", comm, start_ns=start, duration_ns=dur)
    return g.build()


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=2, max_value=4).flatmap(lambda k: st.lists(
    st.tuples(st.lists(st.integers(1, 500), min_size=8, max_size=8),
              st.lists(st.tuples(st.integers(0, 2500), st.integers(0, 300)), min_size=4,
                       max_size=4)), min_size=k, max_size=k)))
def test_no_two_events_change_order_on_any_stream(params) -> None:
    """Savings on one stream never turn another stream's events around (a wait that came
    after a send still comes after it): every boundary keeps its order."""
    graphs = [two_streams(h, o) for h, o in params]
    out = fastest_per_op(graphs)
    ref = min(graphs, key=step_span_ns)
    pairs = []
    for a, b in zip(ref.nodes, out.nodes, strict=True):
        pairs += [(a.start_ns, b.start_ns), (a.start_ns + a.duration_ns, b.start_ns + b.duration_ns)]
    pairs.sort()
    assert all(x[1] <= y[1] for x, y in zip(pairs, pairs[1:], strict=False)), pairs
    assert all(b.duration_ns <= a.duration_ns for a, b in zip(ref.nodes, out.nodes, strict=True))


# -- through the tracer ----------------------------------------------------------------------

UNEVEN = """
import torch
import torch.distributed as dist

def build(ctx):
    calls = [0]
    def step():
        calls[0] += 1
        x = torch.ones(8)
        dist.all_reduce(x, group=ctx.group("dp"))
        if calls[0] % 2:               # every other call does one thing more
            {extra}
    return step
"""
UNEVEN_OPS = UNEVEN.format(extra="x = torch.relu(x)")
UNEVEN_COMM = UNEVEN.format(extra='dist.all_reduce(x, group=ctx.group("dp"))')


def _script(tmp_path, body: str) -> str:
    p = tmp_path / "user.py"
    p.write_text(textwrap.dedent(body))
    return f"{p}:build"


@pytest.mark.parametrize("body, message", [
    (UNEVEN_OPS, "measured step 2 runs different operators from step 1"),
    (UNEVEN_COMM, "measured step 2 issues different collectives from step 1"),
])
def test_a_workload_whose_steps_differ_is_refused(tmp_path, body, message) -> None:
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    from echo_et.trace.layout import ParallelLayout
    from echo_et.trace.tracer import TraceOptions, trace
    from echo_et.workloads import load_script

    with pytest.raises(EchoError, match=rf"^layout dp=2 tp=1 pp=1 microbatches=1, rank 0: "
                                        rf"{message}.*trace it with one measured step"):
        trace(load_script(_script(tmp_path, body)), ParallelLayout(dp=2),
              TraceOptions(measured_steps=2))


def test_trace_cli_with_several_measured_steps(tmp_path) -> None:
    """Same program and collectives as one measured step; no piece longer than there."""
    pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")
    from typer.testing import CliRunner

    from echo_et.cli.main import app
    from echo_et.ir import check_job, load_job

    tiny = ["trace", "--layers", "2", "--hidden", "16", "--heads", "2", "--seq", "8",
            "--micro-batch", "1", "--vocab", "32", "--dp", "2", "--tp", "2"]
    runner = CliRunner()
    one, three = tmp_path / "one", tmp_path / "three"
    assert runner.invoke(app, [*tiny, "-o", str(one)]).exit_code == 0
    r = runner.invoke(app, [*tiny, "--steps", "3", "-o", str(three), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["graphs"] == 1
    a, b = load_job(one), load_job(three)
    assert check_job(b) == []
    assert b.manifest.attrs["trace.measured_steps"] == "3"
    assert b.manifest.provenance.command.endswith("--steps 3 -o three")
    ga, gb = a.graph_of(0), b.graph_of(0)
    assert [(n.kind, n.name) for n in ga.nodes] == [(n.kind, n.name) for n in gb.nodes]
    assert [(n.collective.type, n.collective.in_bytes) for n in gb.nodes
            if n.kind == pb.KIND_COLLECTIVE] == \
        [(n.collective.type, n.collective.in_bytes) for n in ga.nodes
         if n.kind == pb.KIND_COLLECTIVE]
    assert b.binding(0).measured_step_ns == step_span_ns(gb) > 0
    # the combined timeline keeps every stream's order: it replays and simulates
    from echo_et.models.comm import CommModel
    from echo_et.sim import simulate

    for mode in ("replay", "predict"):
        assert simulate(b, mode, comm_model=CommModel.preset("a100-ib")).step_time_ns > 0
