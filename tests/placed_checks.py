"""What a closed-form (repeat-block) prediction must equal: the same job simulated node by node,
in everything but the simulator's event count. Shared by the tests of traced workloads."""

from __future__ import annotations

from typing import Any


def assert_placed_as_expanded(timed: Any, comm: Any, slow: Any, **options: Any) -> tuple[Any, Any]:
    """``timed`` predicted with its repeat blocks placed and node by node (``options``: more
    ``SimOptions``, 8 GPUs a node): equal results and timelines; (placed, expanded)."""
    from echo_et.sim import SimOptions, simulate

    def run(repeats: bool):
        return simulate(timed, "predict", options=SimOptions(gpus_per_node=8, repeats=repeats, **options),
                        comm_model=comm, slowdown_model=slow)

    placed, expanded = run(True), run(False)
    assert_same_results(placed, expanded)
    return placed, expanded


def assert_same_results(placed: Any, expanded: Any) -> None:
    """Two simulation results equal in everything but the simulator's event count."""
    a, b = placed.to_json(), expanded.to_json()
    a.pop("events")
    b.pop("events")
    assert a == b
    assert list(placed.timeline_events()) == list(expanded.timeline_events())
