"""Times as people read them, in the local time zone."""

from __future__ import annotations

import time


def local_time(epoch: float, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    """``epoch`` formatted with ``fmt``; a time no date can show (1e20, let in
    by an older import) as its number of seconds, never an OverflowError."""
    try:
        return time.strftime(fmt, time.localtime(epoch))
    except (OverflowError, OSError, ValueError):
        return f"{epoch:g}s after 1970"
