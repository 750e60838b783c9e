"""Calibration samples from collectives measured in real traces.

A traced collective kernel starts when its rank launches it and ends when the slowest member
is done, so its duration includes waiting for the last member to arrive. The member that
arrived last waited least: its duration is the closest to the pure execution time the model
predicts. So per (collective, bytes, group) we keep the *minimum* duration over all ranks and
all calls. Point-to-point kernels are not used (the fit prices collectives).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from echo_et.errors import EchoError
from echo_et.ir.job import Job
from echo_et.ir.schema import collective_name, pb
from echo_et.models.comm.fit import Sample
from echo_et.models.comm.nccl import COLLECTIVES
from echo_et.models.comm.topology import placement

Record = tuple[str, int, Sequence[int], int]   # (collective, IR bytes, global ranks, duration ns)


def job_records(job: Job) -> Iterator[Record]:
    """Every measured collective kernel of ``job``, once per rank that ran it."""
    for graph_id, ranks in job.ranks_of_graph().items():
        graph = job.graph(graph_id)
        for node in graph:
            if node.kind != pb.KIND_COLLECTIVE or node.duration_ns <= 0:
                continue
            name = collective_name(node.collective.type)
            if name not in COLLECTIVES:
                continue
            for rank in ranks:
                group = job.resolve_group(rank, node.collective.group)
                yield name, int(node.collective.in_bytes), tuple(group.ranks), int(node.duration_ns)


def trace_samples(records: Iterable[Record], gpus_per_node: int, source: str = "trace") -> list[Sample]:
    """One sample per (collective, bytes, group): the minimum measured duration."""
    best: dict[tuple[str, int, tuple[int, ...]], int] = {}
    for coll, nbytes, ranks, ns in records:
        if coll not in COLLECTIVES or coll in ("send", "recv"):
            raise EchoError(f"{source}: unknown collective {coll!r}")
        if nbytes < 0 or ns <= 0:
            continue
        key = (coll, int(nbytes), tuple(int(r) for r in ranks))
        if key not in best or ns < best[key]:
            best[key] = int(ns)
    out = []
    for (coll, nbytes, ranks), ns in sorted(best.items()):
        if len(ranks) < 2 or nbytes == 0:
            continue  # one-rank groups and empty collectives say nothing about the network
        out.append(Sample(coll, nbytes, placement(list(ranks), gpus_per_node, where=source),
                          ns / 1000.0, 0, source))
    return out
