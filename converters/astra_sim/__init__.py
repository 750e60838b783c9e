"""ASTRA-sim export: a Job as one Chakra ET file per rank plus the configuration files
ASTRA-sim's analytical backend needs, written so that it runs on both the legacy Chakra
feeder and feeder v3 of ASTRA-sim master (``../shared/docs/reference/chakra-astrasim.md``
sections 4 and 7).

- :func:`export` (also ``write``): Job -> folder with ``workload.{rank}.et``, ``network.yml``,
  ``system.json``, ``remote_memory.json``, ``comm_group.json``, ``start_offsets.json`` and
  ``run.sh``; :class:`ExportPlan` plans once, writes, and gives the exported nodes as a Job
  (:meth:`ExportPlan.view`) for echo-et's own replay of the export.
- :func:`check_export`: the contract check, run on every export and by
  ``echo-et check --astra-sim``.
- :mod:`.costs`: ASTRA-sim's time for a collective or send on a given network.

The time is kept (:mod:`.plan`): host threads become CPU compute nodes, kernels GPU compute
nodes, communication COMM nodes, with the launch and wait dependencies between them, so
that every node starts at its measured time. What is lost, and counted: concurrency
ASTRA-sim cannot express (several GPU streams, several communication streams), and
sub-microsecond precision; collective types ASTRA-sim cannot network are approximated (see
:mod:`.mapping`), every mapping counted in the export's ``mapped``.
"""

from __future__ import annotations

from .check import check_export
from .configs import ExportOptions
from .writer import ExportPlan, export

write = export

__all__ = ["ExportOptions", "ExportPlan", "check_export", "export", "write"]
