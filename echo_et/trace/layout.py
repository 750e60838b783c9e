"""The parallel layout a traced job runs under, and where each rank sits in it.

Ranks are numbered like Megatron-LM (and ``echo_et.passes.mesh``' default order):
tensor parallelism fastest, then context parallelism (Megatron-Core's "tp-cp-ep-dp-pp"
order; 1 unless a job splits its sequences), then data parallelism, then pipeline
parallelism::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so a tensor-parallel group is a run of consecutive ranks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from echo_et.errors import EchoError
from echo_et.ir.conventions import EMBEDDING_GROUP, MODEL_PARALLEL_GROUP, derived_group_coords
from echo_et.ir.limits import MAX_MICROBATCHES, MAX_WORLD_SIZE

ROLES = ("tp", "dp", "pp")
# The context-parallel axis: a role of the layouts that have one (cp > 1) only, so that a job
# without it declares the groups it always did.
CP_ROLE = "cp"
# Megatron-Core's data-parallel group with context parallelism (every dp and cp rank of one tp
# and pp coordinate): the ranks that hold the same weights, whose gradients it reduces and
# over which its distributed optimizer shards. The same ranks as "dp" when cp = 1.
DP_CP_GROUP = "dp_cp"
# Groups derived from the layout that not every rank belongs to: "embd" (Megatron's
# embedding group: the first and the last pipeline stage of the same tp, cp and dp
# coordinates, which share the word embedding), "mp" (Megatron's model-parallel group: every
# tp and pp rank of one data-parallel replica and context-parallel rank) and "dp_cp".
DERIVED_ROLES = (EMBEDDING_GROUP, MODEL_PARALLEL_GROUP, DP_CP_GROUP)


@dataclass(frozen=True)
class ParallelLayout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    zero: int = 0
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "microbatches", "cp"):
            if int(getattr(self, name)) < 1:
                raise EchoError(f"layout {self.describe()}: {name} must be >= 1")
        if self.zero not in (0, 1):
            raise EchoError(f"layout {self.describe()}: ZeRO stage {self.zero} is not supported "
                            "(0 or 1)")
        if self.world_size > MAX_WORLD_SIZE or self.microbatches > MAX_MICROBATCHES:
            raise EchoError(f"layout {self.describe()}: {self.world_size:,} ranks and {self.microbatches:,} "
                            f"micro-batches; the limits are {MAX_WORLD_SIZE:,} ranks and {MAX_MICROBATCHES:,} "
                            "micro-batches")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def roles(self) -> tuple[str, ...]:
        """The layout's axes: tp, dp, pp, and cp where the layout has one."""
        return ROLES + ((CP_ROLE,) if self.cp > 1 else ())

    def describe(self) -> str:
        z = f" zero={self.zero}" if self.zero else ""
        c = f" cp={self.cp}" if self.cp > 1 else ""
        return f"dp={self.dp} tp={self.tp} pp={self.pp}{c} microbatches={self.microbatches}{z}"

    def check_world_size(self, world_size: int) -> None:
        if world_size != self.world_size:
            what = "dp*tp*pp*cp" if self.cp > 1 else "dp*tp*pp"
            raise EchoError(f"layout {self.describe()}: {what} = {self.world_size} differs from "
                            f"the world size {world_size}")

    # -- coordinates -------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        if not 0 <= rank < self.world_size:
            raise EchoError(f"layout {self.describe()}: rank {rank} is outside 0..{self.world_size - 1}")
        c = {"tp": rank % self.tp, "dp": rank // (self.tp * self.cp) % self.dp,
             "pp": rank // (self.tp * self.cp * self.dp)}
        if self.cp > 1:
            c["cp"] = rank // self.tp % self.cp
        return c

    def rank_of(self, tp: int, dp: int, pp: int, cp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def group_ranks(self, role: str, rank: int) -> tuple[int, ...]:
        """Global ranks of ``rank``'s group of ``role`` ("tp", "dp", "pp", "cp", "world", or a
        derived role: "embd", "mp", "dp_cp"), in group-rank order. A middle pipeline stage's "embd"
        group is that of its tp and dp coordinates, which it is not a member of. (Asked for
        every communication call a trace records: remembered per layout, role and rank.)"""
        if role == "world":
            return tuple(range(self.world_size))
        # Remembered once per group, by its first member, not per rank: a dp group of 100K
        # ranks would otherwise be kept (and hashed) 100K times.
        return _group_ranks(self, role, self.group_first(role, rank))

    def group_first(self, role: str, rank: int) -> int:
        """The first member of ``rank``'s group of ``role``: the group's identity, which costs
        nothing to hash or compare (its member tuple costs the group's size)."""
        if role == "world":
            return 0
        c = self.coords(rank)
        if role in self.roles:
            return self.rank_of(**{**c, role: 0})
        if role == EMBEDDING_GROUP:
            return self.rank_of(c["tp"], c["dp"], 0, c.get("cp", 0))
        if role == MODEL_PARALLEL_GROUP:
            return self.rank_of(0, c["dp"], 0, c.get("cp", 0))
        if role == DP_CP_GROUP:
            return self.rank_of(c["tp"], 0, c["pp"])
        raise EchoError(f"layout {self.describe()}: unknown group role {role!r}")

    def is_member(self, role: str, rank: int) -> bool:
        return rank in self.group_ranks(role, rank)

    def all_groups(self, role: str) -> list[tuple[int, ...]]:
        """Every group of ``role``, ordered by first rank."""
        firsts = dict.fromkeys(self.group_first(role, r) for r in range(self.world_size))
        return sorted(_group_ranks(self, role, f) for f in firsts)


@functools.lru_cache(maxsize=1 << 16)
def _group_ranks(layout: ParallelLayout, role: str, rank: int) -> tuple[int, ...]:
    c = layout.coords(rank)
    if role == DP_CP_GROUP:       # every dp and cp rank of the tp and pp coordinates, in rank order
        return tuple(layout.rank_of(c["tp"], d, c["pp"], k) for d in range(layout.dp) for k in range(layout.cp))
    if role in DERIVED_ROLES:
        return tuple(layout.rank_of(**m) for m in derived_group_coords(role, c, layout.tp, layout.pp))
    if role not in layout.roles:
        raise EchoError(f"layout {layout.describe()}: unknown group role {role!r}")
    n = {"tp": layout.tp, "dp": layout.dp, "pp": layout.pp, "cp": layout.cp}[role]
    return tuple(layout.rank_of(**{**c, role: i}) for i in range(n))
