"""The locks of a queue folder: flock on whole files (the queue ``lock``,
runners' liveness locks, older versions' per-item claims) and OFD byte-range
locks in ``claims.lock`` (one byte per item id, one open file description per
claim, so the claim lasts until the runner, the keeper and the child have all
closed theirs). Every file is opened relative to the folder handle."""

from __future__ import annotations

import errno
import fcntl
import math
import os
import struct
import time
from pathlib import Path

from statequeue.core.errors import LockTimeout, NoAccess, UsageError
from statequeue.store.journal.folder import QueueFolder

CLAIMS = "claims.lock"
# struct flock (64-bit Linux): type, whence, start, len, pid; l_pid is 0 for OFD locks.
FLOCK = struct.Struct("@hhqqi4x")
OFD_LOCKS = hasattr(fcntl, "F_OFD_SETLK") and FLOCK.size == 32
LOCK_TIMEOUT_ENV = "STATEQUEUE_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT = 60.0


def lock_timeout() -> float:
    """Seconds to wait for the queue lock: $STATEQUEUE_LOCK_TIMEOUT, default 60."""
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "")
    if not raw:
        return DEFAULT_LOCK_TIMEOUT
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    # NaN compares false, so it was taken as 0 (never wait), and -5 as 0 too;
    # inf stays: wait as long as it takes.
    if not seconds >= 0:
        raise UsageError(f"{LOCK_TIMEOUT_ENV} must be a number of seconds >= 0, not {raw!r}")
    return seconds


def wait_for_lock(fd: int, path: Path, limit: float | None = None) -> None:
    """flock ``fd`` exclusively, waiting up to the lock timeout (then LockTimeout)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return
    except BlockingIOError:
        pass
    limit = lock_timeout() if limit is None else limit
    deadline = time.monotonic() + limit
    pause = 0.001
    while True:
        time.sleep(pause)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"{path} is held by another process (waited {limit:g}s; "
                    f"set {LOCK_TIMEOUT_ENV} to wait longer)"
                ) from None
            pause = min(pause * 2, 0.05)


def try_lock(folder: QueueFolder, sub: str, name: str, *, create: bool) -> int | None:
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    fd = folder.open_file(name, flags, sub=sub)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def runner_locks_held(path: Path) -> bool:
    """Whether a runner holds its lock in the queue folder at ``path``, read
    without opening the journal (for `drop` of a queue too damaged to open)."""
    folder = QueueFolder.open(path, create=False)
    try:
        try:
            names = folder.names("runners")
        except NoAccess:
            raise
        except UsageError:  # ``runners`` is not a folder: no runner can hold a lock in it
            return False
        return not all(_runner_lock_free(folder, n) for n in names)
    finally:
        folder.close()


def _runner_lock_free(folder: QueueFolder, name: str) -> bool:
    """lock_is_free for a runner's lock, where a folder in its place (a broken
    queue being dropped) is a lock nobody can hold."""
    try:
        return lock_is_free(folder, "runners", name)
    except IsADirectoryError:
        return True


def lock_is_free(folder: QueueFolder, sub: str, name: str) -> bool:
    """True when nobody holds a flock on ``name`` in ``sub`` (a missing file is free)."""
    try:
        fd = try_lock(folder, sub, name, create=False)
    except FileNotFoundError:
        return True
    if fd is None:
        return False
    os.close(fd)
    return True


def open_claims_probe(folder: QueueFolder) -> int:
    """claims.lock opened to test others' claims (F_OFD_GETLK needs no write
    access, so a read-only queue can be inspected); -1 if it does not exist
    yet (nobody has claimed anything through it)."""
    try:
        return folder.open_file(CLAIMS, os.O_RDONLY)
    except FileNotFoundError:
        return -1


def lock_range(fd: int, item_id: int) -> bool:
    """Write-lock byte ``item_id`` of the claims file; False if another holds it."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, item_id, 1, 0))
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def range_locked(fd: int, item_id: int) -> bool:
    """True when another open file description holds byte ``item_id``."""
    probe = FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, item_id, 1, 0)
    found = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
    return bool(FLOCK.unpack(found)[0] != fcntl.F_UNLCK)


def unlink_if_free(folder: QueueFolder, sub: str, name: str) -> None:
    """Remove the lock file ``name`` in ``sub`` only if nobody holds it. A
    holder (a descendant of a child that inherited a claim) would otherwise
    keep a lock that the next taker, creating a fresh file, never sees."""
    try:
        probe = try_lock(folder, sub, name, create=False)
    except FileNotFoundError:
        return
    if probe is not None:  # still free while we hold it: nobody is using it
        try:
            # Only the file probed: its name may have gone to a new file meanwhile
            # (removed by its holder, made again and locked), which stays.
            here = folder.stat(name, sub=sub)
            mine = os.fstat(probe)
            if (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino):
                folder.unlink(name, sub=sub)
        except FileNotFoundError:
            pass
        finally:
            os.close(probe)
