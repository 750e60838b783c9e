"""GPU names, matched exactly: which variant a name is, the data sheet it uses, and the
collective-model preset of its node type.

A GPU family comes in variants that differ where the models look: an H100 PCIe has 114 SMs
and 2,000 GB/s of HBM where the SXM5 has 132 and 3,350 GB/s; an A100 PCIe has no NVLink
switch. Matching a name by substring ("h100" in "NVIDIA H100 PCIe") handed every variant the
SXM data sheet without a word; here a name is one of the spellings of one variant below, or
it is refused with the names that are known. A variant echo-et has no data sheet or no
collective preset for says so (:func:`datasheet_key`, :func:`comm_preset`) instead of
borrowing another's.

A spelling is compared after :func:`normalize` (case, spaces, underscores and the ``NVIDIA``
/ ``Tesla`` prefix do not matter), so ``NVIDIA A100-SXM4-80GB`` (what CUDA reports),
``A100-SXM4-80GB`` (what nccl-tests prints) and ``a100-80gb`` (the preset name) are one GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from echo_et.errors import EchoError


@dataclass(frozen=True)
class GpuVariant:
    product: str                  # "A100 PCIe 40GB"
    spellings: tuple[str, ...]    # preset names, the names CUDA / nvidia-smi / nccl-tests report
    datasheet: str | None         # key of its data sheet (echo_et.models.compute.gpus); None: none
    comm_preset: str | None       # collective-model preset of its node type; None: a PCIe board
    why_no_datasheet: str = ""


VARIANTS: tuple[GpuVariant, ...] = (
    GpuVariant("A100 SXM4 40GB", ("a100", "a100-sxm4-40gb", "a100-sxm-40gb", "a100-40gb",
                                  # Meta's HGX A100 module: 108 SMs and 40 GB in the HTA traces
                                  "a100-pg509-200"), "a100", "a100-ib"),
    GpuVariant("A100 SXM4 80GB", ("a100-80gb", "a100-sxm4-80gb", "a100-sxm-80gb"), "a100-80gb", "a100-ib"),
    GpuVariant("A100 PCIe 40GB", ("a100-pcie", "a100-pcie-40gb", "a100-40gb-pcie"), "a100-pcie", None),
    GpuVariant("A100 PCIe 80GB", ("a100-pcie-80gb", "a100-80gb-pcie"), "a100-pcie-80gb", None),
    GpuVariant("H100 SXM5 80GB", ("h100", "h100-sxm5-80gb", "h100-sxm-80gb", "h100-80gb-hbm3", "h100-sxm5"),
               "h100", "h100-ib"),
    GpuVariant("H100 PCIe 80GB", ("h100-pcie", "h100-pcie-80gb"), "h100-pcie", None),
    GpuVariant("H100 NVL 94GB", ("h100-nvl", "h100-nvl-94gb"), None, None,
               "echo-et has no data sheet for the H100 NVL (94 GB HBM3 at 3.9 TB/s, PCIe, its own "
               "clocks): it is not an H100 SXM5"),
    GpuVariant("H800 SXM5 80GB", ("h800", "h800-sxm5-80gb", "h800-80gb-hbm3", "h800-sxm5"), "h800", "h800-ib"),
    GpuVariant("V100 SXM2 32GB", ("v100", "v100-sxm2-32gb"), "v100", "v100-ib"),
    GpuVariant("V100 SXM2 16GB", ("v100-16gb", "v100-sxm2-16gb"), "v100-16gb", "v100-ib"),
    GpuVariant("V100 PCIe 16GB", ("v100-pcie", "v100-pcie-16gb"), "v100-pcie", None),
    GpuVariant("V100 PCIe 32GB", ("v100-pcie-32gb",), "v100-pcie-32gb", None),
)

_BY_SPELLING = {s: v for v in VARIANTS for s in v.spellings}
_PREFIX = re.compile(r"^(nvidia|tesla)-")


def normalize(name: str) -> str:
    """A GPU name as compared: lower case, ``-`` for spaces and underscores, no ``NVIDIA`` /
    ``Tesla`` prefix (``NVIDIA H100 80GB HBM3`` -> ``h100-80gb-hbm3``)."""
    s = re.sub(r"[\s_]+", "-", str(name).strip().lower())
    return _PREFIX.sub("", re.sub(r"-+", "-", s))


def known_names() -> list[str]:
    """The short names (data-sheet keys), what an error lists."""
    return sorted({v.datasheet for v in VARIANTS if v.datasheet})


def variant(name: str) -> GpuVariant:
    """The variant ``name`` spells; unknown -> one line with the known names."""
    v = _BY_SPELLING.get(normalize(name or ""))
    if v is None:
        raise EchoError(f"unknown GPU {name!r} (presets: {', '.join(known_names())}; or the name CUDA "
                        "reports for one of them, e.g. 'NVIDIA A100-SXM4-80GB', 'NVIDIA H100 PCIe')")
    return v


def datasheet_key(name: str) -> str:
    """The data sheet ``name`` uses; a known variant without one is refused saying so."""
    v = variant(name)
    if v.datasheet is None:
        raise EchoError(f"GPU {name!r} is the {v.product}: {v.why_no_datasheet} (presets: "
                        f"{', '.join(known_names())})")
    return v.datasheet


def comm_preset(name: str, presets: list[str]) -> str:
    """The collective-model preset for GPU ``name``; a variant without one is refused saying
    why (``presets``: the preset names, for the message)."""
    v = variant(name)
    if v.comm_preset is None:
        raise EchoError(f"no collective preset for GPU {name!r}: the {v.product} is a PCIe board, whose links "
                        f"the presets ({', '.join(presets)}: SXM nodes with NVLink/NVSwitch and InfiniBand) do "
                        "not model; give a calibrated profile or name a preset")
    return v.comm_preset
