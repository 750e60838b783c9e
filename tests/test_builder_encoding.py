"""The builder's hand-encoded dependencies and varints equal what protobuf itself writes."""

from __future__ import annotations

import pytest

from echo_et.ir import GraphBuilder, pb
from echo_et.ir.builder import _add_deps, _varint
from echo_et.ir.io import encode_varint

EDGES = [0, 1, 127, 128, 200, 16383, 16384, 100_000, 2_097_151, 2_097_152, 2**40, 2**63 - 1]


@pytest.mark.parametrize("value", EDGES)
def test_varint_matches_the_reference_encoder(value):
    assert _varint(value) == encode_varint(value)


@pytest.mark.parametrize("node_id", EDGES)
@pytest.mark.parametrize("kind", [0, pb.DEP_DATA, pb.DEP_CONTROL, pb.DEP_LAUNCH, pb.DEP_SYNC])
def test_one_dependency_encodes_as_deps_add(node_id, kind):
    fast, ref = pb.Node(), pb.Node()
    _add_deps(fast, [(node_id, kind)])
    ref.deps.add(id=node_id, kind=kind)
    assert fast.SerializeToString() == ref.SerializeToString()


def test_several_and_plain_dependencies_encode_as_deps_add():
    deps = [5, (300, pb.DEP_CONTROL), (20_000, pb.DEP_SYNC), (2**40, 0)]
    fast, ref = pb.Node(), pb.Node()
    _add_deps(fast, deps)
    for d in deps:
        i, k = d if isinstance(d, tuple) else (d, pb.DEP_DATA)
        ref.deps.add(id=i, kind=k)
    assert fast.SerializeToString() == ref.SerializeToString()


def test_out_of_range_dependency_is_refused_by_protobuf():
    gb = GraphBuilder("g")
    with pytest.raises(ValueError):
        gb.node(pb.KIND_CPU_OP, "x", 0, deps=[(-1, pb.DEP_CONTROL)])
