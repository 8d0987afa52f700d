"""Writing a cache file (state.ckpt, keys.ckpt, stats.ckpt) beside the journal.

A cache is never the truth, and losing it costs only time, so it is written
to a temp name and renamed, without fsync: a crash leaves an old, empty or
torn file, which its reader's checks (checksums, the journal position it
names) refuse. The same code for all three, so they fail the same way.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING

from statequeue.core.errors import StateQueueError

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder


def write_cache(
    folder: QueueFolder, name: str, parts: Iterable[bytes], *, staged: str | None = None
) -> bool:
    """Write ``parts`` to ``name`` (temp + rename), or leave them under the
    temp name ``staged`` for a compaction to rename with the journal they
    name. False if it could not be written: the queue works the same."""
    # The thread too: a `stats` and the refresh after a checkpoint (a thread,
    # store/stats_refresh.py) may write the same cache at once in one process.
    tmp = staged or f".{name}.{os.getpid()}-{threading.get_native_id()}.tmp"
    try:
        fd = folder.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for data in parts:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        if staged is None:
            os.replace(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    except (OSError, StateQueueError):  # a link or no access: the queue works without it
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        return False
    return True
