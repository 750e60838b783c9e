"""Pause Python's cyclic garbage collector while the simulator builds its timeline.

The event loop allocates millions of small containers that all stay alive until the
result is made (meeting tuples, each collective's participant list, per-item dicts), and
none of them becomes cyclic garbage (the participant lists, which link the ranks' states to
one another, are dropped once the result is made: tests/test_sim_memory.py). Every
allocation burst still triggers the cyclic collector, whose full passes walk every live
container: about a quarter of a run without symmetry at 1,024 ranks (``python
benchmarks/sim_speed.py --one 1024 off``), more at 8,192. Reference counting still frees
everything that dies; the collector resumes (as it was) when the run ends, however it ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Disable the cyclic collector for the block; restore its previous state after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
