"""What a writer will write, estimated from a Job before a byte is written.

An export writes every rank's expanded graph (Chakra, ASTRA-sim, Chrome, a simulated
timeline) or every distinct graph (GraphML): a Job of 2**18 ranks sharing one graph, or a
graph whose repeat blocks expand to millions of nodes, is a few kilobytes on disk and
terabytes once written out. :func:`estimate_output` counts the nodes each format writes from
the graphs' stored nodes and their repeat blocks (no expansion), times a lower bound on the
bytes one node takes in that format, so a refusal is of what surely cannot be written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from echo_et.ir.graph import Graph
from echo_et.ir.job import Job
from echo_et.ir.schema import pb

# What one export may write unless the caller raises it (the CLI's --max-output).
DEFAULT_MAX_OUTPUT_BYTES = 64 * 10**9
# Lower bounds on the bytes one node takes (measured on fixtures/jobs: Chakra 94-181 B per node,
# Chrome JSON 213-237, GraphML 439-506 per node of a distinct graph). ASTRA-sim's workload
# merges host and compute runs into few nodes, so only its communication nodes are counted.
BYTES_PER_NODE = {"chakra": 80, "chrome": 200, "graphml": 400, "astra-sim": 20}
_COMM_KINDS = frozenset({pb.KIND_COLLECTIVE, pb.KIND_SEND, pb.KIND_RECV})


@dataclass(frozen=True)
class GraphSize:
    nodes: int        # expanded
    comm: int         # expanded communication nodes (collectives, sends, receives)


def graph_size(graph: Graph) -> GraphSize:
    """The expanded graph's node count and communication nodes, without expanding it."""
    stored = graph.stored_nodes
    nodes = len(stored)
    comm = sum(1 for n in stored if n.kind in _COMM_KINDS)
    if graph.has_repeats:
        for body in graph.bodies():
            k = len(body.block.instances)
            nodes += len(body.nodes) * k
            comm += sum(1 for n in body.nodes if n.kind in _COMM_KINDS) * k
    return GraphSize(nodes, comm)


@dataclass(frozen=True)
class OutputEstimate:
    fmt: str
    ranks: int        # ranks (or distinct graphs) written
    nodes: int        # nodes written, over all of them
    bytes: int        # a lower bound on the bytes written (with ``of``: on those of that many nodes)
    of: int | None = None   # the nodes there are, when a bound keeps ``nodes`` of them

    def describe(self) -> str:
        unit = "distinct graphs" if self.fmt == "graphml" else "ranks"
        what = "communication nodes" if self.fmt == "astra-sim" else "nodes"
        count = f"{self.nodes:,} {what}" if self.of is None else f"the first {self.nodes:,} of {self.of:,} {what}"
        return f"{count} over {self.ranks:,} {unit}, >= {BYTES_PER_NODE[self.fmt]} bytes each"


def estimate_output(job: Job, fmt: str, ranks: Iterable[int] | None = None, *, per_rank: bool = True,
                    max_nodes: int | None = None) -> OutputEstimate:
    """What writing ``job`` in ``fmt`` takes: every rank's expanded graph (``ranks``: only
    those), or with ``per_rank=False`` every distinct graph once (GraphML). ``max_nodes``:
    the writer keeps at most about that many nodes, all ranks together (a simulated
    timeline's ``--timeline-events``), and the estimate is of those."""
    sizes: dict[str, GraphSize] = {}

    def size(gid: str) -> GraphSize:
        if gid not in sizes:
            sizes[gid] = graph_size(job.graph(gid))
        return sizes[gid]

    if per_rank:
        parts = [size(job.binding(r).graph) for r in _chosen(job, ranks)]
    else:
        parts = [size(g) for g in sorted(set(job.graph_ids()))]
    nodes = sum(p.comm if fmt == "astra-sim" else p.nodes for p in parts)
    if max_nodes is not None and nodes > max_nodes:
        return OutputEstimate(fmt, len(parts), max_nodes, max_nodes * BYTES_PER_NODE[fmt], of=nodes)
    return OutputEstimate(fmt, len(parts), nodes, nodes * BYTES_PER_NODE[fmt])


def _chosen(job: Job, ranks: Iterable[int] | None) -> list[int]:
    known = set(job.ranks())
    return job.ranks() if ranks is None else [r for r in ranks if r in known]


def nodes_by_rank(job: Job, ranks: Iterable[int] | None = None) -> dict[int, int]:
    """Each rank's expanded node count (``ranks``: only those of the job among them), in
    rank order, without expanding a graph."""
    sizes: dict[str, int] = {}
    out: dict[int, int] = {}
    for r in sorted(set(_chosen(job, ranks))):
        gid = job.binding(r).graph
        if gid not in sizes:
            sizes[gid] = graph_size(job.graph(gid)).nodes
        out[r] = sizes[gid]
    return out
