"""Overlap slowdown: compute kernels run slower while communication overlaps them.

``SlowdownModel.factor(node, duration_ns, overlap_ratio)`` is what the simulator asks;
``fit`` learns a model from a kernel dataset (``read_csv_samples``) or from a Job's own
kernels (``samples_from_job``). See ``docs/slowdown.md``.
"""

from echo_et.models.slowdown.evaluate import cross_validate, grouped_folds
from echo_et.models.slowdown.fit import Sample, fit, read_csv_samples, samples_from_job
from echo_et.models.slowdown.model import SlowdownModel, default_model

__all__ = [
    "Sample",
    "SlowdownModel",
    "cross_validate",
    "default_model",
    "fit",
    "grouped_folds",
    "read_csv_samples",
    "samples_from_job",
]
