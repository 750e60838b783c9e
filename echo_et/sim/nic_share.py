"""Transfers that leave a node at the same time share its network interfaces.

The collective model prices a group as if each of its GPUs had its own share of the network
(``net_gbps`` per GPU). On a real node the GPUs inject into a fixed set of NICs: one GPU alone
may push up to its own link (``gpu_gbps``: its NIC, or the PCIe switch it hangs off), and all
GPUs together at most what the node's NICs carry (``node_gbps``). How much a transfer gets
therefore depends on how many of the node's GPUs are sending across nodes at that moment.

Which transfers run together is read from the job's structure, not from simulated time: the
simulator evaluates the step rank by rank (a max-plus recurrence, see
``docs/simulator.md``), never in global time order, so a time-driven share would depend on the
order ranks are visited. Groups of one role whose members run, position by position, the same
graphs issue the same collective at the same moment of an SPMD step: every data-parallel
group of a pipeline stage reduces its gradients together, every pipeline group sends a stage's
activations together (a job with one graph per rank, converted from one trace each, has no
shared graphs: there the groups of one role and size run together). For a transfer the
*load* on a node is the number of that node's GPUs those sibling transfers send across
nodes from (a ring's GPUs on the node; a send's source,
a receive's destination: links are full duplex), and each of them gets

    min(gpu_gbps, node_gbps / load)   GB/s of the network

on the node that gives it least. With ``gpu_gbps = node_gbps / gpus_per_node`` (the cluster
stated per GPU, or per node and shared evenly: the collective model's own assumption) and
Megatron's rank order, sibling groups fill each node and nothing changes; a node with fewer or
faster NICs than GPUs, or a layout whose stage leaves part of a node quiet, changes the price.
Transfers of different roles (a pipeline send during another stage's gradient all-reduce) are
not assumed to overlap. See ``docs/comm-model.md`` ("Shared network interfaces").
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable
from dataclasses import dataclass

from echo_et.errors import EchoError
from echo_et.ir.job import Job
from echo_et.ir.schema import pb


@dataclass(frozen=True)
class NodeNetwork:
    """A node's network as sized: GB/s (10**9 bytes/s), one direction."""

    gpus_per_node: int
    node_gbps: float     # all the node's NICs together
    gpu_gbps: float      # the most one GPU injects alone

    def __post_init__(self) -> None:
        if isinstance(self.gpus_per_node, bool) or int(self.gpus_per_node) < 1:
            raise EchoError(f"node network: gpus per node must be >= 1, got {self.gpus_per_node}")
        for name in ("node_gbps", "gpu_gbps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < float("inf"):
                raise EchoError(f"node network: {name} must be a positive number, got {v!r}")

    def rate(self, load: int) -> float:
        """GB/s each of ``load`` GPUs sending across nodes at once gets."""
        return min(self.gpu_gbps, self.node_gbps / max(1, load))


class NicSharing:
    """The network rate of each group's transfers in ``job`` on ``net``'s nodes."""

    def __init__(self, job: Job, net: NodeNetwork):
        self.net = net
        gpn = net.gpus_per_node
        graph_of = {r: job.binding(r).graph for r in job.ranks()}
        by_graphs: dict[Hashable, list[pb.ProcessGroup]] = defaultdict(list)
        for g in job.manifest.groups:
            by_graphs[(g.role, tuple(graph_of.get(r, "") for r in g.ranks))].append(g)
        # A group whose members' graphs no other group shares (a job converted from one
        # trace per rank) runs with the groups of its role and size: replicas issue the same
        # collectives, whatever their graphs are called.
        self._family: dict[int, Hashable] = {}
        members: dict[Hashable, list[pb.ProcessGroup]] = defaultdict(list)
        for key, groups in by_graphs.items():
            for g in groups:
                fam = key if len(groups) > 1 else (g.role, len(g.ranks))
                self._family[g.id] = fam
                members[fam].append(g)
        self._members = dict(members)
        self._node = lambda r: r // gpn
        self._coll: dict[Hashable, dict[int, int]] = {}
        self._p2p: dict[tuple[Hashable, int, int], tuple[Counter, Counter]] = {}

    def _ring_load(self, fam: Hashable) -> dict[int, int]:
        """GPUs per node in the family's groups that span nodes (they all run at once)."""
        got = self._coll.get(fam)
        if got is None:
            senders: set[int] = set()   # a GPU in two groups of the family sends once
            for g in self._members[fam]:
                if len({self._node(r) for r in g.ranks}) > 1:
                    senders.update(g.ranks)
            got = self._coll[fam] = dict(Counter(self._node(r) for r in senders))
        return got

    def collective_gbps(self, group: pb.ProcessGroup) -> float | None:
        """Network GB/s per GPU of a collective on ``group``; None when it stays in a node."""
        nodes = {self._node(r) for r in group.ranks}
        if len(nodes) < 2:
            return None
        load = self._ring_load(self._family[group.id])
        return min(self.net.rate(load.get(n, 1)) for n in nodes)

    def p2p_gbps(self, group: pb.ProcessGroup, src: int, dst: int) -> float | None:
        """Network GB/s of a send from global rank ``src`` to ``dst`` on ``group``; None
        when both are on one node."""
        if self._node(src) == self._node(dst):
            return None
        ranks = list(group.ranks)
        if src not in ranks or dst not in ranks:
            # The simulator may name the group of the receiver's representative: the
            # sender's sibling group holds the pair.
            fam = self._family[group.id]
            group = next((g for g in self._members[fam] if src in g.ranks and dst in g.ranks), None)
            if group is None:
                raise EchoError(f"send from rank {src} to {dst}: no group of the role of group "
                                f"{ranks and ranks[0]}.. holds both")
            ranks = list(group.ranks)
        return self._send_gbps(group, ranks.index(src), ranks.index(dst))

    def _send_gbps(self, group: pb.ProcessGroup, i: int, j: int) -> float | None:
        """The same, by the members' positions in the group."""
        src, dst = self._node(group.ranks[i]), self._node(group.ranks[j])
        if src == dst:
            return None
        fam = self._family[group.id]
        key = (fam, i, j)
        got = self._p2p.get(key)
        if got is None:
            pairs = {(g.ranks[i], g.ranks[j]) for g in self._members[fam]
                     if self._node(g.ranks[i]) != self._node(g.ranks[j])}
            got = self._p2p[key] = (Counter(self._node(a) for a in {a for a, _ in pairs}),
                                    Counter(self._node(b) for b in {b for _, b in pairs}))
        return min(self.net.rate(got[0][src]), self.net.rate(got[1][dst]))

    def rank_key(self, job: Job, rank: int) -> tuple:
        """What the shares make different between ranks (for the simulator's symmetry): the
        rate of every group the rank is in and of its sends to the other members."""
        out = []
        for gid in job.binding(rank).groups.values():
            g = job.group(gid)
            me = list(g.ranks).index(rank)
            sends = tuple(self._send_gbps(g, me, j) for j in range(len(g.ranks)) if j != me)
            out.append((g.role, len(g.ranks), self.collective_gbps(g), sends))
        return tuple(sorted(out, key=repr))
