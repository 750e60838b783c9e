"""Reader for collective lookup tables in vTrain's format (``AR_GPU<N>_<min>_<max>_LUT``).

A table is CSV with the header ``size(B),count,type,time(ns),busbw(GB/s),time(ns),busbw(GB/s)``
(out-of-place, then in-place) and one row per size; vTrain's A100 tables measure all-reduce
on N GPUs of one node from 1 MiB to 1 GiB in 1 MiB steps. The group size is not in the table:
it comes from ``GPU<N>`` in the file name, or from the caller. Rows become a
:class:`~echo_et.models.comm.nccl_tests.Run` (times in us, all ranks on one host), so the
calibration and evaluation code treats them like nccl-tests output.

``octaves``: a table of 1024 linear steps would outweigh every nccl-tests log in a fit (those
have ~25 sizes over 30 octaves), so by default only two sizes per octave are kept (2^i and
3 x 2^(i-1) bytes, where present); ``octaves=False`` keeps every row.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.models.comm.nccl_tests import Row, Run

HEADER = "size(B),count,type,time(ns)"
COLUMNS = ("size", "count", "type", "time", "time")   # how a table's run names its columns
_GPUS = re.compile(r"GPU(\d+)", re.IGNORECASE)


def is_lut(path: str | Path) -> bool:
    """Whether ``path`` starts like a lookup table (cheap: reads the first line)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(256)
    except OSError:
        return False
    return first.decode("utf-8", "replace").lstrip("\ufeff").startswith(HEADER)


def _keep(size: int) -> bool:
    if size <= 0:
        return False
    if size & (size - 1) == 0:
        return True
    half = size // 3
    return size % 3 == 0 and half & (half - 1) == 0


def read_lut(path: str | Path, ranks: int | None = None, collective: str = "all_reduce",
             octaves: bool = True) -> list[Run]:
    """The table at ``path`` as one single-node run of ``ranks`` GPUs."""
    p = Path(path)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        raise EchoError(f"{p.name}: not a text file, so not a lookup table") from None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith(HEADER):
        raise EchoError(f"{p.name}: not a lookup table (no '{HEADER},...' header)")
    if ranks is None:
        m = _GPUS.search(p.name)
        if not m:
            raise EchoError(f"{p.name}: the group size is not in the file name (GPU<N>); give it")
        ranks = int(m.group(1))
    if ranks < 1:
        raise EchoError(f"{p.name}: the group size must be >= 1, got {ranks}")
    rows: list[Row] = []
    for i, line in enumerate(lines[1:], start=2):
        f = line.split(",")
        if len(f) < 4:
            raise EchoError(f"{p.name}:{i}: expected size,count,type,time(ns)[,busbw,time(ns),busbw]")
        try:
            size, count = int(f[0]), int(f[1])
            oop = float(f[3]) / 1000.0
            inp = float(f[5]) / 1000.0 if len(f) > 5 else None
        except ValueError:
            raise EchoError(f"{p.name}:{i}: not a number in {line!r}") from None
        if size <= 0 or not oop > 0:
            raise EchoError(f"{p.name}:{i}: size and time must be positive")
        if octaves and not _keep(size):
            continue
        rows.append(Row(size, count, f[2], "sum", oop, inp if inp and inp > 0 else None))
    if not rows:
        raise EchoError(f"{p.name}: the table has no rows")
    run = Run(source=p.name, sha256=hashlib.sha256(data).hexdigest(), index=0, threads=ranks, gpus_per_thread=1,
              hosts={r: "node-0" for r in range(ranks)}, columns=list(COLUMNS),
              rows=rows, collective=collective)
    return [run]
