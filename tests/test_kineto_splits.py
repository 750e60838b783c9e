"""Uneven all-to-all: per-peer bytes from the split sizes a trace records, stored as the
``in_split_bytes`` / ``out_split_bytes`` node attrs the ASTRA-sim exporter reads.

None of the shared traces records non-empty splits (HTA's nccl_data has ``"[]"``, the
others predate the args), so the traces are written here in the formats PyTorch writes:
``c10d::alltoall_base_`` concrete inputs (as PyTorch 2.13 records a gloo
``all_to_all_single`` with ``record_shapes=True``) and ``In/Out split size`` args on NCCL
kernels (as ``record_param_comms`` metadata)."""

from __future__ import annotations

import json

from test_kineto_graph import NCCL_SR, convert, cpu, gpu, rt, write

from echo_et.converters.astra_sim.writer import export
from echo_et.ir import pb

# What two gloo ranks recorded for all_to_all_single(out, in, out_splits, in_splits) on
# tensors of 3 floats per row: rank 0 sends 1 row to itself and 2 to rank 1, rank 1 sends
# 3 rows to rank 0 and 5 to itself.
GLOO_CALLS = {
    0: {"dims": [[4, 3], [3, 3]], "splits": ("[1, 3]", "[1, 2]")},
    1: {"dims": [[7, 3], [8, 3]], "splits": ("[2, 5]", "[3, 5]")},
}


def _gloo_rank(rank: int) -> list[dict]:
    call = GLOO_CALLS[rank]
    out_splits, in_splits = call["splits"]
    return [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        cpu("c10d::alltoall_base_", 100, 20, **{
            "Ev Idx": 1, "Input Dims": call["dims"] + [[], [], [], [], []],
            "Input type": ["float", "float", "", "ScalarList", "ScalarList", "Scalar", "Scalar"],
            "Concrete Inputs": ["", "", "", out_splits, in_splits, "False", "-1"]}),
        cpu("gloo:all_to_all", 105, 300, cat="user_annotation", tid=20, **{
            "Ev Idx": 2, "Input Dims": [call["dims"][1]], "Input type": ["float"]}),
    ]


def test_gloo_split_sizes_become_per_peer_bytes(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json").write_text(json.dumps({
            "schemaVersion": 1, "traceEvents": _gloo_rank(r),
            "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2, "pg_config": [
                {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 2, "ranks": [0, 1]}]}}))
    job = convert(tmp_path)
    row = 3 * 4
    got = {}
    for r in (0, 1):
        (a2a,) = [n for n in job.graph_of(r).nodes if n.kind == pb.KIND_COLLECTIVE]
        out_splits, in_splits = (json.loads(x) for x in GLOO_CALLS[r]["splits"])
        assert a2a.attrs["in_split_bytes"] == ",".join(str(x * row) for x in in_splits)
        assert a2a.attrs["out_split_bytes"] == ",".join(str(x * row) for x in out_splits)
        assert (a2a.collective.in_bytes, a2a.collective.out_bytes) == \
            (sum(in_splits) * row, sum(out_splits) * row)
        got[r] = ([int(x) for x in a2a.attrs["in_split_bytes"].split(",")],
                  [int(x) for x in a2a.attrs["out_split_bytes"].split(",")])
    # What one rank sends a peer is what that peer receives from it.
    assert got[0][0][1] == got[1][1][0] and got[1][0][0] == got[0][1][1]
    # The ASTRA-sim exporter takes them as the true per-peer sizes.
    report = export(job, tmp_path / "astra")
    assert report["mapped"]["all_to_all(uneven, in_split_bytes)->COMM_SEND_NODE/COMM_RECV_NODE per peer"] == 2


def _nccl_rank(split_args: dict, pg_ranks: str = "[0, 1]", pg_name: str = "0") -> list[dict]:
    args = {"Collective name": "all_to_allv", "In msg nelems": 8, "Out msg nelems": 12,
            "dtype": "Float", "Group size": len(json.loads(pg_ranks)), "Process Group Name": pg_name,
            "Process Group Ranks": pg_ranks, **split_args}
    return [
        cpu("ProfilerStep#1", 0, 1000, cat="user_annotation", **{"Ev Idx": 0}),
        rt("cudaLaunchKernel", 100, 5, 1),
        gpu(NCCL_SR, 110, 50, 1, 20, **args),
    ]


def _a2a(job, rank=0) -> pb.Node:
    (n,) = [n for n in job.graph_of(rank).nodes if n.kind == pb.KIND_COLLECTIVE]
    assert n.collective.type == pb.COLL_ALL_TO_ALL
    return n


def test_nccl_kernel_split_args(tmp_path):
    job = convert(write(tmp_path, _nccl_rank({"In split size": "[2, 6]", "Out split size": "[4, 8]"})))
    n = _a2a(job)
    assert (n.collective.in_bytes, n.collective.out_bytes) == (32, 48)
    assert (n.attrs["in_split_bytes"], n.attrs["out_split_bytes"]) == ("8,24", "16,32")


def test_even_truncated_and_inconsistent_splits_give_no_attrs(tmp_path):
    cases = [({"In split size": "[]", "Out split size": "[]"}, {}),
             ({"In split size": "[2, 6, ...]", "Out split size": "[]"},
              {"all_to_all_splits_truncated": 1}),
             # 3 sizes for 2 peers; 48 output bytes are not 5 + 2 rows of one size
             ({"In split size": "[2, 3, 3]", "Out split size": "[5, 2]"},
              {"all_to_all_splits_inconsistent": 2})]
    for i, (args, dropped) in enumerate(cases):
        d = tmp_path / str(i)
        d.mkdir()
        job = convert(write(d, _nccl_rank(args)))
        n = _a2a(job)
        assert "in_split_bytes" not in n.attrs and "out_split_bytes" not in n.attrs
        for reason, count in dropped.items():
            assert job.manifest.dropped[reason] == count


def test_partial_job_forgets_splits_of_untraced_peers(tmp_path):
    """Rank 0 of 4 traced, its all-to-all on sub-group [0, 1]: the Job keeps rank 0 alone,
    so sizes per member of the original group would name a peer it does not have."""
    pgs = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
           {"pg_name": "1", "pg_desc": "sub", "pg_size": 2, "ranks": [0, 1]}]
    evs = _nccl_rank({"In split size": "[2, 6]", "Out split size": "[4, 8]"}, pg_name="1")
    job = convert(write(tmp_path, evs, world_size=4, pg_config=pgs))
    assert job.manifest.attrs["kineto.partial"] == "renumbered"
    n = _a2a(job)
    assert "in_split_bytes" not in n.attrs and "out_split_bytes" not in n.attrs
    assert job.manifest.dropped["all_to_all_splits_of_untraced_peers"] == 1
