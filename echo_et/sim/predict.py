"""Predict mode: communication from the CC model, compute slowed where it overlaps comm.

Collectives of unknown type (and communication kernels of unknown libraries) keep their
replay time: the model cannot price them, and the count is reported in the result.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from echo_et.errors import EchoError
from echo_et.ir.job import Job
from echo_et.ir.schema import pb
from echo_et.sim.nic_share import NicSharing, NodeNetwork
from echo_et.sim.simulator import CommCall, SimOptions, Simulator
from echo_et.sim.symmetry import placement_pattern


class Predictor(Simulator):
    """Prices communication with ``comm_model`` (the CC model contract: ``estimate(name,
    in_bytes, global_ranks, dtype=, gpus_per_node=)`` and ``p2p(nbytes, src, dst)``, both
    returning an object with ``time_ns``) and applies ``slowdown_model`` (an object with
    ``factor(node, duration_ns, overlap_ratio) -> float``) to compute that overlaps
    communication, iterating composer and slowdown to a fixed point. With ``node_network``
    the network share of each cross-node transfer follows from the node's NICs and the
    transfers that leave the node with it (:mod:`echo_et.sim.nic_share`); the collective
    model then prices it at that rate (its ``with_overrides(inter_bw_gbps=)``)."""

    mode = "predict"

    def __init__(self, job: Job, options: SimOptions | None = None, *, comm_model: Any,
                 slowdown_model: Any = None, node_network: NodeNetwork | None = None):
        super().__init__(job, options)
        if comm_model is None:
            raise EchoError("predict mode needs a communication model (a profile or a preset)")
        self.comm_model = comm_model
        self.slowdown_model = slowdown_model
        self._estimates: dict[Hashable, int] = {}
        self._patterns: dict[int, tuple[int, ...]] = {}
        self.unpriced = 0
        self._unpriced_per_run = 0
        if not self.gpus_per_node:
            # Place ranks on nodes the way the model will, so that symmetry stays exact.
            self.gpus_per_node = int(getattr(comm_model, "gpus_per_node", 0) or 0)
        self.sharing = None if node_network is None else NicSharing(job, node_network)
        self._at_rate: dict[float, Any] = {}
        if node_network is not None and self.gpus_per_node and node_network.gpus_per_node != self.gpus_per_node:
            raise EchoError(f"node network of {node_network.gpus_per_node} GPUs per node, but ranks are placed "
                            f"{self.gpus_per_node} per node")

    def _model(self, gbps: float | None) -> Any:
        """The collective model, at ``gbps`` of network per GPU when a share applies."""
        if gbps is None:
            return self.comm_model
        got = self._at_rate.get(gbps)
        if got is None:
            got = self._at_rate[gbps] = self.comm_model.with_overrides(inter_bw_gbps=gbps)
        return got

    def symmetry_key(self, rank: int) -> Hashable:
        base = super().symmetry_key(rank)
        return base if self.sharing is None else (base, self.sharing.rank_key(self.job, rank))

    def _pattern(self, group: pb.ProcessGroup) -> tuple[int, ...]:
        p = self._patterns.get(group.id)
        if p is None:
            p = placement_pattern(list(group.ranks), self.gpus_per_node)
            self._patterns[group.id] = p
        return p

    def collective(self, call: CommCall) -> int:
        if call.coll_type == pb.COLL_UNKNOWN:
            self.unpriced += 1
            return super().collective(call)
        gbps = None if self.sharing is None else self.sharing.collective_gbps(call.group)
        key = ("c", call.coll_type, call.in_bytes, call.dtype, call.root, self._pattern(call.group), gbps)
        got = self._estimates.get(key)
        if got is None:
            est = self._model(gbps).estimate(call.op, call.in_bytes, list(call.group.ranks),
                                           dtype=call.dtype or "float32",
                                           gpus_per_node=self.gpus_per_node or None)
            got = max(0, round(est.time_ns))
            self._estimates[key] = got
        return got

    def p2p(self, call: CommCall) -> int:
        gpn = self.gpus_per_node
        same_node = gpn > 0 and call.src // gpn == call.dst // gpn
        gbps = None if self.sharing is None else self.sharing.p2p_gbps(call.group, call.src, call.dst)
        key = ("p", call.in_bytes, call.src == call.dst, same_node if gpn > 0 else (call.src, call.dst), gbps)
        got = self._estimates.get(key)
        if got is None:
            est = self._model(gbps).p2p(call.in_bytes, call.src, call.dst, gpus_per_node=gpn or None)
            got = max(0, round(est.time_ns))
            self._estimates[key] = got
        return got

    def slowdown(self, node: pb.Node, duration_ns: int, overlap_ratio: float, rank: int) -> float:
        if self.slowdown_model is None:
            return 1.0
        return float(self.slowdown_model.factor(node, duration_ns, overlap_ratio))

    def uses_slowdown(self) -> bool:
        return self.slowdown_model is not None

    def _meeting_hooks_pure(self) -> bool:
        return type(self).collective is Predictor.collective and type(self).p2p is Predictor.p2p

    def _simulate(self, durs: dict[int, list[int]]) -> None:
        before = self.unpriced
        super()._simulate(durs)
        self._unpriced_per_run = self.unpriced - before

    def _repeat_round(self) -> None:
        # every run counts the collectives it could not price: a round not run counts them too
        self.unpriced += self._unpriced_per_run

    def _result(self):
        res = super()._result()
        res.options["unpriced_collectives"] = self.unpriced
        return res
