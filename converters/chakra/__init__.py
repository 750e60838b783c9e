"""MLCommons Chakra execution traces (``.et``): read into a Job, write a Job back.

Format range: the Chakra protobuf schema of Oct 2023 and later (``et_def.proto`` as in
``mlc-chakra`` 1.0.0, often called schema 0.0.4; ``GlobalMetadata.version`` is not
checked). One file per rank, ``PREFIX.{rank}.et``, plain or gzip. Files in the earlier,
wire-incompatible schema are refused with a clear message.

What is lost reading: tensor values and outputs (``IOInfo``) except shapes/types of
inputs; membership of non-world process groups is guessed from usage. What is lost
writing: times become whole microseconds, launch/sync deps become ``data_deps``. Both
sides count what they dropped; see docs/chakra.md.
"""

from __future__ import annotations

from pathlib import Path

from .reader import rank_of_name, read
from .wire import sniff_content
from .writer import write


def sniff(path: Path) -> bool:
    """A file named ``*.et`` / ``*.et.gz`` is Chakra (reading it explains what is wrong
    with it); another name is Chakra when its content starts like a current Chakra ET."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.name.endswith((".et", ".et.gz")):
        return True
    if path.name.endswith((".json", ".json.gz", ".txt", ".csv")):
        return False
    return sniff_content(path)


__all__ = ["rank_of_name", "read", "sniff", "write"]
