"""Reading and writing graph files and Job directories.

A graph file is a stream of length-delimited protobuf messages: one GraphHeader, then Nodes
until EOF (the same framing as Chakra's ``.et``), so a graph is written and read one node at
a time. Gzip is detected by its magic bytes on read. A Job directory holds ``manifest.pb``
and ``graphs/<id>.graph``; it is written to a temporary sibling and renamed into place so
that a failed write never leaves a half-written Job.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import shutil
import tempfile
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


def open_maybe_gzip(path: str | os.PathLike[str]) -> BinaryIO:
    """Open for binary reading, transparently un-gzipping when the file starts with 1f 8b."""
    f = open(path, "rb")  # noqa: SIM115 - returned to the caller
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
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise EchoError(f"{where}: cannot read ({e})") from None


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


def write_graph_stream(f: BinaryIO, header: pb.GraphHeader, nodes: Iterable[pb.Node]) -> int:
    if not header.schema_version:
        header.schema_version = SCHEMA_VERSION
    write_delimited(f, header)
    count = 0
    for n in nodes:
        write_delimited(f, n)
        count += 1
    return count


def write_graph(graph: Graph, path: str | os.PathLike[str]) -> None:
    with atomic_file(path) as f:
        write_graph_stream(f, graph.header, graph.nodes)


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


class atomic_file:  # noqa: N801 - used as a context manager like open()
    """Write to a temporary file beside ``path``; rename into place only on success."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._tmp: tempfile._TemporaryFileWrapper[bytes] | None = None

    def __enter__(self) -> BinaryIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.NamedTemporaryFile(
            "wb", dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp", delete=False
        )
        return self._tmp  # type: ignore[return-value]

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._tmp is not None
        self._tmp.close()
        if exc_type is None:
            publish_mode(self._tmp.name)
            os.replace(self._tmp.name, self.path)
        else:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp.name)


class _HashingWriter:
    """A binary sink that hashes what passes through it (graph files are hashed as written)."""

    def __init__(self, f: BinaryIO):
        self._f = f
        self.sha256 = hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        return self._f.write(data)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str], *, replaceable: Callable[[Path], bool] | None = None,
               kind: str = "an earlier output") -> Iterator[Path]:
    """Yield a temporary directory beside ``dest``; on success it replaces ``dest`` whole.

    An existing non-empty ``dest`` is replaced only when ``replaceable(dest)`` says it is an
    earlier output of the same kind, so a mistyped path never wipes a user's folder. On any
    failure the temporary directory is removed and ``dest`` is left as it was."""
    dest = Path(dest)
    if dest.exists():
        if not dest.is_dir():
            raise EchoError(f"{dest}: exists and is not a directory")
        if any(dest.iterdir()) and not (replaceable and replaceable(dest)):
            raise EchoError(f"{dest}: exists and is not {kind}; refusing to replace it")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    publish_mode(tmp)
    try:
        yield tmp
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(dest, old)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- job directories ------------------------------------------------------------------------
def is_job_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / MANIFEST_NAME).is_file()


def read_manifest(job_dir: str | os.PathLike[str]) -> pb.JobManifest:
    p = Path(job_dir) / MANIFEST_NAME
    if not p.is_file():
        raise EchoError(f"{job_dir}: not an echo-et job directory (no {MANIFEST_NAME})")
    m = pb.JobManifest()
    try:
        m.ParseFromString(p.read_bytes())
    except DecodeError as e:
        raise EchoError(f"{p}: manifest does not decode ({e})") from None
    if not m.schema_version.startswith("echo-et/"):
        raise EchoError(f"{p}: not an echo-et manifest")
    return m


def load_job(job_dir: str | os.PathLike[str]) -> Job:
    """Open a Job directory; graphs are read when first used."""
    root = Path(job_dir)
    manifest = read_manifest(root)
    paths = {g.id: root / g.path for g in manifest.graphs}

    def loader(graph_id: str) -> Graph:
        if graph_id not in paths:
            raise EchoError(f"{root}: graph {graph_id!r} is not listed in the manifest")
        g = read_graph(paths[graph_id])
        if g.id != graph_id:
            raise EchoError(f"{paths[graph_id]}: header id {g.id!r} differs from manifest {graph_id!r}")
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
    with atomic_dir(dest, replaceable=is_job_dir, kind="an echo-et job directory") as tmp:
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
                write_graph_stream(w, g.header, g.nodes)  # type: ignore[arg-type]
            manifest.graphs.add(id=gid, path=rel, nodes=len(g.nodes), sha256=w.sha256.hexdigest())
        if not manifest.schema_version:
            manifest.schema_version = SCHEMA_VERSION
        (tmp / MANIFEST_NAME).write_bytes(manifest.SerializeToString(deterministic=True))
    return dest
