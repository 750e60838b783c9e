"""``ComputeModel``: the time of an operator on a GPU, from its name, shapes and dtypes.

Example::

    m = ComputeModel.preset("h100")
    m.op_time_ns("aten::mm", "[[8192, 4096], [4096, 4096]]", '["c10::BFloat16", "c10::BFloat16"]')
"""

from __future__ import annotations

from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir.attention import is_causal
from echo_et.ir.schema import pb
from echo_et.models.compute import kernels as K
from echo_et.models.compute import ops
from echo_et.models.compute.gpus import DATASHEETS, resolve_gpu
from echo_et.models.compute.kernels import Kernel
from echo_et.models.compute.profile import ComputeProfile, load_preset, load_profile, write_profile
from echo_et.models.compute.roofline import BOUND_OVERHEAD, kernel_bound_ns, kernel_time_ns


class ComputeModel:
    """A compute profile (GPU data sheet + fitted efficiencies) and the operator tables.
    Immutable; answers are cached per distinct operator call."""

    def __init__(self, profile: ComputeProfile):
        self.profile = profile
        self._cache: dict[tuple, tuple[int, str]] = {}
        self._bounds: dict[tuple, dict[str, float]] = {}

    @classmethod
    def preset(cls, name: str) -> ComputeModel:
        return cls(load_preset(name))

    @classmethod
    def load(cls, path: str | Path) -> ComputeModel:
        return cls(load_profile(path))

    def save(self, path: str | Path) -> None:
        write_profile(self.profile, path)

    def for_gpu(self, name: str) -> ComputeModel:
        return ComputeModel(self.profile.for_gpu(name))

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def gpu(self) -> str:
        """The GPU's preset name (``a100``)."""
        return self.profile.gpu.key

    @property
    def gpu_name(self) -> str:
        """The GPU's product name (``A100-SXM4-40GB``), what a Job manifest records."""
        return self.profile.gpu.name

    @property
    def host_launch_ns(self) -> int:
        """Host time to issue one operator (given to launch nodes of untimed graphs)."""
        return round(self.profile.params["host_launch_ns"])

    @property
    def host_collective_ns(self) -> int:
        """Host time to issue one collective or point-to-point call (its own parameter: the
        framework's cost per communication call need not be an operator's)."""
        return round(self.profile.params["host_collective_ns"])

    def launch_ns(self, op: str) -> int:
        """Host time of a launch node issuing ``op``."""
        return self.host_collective_ns if ops.is_comm_op(op) else self.host_launch_ns

    def memcpy_ns(self, nbytes: int, memset: bool = False) -> int:
        """A device-to-device copy (reads and writes ``nbytes``) or a memset (writes them)."""
        return round(self.kernel_ns(_memcpy_kernel(nbytes, memset)))

    def memcpy_bounds(self, nbytes: int, memset: bool = False) -> dict[str, float]:
        """:meth:`memcpy_ns` split by what sets it (:meth:`kernels_bounds`)."""
        return self.kernels_bounds((_memcpy_kernel(nbytes, memset),))

    def kernel_scale(self, source_gpu: str, kernel_name: str, compute_bound: bool) -> float | None:
        """Factor from a kernel measured on ``source_gpu`` (any spelling) to this GPU, for a
        kernel the operator tables cannot price: the ratio of peak FLOP rates (compute-bound
        kernels; FP32 for ``sgemm``/``f32`` names, else FP16 tensor) or of HBM bandwidths.
        None when the source GPU is unknown or is this GPU."""
        try:
            src = DATASHEETS[resolve_gpu(source_gpu)] if source_gpu else None
        except EchoError:
            return None
        dst = self.profile.gpu
        if src is None or src.key == dst.key:
            return None
        if compute_bound:
            name = kernel_name.lower()
            math = "fp32" if ("sgemm" in name or "f32" in name) and "tf32" not in name else "fp16"
            return src.peak_flops(math) / dst.peak_flops(math)
        return src.hbm_gbps / dst.hbm_gbps

    # -- pricing ----------------------------------------------------------------------------
    def kernel_ns(self, kernel: Kernel) -> float:
        return kernel_time_ns(kernel, self.profile.gpu, self.profile.params, self.profile.fp32_matmul)

    def kernels_ns(self, kernels: tuple[Kernel, ...] | list[Kernel]) -> float:
        return sum(self.kernel_ns(k) for k in kernels)

    def kernels_bounds(self, kernels: tuple[Kernel, ...] | list[Kernel]) -> dict[str, float]:
        """ns of ``kernels`` by what sets each one's time (``roofline.BOUNDS``: the sustained
        tensor-core ceiling, the tiled compute side, the memory side, the per-kernel
        overhead); the values add up to :meth:`kernels_ns`."""
        out: dict[str, float] = {}
        p = self.profile
        for k in kernels:
            side, ns, overhead = kernel_bound_ns(k, p.gpu, p.params, p.fp32_matmul)
            out[side] = out.get(side, 0.0) + ns
            out[BOUND_OVERHEAD] = out.get(BOUND_OVERHEAD, 0.0) + overhead
        return out

    def op_cost(self, op: str, shapes: str = "", dtypes: str = "", attrs: dict[str, str] | None = None
                ) -> tuple[int, str]:
        """(time in ns, how it was priced: ops.PRICED / NO_WORK / GUESSED / NO_SHAPES)."""
        key = _op_key(op, shapes, dtypes, attrs)
        hit = self._cache.get(key)
        if hit is None:
            cost = ops.op_cost(*key)
            hit = (round(self.kernels_ns(cost.kernels)), cost.status)
            self._cache[key] = hit
        return hit

    def op_bounds(self, op: str, shapes: str = "", dtypes: str = "", attrs: dict[str, str] | None = None
                  ) -> dict[str, float]:
        """:meth:`op_cost`'s time split by what sets it (:meth:`kernels_bounds`; empty for an
        operator without kernels)."""
        key = _op_key(op, shapes, dtypes, attrs)
        hit = self._bounds.get(key)
        if hit is None:
            hit = self.kernels_bounds(ops.op_cost(*key).kernels)
            self._bounds[key] = hit
        return hit

    def op_time_ns(self, op: str, shapes: str = "", dtypes: str = "", attrs: dict[str, str] | None = None) -> int:
        return self.op_cost(op, shapes, dtypes, attrs)[0]

    def time_ns(self, item: pb.ComputeInfo | pb.Node) -> int:
        """Time of a compute node (or its compute payload), or of a CPU operator node."""
        if isinstance(item, pb.Node):
            attrs = dict(item.attrs)
            if item.HasField("compute"):
                c = item.compute
                return self.op_time_ns(c.op or item.name, c.shapes, c.dtypes, attrs)
            if item.HasField("cpu"):
                return self.op_time_ns(item.cpu.op or item.name, item.cpu.shapes, item.cpu.dtypes, attrs)
            return self.op_time_ns(item.name, "", "", attrs)
        return self.op_time_ns(item.op, item.shapes, item.dtypes)


def _memcpy_kernel(nbytes: int, memset: bool) -> Kernel:
    return K.mem("fill", nbytes) if memset else K.mem("copy", 2 * nbytes)


def _op_key(op: str, shapes: str, dtypes: str, attrs: dict[str, str] | None) -> tuple[str, str, str, str, bool]:
    """``ops.op_cost``'s arguments for an operator call (its output shapes and causality from
    the node's attributes): one key for both caches."""
    attrs = attrs or {}
    return op, shapes, dtypes, attrs.get("out_shapes", ""), is_causal(attrs)
