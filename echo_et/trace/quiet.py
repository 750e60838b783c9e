"""Keep the profiler's own chatter off the user's terminal.

libkineto (C++) writes a ``USDT: ... profiler_start`` and a ``profiler_stop`` line (and
``STAGE:`` lines at some log levels) straight to file descriptor 2 each time a profiler
starts and stops: one pair per profiled step, so ``echo-et trace --steps 12`` printed over
a hundred. ``KINETO_LOG_LEVEL`` cannot drop them without dropping Kineto's errors too (it is
read once, and USDT is its highest level), so the profiler runs with fd 2 sent to a
temporary file, and every line that is not that chatter is passed on afterwards.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

KINETO_CHATTER = re.compile(r"^(USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] ")


@contextlib.contextmanager
def profiler_chatter_filtered() -> Iterator[None]:
    """Run the block with fd 2 captured; replay its lines to stderr except Kineto's chatter."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            kept = [line for line in tmp.read().decode(errors="replace").splitlines(keepends=True)
                    if not KINETO_CHATTER.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
