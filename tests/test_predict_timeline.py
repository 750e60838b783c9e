"""``echo-et predict`` simulates with its repeat blocks placed in closed form: its step,
breakdown and critical path are the node-by-node simulation's to the ns, and so is its
timeline (every copy's box at the time the placement gives it), byte for byte in Kineto's
schema; a bounded timeline is exactly the whole one's boxes that start before its end."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the meta-device tracer needs torch (pip install 'echo-et[trace]')")

from echo_et.cli.cluster_opts import cluster_from_options  # noqa: E402
from echo_et.converters.chrome import kineto_traces  # noqa: E402
from echo_et.experiments.config_rows import ConfigSweepOptions  # noqa: E402
from echo_et.experiments.config_sweep import predict_job, trace_row  # noqa: E402
from echo_et.sim.timeline import timeline_events, window_end  # noqa: E402

BASE = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "micro_batch": 1, "vocab": 256}
CONFIGS = {
    # TP, PP and DP, 4 micro-batches per pipeline, no recomputation
    "tp2-pp2-dp2": ({**BASE, "global_batch": 8, "tp": 2, "pp": 2, "dp": 2}, False),
    # a deeper pipeline with many micro-batches (warm-up, steady 1F1B, drain), recomputation
    "pp4-dp2-mb16": ({**BASE, "layers": 4, "global_batch": 32, "tp": 1, "pp": 4, "dp": 2}, True),
    # DP only, across two nodes of 2 GPUs (the gradient all-reduce leaves the node)
    "dp4-nodes": ({**BASE, "global_batch": 8, "tp": 1, "pp": 1, "dp": 4}, False),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def both(request):
    """(placed, expanded, their timed Jobs, the class representatives) for one configuration."""
    config, recompute = CONFIGS[request.param]
    per_node = 2 if request.param == "dp4-nodes" else 8
    opts = ConfigSweepOptions(cluster=cluster_from_options("a100", per_node, None, "800Gb/s/node"),
                              recompute=recompute)
    job = trace_row(config, opts, jobs=1)
    placed, t1 = predict_job(job, opts, repeats=True)
    expanded, t2 = predict_job(job, opts, repeats=False)
    reps = [members[0] for _, members in expanded.rank_classes()]
    return placed, expanded, t1, t2, reps


def test_placed_prediction_is_the_node_by_node_one(both) -> None:
    """What summary.json holds, but ``events`` (the simulator's own count: a placed
    occurrence is one), is the same."""
    placed, expanded, _, _, reps = both
    assert any(st.blocks is not None for st in placed.timeline.states)   # the blocks were placed
    assert placed.events < expanded.events
    a, b = placed.to_json(), expanded.to_json()
    a.pop("events")
    b.pop("events")
    assert a == b
    assert [m for _, m in placed.rank_classes()] == [m for _, m in expanded.rank_classes()]
    assert len(reps) >= 1 and placed.step_time_ns > 0


def test_placed_timeline_is_the_node_by_node_one(both) -> None:
    placed, expanded, t1, t2, reps = both
    a = kineto_traces(timeline_events(placed, reps), t1)
    b = kineto_traces(timeline_events(expanded, reps), t2)
    assert list(a) == reps and a == b
    assert window_end(placed, reps, None) == window_end(expanded, reps, None)


def test_a_bounded_timeline_is_the_prefix_of_the_whole_one(both) -> None:
    placed, expanded, _, _, reps = both
    whole = list(timeline_events(placed, reps))
    total = len(whole)
    assert window_end(placed, reps, None) == (None, total)
    assert window_end(placed, reps, total) == (None, total)
    for cap in (1, 7, total // 3, total - 1):
        until, of = window_end(placed, reps, cap)
        assert of == total and until is not None
        kept = [e for e in whole if e.start_ns < until]
        first = min(e.start_ns for e in whole)
        assert kept and cap < sum(1 for e in whole if e.start_ns <= until)   # the longest such prefix
        # at most cap, or (when more than cap start at the first instant) just those
        assert len(kept) <= cap or all(e.start_ns == first for e in kept)
        for result in (placed, expanded):
            assert list(timeline_events(result, reps, until_ns=until)) == kept
    with pytest.raises(ValueError):
        window_end(placed, reps, 0)


def test_a_window_over_ranks_that_share_a_class_counts_every_rank_s_boxes(both) -> None:
    """The window is found from each rank class's earliest starts, counted once per chosen
    rank of the class: the same cut as sorting every chosen rank's every box."""
    placed, _, _, _, reps = both
    ranks = placed.timeline.ranks
    assert len(ranks) > len(reps)                                   # ranks share classes
    starts = sorted(e.start_ns for e in timeline_events(placed, ranks))
    first = starts[0]
    for cap in (1, 2, 5, 100, len(starts) // 2, len(starts) - 1):
        cut = starts[cap]
        want = cut if cut > first else next((s for s in starts if s > first), None)
        assert window_end(placed, ranks, cap) == (want, len(starts))
