"""select: cut a Job down to a subset of ranks (e.g. one pipeline of a 3D job, one node).

The chosen ranks are renumbered 0..k-1 in the order given. Every process group a kept rank
uses must lie entirely inside the selection (a collective whose members were cut away
cannot run); a group that straddles the cut is refused with its name. Graphs are shared
as before, and only the graphs still bound are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from echo_et.errors import EchoError, OptionError
from echo_et.ir import Job
from echo_et.ir.limits import MAX_WORLD_SIZE
from echo_et.passes.derive import derived_job_builder


def parse_ranks(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]. The count is known before the list is made:
    more ranks than a job can have (``MAX_WORLD_SIZE``) are refused, not built."""
    out: list[int] = []
    count = 0
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            a, b = (int(x) for x in part.split("-", 1)) if "-" in part else (int(part), int(part))
        except ValueError:
            raise OptionError("ranks", f"{text!r}: expected ranks like 0-3,8") from None
        count += max(0, b - a + 1)
        if count > MAX_WORLD_SIZE or max(a, b) >= MAX_WORLD_SIZE:
            shown = text if len(text) <= 40 else text[:37] + "..."
            raise OptionError("ranks", f"{shown!r} names {count} ranks up to rank {max(a, b)}; the limit is "
                                       f"{MAX_WORLD_SIZE} ranks (0..{MAX_WORLD_SIZE - 1}), the most a job has")
        out.extend(range(a, b + 1))
    if not out:
        raise OptionError("ranks", f"{text!r}: no rank given")
    return out


def select_ranks(job: Job, ranks: Sequence[int]) -> Job:
    """A Job of ``ranks`` only (renumbered in the order given); ``job`` is not modified."""
    ranks = list(ranks)
    if len(set(ranks)) != len(ranks):
        raise EchoError("select: a rank is listed twice")
    bad = [r for r in ranks if not 0 <= r < job.world_size]
    if bad:
        raise EchoError(f"select: rank {bad[0]} is outside the job's {job.world_size} ranks")
    new_of = {r: i for i, r in enumerate(ranks)}
    jb = derived_job_builder(job, len(ranks), None)
    m = jb.job.manifest
    m.attrs["select.ranks"] = ",".join(str(r) for r in ranks) if len(ranks) <= 64 else f"{len(ranks)} ranks"
    new_gid: dict[int, int] = {}
    used_graphs: set[str] = set()
    bindings = []
    for r in ranks:
        b = job.binding(r)
        groups = {}
        for key, gid in sorted(b.groups.items()):
            if gid not in new_gid:
                g = job.group(gid)
                outside = [x for x in g.ranks if x not in new_of]
                if outside:
                    raise EchoError(f"select: process group {g.id} ({g.name or 'unnamed'}) of rank {r} "
                                    f"also holds rank {outside[0]}, which is not selected")
                new_gid[gid] = jb.group([new_of[x] for x in g.ranks], name=g.name, desc=g.desc,
                                        role=g.role)
            groups[key] = new_gid[gid]
        used_graphs.add(b.graph)
        bindings.append((new_of[r], b, groups))
    for gid in job.graph_ids():
        if gid in used_graphs:
            jb.add_graph(job.graph(gid).copy())
    for nr, b, groups in bindings:
        jb.bind(nr, b.graph, groups, measured_step_ns=b.measured_step_ns, clock_offset_ns=b.clock_offset_ns)
    out = jb.build()
    lay = job.manifest.layout
    if lay.dp * lay.tp * lay.pp == job.world_size and len(ranks) != job.world_size:
        m.layout.source = f"selected({lay.source})"
        m.layout.ClearField("dp")
        m.layout.ClearField("tp")
        m.layout.ClearField("pp")
    else:
        m.layout.CopyFrom(lay)
    return out
