"""The export as an echo-et Job: exactly the nodes, lanes and dependencies written for
ASTRA-sim, so that echo-et's simulator can replay what was exported (``expected_step_ns``).

Each distinct graph becomes one graph of the view, with one stream per ASTRA-sim resource:
``host`` (the host lane), ``gpu``, ``comm`` (collectives and sends), and one stream per
traced stream of receives (ASTRA-sim does not limit receives). Every node is a plain node
of that stream with the exported length (whole microseconds, as ASTRA-sim runs it) and
``DEP_DATA`` dependencies; start times are left at 0, so the simulator keeps no measured
gaps, as ASTRA-sim keeps none. Collectives and send/recv are the traced nodes themselves
(same group keys and sequence numbers): their time is whatever the simulator gives them.
An all-to-all, written as per-peer send/recv for ASTRA-sim, stays one collective here;
collectives merged into one (they ran concurrently) are one collective of the summed bytes.
Each rank's start offset becomes its binding's ``clock_offset_ns``.
"""

from __future__ import annotations

from echo_et.ir.graph import Graph
from echo_et.ir.job import Job
from echo_et.ir.schema import pb

from .planned import COMM, COMP, GPU, HOST, RECV, GraphPlan, exported_us

LANE_STREAMS = {HOST: (0, "astra:host", pb.STREAM_CPU_THREAD), GPU: (1, "astra:gpu", pb.STREAM_GPU_COMPUTE),
                COMM: (2, "astra:comm", pb.STREAM_GPU_COMM)}


def view_graph(plan: GraphPlan, header: pb.GraphHeader) -> Graph:
    g = Graph()
    g.header.id = plan.graph_id
    g.header.name = header.name
    for key, size in header.group_sizes.items():
        g.header.group_sizes[key] = size
    for sid, name, kind in LANE_STREAMS.values():
        g.header.streams.add(id=sid, name=name, kind=kind)
    recv_streams: dict[int, int] = {}
    for pn in plan.nodes:
        if pn.lane == RECV:
            src = pn.node.stream
            if src not in recv_streams:
                sid = len(LANE_STREAMS) + len(recv_streams)
                recv_streams[src] = sid
                g.header.streams.add(id=sid, name=f"astra:recv:{src}", kind=pb.STREAM_GPU_COMM)
            stream = recv_streams[src]
        else:
            stream = LANE_STREAMS[pn.lane][0]
        if pn.role == COMP:
            n = g.new_node(id=pn.index + 1, name=pn.name, kind=pb.KIND_COMPUTE, stream=stream,
                           duration_ns=0 if pn.index == 0 else exported_us(pn) * 1000)
            n.attrs["astra_lane"] = "cpu" if plan.is_cpu(pn) else "gpu"
            if pn.node is not None:
                n.attrs["traced_id"] = str(pn.node.id)
        else:
            n = g.add(pn.node)
            n.id = pn.index + 1
            if pn.merged:   # concurrent collectives of the group, written as one
                n.collective.in_bytes, n.collective.out_bytes = pn.in_bytes, pn.out_bytes
            n.stream = stream
            n.start_ns = 0
            del n.deps[:]
            n.attrs["traced_id"] = str(pn.node.id)
        for d in pn.deps:
            n.deps.add(id=d + 1, kind=pb.DEP_DATA)
    return g


def view_job(job: Job, plans: dict[str, GraphPlan], offsets_us: dict[int, int]) -> Job:
    """The export as a Job (see the module docstring)."""
    m = pb.JobManifest()
    m.CopyFrom(job.manifest)
    m.name = (m.name or "job") + " (ASTRA-sim export)"
    for b in m.bindings:
        b.clock_offset_ns = offsets_us.get(b.rank, 0) * 1000
    graphs = {gid: view_graph(plan, job.graph(gid).header) for gid, plan in plans.items()}
    return Job(m, graphs, source=f"{job.source or 'job'} (ASTRA-sim export)")


__all__ = ["view_graph", "view_job"]
