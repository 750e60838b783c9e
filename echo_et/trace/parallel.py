"""Tracing the distinct ranks of a layout on several cores (meta device only).

The ranks a ``verify stage`` trace runs are known before it starts (the lowest rank of each
pipeline stage) and each is traced on its own, so once the first one has warmed the process
it forks: each child traces its share and sends back the
:class:`~echo_et.trace.session.RankRun` (pickled), the parent traces the rest. A rank's
trace does not depend on which ranks the process traced before (tests compare the Jobs byte
for byte), so the result is the serial one. Only the meta device, with PyTorch's OpenMP pool
kept at one thread (a forked child does not get the pool's threads and would wait for them
forever); real-device traces are bounded by the device anyway.

A child that fails, dies or returns something unreadable costs only time: the parent
traces that child's ranks itself (so an error is reported exactly as a serial trace
reports it).
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any

Traced = dict[int, tuple[Any, str]]     # rank -> (RankRun, structure hash)


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the system says; else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def can_fork() -> bool:
    """Linux only: elsewhere (macOS) system libraries are not safe in a forked child."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def shares(ranks: Sequence[int], jobs: int) -> list[list[int]]:
    """``ranks`` dealt round-robin to ``jobs`` workers (the stages are of similar size)."""
    out: list[list[int]] = [[] for _ in range(max(1, min(jobs, len(ranks))))]
    for i, r in enumerate(ranks):
        out[i % len(out)].append(r)
    return out


def trace_in_parallel(ranks: Sequence[int], jobs: int, trace_one: Callable[[int], tuple[Any, str]]
                      ) -> Traced:
    """``trace_one(rank)`` for every rank, on ``jobs`` processes (this one included).
    A rank missing from the answer was in the share of a child that failed: the caller
    traces it itself."""
    # The first rank warms the process (imports, PyTorch's first calls of each kernel): a
    # child forked after it inherits that instead of paying it again.
    out: Traced = {ranks[0]: trace_one(ranks[0])}
    parts = shares(ranks[1:], jobs)
    children: list[tuple[int, int, list[int]]] = []       # (pid, read fd, ranks)
    for share in parts[1:]:
        r_fd, w_fd = os.pipe()
        pid = os.fork()
        if pid == 0:   # the child: trace, send, leave without running the parent's exit code
            os.close(r_fd)
            code = 0
            try:
                payload = pickle.dumps({r: trace_one(r) for r in share}, protocol=pickle.HIGHEST_PROTOCOL)
                with os.fdopen(w_fd, "wb") as w:
                    w.write(payload)
            except BaseException:  # noqa: BLE001 - the parent re-traces this share and reports
                code = 1
            os._exit(code)
        os.close(w_fd)
        children.append((pid, r_fd, share))
    # the parent's own share while the children work
    out.update({r: trace_one(r) for r in parts[0]})
    for pid, fd, _share in children:
        data = _read_all(fd)
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0 or not data:
            continue
        try:
            got = pickle.loads(data)
        except Exception:  # noqa: BLE001 - unreadable: traced again by the parent
            continue
        out.update(got)
    return out


def _read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as f:
        return f.read()
