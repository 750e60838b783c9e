"""The compute-time model: how long an operator runs on a named GPU.

From an operator's name, input shapes and dtypes (:mod:`~echo_et.models.compute.ops`) to
the kernels it launches, each priced by a roofline with efficiency curves
(:mod:`~echo_et.models.compute.roofline`) on a GPU data sheet
(:mod:`~echo_et.models.compute.gpus`) with efficiencies fitted on measured A100 kernels,
layers and iterations (:mod:`~echo_et.models.compute.fit`, :mod:`~echo_et.models.compute.data`).
Retiming a whole Job is a pass: :func:`echo_et.passes.retime_compute`.

Example::

    m = ComputeModel.preset("h100")
    m.op_time_ns("aten::mm", "[[8192, 4096], [4096, 4096]]", '["c10::BFloat16", "c10::BFloat16"]')
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from echo_et.models.compute._dtypes import math_class
from echo_et.models.compute.fit import END_TO_END_PARAMS, Sample, sample_from_ops
from echo_et.models.compute.fit import fit as _fit
from echo_et.models.compute.gpus import DATASHEETS, GpuSpec, gpu_names, resolve_gpu
from echo_et.models.compute.model import ComputeModel
from echo_et.models.compute.ops import GUESSED, NO_SHAPES, NO_WORK, PRICED
from echo_et.models.compute.profile import ComputeProfile, load_preset, load_profile, write_profile

__all__ = ["DATASHEETS", "GUESSED", "NO_SHAPES", "NO_WORK", "PRICED", "ComputeModel", "ComputeProfile", "GpuSpec",
           "Sample", "fit_end_to_end", "gpu_names", "load_preset", "load_profile", "math_class", "resolve_gpu",
           "write_profile"]


def fit_end_to_end(samples: Iterable[tuple[Sequence[tuple[Any, float]], float, float]], prior: ComputeModel, *,
                   params: Sequence[str] = END_TO_END_PARAMS, group: str = "") -> ComputeModel:
    """Fit ``params`` of ``prior`` to measured iterations. A sample is ``(compute, rest_ns,
    measured_ns)``: the compute operators on the simulated critical path with how many times
    each ran (``pb.ComputeInfo`` / ``pb.Node`` / ``layers.OpCall``, count), the rest of the
    path in ns (exposed communication, bubbles), and the measured iteration time in ns. The
    other parameters keep their values; the result minimises the relative error of
    ``rest + sum(count x time)``."""
    from echo_et.models.compute.fit import PARAM_NAMES

    ss = [sample_from_ops(calls, measured, rest, group=group, source="iterations") for calls, rest, measured in samples]
    fixed = [n for n in PARAM_NAMES if n not in set(params)]
    res = _fit(ss, prior.profile, fixed=fixed)
    return ComputeModel(res.profile)
