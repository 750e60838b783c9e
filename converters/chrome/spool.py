"""The streamed timeline writer's scratch file: each event stored as it comes (``marshal``;
``pickle`` for what marshal refuses) and read back by its position, in an unnamed temporary
file (removed when closed, or by the system when the process dies)."""

from __future__ import annotations

import marshal
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path

from echo_et.ir.timeline import TimelineEvent, TimelineStream

# A lower bound on the bytes one event's record takes (measured: 114 to 119 bytes the smallest,
# 127 to 173 on average, simulated timelines of fixtures/jobs, the DLRM trace and the README's
# predict; the Kineto text of the same event is 210 to 290 bytes).
RECORD_MIN_BYTES = 100


def scratch_dir(dest: str | os.PathLike[str]) -> Path:
    """The folder in which the timeline writer's scratch file for ``dest`` is made: the
    output's own folder (beside one file; in the temporary folder that a folder of rank files
    is written in, beside it), so the scratch takes the output's file system."""
    return Path(dest).absolute().parent


@dataclass(frozen=True)
class ScratchEstimate:
    """The scratch file a write needs at its largest, next to what it has written."""

    where: Path     # the folder it is made in
    events: int     # the event records it holds then
    bytes: int      # a lower bound on its size then

    def describe(self) -> str:
        return f"{self.events:,} events, >= {RECORD_MIN_BYTES} bytes each"

_EVENT_FIELDS = ("rank", "track", "name", "start_ns", "duration_ns", "category", "track_order", "args", "kind",
                 "stream", "node_id", "launch_id")


class Spool:
    """The events of a timeline in an unnamed scratch file, each read back by its position."""

    def __init__(self, where: Path):
        self.f = tempfile.TemporaryFile(dir=where)  # noqa: SIM115 - closed by close()
        self.fd = self.f.fileno()
        self.end = 0
        self.streams: list[TimelineStream | None] = []   # held: their ids key _stream_ix
        self._stream_ix: dict[int, int] = {}

    def put(self, e: TimelineEvent) -> tuple[int, int]:
        """Store ``e``; (offset, size) of its record."""
        ix = self._stream_ix.get(id(e.stream))
        if ix is None:
            ix = self._stream_ix[id(e.stream)] = len(self.streams)
            self.streams.append(e.stream)
        args = e.args if type(e.args) is dict else dict(e.args)
        rec = (e.rank, e.track, e.name, e.start_ns, e.duration_ns, e.category, e.track_order, args,
               e.kind, ix, e.node_id, e.launch_id)
        try:
            data = b"m" + marshal.dumps(rec)
        except ValueError:   # a value marshal does not take (a subclass of int or str, ...)
            data = b"p" + pickle.dumps(rec, protocol=pickle.HIGHEST_PROTOCOL)
        self.f.write(data)
        at = self.end
        self.end += len(data)
        return at, len(data)

    def ready(self) -> None:
        """Make what was stored readable (before :meth:`get`)."""
        self.f.flush()

    def get(self, at: int, size: int) -> TimelineEvent:
        data = os.pread(self.fd, size, at)
        rec = marshal.loads(data[1:]) if data[:1] == b"m" else pickle.loads(data[1:])  # noqa: S301 - our own file
        # The event's own fields, set without TimelineEvent's frozen __init__ (6 us a box, most
        # of the cost of reading one back); the stream is the very object the event had.
        e = object.__new__(TimelineEvent)
        e.__dict__.update(zip(_EVENT_FIELDS, rec, strict=True))
        e.__dict__["stream"] = self.streams[rec[9]]
        return e

    def reset(self) -> None:
        """Forget every record (the streams stay known)."""
        self.f.seek(0)
        self.f.truncate()
        self.end = 0

    def close(self) -> None:
        self.f.close()
