"""scale and inject on real traces: the DLRM 8-rank Kineto job (../shared/data) and the
project's own CPU fixtures (a single-rank profile and a real 4-rank DDP run of the same model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import FIXTURES, shared_path, unpack
from echo_et.converters import ReadOptions, read
from echo_et.ir import check_job
from echo_et.ir.schema import pb
from echo_et.passes import infer_layout, scale
from echo_et.passes.inject import inject_dp

CPU_SINGLE = FIXTURES / "traces" / "cpu_single"
DDP_GLOO4 = FIXTURES / "traces" / "ddp_gloo4"


def _need(p: Path) -> Path:
    assert p.exists(), f"the shipped fixture {p} is missing"
    return p


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    root = unpack(archive, tmp_path_factory.mktemp("dlrm"))
    files = sorted(root.rglob("*.json"))
    return read(files, "kineto", ReadOptions())


@pytest.fixture(scope="module")
def single():
    d = _need(CPU_SINGLE)
    return read([d / "rank0.kineto.json.gz"], "kineto", ReadOptions(host_et=[d / "rank0.et.json.gz"]))


def _colls(job, rank):
    return [(n.collective.type, n.collective.in_bytes) for n in job.graph_of(rank).nodes
            if n.kind == pb.KIND_COLLECTIVE]


def test_dlrm_layout_is_dp8_with_world_all_to_all(dlrm) -> None:
    d = infer_layout(dlrm)
    # The DLRM trace has one world-wide group carrying all-reduce and all-to-all.
    assert (d.dp, d.tp, d.pp, d.ep) == (8, 1, 1, 8)
    assert d.source == "inferred:groups"


@pytest.mark.parametrize("new_dp", [16, 1024])
def test_dlrm_scaled_in_dp_reuses_the_eight_rank_graphs(dlrm, new_dp: int) -> None:
    out, report = scale(dlrm, dp=new_dp)
    assert check_job(out) == []
    assert out.world_size == new_dp and len(out.graph_ids()) == 8
    assert out.manifest.layout.ep == new_dp
    for r in (0, 9, new_dp - 1):
        # Rank r runs old rank r mod 8's program, same collectives (keep-rank all-to-all).
        assert out.binding(r).graph == dlrm.binding(r % 8).graph
        assert _colls(out, r) == _colls(dlrm, r % 8)
        assert list(out.resolve_group(r, "0").ranks) == list(range(new_dp))
    assert report.resized_collectives == 0


def test_dlrm_keep_peer_all_to_all_grows_per_rank_bytes(dlrm) -> None:
    out, report = scale(dlrm, dp=16, a2a="keep-peer")
    assert check_job(out) == []
    before = [b for t, b in _colls(dlrm, 3) if t == pb.COLL_ALL_TO_ALL]
    after = [b for t, b in _colls(out, 3) if t == pb.COLL_ALL_TO_ALL]
    assert after == [2 * b for b in before]
    assert report.resized_collectives == 8 * len(before)


def test_inject_matches_a_real_ddp_run_of_the_same_model(single) -> None:
    """The 4-rank gloo DDP run (bucket_cap_mb recorded in its run.json) issued these
    all-reduces; injecting into the single-rank profile of the same model must give the same."""
    run = json.loads((_need(DDP_GLOO4) / "run.json").read_text())
    out, report = inject_dp(single, dp=run["world_size"], bucket_mb=run["bucket_cap_mb"])
    assert check_job(out) == []
    assert report.bucket_bytes == run["ddp_bucket_sizes_bytes"]
    real = read(sorted(DDP_GLOO4.glob("rank*.kineto.json.gz")), "kineto", ReadOptions())
    assert _colls(out, 0) == _colls(real, 0)


def test_inject_single_rank_profile_to_dp_1024(single) -> None:
    run = json.loads((CPU_SINGLE / "run.json").read_text())
    out, report = inject_dp(single, dp=1024)
    assert check_job(out) == []
    assert out.world_size == 1024 and len(out.graph_ids()) == 1
    # Every parameter's gradient, float32, in one default-sized (1 MiB first) bucket.
    assert report.param_bytes == 4 * run["param_count"]
    assert report.gradients == 2 * (len(run["layers"]) - 1)  # weight + bias per Linear
    assert report.bucket_bytes == [4 * run["param_count"]]
    out1, _ = inject_dp(single, dp=1024, zero=1)
    assert check_job(out1) == []
    types = [t for t, _ in _colls(out1, 0)]
    assert types == [pb.COLL_REDUCE_SCATTER, pb.COLL_ALL_GATHER]


def test_gradients_and_first_bucket_match_ddp_on_a_real_gpu_run(dlrm) -> None:
    """DLRM on 8 V100s under DDP (NCCL): the dense gradients inject reads from rank 0's
    AccumulateGrad shapes (the embeddings' sparse gradient left out) add up to exactly what
    DDP all-reduced that step, and DDP's first bucket (1 MiB cap) is inject's first bucket.
    DDP reduced one 448-byte gradient in a bucket of its own where inject's second bucket
    holds it; the DDP rule that split it is not one inject knows."""
    from echo_et.passes.gradients import bucket_gradients
    from echo_et.passes.inject import DEFAULT_BUCKET_MB, DEFAULT_FIRST_BUCKET_BYTES, find_gradients

    graph = dlrm.graph_of(0)
    real = [n.collective.in_bytes for n in graph.nodes
            if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_REDUCE]
    assert real == [1_576_964, 448, 907_840]
    grads, source = find_gradients(graph, None)
    assert source == "AccumulateGrad input shapes (1 without a dense gradient left out)"
    assert sum(g.nbytes for g in grads) == sum(real)
    buckets = bucket_gradients(grads, DEFAULT_FIRST_BUCKET_BYTES, int(DEFAULT_BUCKET_MB * (1 << 20)))
    assert [sum(g.nbytes for g in b) for b in buckets] == [1_576_964, 448 + 907_840]
