"""``Queue.compact``: the logs of finished items first, then the rewrite.

An outside tester filled a small disk with a run's logs and asked `compact
--keep-logs 0s` to free it: compaction appended to the archive first, failed
for want of space (exit 6), and never reached the logs, so only `rm` by hand
freed the disk. Removing a file needs no space, and on a full disk the logs
are what frees room for the archive and the new journal: they go first, and
stay removed even when the rewrite then fails. A rewrite that still finds the
disk full says what frees space.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from statequeue.core.errors import DiskFull

if TYPE_CHECKING:
    from statequeue.core.views import CompactResult, LogsRemoved
    from statequeue.store.base import Store

__all__ = ["compact_store"]


def compact_store(store: Store, keep_logs: float) -> CompactResult:
    """Remove the logs of finished items older than ``keep_logs`` seconds,
    then compact ``store``; DiskFull, saying what frees space, if the
    rewrite finds no room even so."""
    removed = store.remove_finished_logs(keep_logs)
    try:
        result = store.compact()
    except DiskFull as exc:
        raise DiskFull(f"{exc.message} ({_what_frees_space(keep_logs, removed)})") from None
    return dataclasses.replace(result, logs_removed=removed)


def _what_frees_space(keep_logs: float, removed: LogsRemoved) -> str:
    if keep_logs > 0:  # newer logs of finished items may still be there
        return (
            "`statequeue compact --keep-logs 0s` frees space: "
            "it removes every finished item's logs first"
        )
    n = removed.files
    done = f"removed {n} log{'' if n == 1 else 's'} of finished items, not enough"
    if not n:
        done = "no logs of finished items to remove"
    return f"{done}: free space on the disk, then run `statequeue compact` again"
