"""The parallel layout a traced job runs under, and where each rank sits in it.

Ranks are numbered like Megatron-LM (and ``echo_et.passes.mesh``' default order):
tensor parallelism fastest, then context parallelism (Megatron-Core's "tp-cp-ep-dp-pp"
order; 1 unless a job splits its sequences), then data parallelism, then pipeline
parallelism::

    rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))

so a tensor-parallel group is a run of consecutive ranks.

Expert parallelism (``ep``, mixture-of-experts layers) multiplies nothing: as in Megatron-Core
(whose expert tensor parallelism defaults to ``tp``), the ``dp x cp`` ranks of one tp and pp
coordinate (the "dp_cp" group, in its rank order) are cut into expert-parallel groups of ``ep``
consecutive ones ("ep": each holds ``experts / ep`` of every MoE layer's experts and they
exchange tokens); the ranks at the same place of every ep group hold the same experts and
reduce their gradients together ("edp", expert data parallelism); "tp_ep" is every tp and ep
rank of one expert-parallel group (the dispatcher gathers its token counts over it)::

    k = cp_rank + cp * dp_rank;  ep_rank = k % ep;  edp_rank = k // ep
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
DERIVED_ROLES_DENSE = (EMBEDDING_GROUP, MODEL_PARALLEL_GROUP, DP_CP_GROUP)
# Expert parallelism's axis (a role of the layouts with ep > 1, as cp is) and the groups derived
# with it (see the module docstring); the manifest's role "ep" is ROLE_EP.
EP_ROLE = "ep"
EXPERT_DP_GROUP = "edp"
TP_EP_GROUP = "tp_ep"
DERIVED_ROLES = DERIVED_ROLES_DENSE + (EXPERT_DP_GROUP, TP_EP_GROUP)


@dataclass(frozen=True)
class ParallelLayout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    microbatches: int = 1
    zero: int = 0
    cp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "microbatches", "cp", "ep"):
            if int(getattr(self, name)) < 1:
                raise EchoError(f"layout {self.describe()}: {name} must be >= 1")
        if (self.dp * self.cp) % self.ep:
            what = "dp x cp" if self.cp > 1 else "dp"
            raise EchoError(f"layout {self.describe()}: expert parallelism ep ({self.ep}) must divide {what} "
                            f"({self.dp * self.cp}): Megatron-Core cuts its expert-parallel groups out of the "
                            "data-parallel ranks")
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
        return ROLES + ((CP_ROLE,) if self.cp > 1 else ()) + ((EP_ROLE,) if self.ep > 1 else ())

    def describe(self) -> str:
        z = f" zero={self.zero}" if self.zero else ""
        c = f" cp={self.cp}" if self.cp > 1 else ""
        e = f" ep={self.ep}" if self.ep > 1 else ""
        return f"dp={self.dp} tp={self.tp} pp={self.pp}{c}{e} microbatches={self.microbatches}{z}"

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

    def expert_coords(self, rank: int) -> tuple[int, int]:
        """(ep rank, edp rank) of ``rank`` (see the module docstring)."""
        c = self.coords(rank)
        k = c.get("cp", 0) + self.cp * c["dp"]
        return k % self.ep, k // self.ep

    def dp_cp_rank(self, tp: int, k: int, pp: int) -> int:
        """The rank at index ``k`` of the dp_cp group of coordinates ``tp`` and ``pp``."""
        return self.rank_of(tp, k // self.cp, pp, k % self.cp)

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
        if role in (EP_ROLE, EXPERT_DP_GROUP, TP_EP_GROUP):
            e, d = self.expert_coords(rank)
            if role == EP_ROLE:
                return self.dp_cp_rank(c["tp"], d * self.ep, c["pp"])
            if role == EXPERT_DP_GROUP:
                return self.dp_cp_rank(c["tp"], e, c["pp"])
            return self.dp_cp_rank(0, d * self.ep, c["pp"])
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
    if role in (EP_ROLE, EXPERT_DP_GROUP, TP_EP_GROUP):     # rank is its group's first member
        ep, k0 = layout.ep, c.get("cp", 0) + layout.cp * c["dp"]
        if role == EP_ROLE:
            return tuple(layout.dp_cp_rank(c["tp"], k0 + i, c["pp"]) for i in range(ep))
        if role == EXPERT_DP_GROUP:
            return tuple(layout.dp_cp_rank(c["tp"], k0 + ep * j, c["pp"])
                         for j in range(layout.dp * layout.cp // ep))
        return tuple(layout.dp_cp_rank(t, k0 + i, c["pp"]) for i in range(ep) for t in range(layout.tp))
    if role == DP_CP_GROUP:       # every dp and cp rank of the tp and pp coordinates, in rank order
        return tuple(layout.rank_of(c["tp"], d, c["pp"], k) for d in range(layout.dp) for k in range(layout.cp))
    if role in DERIVED_ROLES:
        return tuple(layout.rank_of(**m) for m in derived_group_coords(role, c, layout.tp, layout.pp))
    if role not in layout.roles:
        raise EchoError(f"layout {layout.describe()}: unknown group role {role!r}")
    n = {"tp": layout.tp, "dp": layout.dp, "pp": layout.pp, "cp": layout.cp}[role]
    return tuple(layout.rank_of(**{**c, role: i}) for i in range(n))
