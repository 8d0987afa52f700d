"""`compact --keep-logs DUR`: the logs of finished items, removed once old.

Compaction moves finished results to the archive, but each attempt's output
stays in ``logs/ID.N.log``: 500 items left 500 files for ever. Once an item is
done (archived, or to be archived by the compaction that follows) its logs are
kept for ``keep`` seconds after they were last written, then removed here.
`compact` does this before it writes anything: removing needs no space, and on
a full disk the logs are what frees room for the archive and the new journal.
Logs of items that are not done (pending, running, failed, held, cancelled)
are never touched: they are what a person looks at to fix or retry an item.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable

from statequeue.core.views import LogsRemoved
from statequeue.store.journal.folder import QueueFolder

__all__ = ["remove_finished_logs"]

_LOG_NAME = re.compile(r"(\d+)\.\d+\.log\Z")


def remove_finished_logs(
    folder: QueueFolder, is_finished: Callable[[int], bool], keep: float
) -> LogsRemoved:
    """Remove every log file of a finished item last written more than
    ``keep`` seconds ago; what was removed. Never follows a link."""
    try:
        fd = folder.subfolder("logs")
    except FileNotFoundError:
        return LogsRemoved()
    cutoff = time.time() - keep
    files = size = 0
    for name in folder.names("logs"):
        found = _LOG_NAME.match(name)
        if found is None or not is_finished(int(found.group(1))):
            continue
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_mtime > cutoff:
            continue
        with contextlib.suppress(FileNotFoundError):  # removed meanwhile: not ours to count
            os.unlink(name, dir_fd=fd)
            files, size = files + 1, size + info.st_size
    if files:
        os.fsync(fd)  # the removals are durable before compact reports them
    return LogsRemoved(files, size)
