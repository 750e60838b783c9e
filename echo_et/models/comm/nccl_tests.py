"""Reader for nccl-tests output: every binary (``all_reduce_perf``, ``all_gather_perf``,
``reduce_scatter_perf``, ``alltoall_perf``, ``broadcast_perf``, ``reduce_perf``,
``sendrecv_perf``, ``gather_perf``, ``scatter_perf``, ``hypercube_perf``).

Accepts the plain output of one process (``-g N`` or ``-t N``) and the output of an MPI run
where every line carries a ``[1,0]<stdout>:`` prefix; output of several ranks may be
interleaved inside one line (``...A100-SXM4-40GB[1,3]<stderr>:NCCL WARN ...``): every
prefix starts a new segment and only stdout segments are read. One file may hold several
runs (each starts at ``# nThread``; nccl-tests 2.14+ opens each with ``# Collective test
starting: <binary>``).

What ``size`` and ``count`` mean is nccl-tests' own, per binary (its ``GetCollByteCount``):
``size`` is the larger of the send and receive buffers of one rank, ``count`` the element
count passed to NCCL (:data:`SIZE_PER_COUNT`: ``size = count x type size`` or ``ranks x
count x type size``). The IR bytes (per-rank input, the Chakra convention) are
:func:`ir_bytes`; docs/comm-model.md has the table.

Which collective a run holds: ``collective=`` when given, else its ``# Collective test
starting`` header, else the file name, else the table (``size / (count x type size)``, the
``root`` value, the reduction and ``busbw / algbw``; see :func:`_from_table`).

Warm-up outliers: nccl-tests times its first sizes right after warm-up, and the first
sizes of multi-node runs can be far slower than the next ones. Within each time column,
a time among the first :data:`WARMUP_ROWS` sizes is dropped when it exceeds
:data:`WARMUP_FACTOR` x the smallest time of the next three sizes (a larger message cannot
legitimately be that much faster). The measurement of a size is then the smaller of its
out-of-place and in-place times (noise only adds time); with one rank the in-place
all-reduce is a no-op NCCL skips, so only out-of-place is used. Rows of 0 bytes (a size
below ``ranks x type size`` rounds to nothing) are not measurements.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from echo_et.errors import EchoError, OptionError
from echo_et.ir.dtypes import dtype_size

WARMUP_ROWS = 4
WARMUP_FACTOR = 1.25

_PREFIX = re.compile(r"\[\d+,\d+\]<(stdout|stderr)>:")
_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)(.*)$")
_RANK = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+"
                   r"\[[^\]]*\]\s*(.*)$")
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"nccl-library=(\d+)|NCCL version (\d+\.\d+\.\d+)")
_REDUCED_MAX = re.compile(r"#\s*Reducing maxBytes to (\d+)")

# nccl-tests binary -> the collective this model calls it
BINARIES = {
    "all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all",
    "broadcast_perf": "broadcast", "reduce_perf": "reduce", "sendrecv_perf": "sendrecv",
    "gather_perf": "gather", "scatter_perf": "scatter", "hypercube_perf": "hypercube",
}
SUPPORTED = tuple(BINARIES.values())
# size / (count x type size), from each binary's GetCollByteCount: "1" or "ranks"
SIZE_PER_COUNT = {
    "all_reduce": "1", "broadcast": "1", "reduce": "1", "sendrecv": "1",
    "all_gather": "ranks", "reduce_scatter": "ranks", "all_to_all": "ranks",
    "gather": "ranks", "scatter": "ranks", "hypercube": "ranks",
}
ROOTED = ("broadcast", "reduce", "gather", "scatter")
# busbw / algbw, from each binary's GetBw: "2(n-1)/n", "(n-1)/n" or "1"
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "sendrecv": lambda n: 1.0, "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0, "hypercube": lambda n: 1.0,
    **{c: (lambda n: (n - 1) / n) for c in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")},
}
# file-name words, most specific first ("reducescatter" before "reduce", "allgather" before "gather")
_NAME_WORDS = (("allreduce", "all_reduce"), ("reducescatter", "reduce_scatter"), ("allgather", "all_gather"),
               ("alltoall", "all_to_all"), ("sendrecv", "sendrecv"), ("hypercube", "hypercube"),
               ("broadcast", "broadcast"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"))


@dataclass(frozen=True)
class Row:
    size: int                   # nccl-tests "size" column (bytes)
    count: int
    dtype: str
    redop: str
    out_of_place_us: float | None
    in_place_us: float | None
    root: int = -1              # the root column (-1: none, or no column)
    bus_per_alg: float | None = None    # busbw / algbw of the row, when both are readable
    line: int = field(default=0, compare=False)   # line in the file (1-based; 0: not from a file)


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
    line: int = 0               # line of the run's "# nThread" header
    binary: str = ""            # "# Collective test starting: <binary>", when stated
    binary_line: int = 0
    nccl_version: str = ""      # the NCCL library the header states ("2.29.2"), "" when not
    sizes_asked: tuple[int, ...] = ()   # the sizes the header's -b/-e/-f ask for
    missing_sizes: tuple[int, ...] = ()  # asked for but not in the table (a truncated log)

    @property
    def ranks(self) -> int:
        return max(self.hosts) + 1 if self.hosts else self.threads * self.gpus_per_thread

    def ir_bytes(self, row: Row) -> int:
        return ir_bytes(self.collective, row, self.ranks)


def ir_bytes(collective: str, row: Row, ranks: int) -> int:
    """Per-rank input bytes (the IR convention) of a row: the shard (``count x type size``)
    for all_gather, gather and hypercube (an all-gather by send/recv), nccl-tests' ``size``
    (the whole input or send buffer) for the others."""
    if collective in ("all_gather", "gather", "hypercube"):
        return row.size // max(1, ranks)
    return row.size


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
    binary: tuple[str, int] | None = None
    version = ""
    for lineno, line in _segments(text):
        s = line.strip()
        m = _STARTING.match(s)
        if m:
            binary = (m.group(1), lineno)
            continue
        m = _VERSION.search(s)
        if m and (s.startswith("#") or "NCCL INFO" in s):
            version = _version_text(m)
            if run is not None and not run.nccl_version:
                run.nccl_version = version
        m = _HEADER.match(s)
        if m:
            run = Run(name, sha256, len(runs), int(m.group(1)), int(m.group(2)), line=lineno,
                      nccl_version=version)
            run.sizes_asked = _asked_sizes(m.group(3))
            if binary is not None:
                run.binary, run.binary_line = binary
                binary = None
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
        m = _REDUCED_MAX.match(s)
        if m:
            limit = int(m.group(1))
            run.sizes_asked = tuple(x for x in run.sizes_asked if x <= limit)
            continue
        if s.startswith("#"):
            tokens = s.lstrip("#").split()
            if tokens[:2] == ["size", "count"] and "time" in tokens:
                if run.columns and run.rows:
                    raise EchoError(f"{name}:{lineno}: a second table in one run without its own "
                                    "'# nThread' header (mixed collectives?)")
                run.columns = tokens
            continue
        if run.columns and s[:1].isdigit():
            row = _row(s, run.columns, lineno)
            if row is not None:
                run.rows.append(row)
    if not runs:
        raise EchoError(f"{name}: not nccl-tests output (no '# nThread ... nGpus ...' header)")
    for r in runs:
        where = f"{name}:{r.line}"
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
        r.collective = collective or _collective(r, name)
        _check_sizes(r, name)
        r.missing_sizes = _missing(r)
    _check_mixed(runs, name, collective)
    return runs


def _version_text(m: re.Match) -> str:
    if m.group(2):
        return m.group(2)
    code = int(m.group(1))
    if code >= 10000:                       # NCCL_VERSION_CODE from 2.9: major*10000+minor*100+patch
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _asked_sizes(rest: str) -> tuple[int, ...]:
    """The sizes ``-b``/``-e``/``-f`` (or ``-i``) ask for, from the header's tail."""
    lo = re.search(r"minBytes\s+(\d+)", rest)
    hi = re.search(r"maxBytes\s+(\d+)", rest)
    step = re.search(r"step:\s*(\d+)\((factor|bytes)\)", rest)
    if not (lo and hi and step):
        return ()
    size, top, inc = int(lo.group(1)), int(hi.group(1)), int(step.group(1))
    out: list[int] = []
    while size <= top and len(out) < 4096 and inc > (1 if step.group(2) == "factor" else 0):
        out.append(size)
        size = size * inc if step.group(2) == "factor" else size + inc
    return tuple(out)


def _missing(run: Run) -> tuple[int, ...]:
    """Asked-for sizes after the table's last row: the log was cut (nccl-tests prints every
    size it is asked for, rounding it down to whole elements per rank)."""
    if not run.sizes_asked or len(run.rows) >= len(run.sizes_asked):
        return ()
    last = run.rows[-1].size
    return tuple(s for s in run.sizes_asked[len(run.rows):] if s > last)


def _segments(text: str):
    """(line number, logical line): MPI prefixes removed, interleaved prefixes split off,
    stderr dropped."""
    for lineno, raw in enumerate(text.splitlines(), start=1):
        parts = _PREFIX.split(raw)
        if len(parts) == 1:
            yield lineno, raw
            continue
        if parts[0].strip():
            yield lineno, parts[0]
        for i in range(1, len(parts) - 1, 2):
            if parts[i] == "stdout":
                yield lineno, parts[i + 1]


def _row(line: str, columns: list[str], lineno: int) -> Row | None:
    """One table row, or None for a line that is not one (a header without a ``type``
    column is refused after the table is read, naming it)."""
    tokens = line.split()
    if len(tokens) != len(columns) or "type" not in columns:
        return None
    times = [i for i, c in enumerate(columns) if c == "time"]
    try:
        size, count = int(tokens[0]), int(tokens[1])
        oop = _time(tokens[times[0]])
        inp = _time(tokens[times[1]]) if len(times) > 1 else None
        root = int(tokens[columns.index("root")]) if "root" in columns else -1
    except ValueError:
        return None
    redop = tokens[columns.index("redop")] if "redop" in columns else "none"
    ratio = None
    if "algbw" in columns and "busbw" in columns:
        try:
            alg, bus = float(tokens[columns.index("algbw")]), float(tokens[columns.index("busbw")])
            ratio = bus / alg if alg >= 1.0 else None     # 2 decimals: too coarse below 1 GB/s
        except ValueError:
            ratio = None
    return Row(size, count, tokens[columns.index("type")], redop, oop, inp, root, ratio, lineno)


def _time(tok: str) -> float | None:
    if tok.upper() == "N/A":
        return None
    v = float(tok)
    return v if v > 0 and v == v and v != float("inf") else None


def _collective(run: Run, name: str) -> str:
    """The collective of a run: its section header, else the file name, else the table."""
    if run.binary:
        if run.binary not in BINARIES:
            raise EchoError(f"{name}:{run.binary_line}: {run.binary} is not a collective this model knows "
                            f"(known: {', '.join(BINARIES)})")
        return BINARIES[run.binary]
    word = re.sub(r"[^a-z]", "", name.lower())
    for pattern, coll in _NAME_WORDS:
        if pattern in word:
            return coll
    return _from_table(run, name)


def _from_table(run: Run, name: str) -> str:
    """What the table says: ``size / (count x type size)`` (1 or the ranks), a root, a
    reduction, and ``busbw / algbw`` (2(n-1)/n all-reduce, 1 send/recv)."""
    row = max(run.rows, key=lambda r: r.size)   # the largest size: its count is never rounded to 0
    where = f"{name}:{row.line}"
    width = dtype_size(row.dtype)
    if width is None or row.count == 0:
        raise OptionError("collective", f"{where}: cannot tell which collective this is (type {row.dtype!r}); "
                          "name the collective")
    reduces = row.redop.lower() not in ("none", "")
    n = run.ranks
    ratio = row.size / (row.count * width)
    factors = [r.bus_per_alg for r in run.rows if r.bus_per_alg is not None]
    bus = factors[-1] if factors else None

    def near(a: float | None, b: float) -> bool:
        return a is not None and abs(a - b) <= 0.02 * b

    if abs(ratio - 1) < 1e-9:
        if row.root >= 0:
            return "reduce" if reduces else "broadcast"
        if reduces and n > 2 and near(bus, 1.0):
            return "sendrecv"
        if reduces:
            return "all_reduce"   # at 2 ranks all_reduce and sendrecv print the same busbw
    elif n > 1 and abs(ratio - n) < 1e-9:
        if row.root >= 0:
            raise OptionError("collective", f"{where}: gather or scatter (the table cannot tell); name the collective")
        if reduces:
            return "reduce_scatter"
        if near(bus, 1.0) and n > 2:
            return "hypercube"
        raise OptionError("collective", f"{where}: all_gather or all_to_all (the table cannot tell); "
                          "name the collective")
    raise OptionError("collective", f"{where}: cannot tell which collective this is; name the collective")


def _check_sizes(run: Run, name: str) -> None:
    """Every row's size must be what nccl-tests prints for its count (see SIZE_PER_COUNT)."""
    per = run.ranks if SIZE_PER_COUNT[run.collective] == "ranks" else 1
    for row in run.rows:
        width = dtype_size(row.dtype)
        if width is None:
            raise EchoError(f"{name}:{row.line}: unknown data type {row.dtype!r}")
        if row.size != per * row.count * width:
            raise EchoError(f"{name}:{row.line}: size {row.size} contradicts count {row.count} x {width} B"
                            + (f" x {per} ranks" if per > 1 else "") + f" for {run.collective}")


def _check_mixed(runs: list[Run], name: str, collective: str | None) -> None:
    """Several runs of different collectives in one file need their own section headers."""
    if collective is not None or len({r.collective for r in runs}) < 2:
        return
    for r in runs:
        if not r.binary:
            raise OptionError("collective", f"{name}:{r.line}: runs of different collectives "
                              f"({', '.join(sorted({x.collective for x in runs}))}) in one file without "
                              "'# Collective test starting' headers; split the file or name the collective")


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
        if not kept or row.size == 0:
            dropped += 1
            continue
        out.append(Measurement(run.ir_bytes(row), min(kept), row.size))  # type: ignore[type-var]
    return out, dropped, outliers
