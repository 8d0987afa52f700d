"""The traceback of a library attempt that raised, kept as that attempt's log.

A command's output is its log (run/jobs.py). For ``work()`` and ``map`` the
output that says what went wrong is the exception's traceback: it is written
where `statequeue logs ID` reads an attempt's output, through the store's
logs feature (store/base.py): ``save_log`` for a store that keeps logs itself
(PostgreSQL), else a file in the folder of ``logs_fd`` (the journal). A store
with neither (memory) keeps none.
"""

from __future__ import annotations

import contextlib
import traceback

from statequeue.core.errors import StateQueueError
from statequeue.core.fileio import create_own
from statequeue.core.models import Claim
from statequeue.store.base import Store

__all__ = ["LOG_LIMIT", "log_traceback"]

LOG_LIMIT = 1 << 20
"""At most this many bytes of a traceback are kept (``run --log-limit``'s default)."""


def log_traceback(store: Store, claim: Claim, exc: BaseException) -> None:
    """Keep ``exc``'s traceback as the log of ``claim``'s attempt; called before
    the attempt's failure is recorded. A log never costs a result: a log that
    cannot be written is left out."""
    text = "".join(traceback.format_exception(exc))
    data = text.encode("utf-8", "backslashreplace")[-LOG_LIMIT:]
    with contextlib.suppress(OSError, StateQueueError):
        if store.stores_logs:
            store.save_log(claim, data)  # made durable with the finish that follows
        elif store.logs_fd >= 0:
            _write_file(store.logs_fd, f"{claim.item_id}.{claim.attempt}.log", data)


def _write_file(folder_fd: int, name: str, data: bytes) -> None:
    # Relative to the folder the store holds open, never through a link, and
    # only a file of this user's (as jobs.py: what else is there is replaced).
    fd = create_own(name, folder_fd)
    with open(fd, "wb") as f:
        f.write(data)
