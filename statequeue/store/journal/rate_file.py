"""The queue's shared start rate on this machine: the token bucket
(rate_bucket.py) in a small file, ``rate``, read and rewritten under a flock
on the file itself, so every runner of the queue takes its starts from one
bucket without taking the queue's own lock.

No fsync, on purpose: the bucket is pacing state, not acknowledged data
(DESIGN.md's recipe is for results). A crash that loses an update, or tears
the file, at worst lets one burst of items start early; a file that does not
parse is a fresh, full bucket. The queue's records never depend on it.
"""

from __future__ import annotations

import fcntl
import os
import time

import orjson

from statequeue.store.journal.folder import QueueFolder
from statequeue.store.rate_bucket import Bucket, BucketChange, bucket_from

NAME = "rate"
_MAX_BYTES = 4096


class RateFile:
    """The ``rate`` file of one queue folder, opened on first use."""

    def __init__(self, folder: QueueFolder) -> None:
        self._folder = folder
        self._fd = -1

    def update(self, change: BucketChange, *, create: bool = True) -> Bucket | None:
        """Apply ``change`` to the bucket under the file's flock (at the time
        it is given) and write back what it returns (None: nothing changed).
        Returns the bucket after. Without ``create``, a queue that never had
        a bucket reads as None (``status`` creates no file)."""
        if self._fd < 0:
            try:
                self._fd = self._folder.open_file(NAME, os.O_RDWR | (os.O_CREAT if create else 0))
            except FileNotFoundError:
                return None
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            try:
                found = bucket_from(orjson.loads(os.pread(self._fd, _MAX_BYTES, 0)))
            except orjson.JSONDecodeError:
                found = None  # new, or torn by a crash: start afresh (see the docstring)
            changed = change(found, time.time())
            if changed is None:
                return found
            data = orjson.dumps(changed.as_dict())
            os.pwrite(self._fd, data, 0)
            os.ftruncate(self._fd, len(data))
            return changed
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
