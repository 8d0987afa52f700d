"""The queue's space reserve: a small file, ``reserve``, that a run keeps so
that a full disk cannot keep it from handing its items back.

A run that finds the disk full stops without acknowledging (exit 6). The
items it had in flight go back as pending with a record each; on a disk
with no room left that record could not be written either, and the next
run would recover them as if their runner had died, counting a crash (three
such stops and an innocent item is held as poison). So, as databases do, a
run keeps 64 KiB allocated in the queue folder, and removes it to write
those records when a write of the journal found the disk full.

Best effort where it cannot be made for other reasons (a file system
without ``posix_fallocate``, a queue the user may only read): the run goes on
as it was before there were reserves. But a disk with no room for it refuses
the run (DiskFull, exit 6, before anything is claimed): such a run would
fill the disk at once and, with no room to give its items back, leave them to
be recovered as crashes (an outside tester's item was held as poison after
three such runs). No fsync, on purpose: the reserve holds no data; a crash
that loses it loses nothing, and the next run makes it again.
"""

from __future__ import annotations

import contextlib
import errno
import os

from statequeue.core.errors import DiskFull, NoAccess
from statequeue.store.journal.folder import QueueFolder

NAME = "reserve"
SIZE = 64 * 1024  # a few hundred release records: far more than any -j gives back
_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def keep(folder: QueueFolder) -> bool:
    """Make sure ``folder``'s reserve exists and holds SIZE bytes allocated
    (created O_EXCL, 0600, our own regular file: ``open_own``). False if it
    could not be made for want of support or rights; DiskFull when the disk
    (or the user's quota) has no room for it. A link or another user's file
    at the name raises UnsafeFolder, as every file of the queue folder does."""
    made = True
    try:
        fd = folder.open_file(NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        made = False
        fd = folder.open_file(NAME, os.O_WRONLY)
    except OSError as exc:  # no room for an inode; a queue the user may only read
        if exc.errno in _NO_ROOM:
            raise _no_room(folder) from None
        return False
    except NoAccess:
        return False
    try:
        os.posix_fallocate(fd, 0, SIZE)  # no-op where it is allocated already
    except OSError as exc:
        if made:  # a part of a reserve would only take room the run needs
            with contextlib.suppress(OSError):
                folder.unlink(NAME)
        if exc.errno in _NO_ROOM:
            raise _no_room(folder) from None
        return False
    finally:
        os.close(fd)
    return True


def _no_room(folder: QueueFolder) -> DiskFull:
    full = DiskFull(
        f"no room on the disk of {folder.path} for the queue's {SIZE // 1024} KiB space"
        " reserve: free some space first (a run that filled the disk could not give its"
        " items back, and they would count as crashes); nothing was claimed"
    )
    full.path = str(folder.path / NAME)
    return full


def free(folder: QueueFolder) -> bool:
    """Remove ``folder``'s reserve, freeing its space now; False if there was
    none to remove (or it could not be)."""
    try:
        folder.unlink(NAME)
    except OSError:
        return False
    return True
