"""Waiting in tests for what another process does: a poll with a deadline, a process's end."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

DEADLINE = 60.0  # generous: the machine is shared


def until(check: Callable[[], object], what: str, timeout: float = DEADLINE) -> object:
    """``check()``'s first true value, polled every 20 ms; fails naming ``what`` late."""
    end = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.02)


def gone(pid: int) -> bool:
    """True once ``pid`` has ended (a zombie, not ours to reap, counts)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH: it ended between open and read
        return True
    return stat.rsplit(") ", 1)[-1].startswith("Z")
