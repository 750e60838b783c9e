"""The simulator's results did not move when its core was rewritten for readability
(issue 15): ``simulate``'s JSON and every node's simulated start and end, hashed, equal the
hashes the code before the rewrite gave (commit ea5d98a: this file's ``_digest`` run there,
reading the old ``SimTimeline`` states), for synthetic GPT jobs and the real 8-rank DLRM
trace, in replay and in predict mode (with a CC model fixed here, so that a change to the
shipped presets does not move these).

A change that moves these on purpose (new semantics) updates the hashes in the same commit
and says why; a refactor never does.
"""

from __future__ import annotations

import hashlib
import json

import pytest

from conftest import shared_path, unpack
from echo_et.converters import ReadOptions, read
from echo_et.experiments.synthetic import gpt_3d_job
from echo_et.sim import simulate

BEFORE = {
    "dlrm/predict": ("523ac071036a159cbe5b6cf2296c6bb7f79a3c3ee039f5c724385d1d93b0788b",
                      "479e76408e3ee857dd47646c73479800e5892c9fca05df3a11f9c5bf3a213c22"),
    "dlrm/replay": ("6cc7fedfd043c5eae03fd7a4565d34dc6ade87aa4fd6ce7089d19500c64b4fcd",
                     "c5ccb479eca71b9dc2e4ec53883dcabb1606d612b70050ca3fa38a930b43a443"),
    "gpt-tp2-pp2-dp2/predict": ("4498d6713056feb5b96eb1d8707b1a884bc5e0858c1dad760926621c45e8fa16",
                                 "ec0a1baec8c502178e096de4ba6aed7efe7cdf5c7232aabbbe6ef5634341b40c"),
    "gpt-tp2-pp2-dp2/replay": ("69da00a9b8c50c9c5911223fd267b99339b0116d4b2bf01e88d7234293e88ddd",
                                "3dadbe3f2abe29b8466fa548150a2bb36161cd0ebe1f6004343a8cc0182a4c96"),
    "gpt-tp4-pp4-dp4/predict": ("84432cc77f7d200c85c50438fffba4e3eeb51b782ce4c4a3989987a87bf7b076",
                                 "fa47c35dea04e85f194d2c45f4dbb7e94d1c731ffb5149c09d132f70c8093369"),
    "gpt-tp4-pp4-dp4/replay": ("818f23998d395eab0c724db1007a7bc938b1ae339d9dc56d15b3d68963115f4b",
                                "3a8debda884ca0bd80e102b0fed83704ab8a757e7e2c107865dc6f502fee811a"),
}


class LinearModel:
    """A fixed, test-local CC model: 5 us + bytes / (10 GB/s) (x (n-1)/n for collectives)."""

    class Time:
        def __init__(self, t: float):
            self.time_ns = t

    def estimate(self, name, in_bytes, ranks, dtype="float32", gpus_per_node=None):
        return self.Time(5000 + in_bytes * (len(ranks) - 1) / len(ranks) / 10)

    def p2p(self, nbytes, src, dst, gpus_per_node=None):
        cross = bool(gpus_per_node) and src // gpus_per_node != dst // gpus_per_node
        return self.Time(5000 + nbytes / 10 + (2000 if cross else 0))


def _node_times(res) -> list[tuple[int, int, int, int]]:
    tl = res.timeline
    out = []
    for r in tl.ranks:
        graph = tl.state_of(r).graph
        times = tl.node_times(r)
        out.extend((r, n.id, *times[n.id]) for n in graph.nodes if n.id in times)
    return out


# What is hashed: the results that existed before the rewrite (fields added since, such as
# bubble_ns or new diagnostics, are not part of the comparison).
FIELDS = ("step_time_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "idle_ns", "sync_wait_ns", "host_wait_ns",
          "simulated_as")
KEYS = ("mode", "step_time_ns", "slowest_rank", "critical_path", "simulated_ranks", "world_size", "events", "slowdown")


def _digest(res) -> tuple[str, str]:
    j = res.to_json()
    # idle_ns (no longer in the JSON: docs/step-breakdown.md) is bubble_ns + host_idle_ns
    j = {k: j[k] for k in KEYS} | {"ranks": {r: {k: v[k] if k != "idle_ns" else v["bubble_ns"] + v["host_idle_ns"]
                                                 for k in FIELDS} for r, v in j["ranks"].items()}}
    return (hashlib.sha256(json.dumps(j, sort_keys=True).encode()).hexdigest(),
            hashlib.sha256(json.dumps(_node_times(res)).encode()).hexdigest())


def _check(name: str, job) -> None:
    for mode in ("replay", "predict"):
        res = simulate(job, mode, comm_model=LinearModel() if mode == "predict" else None)
        assert _digest(res) == BEFORE[f"{name}/{mode}"], f"{name} {mode}: simulated results moved"


@pytest.mark.parametrize("name, shape", [("gpt-tp2-pp2-dp2", (2, 2, 2, 4, 2)), ("gpt-tp4-pp4-dp4", (4, 4, 4, 8, 1))])
def test_synthetic_jobs_simulate_as_before(name, shape) -> None:
    tp, pp, dp, mb, layers = shape
    _check(name, gpt_3d_job(tp, pp, dp, microbatches=mb, layers=layers))


def test_real_dlrm_trace_simulates_as_before(tmp_path) -> None:
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    files = sorted(unpack(archive, tmp_path / "in").rglob("*.json"))
    _check("dlrm", read(files, "kineto", ReadOptions()))
