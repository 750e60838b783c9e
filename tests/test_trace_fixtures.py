"""The committed traced Jobs (fixtures/jobs) are valid, match the commands their README
gives, and agree with what the layouts and the real DDP run imply. Torch-free."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from conftest import FIXTURES
from echo_et.ir import check_job, load_job
from echo_et.ir.io import MANIFEST_NAME
from echo_et.ir.schema import pb

JOBS = FIXTURES / "jobs"


def _readme_rows() -> dict[str, tuple[str, int]]:
    rows = {}
    for line in (JOBS / "README.md").read_text().splitlines():
        m = re.match(r"\| `([\w-]+)` \| `(echo-et trace [^`]+)` \| (\d+) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), int(m.group(3)))
    return rows


ROWS = _readme_rows()


def _options(command: str) -> dict[str, str]:
    args = shlex.split(command)[2:]
    out = {}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        out[flag] = value.rpartition("/")[2] if flag == "--script" else value
    return out


def test_readme_lists_every_job():
    dirs = sorted(p.name for p in JOBS.iterdir() if (p / MANIFEST_NAME).is_file())
    assert dirs and sorted(ROWS) == dirs


@pytest.mark.parametrize("name", sorted(ROWS))
def test_job_is_valid_and_made_by_its_command(name):
    command, ranks = ROWS[name]
    job = load_job(JOBS / name)
    assert check_job(job) == []
    m = job.manifest
    assert m.world_size == ranks == len(m.bindings)
    want = _options(command)
    got = _options(m.provenance.command)
    assert {k: got.get(k) for k in want} == want
    lay = m.layout
    for flag, value in (("--dp", lay.dp), ("--tp", lay.tp), ("--pp", lay.pp),
                        ("--zero", lay.zero_stage), ("--microbatches", lay.microbatches)):
        assert int(got[flag]) == value
    assert lay.dp * lay.tp * lay.pp == m.world_size
    for ref in m.graphs:
        assert (JOBS / name / ref.path).read_bytes()[:2] == b"\x1f\x8b"
    # ranks of one pipeline stage share a graph, stages do not
    stage_of = {r: r // (lay.tp * lay.dp) for r in range(m.world_size)}
    graph_of = {b.rank: b.graph for b in m.bindings}
    for r in range(m.world_size):
        assert graph_of[r] == graph_of[stage_of[r] * lay.tp * lay.dp]
    assert len(set(graph_of.values())) == lay.pp


def test_ddp_job_issues_the_buckets_of_the_real_ddp_run():
    run = json.loads((FIXTURES / "traces" / "ddp_gloo4" / "run.json").read_text())
    job = load_job(JOBS / "ddp-dp4")
    assert job.world_size == run["world_size"]
    for rank in range(job.world_size):
        g = job.graph_of(rank)
        colls = [n.collective for n in sorted(g.nodes, key=lambda n: n.id)
                 if n.kind == pb.KIND_COLLECTIVE]
        assert [c.in_bytes for c in colls] == run["ddp_bucket_sizes_bytes"]
        assert {c.type for c in colls} == {pb.COLL_ALL_REDUCE}


def test_gpt_stages_communicate_as_the_layout_implies():
    job = load_job(JOBS / "gpt-tp2-pp2-dp2")
    work = json.loads(job.manifest.attrs["trace.workload"])
    act = work["micro_batch"] * work["seq"] * work["hidden"] * 4
    micro = job.manifest.layout.microbatches
    for rank in (0, 4):
        g = job.graph_of(rank)
        p2p = [n for n in g.nodes if n.kind in (pb.KIND_SEND, pb.KIND_RECV)]
        assert len(p2p) == 2 * micro and {n.p2p.bytes for n in p2p} == {act}
        keys = {n.collective.group for n in g.nodes if n.kind == pb.KIND_COLLECTIVE}
        assert keys == {"tp", "dp"}
