"""What a build function is told about the rank it builds: the ``build_fn`` contract.

A build function has the signature ``build_fn(ctx: RankContext) -> step`` where ``step`` is
a callable taking no arguments that runs ONE full training step of rank ``ctx.rank``
(forward, backward and optimizer over all micro-batches). It is called after
``torch.distributed`` is initialised, so the function may use any torch.distributed API:
``ctx.group("tp"|"dp"|"pp"|"world")`` hands out the layout's process groups, and groups it
creates itself (``new_group``, ``DeviceMesh``) work too. The tracer calls ``step`` twice: a
warm-up step, then the measured one. Everything it allocates must live on ``ctx.device``.

The same contract serves the ex-situ tracer (one process plays each rank in turn) and the
in-situ runner (one real process per rank with gloo), so a workload written once runs both.

Groups are made in two ways. The ex-situ tracer makes only the groups of the rank it plays,
lazily, with ``use_local_synchronization=True`` (a 100K-rank layout has too many groups to
make them all). Real processes (``all_groups=True``, the in-situ runner) make every group of
every role, in one order on every rank, as Megatron's ``initialize_model_parallel`` does:
torch names a locally synchronised group by its ranks, so two roles with the same ranks
("pp" and "mp" at tp 1) would share a name, and a group only some ranks make ("embd" on the
first and last pipeline stages) would leave the later groups' rendezvous waiting forever.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from echo_et.trace.layout import ParallelLayout


@dataclass
class RankContext:
    rank: int
    layout: ParallelLayout
    device: str = "cpu"
    all_groups: bool = False      # real processes: every group made on every rank (above)
    _groups: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    @property
    def tp_rank(self) -> int:
        return self.layout.coords(self.rank)["tp"]

    @property
    def dp_rank(self) -> int:
        return self.layout.coords(self.rank)["dp"]

    @property
    def pp_rank(self) -> int:
        return self.layout.coords(self.rank)["pp"]

    @property
    def cp_rank(self) -> int:
        return self.layout.coords(self.rank).get("cp", 0)

    def group(self, role: str):
        """This rank's torch ProcessGroup for ``role`` ("tp", "dp", "pp", "world"; with context
        parallelism "cp" and "dp_cp"; with expert parallelism "ep", "edp" and "tp_ep"; or a
        derived role: "embd", "mp").

        Groups are made with ``new_group(..., use_local_synchronization=True)`` so that only
        their members take part, and carry the role as ``group_desc``."""
        import torch.distributed as dist

        if role == "world":
            return dist.group.WORLD
        if self.all_groups and not self._groups:
            self._make_every_group()
        pg = self._groups.get(role)
        if pg is None:
            ranks = list(self.layout.group_ranks(role, self.rank))
            pg = dist.new_group(ranks, use_local_synchronization=True, group_desc=role)
            self._groups[role] = pg
        return pg

    def make_groups(self) -> None:
        """Create the tp, dp and pp groups in a fixed order (every member does the same)."""
        for role in ("tp", "dp", "pp"):
            self.group(role)

    def _make_every_group(self) -> None:
        import torch.distributed as dist

        for role in group_order(self.layout):
            mine = self.layout.group_ranks(role, self.rank)
            for ranks in self.layout.all_groups(role):
                pg = dist.new_group(list(ranks), group_desc=role)
                if ranks == mine:
                    self._groups[role] = pg


# the roles of RankContext.group, in the order real processes make their groups
GROUP_ORDER = ("tp", "dp", "pp", "embd", "mp")


def group_order(layout: ParallelLayout) -> tuple[str, ...]:
    """:data:`GROUP_ORDER`, with the context-parallel groups after it where the layout has them,
    then the expert-parallel ones."""
    return (GROUP_ORDER + (("cp", "dp_cp") if layout.cp > 1 else ())
            + (("ep", "edp", "tp_ep") if layout.ep > 1 else ()))
