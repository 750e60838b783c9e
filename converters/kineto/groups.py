"""Which process group a communication belongs to, and who its members are.

The graph-local group key is the c10d process-group name (``"0"`` is the default group).
Members come, in order of trust, from ``distributedInfo.pg_config``, the event's
``Process Group Ranks``, its ``Global rank start/stride`` with ``Group size``; failing
those they are guessed (the world for the default group, else the block of ``Group size``
consecutive ranks holding this rank) and the guess is counted by reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .comm import CommInfo


@dataclass(frozen=True)
class PgDef:
    name: str
    desc: str
    ranks: tuple[int, ...]
    backend: str = ""        # e.g. "cpu:gloo,cuda:gloo" or "cuda:nccl"


@dataclass(frozen=True)
class GroupUse:
    key: str                 # graph-local key (the c10d pg name)
    name: str
    desc: str
    ranks: tuple[int, ...]   # original global ranks, in group-rank order
    guess: str = ""          # "" when taken from the trace, else the reason of the guess


def pg_config(distributed: dict[str, Any]) -> dict[str, PgDef]:
    out: dict[str, PgDef] = {}
    for pg in distributed.get("pg_config") or []:
        if not isinstance(pg, dict):
            continue
        ranks = pg.get("ranks")
        name = pg.get("pg_name")
        if not isinstance(ranks, list) or not all(type(r) is int for r in ranks) or name is None:
            continue
        size = pg.get("pg_size")
        if type(size) is int and size != len(ranks):
            continue  # a truncated member list
        out[str(name)] = PgDef(str(name), str(pg.get("pg_desc", "") or ""), tuple(ranks),
                               str(pg.get("backend_config", "") or ""))
    return out


def gloo_worker_groups(worker_tids: set, pgs: dict[str, PgDef], rank: int) -> dict[int, str]:
    """Gloo worker thread -> process-group name, when it can be told.

    Each gloo process group starts its own worker threads when it is created, in
    ``pg_config`` order, so their thread ids come in runs of consecutive numbers, one run
    per group. When the runs seen in the trace are exactly as many as this rank's gloo
    groups, run i belongs to group i; otherwise nothing is assumed.
    """
    mine = [p for p in pgs.values() if rank in p.ranks and (not p.backend or "gloo" in p.backend)]
    tids = sorted(t for t in worker_tids if type(t) is int)
    if not mine or not tids:
        return {}
    runs: list[list[int]] = [[tids[0]]]
    for t in tids[1:]:
        if t == runs[-1][-1] + 1:
            runs[-1].append(t)
        else:
            runs.append([t])
    if len(runs) != len(mine):
        return {}
    return {t: pg.name for run, pg in zip(runs, mine, strict=True) for t in run}


def _block(rank: int, size: int | None, world: int) -> tuple[int, ...]:
    if world <= 0:
        return (rank,)
    if not size or size >= world:
        return tuple(range(world))
    start = (rank // size) * size
    return tuple(range(start, start + size))


def resolve(info: CommInfo, rank: int, world: int, pgs: dict[str, PgDef],
            fallback_key: str) -> GroupUse:
    name = info.pg_name
    if name:
        pg = pgs.get(name)
        desc = info.pg_desc or (pg.desc if pg else "")
        if pg is not None and rank in pg.ranks:
            return GroupUse(name, name, desc, pg.ranks)
        if info.pg_ranks and rank in info.pg_ranks and (
                not info.group_size or len(info.pg_ranks) == info.group_size):
            return GroupUse(name, name, desc, tuple(info.pg_ranks))
        gs = info.group_size
        if gs and info.rank_start is not None and info.rank_stride:
            ranks = tuple(info.rank_start + info.rank_stride * i for i in range(gs))
            if rank in ranks:
                return GroupUse(name, name, desc, ranks)
        if desc == "default_pg" or name == "0":
            return GroupUse(name, name, desc, _block(rank, None, world), "group_ranks_guessed")
        return GroupUse(name, name, desc, _block(rank, gs, world), "group_ranks_guessed")
    if fallback_key == "0":
        pg = pgs.get("0")
        if pg is not None and rank in pg.ranks:
            return GroupUse("0", "0", pg.desc, pg.ranks, "group_name_guessed")
        mine = [p for p in pgs.values() if rank in p.ranks]
        if len(mine) == 1:
            p = mine[0]
            return GroupUse(p.name, p.name, p.desc, p.ranks, "group_name_guessed")
        return GroupUse("0", "0", "default_pg", _block(rank, info.group_size, world),
                        "group_guessed")
    return GroupUse(fallback_key, fallback_key, "", _block(rank, info.group_size, world),
                    "group_guessed")
