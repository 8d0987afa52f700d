"""Pausing Python's cyclic garbage collector around bulk work.

Replaying or enqueueing a million items creates millions of small acyclic
objects; each collection pass then rescans all of them (profiled: most of the
time of a 1M-item enqueue went to collections triggered inside ``_add``).
Reference counting still frees everything; only cycle detection waits.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-entrant)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
