"""The row log of a sweep: every finished row appended to ``OUT/rows.jsonl`` as it
completes, so a killed sweep loses no finished row, and a resumed one runs only the rest.

The first line is a header naming the sweep (its kind, a hash of its input and one of its
options); each other line is one row, ``{"i": index, "row": {...}}``, written with one
``write`` of the whole line, then flushed to disk (``fsync``) before the next. A sweep killed
mid-write leaves at most a torn last line without its newline, which resuming cuts off. A
row that failed for want of resources (its worker died, it ran past its memory budget)
carries ``"retry": true`` and runs again on resume; a row's own error is its result.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from echo_et.errors import EchoError, OptionError
from echo_et.ir.io import holds_more_than_leftovers, publish_file, temp_file_beside

LOG_FILE = "rows.jsonl"
FORMAT = "echo-et row log 1"


@dataclass(frozen=True)
class LogHeader:
    """What a row log was written for: a resumed sweep must have the same."""

    kind: str            # "config-sweep" or "sweep"
    rows: int            # rows of the whole sweep
    input_sha256: str    # the configuration CSV or the Job, byte for byte
    options_sha256: str  # what every row shares (canonical JSON, with the files it names)
    input_name: str = "input"   # what the input is, for messages ("configuration CSV", "job")

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}


def json_sha256(obj: Any) -> str:
    """The hash of ``obj`` as canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def path_sha256(path: str | os.PathLike[str]) -> str:
    """The hash of a file's bytes, or of a folder's files (their relative names and bytes,
    in name order)."""
    p = Path(path)
    h = hashlib.sha256()
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    for f in files:
        if p.is_dir():
            h.update(f.relative_to(p).as_posix().encode() + b"\0")
        with f.open("rb") as src:
            for block in iter(lambda: src.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class RowLog:
    """An open row log: the rows it already holds (``done``), and :meth:`append` for more."""

    def __init__(self, path: Path, fd: int, header: LogHeader, entries: dict[int, dict[str, Any]]):
        self.path = path
        self.header = header
        self._fd = fd
        self._entries = entries
        self.replaced = 0   # finished rows of an unfinished run that this new log replaced

    @property
    def done(self) -> dict[int, dict[str, Any]]:
        """The finished rows by index, without those to run again (``retry``)."""
        return {i: e["row"] for i, e in self._entries.items() if not e.get("retry")}

    @property
    def seconds(self) -> dict[int, dict[str, float]]:
        """How long each logged row took, where the row function said."""
        return {i: e["seconds"] for i, e in self._entries.items() if e.get("seconds")}

    def append(self, index: int, row: dict[str, Any], *, retry: bool = False,
               seconds: dict[str, float] | None = None) -> None:
        """One finished row, on disk before this returns."""
        entry: dict[str, Any] = {"i": index, "row": row}
        if retry:
            entry["retry"] = True
        if seconds:
            entry["seconds"] = seconds
        _write_line(self._fd, entry, self.path)
        self._entries[index] = entry

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RowLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _write_line(fd: int, obj: dict[str, Any], path: Path) -> None:
    """One JSON line in one write, then fsync: never half a row on disk after a kill."""
    data = (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()
    try:
        view = memoryview(data)
        while view:   # a regular file takes it whole; a short write only on a full disk
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except OSError as e:
        raise EchoError(f"{path}: cannot write ({e.strerror or e})") from None


def is_row_log_dir(path: Path) -> bool:
    """A folder holding a row log (an interrupted sweep's, or a finished one's)."""
    return _read_header(path / LOG_FILE) is not None


def _read_header(log: Path) -> dict[str, Any] | None:
    try:
        with log.open("rb") as f:
            first = f.readline()
    except OSError:
        return None
    try:
        head = json.loads(first)
    except ValueError:
        return None
    return head if isinstance(head, dict) and head.get("format") == FORMAT else None


def open_row_log(outdir: str | os.PathLike[str], header: LogHeader, *, resume: bool,
                 replaceable: Callable[[Path], bool], kind: str) -> RowLog:
    """The row log in ``outdir``: the one there when resuming (refused when written for
    another input or other options), else a new one. ``outdir`` is made if missing; an
    existing folder must be empty, hold a row log, or be ``replaceable`` (an earlier output
    of this kind): a folder of the user's is refused, and nothing in it but the log is
    touched here (the outputs are replaced when the sweep ends)."""
    out = Path(outdir)
    check_output_dir(out, replaceable, kind)
    out.mkdir(parents=True, exist_ok=True)
    log = out / LOG_FILE
    if resume and log.is_file() and _read_header(log) is not None:
        fd = _open_locked(log)
        try:
            entries, end = _read_entries(log, header)
            if end < log.stat().st_size:   # cut off what a crash left of a last line
                os.ftruncate(fd, end)
            return RowLog(log, fd, header, entries)
        except BaseException:
            os.close(fd)
            raise
    if log.is_file() and log.stat().st_size and _read_header(log) is None:
        raise EchoError(f"{log}: not an echo-et row log; refusing to replace it")
    replaced = _unfinished_rows(log, header) if log.is_file() else 0
    _new_log(log, header)
    new = RowLog(log, _open_locked(log), header, {})
    new.replaced = replaced
    return new


def _unfinished_rows(log: Path, header: LogHeader) -> int:
    """How many rows the log of an unfinished run of this very sweep holds (0 for another
    sweep's, or a finished one): what starting over discards. Refuses a log another sweep
    is writing."""
    os.close(_open_locked(log))
    try:
        entries, _ = _read_entries(log, header)
    except EchoError:
        return 0
    done = sum(1 for e in entries.values() if not e.get("retry"))
    return done if done < header.rows else 0


def check_output_dir(out: Path, replaceable: Callable[[Path], bool], kind: str) -> None:
    """Refuse an output folder that is not ours: a file, or a folder of the user's."""
    if out.exists() and not out.is_dir():
        raise EchoError(f"{out}: exists and is not a directory")
    if out.is_dir() and holds_more_than_leftovers(out) and not (replaceable(out) or is_row_log_dir(out)):
        raise EchoError(f"{out}: exists and is not {kind}; refusing to replace it")


def _new_log(log: Path, header: LogHeader) -> None:
    """A log of only the header, put in place by a rename (never a torn header)."""
    fd, tmp = temp_file_beside(log)
    try:
        _write_line(fd, header.to_json(), log)
    finally:
        os.close(fd)
    publish_file(tmp, log)


def _open_locked(log: Path) -> int:
    """The log opened for appending, locked against a second sweep on the same folder."""
    fd = os.open(log, os.O_RDWR | os.O_APPEND)
    try:
        import fcntl
    except ImportError:   # no advisory locks on this platform
        return fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise EchoError(f"{log.parent}: another sweep is writing to this folder") from None
    return fd


def _read_entries(log: Path, header: LogHeader) -> tuple[dict[int, dict[str, Any]], int]:
    """(the rows of a log written for ``header``, the length of its whole lines: a torn last
    line is not read)."""
    data = log.read_bytes()
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    if not lines:
        raise EchoError(f"{log}: no header line; remove the folder to start over")
    _check_header(json.loads(lines[0]), header, log)
    entries: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(lines[1:], start=2):
        entry = _entry(line, header.rows)
        if entry is None:
            if n == len(lines):   # a last line a crash left unreadable: cut it off too
                end -= len(line) + 1
                break
            raise EchoError(f"{log}, line {n}: not a row of this log; remove the folder to start over")
        entries.setdefault(entry["i"], entry)
        if entry.get("retry") is not True and entries[entry["i"]].get("retry"):
            entries[entry["i"]] = entry   # a retried row's result replaces its failure
    return entries, end


def _entry(line: bytes, rows: int) -> dict[str, Any] | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    ok = (isinstance(entry, dict) and isinstance(entry.get("i"), int) and 0 <= entry["i"] < rows
          and isinstance(entry.get("row"), dict))
    return entry if ok else None


def _check_header(head: dict[str, Any], header: LogHeader, log: Path) -> None:
    """Refuse to resume a log of another sweep: one line saying what differs."""
    want = header.to_json()
    if head.get("kind") != want["kind"]:
        raise OptionError("resume", f"{log} is the log of another kind of sweep "
                                    f"({head.get('kind')}, not {want['kind']})")
    if head.get("options_sha256") != want["options_sha256"]:
        raise OptionError("resume", f"{log} was written for other options; give the same options "
                                    "to resume, or start over without resuming")
    if head.get("input_sha256") != want["input_sha256"] or head.get("rows") != want["rows"]:
        raise OptionError("resume", f"{log} was written for another {header.input_name} "
                                    "(its content differs); start over without resuming")


__all__ = ["FORMAT", "LOG_FILE", "LogHeader", "RowLog", "check_output_dir", "is_row_log_dir",
           "json_sha256", "open_row_log", "path_sha256"]
