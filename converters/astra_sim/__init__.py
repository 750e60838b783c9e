"""ASTRA-sim export: a Job as one Chakra ET file per rank plus the configuration files
ASTRA-sim's analytical backend needs, written so that it runs on both the legacy Chakra
feeder and feeder v3 of ASTRA-sim master (``../shared/docs/reference/chakra-astrasim.md``
sections 4 and 7).

- :func:`export` (also ``write``): Job -> folder with ``workload.{rank}.et``, ``network.yml``,
  ``system.json``, ``remote_memory.json``, ``comm_group.json`` and ``run.sh``.
- :func:`check_export`: the contract check, run on every export and by
  ``echo-et check --astra-sim``.

What is lost: host (CPU) time, which is folded into dependencies; the overlap of copies
with kernels (copies become compute nodes); sub-microsecond precision (ASTRA-sim reads
integer microseconds); collective types ASTRA-sim cannot network are approximated (see
:mod:`.mapping`), and every such mapping is counted in the export's ``mapped``.
"""

from __future__ import annotations

from .check import check_export
from .configs import ExportOptions
from .writer import ExportPlan, export

write = export

__all__ = ["ExportOptions", "ExportPlan", "check_export", "export", "write"]
