"""The queue's space reserve: a small file, ``reserve``, that a run keeps so
that a full disk cannot keep it from handing its items back.

A run that finds the disk full stops without acknowledging (exit 6). The
items it had in flight go back as pending with a record each; on a disk
with no room left that record could not be written either, and the next
run would recover them as if their runner had died, counting a crash (three
such stops and an innocent item is held as poison). So, as databases do, a
run keeps 64 KiB allocated in the queue folder, and removes it to write
those records when a write of the journal found the disk full.

Best effort both ways: a reserve that cannot be made (the disk is full
already, a file system without ``posix_fallocate``) leaves the run as it
was before there were reserves. No fsync, on purpose: the reserve holds no
data; a crash that loses it loses nothing, and the next run makes it again.
"""

from __future__ import annotations

import contextlib
import os

from statequeue.core.errors import NoAccess
from statequeue.store.journal.folder import QueueFolder

NAME = "reserve"
SIZE = 64 * 1024  # a few hundred release records: far more than any -j gives back


def keep(folder: QueueFolder) -> bool:
    """Make sure ``folder``'s reserve exists and holds SIZE bytes allocated
    (created O_EXCL, 0600, our own regular file: ``open_own``). False if it
    could not be made (the disk is full, ...). A link or another user's file
    at the name raises UnsafeFolder, as every file of the queue folder does."""
    made = True
    try:
        fd = folder.open_file(NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        made = False
        fd = folder.open_file(NAME, os.O_WRONLY)
    except (OSError, NoAccess):  # no room for an inode; a queue the user may only read
        return False
    try:
        os.posix_fallocate(fd, 0, SIZE)  # no-op where it is allocated already
    except OSError:
        if made:  # a part of a reserve would only take room the run needs
            with contextlib.suppress(OSError):
                folder.unlink(NAME)
        return False
    finally:
        os.close(fd)
    return True


def free(folder: QueueFolder) -> bool:
    """Remove ``folder``'s reserve, freeing its space now; False if there was
    none to remove (or it could not be)."""
    try:
        folder.unlink(NAME)
    except OSError:
        return False
    return True
