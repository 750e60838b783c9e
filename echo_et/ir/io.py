"""Reading and writing graph files and Job directories.

A graph file is a stream of length-delimited protobuf messages: one GraphHeader, then Nodes
until EOF (the same framing as Chakra's ``.et``), so a graph is written and read one node at
a time. Gzip is detected by its magic bytes on read. A Job directory holds ``manifest.pb``
and ``graphs/<id>.graph``; it is written to a temporary sibling and renamed into place so
that a failed write never leaves a half-written Job.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import gzip
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError, Message

from echo_et.errors import EchoError
from echo_et.ir.graph import Graph
from echo_et.ir.job import Job
from echo_et.ir.schema import SCHEMA_VERSION, pb

MANIFEST_NAME = "manifest.pb"
GRAPH_DIR = "graphs"
GRAPH_SUFFIX = ".graph"
MAX_MESSAGE = 1 << 31  # bytes; a longer length prefix means the stream is not length-delimited


# -- varint framing -------------------------------------------------------------------------
def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def write_delimited(f: BinaryIO, message: Message) -> int:
    data = message.SerializeToString(deterministic=True)
    f.write(encode_varint(len(data)))
    f.write(data)
    return len(data)


def _read_varint(f: BinaryIO) -> int | None:
    """The next varint, or None at a clean EOF. Raises EchoError on a truncated varint."""
    shift = 0
    result = 0
    for i in range(10):
        b = f.read(1)
        if not b:
            if i == 0:
                return None
            raise EchoError("truncated length prefix")
        v = b[0]
        result |= (v & 0x7F) << shift
        if not v & 0x80:
            return result
        shift += 7
    raise EchoError("length prefix longer than 10 bytes (not a length-delimited protobuf stream)")


def iter_delimited(f: BinaryIO) -> Iterator[bytes]:
    """Yield the raw bytes of each length-delimited message until EOF."""
    while True:
        n = _read_varint(f)
        if n is None:
            return
        if n > MAX_MESSAGE:
            raise EchoError(f"message length {n} is implausible (not a length-delimited stream)")
        data = f.read(n) if n <= _READ_CHUNK else read_exact(f, n)
        if len(data) != n:
            raise EchoError(f"truncated message: expected {n} bytes, found {len(data)}")
        yield data


_READ_CHUNK = 1 << 20


def read_exact(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes, read in chunks so that a corrupt length prefix near 2 GiB does not
    allocate 2 GiB before the truncation is noticed."""
    parts = []
    left = n
    while left:
        chunk = f.read(min(left, _READ_CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a regular file for binary reading; a FIFO, device or socket in its place is refused
    (reading one would block forever or never end)."""
    f = open(path, "rb", opener=_nonblocking_opener)  # noqa: SIM115 - returned to the caller
    try:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise EchoError(f"{path}: not a regular file (a FIFO, device or socket)")
        os.set_blocking(f.fileno(), True)
    except BaseException:
        f.close()
        raise
    return f


def _nonblocking_opener(path: str, flags: int) -> int:
    # O_NONBLOCK: opening a FIFO with no writer would otherwise block before fstat can refuse it.
    return os.open(path, flags | os.O_NONBLOCK)


def open_maybe_gzip(path: str | os.PathLike[str]) -> BinaryIO:
    """Open for binary reading, transparently un-gzipping when the file starts with 1f 8b."""
    f = open_regular(path)
    magic = f.read(2)
    f.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.open(f, "rb")  # type: ignore[return-value]
    return f


# -- graph files ----------------------------------------------------------------------------
def iter_graph(path: str | os.PathLike[str], *, decoded: bool = True
               ) -> Iterator[pb.GraphHeader | pb.Node | bytes]:
    """Stream a graph file: the header first, then each node (its bytes unless
    ``decoded``)."""
    where = str(path)
    try:
        with open_maybe_gzip(path) as f:
            it = iter_delimited(f)
            first = next(it, None)
            if first is None:
                raise EchoError(f"{where}: empty graph file")
            header = pb.GraphHeader()
            header.ParseFromString(first)
            if not header.schema_version.startswith("echo-et/"):
                raise EchoError(f"{where}: not an echo-et graph file (no echo-et header)")
            yield header
            if not decoded:
                yield from it
                return
            for i, data in enumerate(it):
                node = pb.Node()
                try:
                    node.ParseFromString(data)
                except DecodeError as e:
                    raise EchoError(f"{where}: node #{i} does not decode ({e})") from None
                yield node
    except EchoError as e:
        msg = str(e)
        raise EchoError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except DecodeError as e:
        raise EchoError(f"{where}: not an echo-et graph file ({e})") from None
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise EchoError(f"{where}: cannot read ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    if isinstance(e, zlib.error):
        return f"corrupt gzip data: {e}"
    if isinstance(e, EOFError):
        return "truncated gzip data"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return str(e) or type(e).__name__


def read_graph(path: str | os.PathLike[str]) -> Graph:
    """A whole graph file, each node decoded straight into the graph's store."""
    it = iter_graph(path, decoded=False)
    header = next(it)
    assert isinstance(header, pb.GraphHeader)
    g = Graph(header)
    where = str(path)
    for i, data in enumerate(it):
        try:
            g.add_serialized(data)  # type: ignore[arg-type]
        except DecodeError as e:
            raise EchoError(f"{where}: node #{i} does not decode ({e})") from None
    return g


def matches_sha256(path: str | os.PathLike[str], expected: str) -> bool:
    """Whether the file's bytes, or its un-gzipped content, have SHA-256 ``expected``
    (``save_job`` hashes what it writes; a graph file gzipped afterwards may keep either)."""
    try:
        with open_regular(path) as raw:
            h = hashlib.sha256()
            while chunk := raw.read(_READ_CHUNK):
                h.update(chunk)
        if h.hexdigest() == expected:
            return True
        with open_maybe_gzip(path) as f:
            if not isinstance(f, gzip.GzipFile):
                return False
            h = hashlib.sha256()
            while chunk := f.read(_READ_CHUNK):
                h.update(chunk)
        return h.hexdigest() == expected
    except EchoError:
        raise
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise EchoError(f"{path}: cannot read ({_reason(e)})") from None


def write_graph_stream(f: BinaryIO, header: pb.GraphHeader, nodes: Iterable[pb.Node]) -> int:
    if not header.schema_version:
        header.schema_version = SCHEMA_VERSION
    write_delimited(f, header)
    global _SHORT_PREFIXES
    if _SHORT_PREFIXES is None:
        _SHORT_PREFIXES = [encode_varint(i) for i in range(1 << 14)]
    prefixes = _SHORT_PREFIXES
    count = 0
    block: list[bytes] = []   # framed nodes written a few thousand at a time: fewer calls
    for n in nodes:
        data = n.SerializeToString(deterministic=True)
        size = len(data)
        block.append(prefixes[size] if size < 16384 else encode_varint(size))
        block.append(data)
        count += 1
        if len(block) >= 8192:
            f.write(b"".join(block))
            block.clear()
    if block:
        f.write(b"".join(block))
    return count


_SHORT_PREFIXES: list[bytes] | None = None   # varint lengths 0..16383, made on first use


def write_stored_graph(f: BinaryIO, graph: Graph) -> int:
    """write_graph_stream of the graph as stored, in one serialisation (the same bytes)."""
    if not graph.header.schema_version:
        graph.header.schema_version = SCHEMA_VERSION
    write_delimited(f, graph.header)
    for chunk in graph.stored_framed():
        f.write(chunk)
    return len(graph.stored_nodes)


def write_graph(graph: Graph, path: str | os.PathLike[str]) -> None:
    with atomic_file(path) as f:
        write_stored_graph(f, graph)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def publish_mode(path: str | os.PathLike[str]) -> None:
    """Give a temporary file or directory the mode a plain ``open``/``mkdir`` would have.

    ``tempfile`` creates 0600 files and 0700 directories; renamed into place unchanged, a
    user's outputs would be unreadable to their group."""
    base = 0o777 if os.path.isdir(path) else 0o666
    os.chmod(path, base & ~_umask())


# -- outputs: temporary names, stale leftovers, errors that name the user's path ---------------
# A temporary output is ``.NAME.PID-RANDOM.tmp`` beside NAME (``.old`` for the previous output
# moved aside while a directory is replaced): the PID tells a later run whether the writer is
# still alive, so that the leftovers of killed runs are removed and a live writer's are not.
_TEMP = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)-[A-Za-z0-9_]+\.(?:tmp|old)$")
# Errors that say the output cannot be written (as opposed to an input that cannot be read).
_OUTPUT_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES,
                            errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.ENOTEMPTY,
                            errno.EXDEV, errno.ENAMETOOLONG, errno.EIO})


def _temp_prefix(dest: Path) -> str:
    return f".{dest.name}.{os.getpid()}-"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user holds that pid
        return True
    return True


def is_stale_leftover(path: str | os.PathLike[str]) -> bool:
    """``path`` is a temporary output of a run that was killed (``.NAME.PID-*.tmp`` or
    ``.old`` whose process is gone): not the user's, and not a live writer's."""
    m = _TEMP.match(Path(path).name)
    return m is not None and not _pid_alive(int(m.group("pid")))


def holds_more_than_leftovers(folder: str | os.PathLike[str]) -> bool:
    """``folder`` holds something other than the leftovers of killed runs: an output folder
    whose only entry is a killed run's temporary file is as good as empty."""
    return any(not is_stale_leftover(p) for p in Path(folder).iterdir())


def stale_outputs(dest: str | os.PathLike[str]) -> list[Path]:
    """Temporary outputs beside ``dest`` left by runs that were killed (their process is
    gone): hidden ``.NAME.PID-*.tmp`` files or folders and ``.NAME.PID-*.old`` folders."""
    dest = Path(dest)
    try:
        entries = list(os.scandir(dest.parent))
    except OSError:
        return []
    out = []
    for e in entries:
        m = _TEMP.match(e.name)
        if m and m.group("name") == dest.name and not _pid_alive(int(m.group("pid"))):
            out.append(Path(e.path))
    return sorted(out)


def remove_stale_outputs(dest: str | os.PathLike[str]) -> list[Path]:
    """Remove what :func:`stale_outputs` finds; returns what was removed."""
    removed = []
    for p in stale_outputs(dest):
        try:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
        except OSError:
            pass  # another run removed it first, or it is not ours to remove
    return removed


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """Refuse an output file path that names a directory or anything but a regular file
    (a device, a FIFO, a socket): those are never replaced."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise EchoError(f"{p}: cannot write ({e.strerror or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise EchoError(f"{p}: is a directory (give a file name)")
    if not stat.S_ISREG(st.st_mode):
        raise EchoError(f"{p}: exists and is not a regular file (a device, FIFO or socket); "
                        "refusing to replace it")
    return p


def _is_output_error(e: OSError, tmp: Path | None) -> bool:
    name = e.filename if isinstance(e.filename, str) else None
    if tmp is not None and name is not None and (name == str(tmp) or name.startswith(str(tmp) + os.sep)):
        return True
    return name is None and e.errno in _OUTPUT_ERRNOS


@contextlib.contextmanager
def output_errors(dest: str | os.PathLike[str], tmp: Path | None = None) -> Iterator[None]:
    """Turn an OSError met while writing ``dest`` (through ``tmp``) into one EchoError that names
    ``dest``, the user's path, never the temporary name."""
    try:
        yield
    except EchoError:
        raise
    except OSError as e:
        if not _is_output_error(e, tmp):
            raise
        raise EchoError(f"{dest}: cannot write ({e.strerror or e})") from None


def _prepare_parent(dest: Path) -> None:
    with output_errors(dest):
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise EchoError(f"{dest}: cannot write ({dest.parent} is not a directory)") from None
        except OSError as e:
            raise EchoError(f"{dest}: cannot write ({e.strerror or e})") from None
    remove_stale_outputs(dest)


def temp_file_beside(dest: str | os.PathLike[str]) -> tuple[int, str]:
    """``(fd, name)`` of a new temporary file beside ``dest`` (0600 until published), named so
    that a later run recognises it if this one is killed. Checks ``dest`` and its folder."""
    dest = check_output_file(dest)
    _prepare_parent(dest)
    with output_errors(dest):
        try:
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=_temp_prefix(dest), suffix=".tmp")
        except OSError as e:
            raise EchoError(f"{dest}: cannot write ({e.strerror or e})") from None
    return fd, tmp


def publish_file(tmp: str | os.PathLike[str], dest: str | os.PathLike[str]) -> None:
    """Rename a finished temporary file onto ``dest`` (the last of concurrent writers wins)."""
    dest = Path(dest)
    check_output_file(dest)  # it may have become a directory or a device meanwhile
    with output_errors(dest, Path(tmp)):
        publish_mode(tmp)
        os.replace(tmp, dest)


class atomic_file:  # noqa: N801 - used as a context manager like open()
    """Write to a temporary file beside ``path``; rename into place only on success.

    ``path`` must be a regular file or not exist; any failure removes the temporary file and
    is reported against ``path``."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._tmp: BinaryIO | None = None
        self._name = ""

    def __enter__(self) -> BinaryIO:
        fd, self._name = temp_file_beside(self.path)
        self._tmp = os.fdopen(fd, "wb")
        return self._tmp

    def __exit__(self, exc_type, exc, tb) -> bool:
        assert self._tmp is not None
        try:
            with output_errors(self.path, Path(self._name)):
                self._tmp.close()
                if exc_type is None:
                    publish_file(self._name, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self._name)
            raise
        if exc_type is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._name)
            if issubclass(exc_type, OSError) and _is_output_error(exc, Path(self._name)):
                raise EchoError(f"{self.path}: cannot write ({exc.strerror or exc})") from None
        return False


class _HashingWriter:
    """A binary sink that hashes what passes through it (graph files are hashed as written)."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self._f.write(data)


_REPLACE_TRIES = 50


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str], *, replaceable: Callable[[Path], bool] | None = None,
               kind: str = "an earlier output") -> Iterator[Path]:
    """Yield a temporary directory beside ``dest``; on success it replaces ``dest`` whole.

    An existing non-empty ``dest`` is replaced only when ``replaceable(dest)`` says it is an
    earlier output of the same kind, so a mistyped path never wipes a user's folder. On any
    failure the temporary directory is removed and ``dest`` is left as it was. Concurrent
    writers of one ``dest`` all succeed, the last one's output stays; a writer that cannot get
    its turn after many tries says the output is in use. Leftovers of killed runs beside
    ``dest`` are removed first."""
    dest = Path(dest)
    _check_dest_dir(dest, replaceable, kind)
    _prepare_parent(dest)
    with output_errors(dest):
        try:
            tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(dest), suffix=".tmp", dir=dest.parent))
        except OSError as e:
            raise EchoError(f"{dest}: cannot write ({e.strerror or e})") from None
    try:
        with output_errors(dest, tmp):
            publish_mode(tmp)
            yield tmp
            _check_dest_dir(dest, replaceable, kind)
            _swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class WrittenBy:
    """The test :func:`atomic_dir` takes for "an earlier output of this writer": the folder
    holds ``required`` (when given) and nothing but regular files whose paths (relative,
    ``/``-separated) match one of ``patterns`` (fnmatch), with the folders on their way. One
    file of the user's (a ``notes.txt``), a symlink or a FIFO makes the folder the user's,
    never replaced: replacing a folder deletes everything in it."""

    def __init__(self, patterns: tuple[str, ...], required: str | None):
        self.required = required
        self.globs = patterns if required is None else (required, *patterns)

    def __call__(self, folder: Path) -> bool:
        return self.foreign(folder) is None

    def foreign(self, folder: Path) -> str | None:
        """What makes ``folder`` not this writer's output (the first such entry), or None."""
        first = _first_foreign(folder, "", self.globs)
        if first is None and self.required is not None and not (folder / self.required).is_file():
            return f"no {self.required}"
        return first


def written_by(*patterns: str, required: str | None = None) -> WrittenBy:
    """A :class:`WrittenBy` test for ``patterns`` (and the ``required`` file)."""
    return WrittenBy(patterns, required)


def check_output_dir(dest: str | os.PathLike[str], replaceable: Callable[[Path], bool], kind: str) -> None:
    """The cheap checks of :func:`atomic_dir`, for a verb to run before its long work: ``dest``
    is absent, empty or ``replaceable``, and a folder can be made beside it (the nearest
    existing folder above is writable: a temporary folder is made there and removed, nothing
    else is touched)."""
    dest = Path(dest)
    _check_dest_dir(dest, replaceable, kind)
    _check_writable_beside(dest)


def check_writable_file(dest: str | os.PathLike[str]) -> None:
    """The cheap checks of :func:`atomic_file`, for a verb to run before its long work: ``dest``
    is absent or a regular file, and a file can be made beside it."""
    _check_writable_beside(check_output_file(dest))


def _check_writable_beside(dest: Path) -> None:
    """The nearest existing folder above ``dest`` is a folder we can write in: a temporary
    folder is made there and removed, nothing else is touched."""
    above = dest.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise EchoError(f"{dest}: cannot write ({above} is not a directory)")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=_temp_prefix(dest), suffix=".tmp", dir=above))
    except OSError as e:
        raise EchoError(f"{dest}: cannot write ({e.strerror or e})") from None


def _first_foreign(folder: Path, rel: str, globs: tuple[str, ...]) -> str | None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as e:
        return f"{rel or '.'} ({e.strerror or e})"
    for entry in entries:
        path = f"{rel}{entry.name}"
        if entry.is_dir(follow_symlinks=False):
            if not any(g.startswith(path + "/") for g in globs):
                return f"{path}/"
            inner = _first_foreign(Path(entry.path), path + "/", globs)
            if inner is not None:
                return inner
        elif not (entry.is_file(follow_symlinks=False) and any(fnmatch.fnmatchcase(path, g) for g in globs)):
            return path
    return None


def _check_dest_dir(dest: Path, replaceable: Callable[[Path], bool] | None, kind: str) -> None:
    """Refuse to replace what is not ours to replace. Another writer of the same output may
    move it aside while we look (see :func:`_swap_in`): then look again."""
    for _ in range(_REPLACE_TRIES):
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            raise EchoError(f"{dest}: exists and is not a directory")
        try:
            nonempty = holds_more_than_leftovers(dest)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise EchoError(f"{dest}: cannot write ({e.strerror or e})") from None
        if nonempty and not (replaceable and replaceable(dest)):
            try:
                same = os.lstat(dest).st_ino == st.st_ino
            except FileNotFoundError:
                same = False
            if not same:     # replaced while we looked
                continue
            why = replaceable.foreign(dest) if isinstance(replaceable, WrittenBy) else None
            if why and not why.startswith("no "):
                raise EchoError(f"{dest}: holds {why}, which echo-et did not write: not {kind}; refusing to "
                                "replace it (replacing a folder deletes what is in it)")
            raise EchoError(f"{dest}: exists and is not {kind}; refusing to replace it")
        return
    raise EchoError(f"{dest}: output in use (another run keeps replacing it); try again")


def _swap_in(tmp: Path, dest: Path) -> None:
    """Rename ``tmp`` onto ``dest``, moving an existing ``dest`` aside first (a rename cannot
    replace a non-empty directory). Another writer may swap in between: then try again."""
    for _ in range(_REPLACE_TRIES):
        old = None
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=_temp_prefix(dest), suffix=".old", dir=dest.parent))
            try:
                os.replace(dest, old / "d")
            except FileNotFoundError:  # another writer moved it aside first
                pass
        try:
            os.replace(tmp, dest)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        time.sleep(0.01)
    raise EchoError(f"{dest}: output in use (another run keeps replacing it); try again")


# -- job directories ------------------------------------------------------------------------
def is_job_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


# What save_job writes, and so the only Job folder it replaces (see written_by).
is_job_output = written_by(f"{GRAPH_DIR}/*{GRAPH_SUFFIX}", required=MANIFEST_NAME)
JOB_OUTPUT_KIND = "an echo-et job directory"


def check_job_output(dest: str | os.PathLike[str]) -> None:
    """Refuse, before any long work, a Job output that :func:`save_job` would refuse or
    could not write (see :func:`check_output_dir`)."""
    check_output_dir(dest, is_job_output, JOB_OUTPUT_KIND)


def read_manifest(job_dir: str | os.PathLike[str]) -> pb.JobManifest:
    """The manifest of a Job directory, with its graph references proven safe to follow: each
    a relative path inside the directory, listed once, with a SHA-256 digest."""
    p = Path(job_dir) / MANIFEST_NAME
    if not p.is_file():
        raise EchoError(f"{job_dir}: not an echo-et job directory (no {MANIFEST_NAME})")
    m = pb.JobManifest()
    try:
        with open_regular(p) as f:
            data = f.read(MAX_MESSAGE + 1)
        if len(data) > MAX_MESSAGE:
            raise EchoError(f"{p}: manifest is larger than {MAX_MESSAGE} bytes")
        m.ParseFromString(data)
    except DecodeError as e:
        raise EchoError(f"{p}: manifest does not decode ({e})") from None
    except OSError as e:
        raise EchoError(f"{p}: cannot read ({_reason(e)})") from None
    if not m.schema_version.startswith("echo-et/"):
        raise EchoError(f"{p}: not an echo-et manifest")
    _check_graph_refs(m, Path(job_dir), p)
    return m


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _check_graph_refs(m: pb.JobManifest, root: Path, where: Path) -> None:
    ids: set[str] = set()
    paths: set[str] = set()
    for ref in m.graphs:
        what = f"{where}: graph {ref.id!r}"
        if ref.id in ids:
            raise EchoError(f"{what} is listed twice")
        ids.add(ref.id)
        rel = Path(ref.path)
        if not ref.path or rel.is_absolute() or ".." in rel.parts or "\\" in ref.path or "\x00" in ref.path:
            raise EchoError(f"{what}: path {ref.path!r} is not a relative path inside the job directory")
        norm = rel.as_posix()
        if norm in paths:
            raise EchoError(f"{what}: file {ref.path!r} is also another graph's")
        paths.add(norm)
        if not _SHA256.match(ref.sha256):
            raise EchoError(f"{what}: sha256 {ref.sha256!r} is not a SHA-256 hex digest")


def load_job(job_dir: str | os.PathLike[str]) -> Job:
    """Open a Job directory; graphs are read when first used, each checked against the
    manifest (inside the directory, its SHA-256, its node count, its id)."""
    root = Path(job_dir)
    manifest = read_manifest(root)
    refs = {g.id: g for g in manifest.graphs}

    def loader(graph_id: str) -> Graph:
        ref = refs.get(graph_id)
        if ref is None:
            raise EchoError(f"{root}: graph {graph_id!r} is not listed in the manifest")
        path = root / ref.path
        try:
            inside = path.resolve().is_relative_to(root.resolve())
        except OSError as e:
            raise EchoError(f"{path}: cannot read ({_reason(e)})") from None
        if not inside:
            raise EchoError(f"{path}: leads outside the job directory {root}")
        if not matches_sha256(path, ref.sha256):
            raise EchoError(f"{path}: content does not match the manifest's sha256 (the file was changed "
                            "or damaged)")
        g = read_graph(path)
        if g.id != graph_id:
            raise EchoError(f"{path}: header id {g.id!r} differs from manifest {graph_id!r}")
        if ref.nodes != len(g.stored_nodes):
            raise EchoError(f"{path}: holds {len(g.stored_nodes)} nodes, the manifest says {ref.nodes}")
        return g

    return Job(manifest, loader=loader, source=str(root))


def _graph_file_name(graph_id: str, taken: set[str] | None = None) -> str:
    """``graphs/<id>.graph`` with unsafe characters replaced; when two ids map to the same
    name (``a/b`` and ``a_b``), the later one gets a hash of its id so neither is lost."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in graph_id)
    rel = f"{GRAPH_DIR}/{safe}{GRAPH_SUFFIX}"
    if taken is not None:
        if rel in taken:
            digest = hashlib.sha256(graph_id.encode()).hexdigest()[:12]
            rel = f"{GRAPH_DIR}/{safe}-{digest}{GRAPH_SUFFIX}"
        taken.add(rel)
    return rel


def save_job(job: Job, job_dir: str | os.PathLike[str], *, overwrite: bool = True) -> Path:
    """Write ``job`` as a directory, atomically. Graph refs (path, node count, hash) are
    recomputed from the graphs themselves. Returns the directory path."""
    dest = Path(job_dir)
    if dest.exists() and not overwrite:
        raise EchoError(f"{dest}: already exists")
    with atomic_dir(dest, replaceable=is_job_output, kind=JOB_OUTPUT_KIND) as tmp:
        manifest = pb.JobManifest()
        manifest.CopyFrom(job.manifest)
        del manifest.graphs[:]
        taken: set[str] = set()
        for gid in job.graph_ids():
            g = job.graph(gid)
            rel = _graph_file_name(gid, taken)
            path = tmp / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                w = _HashingWriter(f)
                # As stored: repeat blocks stay blocks (GraphRef.nodes counts stored nodes).
                write_stored_graph(w, g)  # type: ignore[arg-type]
            manifest.graphs.add(id=gid, path=rel, nodes=len(g.stored_nodes), sha256=w.sha256.hexdigest())
        if not manifest.schema_version:
            manifest.schema_version = SCHEMA_VERSION
        (tmp / MANIFEST_NAME).write_bytes(manifest.SerializeToString(deterministic=True))
    return dest
