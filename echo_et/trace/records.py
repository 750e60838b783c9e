"""What the recording process group writes down for each communication call (torch-free).

Span names mark each call in the profile: ``echo:comm#k`` around the call (its issue point;
any local output fill runs inside it) and ``echo:wait#k`` at the first ``wait()`` on its
work (its completion point).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_et.ir.conventions import ISSUE_PREFIX

COMM_SPAN = "echo:comm#"
WAIT_SPAN = "echo:wait#"
__all__ = ["COMM_SPAN", "ISSUE_PREFIX", "WAIT_SPAN", "CommRecord", "span_index"]


@dataclass
class CommRecord:
    """One communication call, as the real job would issue it."""

    index: int                    # issue order on this rank (0, 1, ...)
    op: str                       # COLLECTIVE_NAMES value, or "send" / "recv"
    group_ranks: tuple[int, ...]  # global ranks in group-rank order
    group_name: str
    group_desc: str
    in_bytes: int
    out_bytes: int
    dtype: str
    peer: int | None = None       # group rank of the P2P peer
    tag: int = 0
    root: int | None = None       # group rank of the root of rooted collectives
    waited: bool = False          # a wait() was seen (the completion point is known)

    @property
    def is_p2p(self) -> bool:
        return self.op in ("send", "recv")


def span_index(name: str, prefix: str) -> int | None:
    """k for a span named ``prefix + k``, else None."""
    if not name.startswith(prefix):
        return None
    try:
        return int(name[len(prefix):])
    except ValueError:
        return None
