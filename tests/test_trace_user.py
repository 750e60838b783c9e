"""User workloads (``--script file.py:build_fn``): DDP, programs that differ by rank, groups
outside the layout, and user code that fails."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the ex-situ tracer needs torch (pip install 'echo-et[trace]')")

from echo_et.converters import ReadOptions, read  # noqa: E402
from echo_et.errors import EchoError  # noqa: E402
from echo_et.ir import check_job  # noqa: E402
from echo_et.ir.schema import pb  # noqa: E402
from echo_et.trace.layout import ParallelLayout  # noqa: E402
from echo_et.trace.tracer import TraceOptions, trace  # noqa: E402
from echo_et.workloads import load_script  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DDP_SCRIPT = REPO / "fixtures" / "jobs" / "user_ddp.py"
DDP_REAL = REPO / "fixtures" / "traces" / "ddp_gloo4"


def _script(tmp_path: Path, body: str) -> str:
    p = tmp_path / "user.py"
    p.write_text(textwrap.dedent(body))
    return f"{p}:build"


def _colls(graph) -> list[tuple[int, int]]:
    return [(n.collective.type, n.collective.in_bytes)
            for n in sorted(graph.nodes, key=lambda n: n.id) if n.kind == pb.KIND_COLLECTIVE]


def test_ddp_buckets_match_a_real_ddp_run():
    """The same model under DDP on 4 real gloo processes (fixtures/traces/ddp_gloo4, made by
    fixtures/make_ddp_gloo.py): the ex-situ job issues the buckets DDP reported there."""
    run = json.loads((DDP_REAL / "run.json").read_text())
    res = trace(load_script(f"{DDP_SCRIPT}:build"), ParallelLayout(dp=run["world_size"]),
                TraceOptions(warmup_steps=2))
    job = res.job
    assert check_job(job) == [] and res.graphs == 1
    want = [(pb.COLL_ALL_REDUCE, b) for b in run["ddp_bucket_sizes_bytes"]]
    real = read(sorted(DDP_REAL.glob("rank*.kineto.json.gz")), "kineto", ReadOptions())
    for rank in range(run["world_size"]):
        assert _colls(job.graph_of(rank)) == want
        assert _colls(real.graph_of(rank)) == want
        assert job.resolve_group(rank, "dp").ranks == list(range(run["world_size"]))
    # DDP waits on its buckets inside C++: the wait is placed at the end of the step
    assert job.manifest.dropped["ex_situ_wait_not_observed"] == len(want)


PER_RANK = """
import torch
import torch.distributed as dist

def build(ctx):
    w = torch.randn(16, 16)
    def step():
        x = torch.randn(4, 16) @ w
        if ctx.dp_rank == 2:
            x = torch.relu(x)              # this replica runs one op more
        dist.all_reduce(x, group=ctx.group("dp"))
    return step
"""


def test_ranks_that_differ_are_found_by_hash(tmp_path):
    res = trace(load_script(_script(tmp_path, PER_RANK)), ParallelLayout(dp=3))
    # the ends of the class (ranks 0 and 2) differ, so every rank is traced
    assert res.traced_ranks == [0, 1, 2] and res.graphs == 2
    b = {x.rank: x.graph for x in res.job.manifest.bindings}
    assert b[0] == b[1] != b[2]
    assert any(n.name == "aten::relu" for n in res.job.graph_of(2).nodes)
    assert not any(n.name == "aten::relu" for n in res.job.graph_of(1).nodes)
    assert check_job(res.job) == []


PAIRS = """
import torch
import torch.distributed as dist

def build(ctx):
    mine = None
    for first in range(0, ctx.world_size, 2):
        g = dist.new_group([first, first + 1], group_desc="pairs")
        if ctx.rank in (first, first + 1):
            mine = g
    def step():
        dist.all_reduce(torch.ones(8), group=mine)
    return step
"""


def test_groups_outside_the_layout_bind_per_rank(tmp_path):
    res = trace(load_script(_script(tmp_path, PAIRS)), ParallelLayout(dp=4))
    # which pair an untraced rank would use cannot be derived: every rank is traced
    assert res.traced_ranks == [0, 1, 2, 3] and res.graphs == 1
    job = res.job
    assert [job.resolve_group(r, "pairs").ranks for r in range(4)] == [[0, 1], [0, 1], [2, 3],
                                                                       [2, 3]]
    assert check_job(job) == []


RAISES = """
import torch

def build(ctx):
    if ctx.rank == 1:
        raise ValueError("no weights for this rank")
    return lambda: torch.ones(2).sum()
"""


def test_a_step_that_runs_nothing_is_reported(tmp_path):
    spec = _script(tmp_path, "def build(ctx):\n    return lambda: None\n")
    with pytest.raises(EchoError, match=r"^layout dp=1 tp=1 pp=1 microbatches=1, rank 0: the "
                                        r"profile of the measured step cannot be converted: .*no"):
        trace(load_script(spec), ParallelLayout())


def test_user_function_raising_names_rank_and_layout(tmp_path):
    with pytest.raises(EchoError, match=r"^layout dp=2 tp=1 pp=1 microbatches=1, rank 1: "
                                        r"build_fn raised ValueError: no weights for this rank$"):
        trace(load_script(_script(tmp_path, RAISES)), ParallelLayout(dp=2))


def test_script_spec_errors(tmp_path):
    with pytest.raises(EchoError, match="expected path/to/file.py:function"):
        load_script("user.py")
    with pytest.raises(EchoError, match="does not exist"):
        load_script(f"{tmp_path / 'missing.py'}:build")
    spec = _script(tmp_path, "def other(ctx):\n    pass\n")
    with pytest.raises(EchoError, match="has no function 'build'"):
        load_script(spec)


WORLD = """
import torch
import torch.distributed as dist

def build(ctx):
    def step():
        loss = torch.ones(3).sum()
        dist.all_reduce(loss)              # the default group: the whole world
        dist.barrier()
    return step
"""


def test_default_group_is_the_world_group(tmp_path):
    res = trace(load_script(_script(tmp_path, WORLD)), ParallelLayout(dp=2, tp=2))
    job = res.job
    assert check_job(job) == [] and res.traced_ranks == [0, 3]
    for rank in range(4):
        pg = job.resolve_group(rank, "world")
        assert pg.ranks == [0, 1, 2, 3] and pg.role == pb.ROLE_WORLD
    types = [n.collective.type for n in job.graph_of(2).nodes if n.kind == pb.KIND_COLLECTIVE]
    assert types == [pb.COLL_ALL_REDUCE, pb.COLL_BARRIER]
