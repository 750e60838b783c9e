"""The cluster a prediction is for, as people state it: a GPU name, GPUs per node, and the
intra- and inter-node bandwidths with their units (``150GB/s``, ``800Gb/s/node``).

A :class:`Cluster` is what ``trace``, ``simulate``, ``sweep`` and ``validate`` share: it is
written into a Job's manifest (``hardware``) by the tracer, read back from it, and turned into
the what-if overrides of the collective model. Bandwidths keep the form they were given in
(per GPU or per node) until the GPUs per node are known; the IR and the collective model hold
GB/s per GPU. Text always carries its unit (``150`` alone is refused, see
:mod:`echo_et.ir.units`); code that holds GB/s per GPU passes ``Bandwidth(gbps)``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir.units import Bandwidth, parse_bandwidth


@dataclass(frozen=True)
class Cluster:
    gpu: str | None = None             # a preset GPU name ("a100") or a device name
    gpus_per_node: int | None = None
    intra_bw: Bandwidth | None = None  # NVLink-class bandwidth inside a node
    inter_bw: Bandwidth | None = None  # network bandwidth between nodes
    nic_bw: Bandwidth | None = None    # the most one GPU sends into the network alone (its NIC)

    def __post_init__(self) -> None:
        if self.gpus_per_node is not None and (isinstance(self.gpus_per_node, bool)
                                               or int(self.gpus_per_node) < 1):
            raise OptionError("gpus_per_node", f"GPUs per node must be >= 1, got {self.gpus_per_node}")

    @classmethod
    def parse(cls, *, gpu: str | None = None, gpus_per_node: int | None = None,
              intra_bw: str | Bandwidth | None = None, inter_bw: str | Bandwidth | None = None,
              nic_bw: str | Bandwidth | None = None) -> Cluster:
        """From text as typed: bandwidths are parsed by
        :func:`echo_et.ir.units.parse_bandwidth`; the GPU name is checked against
        the presets."""
        if gpu is not None:
            try:
                gpu = gpu_preset_name(gpu)
            except EchoError as e:
                raise OptionError("gpu", str(e)) from None
        nic = _bw(nic_bw, "nic_bw")
        if nic is not None and nic.per != "gpu":
            raise OptionError("nic_bw", f"{nic.text!r} is per node; give what one GPU's NIC carries (e.g. 200Gb/s)")
        return cls(gpu=gpu, gpus_per_node=gpus_per_node,
                   intra_bw=_bw(intra_bw, "intra_bw"), inter_bw=_bw(inter_bw, "inter_bw"), nic_bw=nic)

    @classmethod
    def from_job(cls, job) -> Cluster:
        """What a Job's manifest says about its hardware (bandwidths there are per GPU)."""
        h = job.manifest.hardware
        return cls(gpu=h.gpu_name or None, gpus_per_node=int(h.gpus_per_node) or None,
                   intra_bw=Bandwidth(h.intra_node_bw_gbps) if h.intra_node_bw_gbps > 0 else None,
                   inter_bw=Bandwidth(h.inter_node_bw_gbps) if h.inter_node_bw_gbps > 0 else None)

    def over(self, base: Cluster) -> Cluster:
        """This cluster's settings, with ``base``'s where this one has none."""
        return Cluster(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None
                          else getattr(base, f.name) for f in dataclasses.fields(self)})

    def intra_gbps(self, gpus_per_node: int | None = None) -> float | None:
        """Intra-node GB/s per GPU (None: not given)."""
        return None if self.intra_bw is None else self.intra_bw.per_gpu(
            self.gpus_per_node or gpus_per_node)

    def inter_gbps(self, gpus_per_node: int | None = None) -> float | None:
        """Inter-node GB/s per GPU (None: not given); a per-node rate is shared by the node's
        GPUs."""
        return None if self.inter_bw is None else self.inter_bw.per_gpu(
            self.gpus_per_node or gpus_per_node)

    def comm_overrides(self, default_gpus_per_node: int | None) -> dict[str, Any]:
        """Keyword arguments for ``CommModel.with_overrides``."""
        gpn = self.gpus_per_node or default_gpus_per_node
        out: dict[str, Any] = {}
        if self.gpus_per_node:
            out["gpus_per_node"] = self.gpus_per_node
        if self.intra_bw is not None:
            out["intra_bw_gbps"] = self.intra_bw.per_gpu(gpn)
        if self.inter_bw is not None:
            out["inter_bw_gbps"] = self.inter_bw.per_gpu(gpn)
        return out

    def node_network(self, default_gpus_per_node: int | None) -> tuple[int, float, float] | None:
        """(GPUs per node, GB/s of the node's NICs together, GB/s one GPU sends alone) when the
        NIC rate is given (None otherwise: every GPU keeps its even share of the node)."""
        if self.nic_bw is None:
            return None
        gpn = self.gpus_per_node or default_gpus_per_node
        if not gpn:
            raise OptionError("nic_bw", "needs the GPUs per node")
        if self.inter_bw is None:
            raise OptionError("nic_bw", "needs the node's network bandwidth (inter_bw) to share")
        return gpn, self.inter_bw.per_gpu(gpn) * gpn, self.nic_bw.gbps

    def write_hardware(self, manifest, default_gpus_per_node: int | None = None) -> None:
        """Record this cluster in a (mutable, not yet built) Job manifest."""
        h = manifest.hardware
        if self.gpu:
            h.gpu_name = self.gpu
        gpn = self.gpus_per_node or default_gpus_per_node
        if self.gpus_per_node:
            h.gpus_per_node = self.gpus_per_node
        if self.intra_bw is not None:
            h.intra_node_bw_gbps = self.intra_bw.per_gpu(gpn)
        if self.inter_bw is not None:
            h.inter_node_bw_gbps = self.inter_bw.per_gpu(gpn)

    def to_json(self, default_gpus_per_node: int | None = None) -> dict[str, Any]:
        gpn = self.gpus_per_node or default_gpus_per_node
        return {"gpu": self.gpu, "gpus_per_node": gpn,
                "intra_bw_gbps_per_gpu": None if self.intra_bw is None else self.intra_bw.per_gpu(gpn),
                "inter_bw_gbps_per_gpu": None if self.inter_bw is None else self.inter_bw.per_gpu(gpn)} | (
                    {} if self.nic_bw is None else {"nic_bw_gbps_per_gpu": self.nic_bw.gbps})


def _bw(v: str | Bandwidth | None, option: str) -> Bandwidth | None:
    if v is None:
        return None
    if isinstance(v, Bandwidth):
        return v
    try:
        return parse_bandwidth(str(v))
    except EchoError as e:
        raise OptionError(option, str(e)) from None


def known_gpus() -> list[str]:
    """GPU names that have presets (the compute model's)."""
    from echo_et.models.compute import gpu_names

    return gpu_names()


def gpu_preset_name(name: str) -> str:
    """The preset GPU name ``name`` stands for ("A100", "NVIDIA A100-SXM4-40GB" -> a100);
    unknown -> one line listing the presets."""
    from echo_et.models.compute import resolve_gpu

    return resolve_gpu(name)
