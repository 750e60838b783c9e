"""ASTRA-sim export of real inputs: the 8-rank DLRM Kineto job, the Chakra feeder test trace
and the SimAI/AICB workloads; every export passes the contract check, and what it holds is
compared with facts read from the inputs themselves."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from chakra.schema.protobuf import et_def_pb2 as et
from test_astra_sim_support import attr_value, read_et

from conftest import SHARED_DATA, shared_path, unpack
from echo_et.converters import ReadOptions, read
from echo_et.converters.astra_sim import check_export, export
from echo_et.ir.schema import pb


# -- DLRM (Kineto) -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    archive = shared_path("traces/param/et_replay/tests/inputs/dlrm_kineto.tar.gz")
    folder = unpack(archive, tmp_path_factory.mktemp("dlrm"))
    files = sorted(p for p in folder.rglob("*.json") if p.is_file())
    job = read(files, "kineto", ReadOptions())
    return files, job


def _kernel_counts(trace: Path) -> Counter:
    events = json.loads(trace.read_text())["traceEvents"]
    c: Counter = Counter()
    for e in events:
        if e.get("cat") == "kernel" and e.get("name", "").startswith("ncclKernel_"):
            c["all_reduce" if "AllReduce" in e["name"] else
              "all_to_all" if "SendRecv" in e["name"] else "other"] += 1
    return c


def test_dlrm_kineto_job_exports_and_passes_the_contract(dlrm, tmp_path):
    files, job = dlrm
    res = export(job, tmp_path / "out")
    assert check_export(tmp_path / "out") == []
    assert res["ranks"] == len(files) == 8
    uneven = 0
    for r, trace in enumerate(files):
        kernels = _kernel_counts(trace)        # e.g. 3 AllReduce and 5 SendRecv per rank
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        colls = Counter(attr_value(n, "comm_type") for n in nodes if n.type == et.COMM_COLL_NODE)
        assert colls[et.ALL_REDUCE] == kernels["all_reduce"]
        sends = [n for n in nodes if n.type == et.COMM_SEND_NODE]
        recvs = [n for n in nodes if n.type == et.COMM_RECV_NODE]
        assert len(sends) % 7 == 0 and len(recvs) == len(sends)   # one per peer of 8 ranks
        assert colls[et.ALL_TO_ALL] + len(sends) // 7 == kernels["all_to_all"]
        uneven += len(sends) // 7
        # Host time is CPU compute nodes; every GPU node is a GPU COMP or communication node.
        cpu = [n for n in nodes if attr_value(n, "is_cpu_op")]
        assert cpu and all(n.type == et.COMP_NODE for n in cpu)
        assert all(not n.ctrl_deps for n in nodes)
    # Every all-to-all is per-peer send/recv; the trace's all-to-all #3 has equal inputs but
    # uneven outputs on every rank.
    assert uneven > 0
    key = next(k for k in res["mapped"] if k.startswith("all_to_all(uneven"))
    assert 0 < res["mapped"][key] < uneven
    assert res["mapped"][key] + res["mapped"]["all_to_all(even)->COMM_SEND_NODE/COMM_RECV_NODE per peer"] == uneven


def test_dlrm_uneven_all_to_all_keeps_each_rank_totals(dlrm, tmp_path):
    _, job = dlrm
    export(job, tmp_path / "out")
    for r in range(job.world_size):
        a2a = [n for n in job.graph_of(r).nodes
               if n.kind == pb.KIND_COLLECTIVE and n.collective.type == pb.COLL_ALL_TO_ALL]
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        sent: Counter = Counter()
        received: Counter = Counter()
        for n in nodes:
            m = re.search(r"\[a2a#(\d+) (send|recv):\d+\]$", n.name)
            if m:
                (sent if m.group(2) == "send" else received)[int(m.group(1))] += \
                    attr_value(n, "comm_size")
        assert sent
        for seq in sent:
            ir = next(x for x in a2a if x.collective.seq == seq)
            # What leaves a rank is its input minus the part it keeps; what arrives is its
            # output minus that part (within one byte per peer).
            own_in = ir.collective.in_bytes - sent[seq]
            own_out = ir.collective.out_bytes - received[seq]
            assert 0 <= own_in <= ir.collective.in_bytes
            assert abs(own_in - own_out) <= job.world_size


# -- Chakra feeder test trace ------------------------------------------------------------------
def test_chakra_feeder_trace_exports(tmp_path):
    from echo_et.experiments.astra_sim import export_with_report

    archive = shared_path("traces/chakra/tests/data/feeder_tests_trace.tar.gz")
    src = next(unpack(archive, tmp_path / "in").rglob("chakra.0.et"))
    _, onodes = read_et(src)
    gpu_comp = [n for n in onodes if n.type == et.COMP_NODE and attr_value(n, "is_cpu_op") is False]
    job = read([src], "chakra", ReadOptions())
    res = export_with_report(job, tmp_path / "out")
    assert check_export(tmp_path / "out") == []
    assert res["ranks"] == 2 and res["job_ranks"] == 1   # one traced rank, one idle partner
    # The reader lays the file out on a timeline; the export keeps it: its replay is the job's.
    assert res["expected_step_ns"] == res["replay_step_ns"]
    assert res["time"]["ranks_losing_over_1pct"] == []
    _, nodes = read_et(tmp_path / "out" / "workload.0.et")
    kernels = [n for n in nodes if n.type == et.COMP_NODE and attr_value(n, "is_cpu_op") is False]
    covered = res["merged"].get("compute (covered by a concurrent kernel)", 0)
    # Every GPU kernel of the file is written, or merged into a kernel that covers it.
    assert res["mapped"]["compute->COMP_NODE"] + covered == len(gpu_comp)
    assert {n.name for n in kernels} <= {o.name for o in gpu_comp} | {o.name for o in onodes
                                                                      if o.type == et.COMM_COLL_NODE}
    assert any(attr_value(n, "is_cpu_op") for n in nodes)     # host time kept
    # Its collectives ran on a group of one rank here: nothing to send, the time stays.
    assert not [n for n in nodes if n.type != et.COMP_NODE]
    assert res["mapped"]["all_reduce(one-rank group)->COMP_NODE"] >= 1


# -- SimAI / AICB workloads ---------------------------------------------------------------------
def _workloads() -> list[str]:
    root = SHARED_DATA / "workloads"
    if not root.exists():
        return ["<missing>"]
    return sorted(str(p.relative_to(SHARED_DATA)) for p in root.rglob("*.txt")
                  if p.read_text().split()[0].isupper() and p.read_text().splitlines()[1].strip().isdigit())


def _header(text: str) -> dict[str, int]:
    toks = text.splitlines()[0].split()
    return {toks[i].rstrip(":"): int(toks[i + 1]) for i in range(1, len(toks) - 1)
            if toks[i + 1].isdigit() and not toks[i].isdigit()}


def _expected_comm_per_rank(text: str, world: int, max_layers: int | None = None) -> tuple[int, int]:
    """Comm entries SimAI would run: a type other than NONE, bytes > 0, on a group of more
    than one rank (group sizes from the header): the collectives other than all-to-all, and
    the sends of the all-to-alls (one per peer)."""
    lines = text.splitlines()
    policy, h = lines[0].split()[0], _header(text)
    tp = h.get("model_parallel_NPU_group") or (1 if policy in ("MICRO", "DATA") else world)
    pp, ep = h.get("pp", 1), h.get("ep", 1)
    dp = world // (tp * pp)
    toks = " ".join(lines[2:]).split()
    rows = [toks[i:i + 12] for i in range(0, len(toks) - 11, 12)][:int(lines[1])]
    rows = rows[:max_layers] if max_layers else rows
    n = sends = 0
    for row in rows:
        for col, default in ((3, "tp"), (6, "tp"), (9, "dp")):
            kind, size = row[col], int(row[col + 1])
            if policy == "MICRO" and col != 9:
                continue
            if kind == "NONE" or size == 0:
                continue
            group = "ep" if kind.endswith("_EP") and not kind.endswith("_DP_EP") else \
                "dp_ep" if kind.endswith("_DP_EP") else default
            sizes = {"tp": tp, "dp": dp, "ep": ep, "dp_ep": dp // ep}
            size = world if policy == "MICRO" else sizes[group]
            if size > 1 and kind.startswith("ALLTOALL"):
                sends += size - 1
            elif size > 1:
                n += 1
    return n, sends


@pytest.mark.parametrize("rel", _workloads())
def test_simai_workload_exports_and_passes_the_contract(rel, tmp_path):
    path = shared_path(rel)
    text = path.read_text()
    h = _header(text)
    max_layers = None
    if h.get("all_gpus", 0) > 1024:
        # The 9216-GPU MoE workload: the smallest world its header allows (TP x PP x EP), and
        # its first 40 layer lines (every comm type it uses); the full export is measured in
        # benchmarks/astra_sim_export.py.
        max_layers = 40
        world = h["model_parallel_NPU_group"] * h["pp"] * h["ep"]
        lines = text.splitlines()
        short = tmp_path / path.name
        short.write_text("\n".join([lines[0], str(max_layers), *lines[2:2 + max_layers]]) + "\n")
        path = short
    else:
        world = h.get("all_gpus") or 2 * max(2, h.get("model_parallel_NPU_group", 1))
    job = read([path], "simai", ReadOptions(world_size=world))
    res = export(job, tmp_path / "out")
    assert check_export(tmp_path / "out") == []
    assert res["ranks"] == world
    want, want_sends = _expected_comm_per_rank(text, world, max_layers)
    for r in sorted({0, world - 1}):
        _, nodes = read_et(tmp_path / "out" / f"workload.{r}.et")
        assert sum(n.type == et.COMM_COLL_NODE for n in nodes) == want
        # All-to-all: per-peer send/recv (NCCL's grouped send/recv).
        assert sum(n.type == et.COMM_SEND_NODE and "[a2a#" in n.name for n in nodes) == want_sends
        assert sum(n.type == et.COMM_RECV_NODE and "[a2a#" in n.name for n in nodes) == want_sends
