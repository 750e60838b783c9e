"""Re-deriving process groups when the data-parallel degree changes.

Each process group of the input is read as a box in the (tp, dp, pp) mesh: for every axis,
the set of coordinates its members take. Scaling data parallelism from D to N keeps the tp
and pp coordinates of a box and either

- **spans dp** (the box covers every dp index: dp groups, a world group): the new group
  covers all N replicas, in ascending rank order; or
- **pins dp** (one dp index: tp groups, pp groups, per-replica groups): the new group is the
  same box inside the new rank's own replica, members in the old order (so P2P peer indices
  and rooted-collective roots keep their meaning).

A group that covers some but not all replicas, or that is not a box, cannot be re-derived
and is refused with its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_et.errors import EchoError
from echo_et.ir.conventions import PER_REPLICA_DESCS
from echo_et.ir.schema import pb
from echo_et.passes.mesh import Mesh


@dataclass(frozen=True)
class GroupShape:
    group: pb.ProcessGroup
    spans_dp: bool
    members: tuple[dict[str, int], ...]   # member coordinates, in group order


def group_shape(mesh: Mesh, group: pb.ProcessGroup, role: str = "") -> GroupShape:
    coords = tuple(mesh.coords(r) for r in group.ranks)
    values = {a: {c[a] for c in coords} for a in ("tp", "dp", "pp")}
    box = 1
    for v in values.values():
        box *= len(v)
    where = f"process group {group.id} ({group.name or 'unnamed'}, {len(group.ranks)} ranks)"
    if box != len(group.ranks):
        raise EchoError(f"{where}: its ranks are not a tp x dp x pp box under layout "
                        f"{mesh.describe()}; cannot re-derive it")
    n_dp = len(values["dp"])
    if group.desc in PER_REPLICA_DESCS:
        spans = False     # per-replica groups (the tracer's, Megatron's), even when one replica is the world
    elif mesh.dp == 1:
        # a group of every rank is the world, unless the layout reads it as its TP or PP
        # group (a TP-only Job's one group): that one stays inside each replica
        spans = role in ("dp", "world") or (role not in ("tp", "pp") and len(group.ranks) == mesh.world > 1)
    elif n_dp == mesh.dp:
        spans = True
    elif n_dp == 1:
        spans = False
    else:
        raise EchoError(f"{where}: covers {n_dp} of {mesh.dp} data-parallel replicas; "
                        "cannot re-derive it at another dp")
    if spans and list(group.ranks) != sorted(group.ranks):
        raise EchoError(f"{where}: spans data parallelism but lists its ranks out of order; "
                        "cannot re-derive it")
    return GroupShape(group, spans, coords)


def derived_ranks(shape: GroupShape, new_mesh: Mesh, dp_index: int) -> list[int]:
    """Members of the group derived from ``shape`` for a rank at ``dp_index`` of ``new_mesh``."""
    if shape.spans_dp:
        out = set()
        for c in shape.members:
            for d in range(new_mesh.dp):
                out.add(new_mesh.rank({**c, "dp": d}))
        return sorted(out)
    return [new_mesh.rank({**c, "dp": dp_index}) for c in shape.members]
