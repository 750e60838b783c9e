"""Reader for nccl-tests output (``all_reduce_perf`` and friends).

Accepts the plain output of one process (``-g N`` or ``-t N``) and the output of an MPI run
where every line carries a ``[1,0]<stdout>:`` prefix; output of several ranks may be
interleaved inside one line (``...A100-SXM4-40GB[1,3]<stderr>:NCCL WARN ...``): every
prefix starts a new segment and only stdout segments are read. One file may hold several
runs (each starts at ``# nThread``).

What a run's columns mean, per collective (nccl-tests ``size`` is the larger of the send
and receive buffers; ``count`` is per rank):

============== ======================== ==========================================
collective     nccl-tests ``size``       IR bytes (per-rank input) we use
============== ======================== ==========================================
all_reduce     the buffer               size
broadcast      the buffer               size
reduce         the buffer               size
reduce_scatter the full input buffer    size
all_gather     the full output buffer   size / ranks (the shard)
all_to_all     the send buffer          size
============== ======================== ==========================================

Which collective a log holds: ``collective=`` when given, else the file name
(``all_gather_perf.log``, ``allgather_16.txt``), else the table itself (a root column means
broadcast or reduce; ``size == count x type size`` with a reduction means all_reduce;
``size == ranks x count x type size`` means reduce_scatter with a reduction and
all_gather/all_to_all without one, which cannot be told apart).

Warm-up outliers: nccl-tests times its first sizes right after warm-up, and the first
sizes of multi-node runs can be far slower than the next ones. Within each time column,
a time among the first :data:`WARMUP_ROWS` sizes is dropped when it exceeds
:data:`WARMUP_FACTOR` x the smallest time of the next three sizes (a larger message cannot
legitimately be that much faster). The measurement of a size is then the smaller of its
out-of-place and in-place times (noise only adds time); with one rank the in-place
all-reduce is a no-op NCCL skips, so only out-of-place is used.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from echo_et.errors import EchoError
from echo_et.ir.collectives import find_collective
from echo_et.ir.dtypes import dtype_size
from echo_et.ir.schema import collective_name

WARMUP_ROWS = 4
WARMUP_FACTOR = 1.25

_PREFIX = re.compile(r"\[\d+,\d+\]<(stdout|stderr)>:")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
                   r"\[[^\]]*\]\s*(.*)$")
SUPPORTED = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


@dataclass(frozen=True)
class Row:
    size: int                   # nccl-tests "size" column (bytes)
    count: int
    dtype: str
    redop: str
    out_of_place_us: float | None
    in_place_us: float | None


@dataclass
class Run:
    """One nccl-tests run: its ranks and their hosts, and its table."""

    source: str                 # file name (no directory)
    sha256: str                 # of the whole file
    index: int                  # which run of the file (0 for the first)
    threads: int
    gpus_per_thread: int
    hosts: dict[int, str] = field(default_factory=dict)   # rank -> host name
    gpu_names: set[str] = field(default_factory=set)
    columns: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    collective: str = ""

    @property
    def ranks(self) -> int:
        return max(self.hosts) + 1 if self.hosts else self.threads * self.gpus_per_thread

    def ir_bytes(self, row: Row) -> int:
        return row.size // self.ranks if self.collective == "all_gather" else row.size


@dataclass(frozen=True)
class Measurement:
    ir_bytes: int
    time_us: float
    nccl_tests_size: int


def read_log(path: str | Path, collective: str | None = None) -> list[Run]:
    """Every run in the nccl-tests output at ``path``."""
    p = Path(path)
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise EchoError(f"{p.name}: not a text file, so not nccl-tests output") from None
    return parse_text(text, p.name, hashlib.sha256(data).hexdigest(), collective)


def parse_text(text: str, name: str, sha256: str = "", collective: str | None = None) -> list[Run]:
    if collective is not None and collective not in SUPPORTED:
        raise EchoError(f"{name}: collective {collective!r} is not one nccl-tests measures "
                        f"({', '.join(SUPPORTED)})")
    runs: list[Run] = []
    run: Run | None = None
    for line in _segments(text):
        s = line.strip()
        m = _HEADER.match(s)
        if m:
            run = Run(name, sha256, len(runs), int(m.group(1)), int(m.group(2)))
            runs.append(run)
            continue
        if run is None:
            continue
        m = _RANK.match(s)
        if m:
            run.hosts[int(m.group(1))] = m.group(2)
            if m.group(3).strip():
                run.gpu_names.add(m.group(3).strip())
            continue
        if s.startswith("#"):
            tokens = s.lstrip("#").split()
            if tokens[:2] == ["size", "count"] and "time" in tokens:
                run.columns = tokens
            continue
        if run.columns and s[:1].isdigit():
            row = _row(s, run.columns, name)
            if row is not None:
                run.rows.append(row)
    if not runs:
        raise EchoError(f"{name}: not nccl-tests output (no '# nThread ... nGpus ...' header)")
    for r in runs:
        where = f"{name}" + (f" (run {r.index + 1})" if len(runs) > 1 else "")
        if not r.columns:
            raise EchoError(f"{where}: no table header with size, count and time columns")
        for col in ("type", "time"):
            if col not in r.columns:
                raise EchoError(f"{where}: the table has no {col!r} column")
        if not r.rows:
            raise EchoError(f"{where}: the table has no rows")
        if r.hosts and len(r.hosts) != max(r.hosts) + 1:
            missing = sorted(set(range(max(r.hosts) + 1)) - set(r.hosts))
            raise EchoError(f"{where}: no device line for rank(s) {missing[:5]}, so the group size "
                            "is unknown")
        r.collective = collective or _infer_collective(r, where)
    return runs


def _segments(text: str):
    """Logical lines: MPI prefixes removed, interleaved prefixes split off, stderr dropped."""
    for raw in text.splitlines():
        parts = _PREFIX.split(raw)
        if len(parts) == 1:
            yield raw
            continue
        if parts[0].strip():
            yield parts[0]
        for i in range(1, len(parts) - 1, 2):
            if parts[i] == "stdout":
                yield parts[i + 1]


def _row(line: str, columns: list[str], name: str) -> Row | None:
    tokens = line.split()
    if len(tokens) != len(columns):
        return None
    times = [i for i, c in enumerate(columns) if c == "time"]
    try:
        size, count = int(tokens[0]), int(tokens[1])
        oop = _time(tokens[times[0]])
        inp = _time(tokens[times[1]]) if len(times) > 1 else None
    except ValueError:
        return None
    redop = tokens[columns.index("redop")] if "redop" in columns else "none"
    return Row(size, count, tokens[columns.index("type")], redop, oop, inp)


def _time(tok: str) -> float | None:
    if tok.upper() == "N/A":
        return None
    v = float(tok)
    return v if v > 0 and v == v and v != float("inf") else None


def _infer_collective(run: Run, where: str) -> str:
    named = find_collective(re.sub(r"[^a-z]", "", run.source.lower()), sendrecv=None)
    if named is not None and collective_name(named) in SUPPORTED:
        return collective_name(named)
    row = run.rows[-1]  # the largest size: its count is never rounded to 0
    reduces = row.redop.lower() not in ("none", "")
    if "root" in run.columns:
        return "reduce" if reduces else "broadcast"
    width = dtype_size(row.dtype)
    if width is None or row.count == 0:
        raise EchoError(f"{where}: cannot tell which collective this is (type {row.dtype!r}); "
                        "pass --collective")
    ratio = row.size / (row.count * width)
    if abs(ratio - 1) < 1e-9 and reduces:
        return "all_reduce"
    if abs(ratio - run.ranks) < 1e-9 and run.ranks > 1:
        if reduces:
            return "reduce_scatter"
        raise EchoError(f"{where}: all_gather or all_to_all (the table cannot tell); pass --collective")
    raise EchoError(f"{where}: cannot tell which collective this is; pass --collective")


def measurements(run: Run) -> tuple[list[Measurement], int, int]:
    """Measured time per size after the warm-up rule (see the module doc), how many sizes
    were dropped entirely and how many single times the rule dropped."""
    cols = [[r.out_of_place_us for r in run.rows]]
    if run.ranks > 1:
        cols.append([r.in_place_us for r in run.rows])
    outliers = 0
    for col in cols:
        for i in range(min(WARMUP_ROWS, len(col))):
            nxt = [t for t in col[i + 1:i + 4] if t is not None]
            if col[i] is not None and nxt and col[i] > WARMUP_FACTOR * min(nxt):
                col[i] = None
                outliers += 1
    out: list[Measurement] = []
    dropped = 0
    for i, row in enumerate(run.rows):
        kept = [c[i] for c in cols if c[i] is not None]
        if not kept:
            dropped += 1
            continue
        out.append(Measurement(run.ir_bytes(row), min(kept), row.size))  # type: ignore[type-var]
    return out, dropped, outliers
