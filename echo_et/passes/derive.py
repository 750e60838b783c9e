"""How a pass starts its output Job: one place that decides what the manifest carries over.

Every pass that builds a new Job (scale, inject, restage, select) starts from
:func:`derived_job_builder`, so provenance, hardware, the chosen step, dropped counts and
attributes survive every rewrite the same way.
"""

from __future__ import annotations

from echo_et.errors import OptionError
from echo_et.ir import Job, JobBuilder
from echo_et.ir.limits import check_node_fill


def derived_job_builder(job: Job, world: int, gpus_per_node: int | None) -> JobBuilder:
    """A JobBuilder for a pass's output: provenance, hardware, step, dropped counts and
    attributes carried over from ``job`` (passes add their own on top)."""
    jb = JobBuilder(job.manifest.name, world, source_format=job.manifest.provenance.source_format)
    m = jb.job.manifest
    m.provenance.CopyFrom(job.manifest.provenance)
    m.hardware.CopyFrom(job.manifest.hardware)
    if gpus_per_node is not None:
        m.hardware.gpus_per_node = gpus_per_node
    m.step = job.manifest.step
    for k, v in job.manifest.dropped.items():
        m.dropped[k] = v
    for k, v in job.manifest.attrs.items():
        m.attrs[k] = v
    return jb


def check_gpus_per_node(world: int, gpus_per_node: int | None) -> None:
    if gpus_per_node is None:
        return
    if gpus_per_node < 1:
        raise OptionError("gpus_per_node", f"GPUs per node must be >= 1, got {gpus_per_node}")
    check_node_fill(world, gpus_per_node)
