"""The cluster options shared by trace, simulate, sweep and validate: ``--gpu``,
``--gpus-per-node``, ``--intra-bw``, ``--inter-bw`` (values with units, see
:mod:`echo_et.ir.units`)."""

from __future__ import annotations

import typer

BW_HELP = ("Values with units: 150GB/s, 800Gb/s (bits), 25GiB/s; per GPU unless followed by "
           "/node (shared by the node's GPUs). A bare number is GB/s per GPU.")


def gpu_opt(what: str = "Target GPU") -> typer.models.OptionInfo:
    return typer.Option(None, "--gpu", metavar="NAME",
                        help=f"{what}: a preset name (a100, a100-80gb, a100-pcie, h100, h100-pcie, h800, v100, ...) "
                        "or the name CUDA reports (NVIDIA A100-SXM4-80GB, NVIDIA H100 PCIe), matched exactly; "
                        "it picks the compute data sheet and the collective preset.")


def gpus_per_node_opt() -> typer.models.OptionInfo:
    return typer.Option(None, "--gpus-per-node", metavar="N",
                        help="GPUs per node (node of rank r = r // N; the ranks fill whole nodes, or fit in one).")


def intra_bw_opt() -> typer.models.OptionInfo:
    return typer.Option(None, "--intra-bw", metavar="RATE",
                        help="Intra-node (NVLink) bandwidth, e.g. 150GB/s. " + BW_HELP)


def inter_bw_opt() -> typer.models.OptionInfo:
    return typer.Option(None, "--inter-bw", metavar="RATE",
                        help="Inter-node (network) bandwidth, e.g. 800Gb/s/node. " + BW_HELP)


def nic_bw_opt() -> typer.models.OptionInfo:
    return typer.Option(None, "--nic-bw", metavar="RATE",
                        help="The most one GPU sends into the network alone (its NIC), e.g. 200Gb/s: "
                        "with --inter-bw RATE/node, the GPUs that leave a node together share its "
                        "network (predict). Per GPU.")


def cluster_from_options(gpu: str | None, gpus_per_node: int | None, intra_bw: str | None,
                         inter_bw: str | None, nic_bw: str | None = None):
    """A :class:`echo_et.models.cluster.Cluster` from the options (an OptionError names the
    option that held a bad value)."""
    from echo_et.models.cluster import Cluster

    return Cluster.parse(gpu=gpu, gpus_per_node=gpus_per_node, intra_bw=intra_bw,
                         inter_bw=inter_bw, nic_bw=nic_bw)
