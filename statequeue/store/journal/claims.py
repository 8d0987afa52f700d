"""The claims and runner locks one journal store holds (promises 3 and 4).

A claim is a lock, not a record: byte ID of ``claims.lock`` write-locked (an
OFD lock, one open file description per claim) while item ID is claimed, or
``claims/ID.lock`` flock'd where there are no OFD locks. A runner holds
``runners/RUNNER.lock`` for its whole life. The kernel drops a lock when the
last process holding it dies, so liveness is told by locks, never by pid.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Any

import orjson

from statequeue.core.errors import StateQueueError, UsageError
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.locks import (
    CLAIMS,
    OFD_LOCKS,
    lock_is_free,
    lock_range,
    open_claims_probe,
    range_locked,
    try_lock,
    unlink_if_free,
)


class ClaimLocks:
    """The lock descriptors of the claims and runners of this process in
    ``folder``, and the probes of other processes' ones."""

    def __init__(self, folder: QueueFolder) -> None:
        self.folder = folder
        self._claims: dict[int, int] = {}
        self._claims_probe = -1  # claims.lock, opened once, to test other holders' claims
        self._runner_locks: dict[str, int] = {}

    def _claim_path(self, item_id: int) -> tuple[QueueFolder, str, str]:
        """The per-item claim file (no OFD locks, or an older version's claim)."""
        return self.folder, "claims", f"{item_id}.lock"

    def free(self, item_id: int) -> bool:
        """Whether nobody (this process included) holds item ``item_id``'s claim."""
        if item_id in self._claims:
            return False
        if OFD_LOCKS:
            if self._claims_probe < 0:
                self._claims_probe = open_claims_probe(self.folder)
            if self._claims_probe >= 0 and range_locked(self._claims_probe, item_id):
                return False
        return lock_is_free(*self._claim_path(item_id))

    def take(self, item_id: int) -> tuple[int, ...] | None:
        """Claim item ``item_id``: the descriptors that hold the claim (for
        the keeper and the child to inherit), or None if another holds it."""
        fd: int | None
        if not OFD_LOCKS:
            fd = try_lock(*self._claim_path(item_id), create=True)
        else:
            # Its own open file description per claim: the lock lasts until
            # the runner, the keeper and the child have all closed theirs.
            fd = self.folder.open_file(CLAIMS, os.O_RDWR | os.O_CREAT)
            if not lock_range(fd, item_id):
                os.close(fd)
                fd = None
        if fd is None:
            return None
        self._claims[item_id] = fd
        return (fd,)

    def drop(self, item_id: int) -> None:
        """Stop holding item ``item_id``'s claim (others that inherited it may still)."""
        fd = self._claims.pop(item_id, None)
        if fd is None:
            return
        os.close(fd)
        if OFD_LOCKS:
            return
        # Remove the lock file only if nobody else holds it. A descendant of
        # the child may still hold it: deleting the file then would let the
        # next claim create a fresh one and run a second copy alongside.
        unlink_if_free(*self._claim_path(item_id))

    def runner_alive(self, runner_id: str) -> bool:
        if runner_id in self._runner_locks:
            return True
        return not lock_is_free(self.folder, "runners", f"{runner_id}.lock")

    def liveness_fds(self, runner_id: str) -> tuple[int, ...]:
        """The fd holding ``runner_id``'s liveness lock (a flock: shared by
        every copy of the fd, so held while any of them is open)."""
        fd = self._runner_locks.get(runner_id)
        return () if fd is None else (fd,)

    def forget_runner(self, runner_id: str) -> None:
        """Remove a dead runner's lock file (if nobody holds it)."""
        unlink_if_free(self.folder, "runners", f"{runner_id}.lock")

    def lock_runner(self, runner_id: str) -> None:
        """Take ``runner_id``'s liveness lock (UsageError if it is in use)."""
        fd = try_lock(self.folder, "runners", f"{runner_id}.lock", create=True)
        if fd is None:
            raise UsageError(f"runner id {runner_id} is already in use")
        self._runner_locks[runner_id] = fd

    def undo_lock_runner(self, runner_id: str) -> None:
        """Undo ``lock_runner`` (registering the runner failed)."""
        fd = self._runner_locks.pop(runner_id)
        self.folder.unlink(f"{runner_id}.lock", sub="runners")
        os.close(fd)

    def unlock_runner(self, runner_id: str) -> None:
        """Remove and release ``runner_id``'s lock (it unregistered)."""
        fd = self._runner_locks.pop(runner_id, None)
        if fd is not None:
            with suppress(FileNotFoundError):
                self.folder.unlink(f"{runner_id}.lock", sub="runners")
            os.close(fd)

    def publish(self, runner_id: str, rows: list[list[Any]]) -> None:
        """Make ``rows`` (JSON, one line) the content of this process's runner
        ``runner_id``'s lock file: what it shows ``status`` (its workers)."""
        fd = self._runner_locks.get(runner_id)
        if fd is None:
            return
        text = orjson.dumps(rows)
        # No fsync: figures for a person, gone with the runner. A reader that
        # comes between the write and the truncate reads up to the newline.
        with suppress(OSError):
            os.pwrite(fd, text + b"\n", 0)
            os.ftruncate(fd, len(text) + 1)

    def published(self, runner_id: str) -> list[Any]:
        """The rows runner ``runner_id`` published ([] if none, or unreadable)."""
        try:
            fd = self.folder.open_file(f"{runner_id}.lock", os.O_RDONLY, sub="runners")
        except (OSError, StateQueueError):
            return []
        try:
            found = orjson.loads(os.read(fd, 65536).partition(b"\n")[0])
        except (OSError, orjson.JSONDecodeError):  # nothing yet, or torn
            return []
        finally:
            os.close(fd)
        return found if isinstance(found, list) else []

    def close(self) -> None:
        """Release every claim and runner lock this process holds."""
        for item_id in list(self._claims):
            os.close(self._claims.pop(item_id))
        if self._claims_probe >= 0:
            os.close(self._claims_probe)
            self._claims_probe = -1
        for rid in list(self._runner_locks):
            os.close(self._runner_locks.pop(rid))
