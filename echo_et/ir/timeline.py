"""A timeline box: what ran, on which rank and track, when (job clock, ns).

The one event type that the measured timeline of a Job (``echo_et.converters.chrome``) and
the simulated one (``echo_et.sim.timeline``) both produce; it lives in the IR, below both, so
the simulator never imports a converter. The Chrome/Perfetto writer is
``echo_et.converters.chrome.write_timeline``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TimelineEvent:
    """One box on a timeline: what ran, on which rank and track, when (job clock, ns)."""

    rank: int
    track: str                  # track (thread) name, e.g. the stream name
    name: str
    start_ns: int
    duration_ns: int
    category: str = ""          # e.g. "compute", "collective", "send"
    track_order: int = 0        # tracks of a rank are sorted by (track_order, track)
    args: Mapping[str, object] = field(default_factory=dict)
