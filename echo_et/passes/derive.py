"""How a pass starts its output Job: one place that decides what the manifest carries over.

Every pass that builds a new Job (scale, inject, restage, select) starts from
:func:`derived_job_builder`, so provenance, hardware, the chosen step, dropped counts and
attributes survive every rewrite the same way.
"""

from __future__ import annotations

from echo_et.errors import OptionError
from echo_et.ir import Job, JobBuilder
from echo_et.ir.limits import check_node_fill, fills_nodes


def derived_job_builder(job: Job, world: int, gpus_per_node: int | None) -> JobBuilder:
    """A JobBuilder for a pass's output: provenance, hardware, step, dropped counts and
    attributes carried over from ``job`` (passes add their own on top)."""
    jb = JobBuilder(job.manifest.name, world, source_format=job.manifest.provenance.source_format)
    m = jb.job.manifest
    m.provenance.CopyFrom(job.manifest.provenance)
    m.hardware.CopyFrom(job.manifest.hardware)
    if gpus_per_node is not None:
        m.hardware.gpus_per_node = gpus_per_node
    elif not fills_nodes(world, m.hardware.gpus_per_node or world):
        # the recorded nodes would be partly filled by the new world (a selection of ranks, a
        # re-staged pipeline on the way to its final size): unknown, as the checker's
        # node-fill rule requires; scale and inject refuse that up front (check_gpus_per_node)
        m.hardware.gpus_per_node = 0
    m.step = job.manifest.step
    for k, v in job.manifest.dropped.items():
        m.dropped[k] = v
    for k, v in job.manifest.attrs.items():
        m.attrs[k] = v
    return jb


def check_gpus_per_node(world: int, gpus_per_node: int | None, recorded: int = 0) -> None:
    """The node-fill rule for a pass's output of ``world`` ranks: the ``gpus_per_node`` asked
    for, else the one the input Job records (``recorded``; 0: unknown), which the output
    carries over (:func:`derived_job_builder`) and the checker holds to the same rule."""
    if gpus_per_node is None:
        try:
            check_node_fill(world, recorded or None)
        except OptionError as e:
            raise OptionError("gpus_per_node", f"the job records {recorded} GPUs per node, which its output "
                                               f"would keep: {e}") from None
        return
    if gpus_per_node < 1:
        raise OptionError("gpus_per_node", f"GPUs per node must be >= 1, got {gpus_per_node}")
    check_node_fill(world, gpus_per_node)
