"""The traces in fixtures/ (made by real PyTorch runs) convert into the Jobs the runs imply.

Expected values come from the model definition (fixtures/tiny_model.py), from what each run
recorded about itself (run.json: world size, DDP's own bucket sizes, profiled steps) and from
the raw trace files; never from the converters' own output.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from conftest import FIXTURES
from echo_et.converters import ReadOptions, read
from echo_et.converters import pytorch_et as et
from echo_et.ir import check_job, pb
from echo_et.ir.schema import collective_name

TRACES = FIXTURES / "traces"


def _tiny_model():
    spec = importlib.util.spec_from_file_location("tiny_model", FIXTURES / "tiny_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tm = _tiny_model()


def run_info(name: str) -> dict:
    return json.loads((TRACES / name / "run.json").read_text())


def raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def colls(graph) -> list[tuple[str, int, int]]:
    return [(collective_name(n.collective.type), n.collective.in_bytes, n.collective.out_bytes)
            for n in graph.nodes if n.kind == pb.KIND_COLLECTIVE]


def kineto(name: str, **kw):
    files = sorted((TRACES / name).glob("rank*.kineto.json.gz"))
    return read(files, "kineto", ReadOptions(**kw))


def host(name: str):
    return et.read([TRACES / name], ReadOptions())


def step_durations_ns(path: Path) -> dict[int, float]:
    return {int(e["name"].split("#")[1]): e["dur"] * 1000 for e in raw(path)["traceEvents"]
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#")}


def test_readme_lists_every_file_and_total_is_small():
    readme = (FIXTURES / "README.md").read_text()
    files = [p for p in TRACES.rglob("*") if p.is_file()]
    assert files
    for p in files:
        rel = p.relative_to(FIXTURES).as_posix()
        braces = [rel.replace(p.name, p.name.replace(p.name.split(".")[0], f"rank{{{ranks}}}"))
                  for ranks in ("0,1,2,3", "0,1")]
        assert rel in readme or any(b in readme for b in braces), rel
    for script in FIXTURES.glob("make_*.py"):
        assert f"python fixtures/{script.name}" in readme
    assert sum(p.stat().st_size for p in files) < 400_000


def test_run_facts_agree_with_the_model():
    n = tm.param_count()
    assert n == sum(i * o + o for i, o in zip(tm.LAYERS, tm.LAYERS[1:], strict=False))
    for name in ("cpu_single", "ddp_gloo4", "fake_pg64"):
        info = run_info(name)
        assert info["param_count"] == n and info["layers"] == list(tm.LAYERS)
    ddp = run_info("ddp_gloo4")
    assert sum(ddp["ddp_bucket_sizes_bytes"]) == n * tm.FLOAT_BYTES
    assert len(ddp["ddp_bucket_sizes_bytes"]) == 2


def test_cpu_single():
    info = run_info("cpu_single")
    last = info["profiled_steps"][-1]
    kin = TRACES / "cpu_single" / "rank0.kineto.json.gz"
    assert sorted(step_durations_ns(kin)) == info["profiled_steps"]
    job = kineto("cpu_single")
    assert check_job(job) == [] and job.world_size == 1 and job.manifest.step == last
    measured = job.manifest.bindings[0].measured_step_ns
    assert measured == pytest.approx(step_durations_ns(kin)[last], abs=1)
    hjob = host("cpu_single")
    assert check_job(hjob) == [] and hjob.manifest.step == last
    names = [n.name for n in hjob.graph("rank0").nodes]
    assert f"ProfilerStep#{last}" in names and names.count("aten::addmm") == len(tm.LAYERS) - 1


def test_ddp_gloo4_all_reduce_buckets_on_every_rank():
    info = run_info("ddp_gloo4")
    buckets = sorted(info["ddp_bucket_sizes_bytes"])
    world = info["world_size"]
    step = info["profiled_steps"][-1]
    for job in (kineto("ddp_gloo4"), host("ddp_gloo4")):
        rules = {i.rule for i in check_job(job)}
        assert rules <= {"p2p-match"}          # equal collective sequences across ranks
        assert job.world_size == world and job.ranks() == list(range(world))
        assert job.manifest.step == step
        for r in range(world):
            got = colls(job.graph_of(r))
            assert {t for t, _, _ in got} == {"all_reduce"}
            assert sorted(b for _, b, _ in got) == buckets
    kjob = kineto("ddp_gloo4")
    for r in range(world):
        kin = TRACES / "ddp_gloo4" / f"rank{r}.kineto.json.gz"
        want = step_durations_ns(kin)[step]
        assert kjob.binding(r).measured_step_ns == pytest.approx(want, abs=1)


def p2p(graph) -> list[tuple[str, int, int]]:
    return [("send" if n.kind == pb.KIND_SEND else "recv", n.p2p.peer, n.p2p.bytes)
            for n in graph.nodes if n.kind in (pb.KIND_SEND, pb.KIND_RECV)]


def ring_expected(rank: int, world: int, nbytes: int) -> list[tuple[str, int, int]]:
    return [("send", (rank + 1) % world, nbytes), ("recv", (rank - 1) % world, nbytes)]


def test_ddp_gloo4_ring_from_host_traces():
    info = run_info("ddp_gloo4")
    world, nbytes = info["world_size"], info["ring_message_bytes"]
    job = host("ddp_gloo4")
    assert check_job(job) == []                # every send meets its recv
    for r in range(world):
        assert p2p(job.graph_of(r)) == ring_expected(r, world, nbytes)


def test_ddp_gloo4_ring_from_kineto():
    info = run_info("ddp_gloo4")
    world, nbytes = info["world_size"], info["ring_message_bytes"]
    job = kineto("ddp_gloo4")
    for r in range(world):
        assert p2p(job.graph_of(r)) == ring_expected(r, world, nbytes)
    assert check_job(job) == []


def test_fake_pg64_collective_sizes():
    info = run_info("fake_pg64")
    world = info["world_size"]
    shard = -(-tm.param_count() // world) * tm.FLOAT_BYTES
    assert shard == info["shard_numel"] * tm.FLOAT_BYTES
    want = [("all_gather", shard, shard * world), ("reduce_scatter", shard * world, shard),
            ("all_reduce", tm.FLOAT_BYTES, tm.FLOAT_BYTES)]
    hjob = host("fake_pg64")
    assert check_job(hjob) == []
    assert hjob.world_size == world and len(hjob.graph_ids()) == 1   # rank 0 stands for all
    assert hjob.manifest.dropped["host_et_untraced_ranks_copied"] == world - 1
    assert colls(hjob.graph("rank0")) == want
    kjob = kineto("fake_pg64")
    assert [t for t, _, _ in colls(kjob.graph_of(0))] == [t for t, _, _ in want]
    # Linked, every Kineto collective names its host op, and any size Kineto lacked is filled.
    linked = kineto("fake_pg64", host_et=[TRACES / "fake_pg64"])
    assert check_job(linked) == []
    assert colls(linked.graph_of(0)) == want
    ops = {n["id"]: n for n in raw(TRACES / "fake_pg64" / "rank0.et.json.gz")["nodes"]}
    for n in linked.graph_of(0).nodes:
        if n.kind == pb.KIND_COLLECTIVE:
            assert ops[int(n.attrs["et_id"])]["name"].startswith("c10d::")
