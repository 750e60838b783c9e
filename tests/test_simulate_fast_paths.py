"""What the simulate side skips or computes in one pass must give the same result to the ns:
a slowdown round whose durations are all the last run's is not run again, the single-row
unions of a rank with repeat blocks equal the 2-D form, the flat layout of a compact
program is the expanded graph's items in their order, and the checker's communication
signature of a graph with repeat blocks is that of its expansion."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from echo_et.ir import pb
from echo_et.ir.job_checker import _signature
from echo_et.sim.analysis import _row_unions, _unions
from echo_et.sim.blocks import compile_compact, flat_layout
from echo_et.sim.program import CAT_OTHER, DEVICE_CATEGORY

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install -e '.[dev]')")

from echo_et.experiments.config_rows import ConfigSweepOptions  # noqa: E402
from echo_et.experiments.config_sweep import models_for  # noqa: E402
from echo_et.passes import retime_compute  # noqa: E402
from echo_et.sim import Predictor, SimOptions  # noqa: E402
from echo_et.trace import ParallelLayout, TraceOptions, trace  # noqa: E402
from echo_et.workloads import GPTConfig, build_gpt  # noqa: E402

SMALL = dict(layers=4, hidden=64, heads=4, seq=32, micro_batch=2, vocab=128)
CASES = {
    "megatron": (GPTConfig.megatron(**SMALL, recompute=True), ParallelLayout(dp=1, tp=2, pp=2, microbatches=5)),
    "ddp-overlap": (GPTConfig(**SMALL, attention="megatron", bucket_mb=0.001),
                    ParallelLayout(dp=2, tp=1, pp=2, microbatches=4)),
}


class Counted(Predictor):
    """Predictor counting its runs."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.runs = 0

    def _simulate(self, durs):
        self.runs += 1
        super()._simulate(durs)


class AlwaysRun(Counted):
    """Every slowdown round is run, as before rounds could be skipped."""

    def _meeting_hooks_pure(self) -> bool:
        return False


@functools.cache
def _timed(name: str):
    cfg, lay = CASES[name]
    job = trace(build_gpt(cfg), lay, TraceOptions(device="meta", warmup_steps=0, verify="stage")).job
    compute, comm, slow = models_for(ConfigSweepOptions())
    return name, retime_compute(job, compute)[0], comm, slow


@pytest.fixture(params=sorted(CASES))
def timed(request):
    return _timed(request.param)


def _run(cls, job, comm, slow, **options):
    sim = cls(job, SimOptions(gpus_per_node=8, check=False, **options), comm_model=comm, slowdown_model=slow)
    return sim, sim.run()


@pytest.mark.parametrize("repeats", [True, False], ids=["blocks", "expanded"])
def test_a_round_that_changes_nothing_is_skipped_with_the_same_result(timed, repeats) -> None:
    name, job, comm, slow = timed
    skip, a = _run(Counted, job, comm, slow, repeats=repeats)
    full, b = _run(AlwaysRun, job, comm, slow, repeats=repeats)
    assert a.to_json() == b.to_json()          # step, breakdown, critical path, rounds, events
    assert a.slowdown["applied"] and a.slowdown["converged"]
    if name == "megatron":    # no compute kernel overlaps a transfer: the round changes nothing
        assert (skip.runs, full.runs) == (1, 2)
    else:                     # the bucketed all-reduces overlap the backward: every round runs
        assert skip.runs == full.runs >= 2


def test_a_skipped_round_still_counts_the_collectives_it_could_not_price() -> None:
    _, job, comm, slow = _timed("megatron")
    job = job.copy()
    # one skeleton collective of unknown type (priced at its measured time, and counted)
    for g in job.graphs():
        node = next(n for n in g.stored_nodes if n.kind == pb.KIND_COLLECTIVE)
        node.collective.type = pb.COLL_UNKNOWN
    skip, a = _run(Counted, job, comm, slow)
    full, b = _run(AlwaysRun, job, comm, slow)
    assert a.options["unpriced_collectives"] > 0
    assert a.to_json() == b.to_json() and skip.runs < full.runs


@pytest.mark.parametrize("seed", range(6))
def test_single_row_unions_equal_the_row_form(seed) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    lo = rng.integers(0, 1000, n).astype(np.int64)
    hi = lo + rng.integers(0, 60, n)             # empty intervals too
    if seed % 2:
        lo = np.sort(lo)                         # ties and sorted input
    subsets = [rng.random(n) < p for p in (0.0, 0.1, 0.5, 1.0)]
    want = [int(v[0]) for v in _row_unions(lo[None, :], hi[None, :], subsets)]
    assert _unions(lo, hi, subsets) == want
    # the union of everything, counted directly
    covered = np.zeros(1100, dtype=bool)
    for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
        covered[a:b] = True
    assert _unions(lo, hi, [np.ones(n, dtype=bool)]) == [int(covered.sum())]
    assert _unions(lo[:0], hi[:0], subsets) == [0] * len(subsets)


def test_flat_layout_is_the_expanded_graph_in_stream_and_id_order(timed) -> None:
    _, job, _, _ = timed
    graph = next(g for g in job.graphs() if g.has_repeats)
    prog = compile_compact(graph)
    info = prog.compact
    lay = flat_layout(prog)
    stored = graph.stored_nodes
    got = []
    for o, ref, cat, host in zip(lay.occ.tolist(), lay.ref.tolist(), lay.category.tolist(), lay.host.tolist(),
                                 strict=True):
        if o < 0:
            node = stored[prog.node_of[ref]]
            k = prog.stream_of[ref]
            assert cat == prog.category[ref]
        else:
            blk = info.occurrences[o].block
            node = blk.nodes[ref]
            k = blk.stream[ref]
            assert cat == blk.category[ref]
        assert host == prog.host_stream[k]
        nid = node.id + (info.occurrences[o].offset if o >= 0 else 0)
        assert cat == DEVICE_CATEGORY.get(node.kind, CAT_OTHER)
        got.append((k, nid))
    expanded = graph.copy()
    expanded.expand()
    streams = sorted({n.stream for n in expanded.nodes})
    dense = {s: k for k, s in enumerate(streams)}
    assert got == sorted((dense[n.stream], n.id) for n in expanded.nodes)
    assert lay.occ.size == info.expanded_items
    assert np.array_equal(lay.skeleton_at, np.flatnonzero(lay.occ < 0))


def _facts(nodes) -> list[tuple]:
    return [(n.id, n.kind, n.name, n.collective.type, n.collective.in_bytes, n.collective.root, n.p2p.bytes)
            for n in nodes]


def test_checker_signature_of_a_compact_graph_is_the_expanded_ones(timed) -> None:
    _, job, _, _ = timed
    graphs = [g for g in job.graphs() if g.has_repeats]
    assert graphs
    for g in graphs:
        flat = g.copy()
        flat.expand()
        a, b = _signature(g), _signature(flat)
        assert a.keys == b.keys
        assert {k: _facts(v) for k, v in a.collectives.items()} == {k: _facts(v) for k, v in b.collectives.items()}
        assert {k: _facts(v) for k, v in a.p2p.items()} == {k: _facts(v) for k, v in b.p2p.items()}
        assert {k: n.id for k, n in a.max_root.items()} == {k: n.id for k, n in b.max_root.items()}
