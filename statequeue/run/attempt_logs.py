"""Handing a finished attempt's log to a store that keeps logs itself.

The runner writes each attempt's output to a local file while it runs (see
jobs.py). A store whose queue is shared by many hosts (PostgreSQL) stores that
output when the attempt ends, so that `logs` and `show` work from any host;
the local file is then removed. For the journal store the file is the log.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from statequeue.core.errors import StateQueueError
from statequeue.core.fileio import open_own
from statequeue.core.models import Claim
from statequeue.store.base import Store


def hand_over_log(store: Store, claim: Claim, path: Path | None) -> None:
    """Store ``path`` (``claim``'s log, capped by --log-limit) and remove it,
    for a store that keeps logs; a stale claim's log stays where it is."""
    if path is None or not store.stores_logs:
        return
    try:
        # The child may have put a FIFO there since (the folder is its
        # result's): only a regular file of this user's is read, never waited
        # on, never through a link (fileio.open_own).
        fd = open_own(str(path), os.O_RDONLY, None)
    except (OSError, StateQueueError):  # gone, a link, a FIFO, another's: nothing of ours
        return
    with open(fd, "rb") as f:
        data = f.read()
    try:
        stored = store.save_log(claim, data)
    except StateQueueError:
        # A log must never cost a result: the finish that follows meets the
        # same trouble (a lost connection) and deals with it; the log stays here.
        return
    if stored:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
