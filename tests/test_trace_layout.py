"""Rank <-> (tp, dp, pp) coordinates and groups of the traced layout (torch-free)."""

from __future__ import annotations

import pytest

from echo_et.errors import EchoError
from echo_et.trace.layout import ParallelLayout
from echo_et.trace.records import CommRecord
from echo_et.trace.tracer import group_key


def test_megatron_rank_order():
    lay = ParallelLayout(dp=2, tp=2, pp=2)
    # tp fastest, then dp, then pp
    assert [tuple(lay.coords(r).values()) for r in range(8)] == [
        (0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0), (0, 0, 1), (1, 0, 1), (0, 1, 1), (1, 1, 1)]
    assert lay.group_ranks("tp", 5) == (4, 5)
    assert lay.group_ranks("dp", 5) == (5, 7)
    assert lay.group_ranks("pp", 5) == (1, 5)
    for role in ("tp", "dp", "pp"):
        groups = lay.all_groups(role)
        assert sorted(r for g in groups for r in g) == list(range(8))


def test_bad_layouts():
    with pytest.raises(EchoError, match="tp must be >= 1"):
        ParallelLayout(tp=0)
    with pytest.raises(EchoError, match="ZeRO stage 3"):
        ParallelLayout(zero=3)
    with pytest.raises(EchoError, match=r"dp\*tp\*pp = 8 differs from the world size 6"):
        ParallelLayout(dp=2, tp=2, pp=2).check_world_size(6)


def _rec(ranks, desc=""):
    return CommRecord(0, "all_reduce", tuple(ranks), "7", desc, 4, 4, "float32")


def test_group_keys_by_membership():
    lay = ParallelLayout(dp=2, tp=2, pp=2)
    assert group_key(lay, 5, _rec((4, 5))) == "tp"
    assert group_key(lay, 5, _rec((5, 7))) == "dp"
    assert group_key(lay, 5, _rec((1, 5))) == "pp"
    assert group_key(lay, 5, _rec(range(8), "default_pg")) == "world"
    assert group_key(lay, 5, _rec((3, 5), "mesh_x")) == "mesh_x"
    assert group_key(lay, 5, _rec((3, 5), "undefined")) == "pg:7"


def test_importing_the_tracer_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, echo_et.trace, echo_et.trace.compare, echo_et.workloads, "
            "echo_et.cli.trace_cmds; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_the_meta_device_graph_builder_does_not_import_torch():
    """The graph half of meta-device tracing (``echo_et.trace.direct_graph``) needs no torch;
    only the recorder (``echo_et.trace.direct``) does."""
    import subprocess
    import sys

    code = "import sys, echo_et.trace.direct_graph; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
