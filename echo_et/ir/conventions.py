"""Node-naming conventions one part writes and another reads.

The ex-situ tracer (``echo_et.trace``) writes them and passes read them back; both depend on
the IR, so the convention lives here, below both, rather than in either.
"""

from __future__ import annotations

# Name prefix of the host operator put where a communication call was issued
# ("issue:send", "issue:all_reduce"); the communication node itself hangs off it.
ISSUE_PREFIX = "issue:"
