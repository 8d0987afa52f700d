"""Exit codes of this process's children that someone other than their owner reaped.

In the guarded shape the runner is a subreaper that reaps every child it
has (run/local_keeper.py): orphans adopted from its items, but also a child
other code of the same process started and waits for itself (the journal's
background compaction). That code finds its child gone (ECHILD, which
``subprocess`` reports as exit 0) and asks here for the real code.
"""

from __future__ import annotations

_expected: set[int] = set()  # children this process's own code started and waits for
_codes: dict[int, int] = {}


def expect(pid: int) -> None:
    """``pid`` is a child this process started for itself (no item's): the
    runner's keeper neither counts it as an item's process nor keeps an
    orphan's code under a pid that may be reused."""
    _expected.add(pid)
    _codes.pop(pid, None)


def expected(pid: int) -> bool:
    """Whether ``pid`` was registered with ``expect`` (and not taken yet)."""
    return pid in _expected


def record(pid: int, code: int) -> None:
    """``pid`` was reaped with ``code`` (an exit code, or -signal); kept
    only for a registered child."""
    if pid in _expected:
        _codes[pid] = code


def take(pid: int) -> int | None:
    """The code ``pid`` was reaped with elsewhere, once; None if it was not.
    Ends the registration."""
    _expected.discard(pid)
    return _codes.pop(pid, None)
