"""Exit codes of this process's children that someone other than their owner reaped.

In the guarded shape the runner is a subreaper that reaps every child it
has (run/local_keeper.py): orphans adopted from its items, but also a child
other code of the same process started and waits for itself (the journal's
background compaction). That code finds its child gone (ECHILD, which
``subprocess`` reports as exit 0) and asks here for the real code.
"""

from __future__ import annotations

_MAX = 256  # codes kept; orphans' are never asked for, so the oldest go first

_codes: dict[int, int] = {}


def record(pid: int, code: int) -> None:
    """``pid`` was reaped with ``code`` (an exit code, or -signal)."""
    _codes[pid] = code
    if len(_codes) > _MAX:
        del _codes[next(iter(_codes))]


def take(pid: int) -> int | None:
    """The code ``pid`` was reaped with elsewhere, once; None if it was not."""
    return _codes.pop(pid, None)
