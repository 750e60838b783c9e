"""Repeat blocks whose sends, recvs and collectives meet other rank classes are placed
together, as bundles (``echo_et.sim.linked_blocks``): the step, every rank's breakdown, the
critical path, the slowdown rounds and the timeline are those of the same job simulated node
by node, with far fewer events; what cannot be bundled (a cycle, a partner outside the job, a
subclass's hook, bundles that wait for one another outside their blocks) is simulated node by
node, and says what the node-by-node simulation says."""

from __future__ import annotations

import numpy as np
import pytest

from echo_et.errors import EchoError
from echo_et.ir import GraphBuilder, JobBuilder, check_job, pb
from echo_et.ir.repeats import p2p_seq_key
from echo_et.models.comm import CommModel
from echo_et.sim import SimOptions
from echo_et.sim.analysis import decider
from echo_et.sim.blocks import NEG, PLACE_ROWS, place
from echo_et.sim.linked_blocks import NARROW_LIMIT, NARROW_NONE, place_narrow
from echo_et.sim.predict import Predictor

MODEL = CommModel.preset("a100-ib")


def _predict(job, cls=Predictor, **options):
    return cls(job, SimOptions(gpus_per_node=8, **options), comm_model=MODEL).run()


def _same(job, cls=Predictor, **options):
    """(placed, node by node): equal in everything but the simulator's event count."""
    from placed_checks import assert_same_results

    placed = _predict(job, cls, **options)
    expanded = _predict(job, cls, repeats=False, **options)
    assert_same_results(placed, expanded)
    return placed, expanded


# -- hand-made rings ------------------------------------------------------------------------------
def _ring(n: int = 2, copies: int = 3, nbytes: int = 8 << 20, *, one_stream: bool = False,
          bound: int | None = None, scale: int = 1):
    """``n`` ranks in a ring, each a block stored once and repeated ``copies`` times: a kernel
    (longer on later ranks), its output sent to the next rank while the previous rank's is
    received (on two communication streams, or one), kernels that use what came, and at the
    end an all-reduce over the ring. ``bound``: only the first ``bound`` ranks in the Job;
    ``scale`` multiplies the first kernel's duration."""
    jb = JobBuilder("ring", n)
    gid = jb.group(list(range(n)), name="cp", role="cp")
    for r in range(bound or n):
        b = GraphBuilder(f"g{r}")
        gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
        tx = b.stream(pb.STREAM_GPU_COMM, "send", device=0)
        rx = tx if one_stream else b.stream(pb.STREAM_GPU_COMM, "recv", device=0)
        b.declare_group("cp", n)
        g = b.graph
        nxt, prv = (r + 1) % n, (r - 1) % n
        k1 = g.new_node(id=1, name="attn", kind=pb.KIND_COMPUTE, stream=gpu, duration_ns=1000 * (r + 1) * scale)
        k1.compute.op = "attn"
        s = g.new_node(id=2, name="send", kind=pb.KIND_SEND, stream=tx)
        s.p2p.group, s.p2p.peer, s.p2p.bytes = "cp", nxt, nbytes
        s.deps.add(id=1, kind=pb.DEP_SYNC)
        v = g.new_node(id=3, name="recv", kind=pb.KIND_RECV, stream=rx)
        v.p2p.group, v.p2p.peer, v.p2p.bytes = "cp", prv, nbytes
        k2 = g.new_node(id=4, name="merge", kind=pb.KIND_COMPUTE, stream=gpu, duration_ns=700)
        k2.compute.op = "merge"
        k2.deps.add(id=3, kind=pb.DEP_SYNC)
        for i, op in ((5, "proj"), (6, "mlp"), (7, "norm")):
            g.new_node(id=i, name=op, kind=pb.KIND_COMPUTE, stream=gpu, duration_ns=300 * i).compute.op = op
        c = g.new_node(id=10 * copies + 1, name="all_reduce", kind=pb.KIND_COLLECTIVE, stream=tx)
        c.collective.type = pb.COLL_ALL_REDUCE
        c.collective.group = "cp"
        c.collective.in_bytes = c.collective.out_bytes = 4096
        c.deps.add(id=10 * (copies - 1) + 7, kind=pb.DEP_SYNC)
        graph = b.build()
        graph.header.attrs["trace.timing"] = "untimed"
        blk = graph.header.repeats.add(id=1, name="layer", first_node=1, last_node=7)
        for m in range(1, copies):
            inst = blk.instances.add(id_offset=10 * m)
            inst.seq_offsets[p2p_seq_key("cp", nxt, True)] = m
            inst.seq_offsets[p2p_seq_key("cp", prv, False)] = m
        jb.add_graph(graph)
        jb.bind(r, f"g{r}", {"cp": gid})
    job = jb.build()
    assert bound is not None or check_job(job) == []
    return job


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("nbytes", [8 << 20, 4096])     # rendezvous (waits for its recv), eager
def test_a_ring_is_placed_as_the_node_by_node_simulation_runs_it(n: int, nbytes: int) -> None:
    placed, expanded = _same(_ring(n, 5, nbytes))
    assert placed.events < expanded.events
    # the later ranks' longer kernels make the earlier ones wait at their recvs
    assert placed.ranks[0].sync_wait_ns > 0 and placed.step_time_ns > 0


def test_eager_sends_on_one_stream_are_placed_and_rendezvous_ones_deadlock_as_node_by_node() -> None:
    """Eager sends on the recv's stream go ahead; sends that wait for a recv queued behind the
    peer's own send wait for each other in a cycle, which is the node-by-node simulation's
    deadlock, said in its words."""
    placed, expanded = _same(_ring(3, 4, 4096, one_stream=True))
    assert placed.events < expanded.events
    job = _ring(3, 4, 8 << 20, one_stream=True)
    with pytest.raises(EchoError) as placed_err:
        _predict(job)
    with pytest.raises(EchoError) as expanded_err:
        _predict(job, repeats=False)
    assert str(placed_err.value) == str(expanded_err.value)
    assert "deadlock" in str(placed_err.value)


def test_a_partner_outside_the_job_is_simulated_node_by_node() -> None:
    placed, expanded = _same(_ring(4, 3, 8 << 20, bound=2), check=False)
    assert placed.events == expanded.events


def test_a_subclass_that_prices_each_meeting_is_simulated_node_by_node() -> None:
    class Slower(Predictor):
        def p2p(self, call):
            return [2 * super().p2p(call)] * len(call.ranks)

    placed, expanded = _same(_ring(2, 3), cls=Slower)
    assert placed.events == expanded.events
    assert placed.step_time_ns > _predict(_ring(2, 3)).step_time_ns


def _waits_outside() -> object:
    """Rank 0 sends (eager) from a block, then joins an all-reduce; rank 1 joins the
    all-reduce first and receives in a block after it: each bundle would wait for the
    other's member to be placed, so the job is simulated node by node."""
    jb = JobBuilder("outside", 2)
    gid = jb.group([0, 1], name="pair", role="cp")
    for r in (0, 1):
        b = GraphBuilder(f"g{r}")
        gpu = b.stream(pb.STREAM_GPU_COMPUTE, "gpu", device=0)
        comm = b.stream(pb.STREAM_GPU_COMM, "comm", device=0)
        b.declare_group("pair", 2)
        g = b.graph
        first = 1 if r == 0 else 3
        k = g.new_node(id=first, name="k", kind=pb.KIND_COMPUTE, stream=gpu, duration_ns=500)
        k.compute.op = "k"
        p = g.new_node(id=first + 1, name="send" if r == 0 else "recv",
                       kind=pb.KIND_SEND if r == 0 else pb.KIND_RECV, stream=comm)
        p.p2p.group, p.p2p.peer, p.p2p.bytes = "pair", 1 - r, 1024
        p.deps.add(id=first, kind=pb.DEP_SYNC)
        c = g.new_node(id=21 if r == 0 else 1, name="all_reduce", kind=pb.KIND_COLLECTIVE, stream=comm)
        c.collective.type = pb.COLL_ALL_REDUCE
        c.collective.group = "pair"
        c.collective.in_bytes = c.collective.out_bytes = 4096
        graph = b.build()
        graph.header.attrs["trace.timing"] = "untimed"
        blk = graph.header.repeats.add(id=1, name="blk", first_node=first, last_node=first + 1)
        inst = blk.instances.add(id_offset=10)
        inst.seq_offsets[p2p_seq_key("pair", 1 - r, r == 0)] = 1
        jb.add_graph(graph)
        jb.bind(r, f"g{r}", {"pair": gid})
    job = jb.build()
    assert check_job(job) == []
    return job


def test_bundles_that_wait_for_each_other_outside_their_blocks_run_node_by_node() -> None:
    placed, expanded = _same(_waits_outside())
    assert placed.events == expanded.events


def test_a_message_between_a_block_and_a_node_outside_every_block_runs_node_by_node() -> None:
    """Rank 1's receives are plain nodes (its graph has no repeat block): rank 0's block is
    not bundled, and the step is the node-by-node one."""
    job = _waits_outside()
    g1 = job.graph("g1")
    del g1.header.repeats[:]
    flat = g1.copy()
    for k in (13, 14):          # the instance's nodes, written out
        n = flat.new_node(id=k, name=("k", "recv")[k - 13],
                          kind=(pb.KIND_COMPUTE, pb.KIND_RECV)[k - 13], stream=flat.node(k - 10).stream)
        n.CopyFrom(flat.node(k - 10))
        n.id = k
        if n.kind == pb.KIND_RECV:
            n.p2p.seq = 1
            del n.deps[:]
            n.deps.add(id=13, kind=pb.DEP_SYNC)
    job.add_graph(flat)
    assert check_job(job) == []
    placed, expanded = _same(job)
    assert placed.events == expanded.events


def test_a_tie_at_a_meeting_goes_to_the_send_then_the_rank_walked_then_the_lowest() -> None:
    class St:
        def __init__(self, rank: int):
            self.rank = rank

    a, b, c = St(4), St(2), St(7)
    assert decider([(a, 5, False, 0), (b, 9, False, 1)], a)[0] is b           # the last to arrive
    assert decider([(a, 9, False, 0), (b, 9, True, 1)], a)[0] is b            # a send and its recv together
    assert decider([(a, 9, False, 0), (c, 9, False, 1), (b, 9, False, 2)], c)[0] is c
    assert decider([(a, 9, False, 0), (c, 9, False, 1), (b, 1, False, 2)], b)[0] is a


# -- traced context-parallel rings ------------------------------------------------------------------
torch = pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install -e '.[dev]')")


def _traced(cp: int, **extra):
    from echo_et.trace import ParallelLayout, TraceOptions, trace
    from echo_et.workloads import GPTConfig, build_gpt

    cfg = GPTConfig.megatron(layers=4, hidden=256, heads=8, seq=512, micro_batch=1, flash_attention=True,
                             dtype="bfloat16", **extra)
    lay = ParallelLayout(tp=2, pp=2, dp=2, cp=cp, microbatches=4)
    return trace(build_gpt(cfg), lay, TraceOptions(device="meta", verify="stage", warmup_steps=0)).job


@pytest.mark.parametrize("cp,extra,eager", [(2, {}, 4 << 20), (4, {"sequence_parallel": True}, 4 << 20),
                                            (4, {}, 0)])
def test_a_traced_ring_predicts_as_node_by_node(cp: int, extra: dict, eager: int) -> None:
    """Megatron-Core's p2p ring traced on the meta device and predicted with the compute model
    and overlap slowdown (eager sends, and with every send waiting for its recv): the same to
    the ns, the layers of every CP rank placed, and a quarter of the events or fewer."""
    from placed_checks import assert_placed_as_expanded

    from echo_et.experiments.config_rows import ConfigSweepOptions
    from echo_et.experiments.config_sweep import models_for
    from echo_et.passes import retime_compute

    compute, comm, slow = models_for(ConfigSweepOptions())
    timed, _ = retime_compute(_traced(cp, **extra), compute)
    placed, expanded = assert_placed_as_expanded(timed, comm, slow, p2p_eager_bytes=eager)
    assert placed.slowdown["applied"] and placed.events * 3 < expanded.events


def test_unique_rows_is_numpys_unique_by_rows() -> None:
    """The one-lexsort unique the slowdown and the linking use gives np.unique's rows and
    inverse (hypothesis-free: a seeded sweep of shapes with many repeats)."""
    import numpy as np

    from echo_et.sim.blocks import unique_rows

    rng = np.random.default_rng(7)
    for _ in range(60):
        keys = rng.integers(-3, 4, size=(int(rng.integers(1, 300)), int(rng.integers(1, 5))))
        got, inv = unique_rows(keys)
        want, want_inv = np.unique(keys, axis=0, return_inverse=True)
        assert np.array_equal(got, want) and np.array_equal(inv, np.asarray(want_inv).reshape(-1))
    got, inv = unique_rows(np.zeros((0, 4), dtype=np.int64))
    assert got.shape == (0, 4) and inv.size == 0


@pytest.mark.parametrize("spread", [1_000, (1 << 30) - 1, 1 << 30, 1 << 40])
def test_an_int32_joint_table_places_exactly_as_the_int64_one(spread: int) -> None:
    """Joint tables are int32 when their paths are short, "no path" a drifted NARROW_NONE:
    placing with one gives the int64 table's starts to the ns, inputs spread over a second
    or over hours (then the table is widened for the call)."""
    rng = np.random.default_rng(spread % 97)
    n, n_in = 400, 24
    wide = rng.integers(0, 50_000_000, size=(n, n_in), dtype=np.int64)
    missing = rng.random((n, n_in)) < 0.6
    drift = rng.integers(0, NARROW_LIMIT, size=int(missing.sum()))
    entry = rng.integers(0, n_in, size=n)
    small = wide.copy()
    wide[missing] = NEG + drift
    small[missing] = NARROW_NONE + drift
    real = rng.integers(0, 50_000_000, size=n)                           # a real path per item
    small[np.arange(n), entry] = wide[np.arange(n), entry] = real
    small = small.astype(np.int32)
    for _ in range(20):
        x = -rng.integers(0, spread, size=n_in, dtype=np.int64)
        x[rng.integers(0, n_in)] = 0                                      # relative to the latest
        assert np.array_equal(place_narrow(small, x), place(wide, x))


def test_a_ring_of_second_long_layers_keeps_int64_tables_and_places_as_node_by_node(monkeypatch) -> None:
    """A bundle with a path of a second or more is filled again with int64's "no path"
    (an int32 table would wrap): the same results as node by node."""
    from echo_et.sim import linked_blocks

    dtypes: list[np.dtype] = []
    fill = linked_blocks._joint_tables

    def recorded(*args):
        d, r = fill(*args)
        dtypes.append(d.dtype)
        return d, r

    monkeypatch.setattr(linked_blocks, "_joint_tables", recorded)
    placed, expanded = _same(_ring(3, 4, 8 << 20, scale=600_000))
    assert np.dtype(np.int64) in dtypes and placed.step_time_ns > 1 << 31
    dtypes.clear()
    _same(_ring(3, 4, 8 << 20))
    assert dtypes and set(dtypes) == {np.dtype(np.int32)}

def _starts_item_by_item(plan, blocks, durs, x):
    """Every joint item's start and every meeting item's arrival for inputs ``x``, item by
    item in Python ints: the rule the tables are filled by, for checking them."""
    start: dict[tuple[int, int], int] = {}
    arrival: dict[tuple[int, int], int] = {}

    def latest(m: int, i: int) -> int:
        blk, d = blocks[m], durs[m]
        p = blk.stream_prev[i]
        got = [start[m, p] + int(d[p]) if p >= 0 else x[plan.col[m] + blk.streams.index(blk.stream[i])]]
        got += [start[m, q] + (0 if fs else int(d[q])) for q, fs in blk.local_gates[i]]
        got += [x[j] for j in plan.ext[m].get(i, ())]
        return max(got)

    def arrive(e: tuple[int, int]) -> int:
        if e not in arrival:
            arrival[e] = latest(*e)
        return arrival[e]

    for m, i in plan.order:
        if (m, i) in plan.meeting_of:
            start[m, i] = max([arrive((m, i))] + [arrive(o) for o in plan.waits_for.get((m, i), ())])
        else:
            start[m, i] = latest(m, i)
    return start, arrival


@pytest.mark.parametrize("scale", [1, 600_000])
def test_joint_tables_place_every_item_as_the_item_by_item_rule(monkeypatch, scale: int) -> None:
    """The level-by-level fill (int32 when short, int64 when a path is a second or more)
    places every item of every member, and every meeting item's arrival, where evaluating
    the bundle item by item puts them: inputs close together and hours apart."""
    from echo_et.sim import linked_blocks

    bundles = []
    place_bundle = linked_blocks.JointTables.place

    def recorded(self, bundle):
        bundles.append((bundle, [st.blocks.durs[o].copy() for st, o in bundle.members]))
        return place_bundle(self, bundle)

    monkeypatch.setattr(linked_blocks.JointTables, "place", recorded)
    _predict(_ring(3, 4, 8 << 20, scale=scale))
    assert bundles
    rng = np.random.default_rng(scale)
    for bundle, durs in bundles[:3]:
        plan = bundle.plan
        blocks = [st.program.compact.occurrences[o].block for st, o in bundle.members]
        d_rows, r_rows = linked_blocks._joint_tables(plan, plan.schedule, durs)
        assert d_rows.dtype == (np.int32 if scale == 1 else np.int64)
        meets = sorted(plan.meeting_of, key=lambda e: plan.base[e[0]] + e[1])
        for spread in (1_000, 1 << 40):
            x = -rng.integers(0, spread, size=plan.n_in, dtype=np.int64)
            x[rng.integers(0, plan.n_in)] = 0
            start, arrival = _starts_item_by_item(plan, blocks, durs, x.tolist())
            want = [start[m, i] for m, blk in enumerate(blocks) for i in range(blk.n)]
            assert place_narrow(d_rows, x).tolist() == want
            assert place_narrow(r_rows, x).tolist() == [arrival[e] for e in meets]


@pytest.mark.parametrize("rows", [1, PLACE_ROWS, PLACE_ROWS + 1, 3 * PLACE_ROWS + 17])
def test_a_large_table_is_placed_piece_by_piece_as_in_one_sum(rows: int) -> None:
    rng = np.random.default_rng(rows)
    x = -rng.integers(0, 1 << 40, size=7, dtype=np.int64)
    for table in (rng.integers(NEG, 1 << 40, size=(rows, 7), dtype=np.int64),
                  rng.integers(NARROW_NONE, 1 << 30, size=(rows, 7), dtype=np.int64).astype(np.int32)):
        assert np.array_equal(place(table, x), (table.astype(np.int64) + x[None, :]).max(axis=1))


def test_a_joint_table_is_dropped_after_its_last_bundle_and_filled_once_a_run(monkeypatch) -> None:
    """A run counts the bundles of each table: the table (and the placements kept with it)
    goes when its last bundle is placed, and no table is filled twice in a run."""
    from echo_et.sim import linked_blocks

    runs: list[set] = []
    held: list[int] = []
    fills: list[int] = []
    new_run, place = linked_blocks.JointTables.new_run, linked_blocks.JointTables.place
    fill = linked_blocks._joint_tables

    def counted_new_run(self, bundles=()):
        runs.append(set())
        return new_run(self, bundles)

    def counted_place(self, bundle):
        runs[-1].add(linked_blocks._table_key(bundle))
        got = place(self, bundle)
        held.append(len(self._tables) + len(self._solutions))
        return got

    def counted_fill(*args):
        fills.append(1)
        return fill(*args)

    monkeypatch.setattr(linked_blocks.JointTables, "new_run", counted_new_run)
    monkeypatch.setattr(linked_blocks.JointTables, "place", counted_place)
    monkeypatch.setattr(linked_blocks, "_joint_tables", counted_fill)
    _same(_ring(3, 6, 8 << 20))
    assert max(held) > 0 and held[-1] == 0
    assert len(fills) == sum(len(keys) for keys in runs)
