"""The event loop's shortcuts give the answer of its general path, to the nanosecond.

Replay's meetings take their own time straight from ``echo_et.sim.replay_times`` when the
``collective`` / ``p2p`` hooks are not overridden; a subclass whose hooks only call
``super()`` takes the general path (a ``CommCall`` per meeting, the hook, its checks).
Collective meeting keys are shared per (program, group key, group class); the cyclic GC is
paused during a run. Each must leave step time, per-rank breakdown, critical path and the
event count exactly as they were."""

from __future__ import annotations

import gc

import pytest

from conftest import FIXTURES
from echo_et.converters import read
from echo_et.errors import EchoError
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.sim import Predictor, SimOptions, Simulator
from echo_et.sim.state import CollectiveKey, P2PKey


class HookedReplay(Simulator):
    """Replay through the hooks: the general path, the reference for the shortcuts."""

    def collective(self, call):
        return super().collective(call)

    def p2p(self, call):
        return super().p2p(call)


def _answer(res) -> dict:
    return {"step": res.step_time_ns, "events": res.events, "critical": res.critical_path,
            "ranks": {r: rr.to_json() for r, rr in sorted(res.ranks.items())}}


def _same(job, **opts) -> dict:
    options = SimOptions(check=False, **opts)
    fast = _answer(Simulator(job, options).run())
    ref = _answer(HookedReplay(job, options).run())
    assert fast == ref
    return fast


def _offset_clocks(job, step_ns: int):
    """Each rank's clock shifted by a different amount (measured times stay per-rank)."""
    for b in job.manifest.bindings:
        b.clock_offset_ns = (b.rank * step_ns) % 7_919
    return job


@pytest.mark.parametrize("tp,pp,dp,mb", [(2, 2, 2, 4), (4, 2, 3, 3), (2, 4, 2, 5), (1, 3, 4, 6), (8, 1, 2, 2)])
@pytest.mark.parametrize("symmetry", [False, True])
def test_replay_shortcut_equals_the_hook_path_on_synthetic_jobs(tp, pp, dp, mb, symmetry) -> None:
    job = gpt_3d_job(tp, pp, dp, microbatches=mb, layers=2, gpus_per_node=4)
    got = _same(job, symmetry=symmetry)
    assert got["events"] > 0
    _same(job, symmetry=symmetry, stragglers={1: 1.3, tp * pp * dp - 1: 0.7})
    _same(job, symmetry=symmetry, p2p_eager_bytes=0)          # every send waits for its recv
    _same(job, symmetry=symmetry, compute_scale=0.5, align_start=True)


@pytest.mark.parametrize("step_ns", [13, 2_003])
def test_replay_shortcut_equals_the_hook_path_with_clock_offsets(step_ns) -> None:
    """Different clocks: the shortcut must fall back to the tails (or the shortest kernel)
    exactly where the hooks do."""
    job = _offset_clocks(gpt_3d_job(2, 2, 3, microbatches=3, layers=2), step_ns)
    _same(job, symmetry=False)
    _same(job, symmetry=False, stragglers={2: 1.5})


@pytest.mark.parametrize("name", ["gpt-tp2-pp2-dp2", "gpt-tp2-pp2-dp8", "ddp-dp4", "gpt-dp4-zero1"])
def test_replay_shortcut_equals_the_hook_path_on_fixtures(name) -> None:
    job = read([FIXTURES / "jobs" / name])
    _same(job, symmetry=False)
    _same(job, symmetry=True, stragglers={1: 1.25})


def test_a_diverging_shortcut_is_caught(monkeypatch) -> None:
    """The comparison above is not vacuous: the shortcut is taken, and a wrong answer from
    it shows (here: every shared-node collective 1 ns longer)."""
    import echo_et.sim.simulator as simulator_module
    from echo_et.sim.replay_times import one_node_time

    job = gpt_3d_job(2, 2, 2, microbatches=3, layers=2)
    monkeypatch.setattr(simulator_module, "one_node_time", lambda parts: one_node_time(parts) + 1)
    with pytest.raises(AssertionError):
        _same(job, symmetry=False)


def test_predict_is_unchanged_by_shared_meeting_keys_and_symmetry() -> None:
    from echo_et.models.comm import CommModel

    job = gpt_3d_job(4, 2, 3, microbatches=3, layers=2, gpus_per_node=4)
    kw = {"comm_model": CommModel.preset("a100-ib")}
    sym = Predictor(job, SimOptions(stragglers={5: 1.2}), **kw).run()
    full = Predictor(job, SimOptions(stragglers={5: 1.2}, symmetry=False), **kw).run()
    strip = {r: {k: v for k, v in rr.to_json().items() if k != "simulated_as"} for r, rr in full.ranks.items()}
    assert strip == {r: {k: v for k, v in rr.to_json().items() if k != "simulated_as"} for r, rr in sym.ranks.items()}
    assert sym.step_time_ns == full.step_time_ns


def test_every_rank_meets_under_its_own_groups_keys() -> None:
    """The shared tables give each rank's collective the key of the group it is bound to,
    and the number of members that group has."""
    job = gpt_3d_job(2, 2, 3, microbatches=2, layers=1)
    res = Simulator(job, SimOptions(symmetry=False)).run()
    groups = {g.id: g for g in job.manifest.groups}
    seen_groups = set()
    for r in job.ranks():
        st = res.timeline.state_of(r)
        binding = job.binding(r)
        for it, key, seq in st.program.collective_items:
            mk = st.meeting_key[it]
            assert isinstance(mk, CollectiveKey) and mk.seq == seq
            seen_groups.add((key, mk.group_class))
            assert st.meeting_size[it] == len(groups[binding.groups[key]].ranks)
        for it, *_ in st.program.p2p_items:
            assert isinstance(st.meeting_key[it], P2PKey)
    # without symmetry each group is its own class: as many classes per key as groups
    assert len({gc for key, gc in seen_groups if key == "tp"}) == 2 * 3
    assert len({gc for key, gc in seen_groups if key == "dp"}) == 2 * 2


@pytest.mark.parametrize("enabled", [True, False])
def test_the_cyclic_gc_is_paused_during_a_run_and_restored(enabled) -> None:
    class Probe(Simulator):
        during: list[bool] = []

        def compute(self, node, measured_ns, rank):
            Probe.during.append(gc.isenabled())
            return super().compute(node, measured_ns, rank)

    class Failing(Simulator):
        def compute(self, node, measured_ns, rank):
            raise EchoError("no")

    job = gpt_3d_job(2, 1, 2, microbatches=1, layers=1)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        Probe(job, SimOptions(symmetry=False)).run()
        assert Probe.during and not any(Probe.during)
        assert gc.isenabled() is enabled
        with pytest.raises(EchoError):
            Failing(job).run()
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
