"""Attempt numbers as the read commands find them: the attempt a log is
of (its name), and the latest attempt an item's records name."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from statequeue.core.views import ItemHistory

__all__ = ["attempt_of", "latest_attempt", "logged_attempt"]


def logged_attempt(path: str) -> int:
    """The attempt a log is of: its name is ID.N.log (a file's, or a stored log's)."""
    return int(os.path.basename(path).split(".")[1])


def latest_attempt(h: ItemHistory) -> int:
    return max((attempt_of(e) for e in h.events), default=0)


def attempt_of(record: dict[str, Any]) -> int:
    kind = record.get("t")
    if kind == "item":  # carried over by compaction: counts its attempts so far
        return int(record.get("attempts", 0))
    return int(record.get("attempt", 0)) if kind in ("start", "end", "arch") else 0
