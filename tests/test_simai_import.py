"""SimAI / AICB workload import: every workload file under ../shared/data/workloads, with
the expected nodes, sizes and groups computed from the file's own text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import shared_path, simai_workloads
from echo_et.cli.main import app
from echo_et.converters import ReadOptions, read
from echo_et.converters.simai import parse, sniff
from echo_et.errors import EchoError, OptionError
from echo_et.ir import check_job, load_job
from echo_et.ir.schema import pb

MOE = "workloads/SimAI/example/workload_analytical.txt"


def _facts(text: str, world: int):
    """Compute nodes, collectives and their bytes that the text implies for one rank."""
    lines = text.splitlines()
    toks = lines[0].split()
    policy = toks[0]
    h = {toks[i].rstrip(":"): int(toks[i + 1]) for i in range(1, len(toks) - 1)
         if toks[i + 1].isdigit() and not toks[i].isdigit()}
    tp = h.get("model_parallel_NPU_group") or (1 if policy in ("MICRO", "DATA") else world)
    pp, ep = h.get("pp", 1), h.get("ep", 1)
    dp = world // (tp * pp)
    sizes = {"tp": tp, "dp": dp, "ep": ep, "dp_ep": dp // ep, "world": world}
    vals = " ".join(lines[2:]).split()
    rows = [vals[i:i + 12] for i in range(0, len(vals) - 11, 12)][:int(lines[1])]
    compute, colls = [], []
    for i, row in enumerate(rows):
        if policy != "MICRO":
            for col, phase in ((2, "fwd"), (5, "ig"), (8, "wg")):
                if phase == "ig" and policy == "DATA" and i == 0:
                    continue
                if int(row[col]) > 1:
                    compute.append(int(row[col]))
        for col, default in ((3, "tp"), (6, "tp"), (9, "dp")):
            kind, size = row[col], int(row[col + 1])
            if kind == "NONE" or size == 0 or (policy == "MICRO" and col != 9):
                continue
            if policy == "DATA" and col != 9:
                continue
            if col == 6 and i == 0 and policy in ("MODEL", "HYBRID_DATA_MODEL", "HYBRID_MODEL_DATA"):
                continue
            group = ("world" if policy == "MICRO" else "dp_ep" if kind.endswith("_DP_EP")
                     else "ep" if kind.endswith("_EP") else default)
            if sizes[group] > 1:
                colls.append((kind.split("_")[0], size, group))
    return policy, h, rows, compute, colls, sizes


def _world(text: str) -> int:
    h = text.splitlines()[0].split()
    if "all_gpus:" in h:
        return int(h[h.index("all_gpus:") + 1])
    tp = int(h[h.index("model_parallel_NPU_group:") + 1]) if "model_parallel_NPU_group:" in h else 1
    return 2 * max(tp, 2)


_NAMES = {pb.COLL_ALL_REDUCE: "ALLREDUCE", pb.COLL_ALL_GATHER: "ALLGATHER",
          pb.COLL_REDUCE_SCATTER: "REDUCESCATTER", pb.COLL_ALL_TO_ALL: "ALLTOALL",
          pb.COLL_BROADCAST: "BROADCAST"}


def _simai_size(c: pb.CollectiveInfo) -> int:
    """The size SimAI's column states: an all-gather's output, otherwise the input."""
    return c.out_bytes if c.type == pb.COLL_ALL_GATHER else c.in_bytes


@pytest.fixture(scope="module")
def moe_job():
    return read([shared_path(MOE)], "simai", ReadOptions())


@pytest.mark.parametrize("rel", simai_workloads())
def test_workload_converts_to_graphs_the_text_describes(rel, request):
    path = shared_path(rel)
    text = path.read_text()
    world = _world(text)
    assert sniff(path)
    job = (request.getfixturevalue("moe_job") if rel == MOE
           else read([path], "simai", ReadOptions(world_size=world)))
    assert check_job(job) == []
    policy, h, rows, compute, colls, sizes = _facts(text, world)
    assert job.world_size == world
    assert len(job.graph_ids()) == 1                    # every rank runs the same layer list
    g = job.graph_of(world - 1)
    nodes = g.nodes
    comp = [n.duration_ns for n in nodes if n.kind == pb.KIND_COMPUTE]
    assert sorted(comp) == sorted(compute)              # ns, as SimAI ticks
    got = [(_NAMES[n.collective.type], _simai_size(n.collective), n.collective.group)
           for n in nodes if n.kind == pb.KIND_COLLECTIVE]
    assert sorted(got) == sorted(colls)
    m = job.manifest
    assert m.attrs["simai_policy"] == policy
    assert (m.layout.tp, m.layout.pp, m.layout.ep) == (sizes["tp"], h.get("pp", 1), h.get("ep", 1))
    declared = int(text.splitlines()[1])
    if declared > len(rows):
        assert m.dropped["simai_declared_layers_missing"] == declared - len(rows)


def test_forward_then_backward_order():
    path = shared_path("workloads/aicb/workload/simAI/model_workload/L7B-M1-C04_Llama7B_megatron_tp2_pp1_mbs1_A100.txt")
    job = read([path], "simai", ReadOptions(world_size=4))
    g = job.graph_of(0)
    by_id = {n.id: n for n in g.nodes}
    layers = [n.annotations.layer for n in g.nodes if n.kind == pb.KIND_COMPUTE]
    phases = [n.attrs["simai_phase"] for n in g.nodes if n.kind == pb.KIND_COMPUTE]
    first_bwd = phases.index("ig")
    assert set(phases[:first_bwd]) == {"fwd"} and "fwd" not in phases[first_bwd:]
    assert layers[:first_bwd] == sorted(layers[:first_bwd])                 # forward ascending
    assert layers[first_bwd:] == sorted(layers[first_bwd:], reverse=True)   # backward descending
    # A blocking TP all-reduce sits between a layer's forward compute and the next one.
    attn = next(n for n in g.nodes if n.name == "attention_layer.fwd_comm")
    nxt = next(n for n in g.nodes if attn.id in [d.id for d in n.deps])
    assert by_id[attn.deps[0].id].name == "attention_layer.fwd" and nxt.kind == pb.KIND_COMPUTE
    # Weight-gradient comm is waited for by nobody inside the step.
    wg = [n for n in g.nodes if n.attrs.get("simai_phase") == "wg" and n.kind == pb.KIND_COLLECTIVE]
    assert wg and not any(d.id in {w.id for w in wg} for n in g.nodes for d in n.deps)


def test_moe_9216_gpus_shares_one_graph_and_the_header_groups(moe_job):
    path = shared_path(MOE)
    text = path.read_text()
    head = text.split()[:20]
    tp = int(head[head.index("model_parallel_NPU_group:") + 1])
    ep = int(head[head.index("ep:") + 1])
    pp = int(head[head.index("pp:") + 1])
    world = int(head[head.index("all_gpus:") + 1])
    job = moe_job
    assert job.world_size == world == 9216
    assert len(job.graph_ids()) == 1
    dp = world // (tp * pp)
    by_role: dict[str, int] = {}
    for grp in job.manifest.groups:
        by_role[grp.desc] = by_role.get(grp.desc, 0) + 1
    assert by_role == {"tp": world // tp, "dp": tp * pp, "ep": world // ep,
                       "dp_ep": world // (dp // ep), "pp": world // pp}
    b = job.binding(world - 1)
    assert list(job.group(b.groups["tp"]).ranks) == [world - 2, world - 1]
    dp_ranks = list(job.group(b.groups["dp"]).ranks)
    assert len(dp_ranks) == dp and dp_ranks[1] - dp_ranks[0] == tp * pp
    ep_ranks = list(job.group(b.groups["ep"]).ranks)
    assert len(ep_ranks) == ep and set(ep_ranks) <= set(dp_ranks)
    assert job.manifest.dropped["simai_pipeline_transfers_not_modelled"] == pp - 1


def test_world_size_override_and_bad_layouts():
    path = shared_path(MOE)
    job = read([path], "simai", ReadOptions(world_size=384))
    assert (job.world_size, job.manifest.layout.dp) == (384, 16)
    with pytest.raises(EchoError, match="not a multiple of TP 2 x PP 12"):
        read([path], "simai", ReadOptions(world_size=100))
    with pytest.raises(EchoError, match="is not a multiple of EP 16"):
        read([path], "simai", ReadOptions(world_size=24 * 8))
    aicb = shared_path("workloads/aicb/workload/simAI/micro_test/all_reduce.txt")
    with pytest.raises(OptionError, match="no all_gpus; give the world size") as err:
        read([aicb], "simai", ReadOptions())
    assert err.value.option == "world_size"


@pytest.mark.parametrize(("body", "message"), [
    ("NOPE\n1\nx -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n", "not a SimAI parallelism policy"),
    ("HYBRID_DLRM DLRM_LAST_BOTTOM_LAYER: 1\n1\nx -1 1 NONE 0 1 NONE 0 1 NONE 0 1\n", "not supported"),
    ("MICRO\n2\nx -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 8 1\ny -1 1 NONE\n", "layer 2 is incomplete"),
    ("MICRO\n1\nx -1 1 NONE 0 1 NONE 0 1 ALLSUM 8 1\n", "'ALLSUM' is not a SimAI comm type"),
    ("MICRO\n1\nx -1 1 NONE 0 1 NONE 0 1 ALLREDUCE -8 1\n", "is negative"),
    ("MICRO\n1\nx -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 8.5 1\n", "is not an integer"),
])
def test_bad_text_names_the_line(tmp_path, body, message):
    p = tmp_path / "w.txt"
    p.write_text(body)
    with pytest.raises(EchoError, match=message) as e:
        read([p], "simai", ReadOptions(world_size=8))
    assert str(p) in str(e.value)


def test_parse_reads_tokens_across_lines_like_simai(tmp_path):
    p = tmp_path / "w.txt"
    p.write_text("MICRO\n1\nx -1 1 NONE 0\n 1 NONE 0 1 ALLGATHER 64 1\n")
    wl = parse(p)
    assert wl.layers[0].wg_comm.nbytes == 64 and wl.layers[0].line == 3


def test_cli_convert_detects_simai(tmp_path):
    path = shared_path("workloads/SimAI/example/microAllReduce.txt")
    runner = CliRunner()
    res = runner.invoke(app, ["convert", str(path), "-o", str(tmp_path / "job"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["world_size"] == 8
    job = load_job(tmp_path / "job")
    assert job.manifest.provenance.source_format == "simai"
    res = runner.invoke(app, ["convert", str(path), "--from", "simai", "--world-size", "12",
                              "-o", str(tmp_path / "bad")])
    assert res.exit_code == 2 and "not a multiple of TP 8" in res.stderr
    assert not (tmp_path / "bad").exists()


def test_update_time_and_sizes_are_kept_per_collective():
    path = shared_path("workloads/SimAI/example/microAllReduce.txt")
    rows = [ln.split() for ln in Path(path).read_text().splitlines()[2:] if ln.strip()]
    job = read([path], "simai", ReadOptions())
    colls = [n for n in job.graph_of(0).nodes if n.kind == pb.KIND_COLLECTIVE]
    assert [(c.collective.in_bytes, c.attrs["update_ns"]) for c in colls] == \
        [(int(r[4]), r[11]) for r in rows]


def test_simai_nodes_of_8_are_recorded_only_where_the_world_fills_them(tmp_path):
    """SimAI's default of 8 GPUs per node is recorded for 8 or 16 ranks (or 4: part of a node);
    for 12 it would leave a node partly filled (the checker's node-fill rule), so it is unknown;
    --gpus-per-node is recorded as given."""
    p = tmp_path / "w.txt"
    p.write_text("MICRO\n1\nx -1 1 NONE 0 1 NONE 0 1 ALLREDUCE 64 1\n")
    for world, gpn in ((4, 8), (8, 8), (16, 8), (12, 0)):
        job = read([p], "simai", ReadOptions(world_size=world))
        assert job.manifest.hardware.gpus_per_node == gpn, world
        assert check_job(job) == []
    assert read([p], "simai", ReadOptions(world_size=12, gpus_per_node=4)).manifest.hardware.gpus_per_node == 4


def test_an_all_gathers_size_is_its_output_and_each_rank_holds_a_shard(tmp_path):
    # SimAI's MockNcclGroup cuts an all-gather's size into one chunk per rank and sends n-1 of
    # them from each rank: the size is the gathered output. AICB writes the parameters a
    # data-parallel rank gathers after the distributed optimizer (2.6 GiB in the MoE example),
    # not one shard of them per rank.
    p = tmp_path / "w.txt"
    p.write_text("HYBRID_TRANSFORMER_FWD_IN_BCKWD model_parallel_NPU_group: 2 all_gpus: 8\n2\n"
                 "a -1 5 ALLGATHER 4096 5 REDUCESCATTER 4096 5 ALLGATHER 4096 0\n"
                 "b -1 5 ALLGATHER 1 5 NONE 0 5 NONE 0 0\n")
    job = read([p], "simai", ReadOptions())
    colls = [n.collective for n in job.graph_of(0).nodes if n.kind == pb.KIND_COLLECTIVE]
    by = {(c.group, c.type, c.out_bytes if c.type == pb.COLL_ALL_GATHER else c.in_bytes): c for c in colls}
    tp_ag = by[("tp", pb.COLL_ALL_GATHER, 4096)]
    assert (tp_ag.in_bytes, tp_ag.out_bytes) == (2048, 4096)          # TP 2: a half each
    dp_ag = by[("dp", pb.COLL_ALL_GATHER, 4096)]
    assert (dp_ag.in_bytes, dp_ag.out_bytes) == (1024, 4096)          # DP 4: a quarter each
    rs = by[("tp", pb.COLL_REDUCE_SCATTER, 4096)]
    assert (rs.in_bytes, rs.out_bytes) == (4096, 2048)
    tiny = by[("tp", pb.COLL_ALL_GATHER, 1)]
    assert (tiny.in_bytes, tiny.out_bytes) == (1, 1)                  # never a shard of 0 bytes
