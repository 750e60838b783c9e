"""Passes: rewrite a Job into a new Job (never in place), each output valid under the checker.

- :func:`infer_layout` decides dp/tp/pp/ep and the rank order (declared, manifest, inferred);
- :func:`scale` changes the data-parallel degree and re-stages pipelines;
- :func:`inject` turns a single-GPU trace into a data-parallel Job (DDP buckets, ZeRO-1);
- :func:`select_ranks` cuts a Job down to a subset of ranks;
- :func:`retime_compute` times every compute node for a GPU with the compute model.

A sweep over layouts (scale + simulate) combines passes with the simulator, so it lives in
:mod:`echo_et.experiments.sweep`.
"""

from echo_et.passes.compute_retime import RetimeReport, retime_compute
from echo_et.passes.layout import LayoutDecision, infer_layout, parse_layout
from echo_et.passes.mesh import Mesh
from echo_et.passes.scale import ScaleReport, scale
from echo_et.passes.select import select_ranks

__all__ = [
    "LayoutDecision",
    "Mesh",
    "RetimeReport",
    "ScaleReport",
    "infer_layout",
    "parse_layout",
    "retime_compute",
    "scale",
    "select_ranks",
]
