"""Where to write a file the user named (`export -o`, `report -o`).

Both write a new file beside the target and rename it over the target, so a
reader sees the old file or the new one, never half of one. That is right
for a regular file only. A path that names a device (`/dev/null`,
`/dev/stdout`), a FIFO or a socket is written through instead: renaming over
it would replace the node itself -- as root, `export -o /dev/null` replaced
the system's /dev/null with a regular file -- and a FIFO's reader would get
nothing. A symbolic link is followed, so the link stays and what it names
gets the new file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from statequeue.core.errors import (
    DiskFull,
    NoAccess,
    NotFound,
    StateQueueError,
    UnsafeFolder,
    UsageError,
)
from statequeue.core.fileio import durability_error


def output_target(path: Path) -> tuple[Path, bool]:
    """The path to replace (``path``, or what its links name) and whether to
    write into it as it is instead (it is there and is not a regular file)."""
    try:
        found = os.stat(path)  # follows links
    except FileNotFoundError:
        return _resolved(path), False  # new: created by the rename (a dangling link: its target)
    except OSError:
        return path, False  # the writer reports the error, naming the path
    refuse_foreign(path, found)
    if stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode):
        return _resolved(path), False  # a folder: refused by the writer, as before
    return path, True


def refuse_foreign(path: Path, found: os.stat_result) -> None:
    """UnsafeFolder (exit 9) when ``path`` (``found``: its stat, links
    followed) is another user's regular file or FIFO in a shared sticky
    folder (/tmp): the rule the kernel applies to an O_CREAT open there with
    fs.protected_regular=2 and fs.protected_fifos=2 (so a shell's `>` is
    refused), which writing through without O_CREAT, or renaming over it,
    would bypass. The folder's owner's files, and one's own, pass."""
    me = os.geteuid()
    if found.st_uid == me or not (stat.S_ISREG(found.st_mode) or stat.S_ISFIFO(found.st_mode)):
        return
    real = Path(os.path.realpath(path))
    try:
        folder = os.stat(real.parent)
    except OSError:
        return  # the writer reports it
    shared = folder.st_mode & stat.S_ISVTX and folder.st_mode & (stat.S_IWOTH | stat.S_IWGRP)
    if not shared or found.st_uid == folder.st_uid:
        return
    kind = "FIFO" if stat.S_ISFIFO(found.st_mode) else "file"
    raise UnsafeFolder(
        f"{path} is a {kind} owned by uid {found.st_uid}, not by you (uid {me}), in the shared "
        f"sticky folder {real.parent}; refusing to write it (as the kernel's protected_fifos "
        "and protected_regular refuse; name a file of your own)"
    )


def check_writable_place(path: Path) -> None:
    """Refuse, before any work, a ``path`` that cannot name the file to
    write: a folder (UsageError, exit 2: bad input, not a failing disk) or
    one inside a folder that is not there (NotFound, exit 7, as `import` of
    a missing file). `export -o` and `report -o` answer alike."""
    if path.is_dir():
        raise UsageError(f"{path} is a folder: name a file to write")
    if not path.parent.is_dir():
        raise NotFound(f"no such folder: {path.parent}")


def creation_refused(path: Path, exc: OSError) -> StateQueueError | None:
    """The error for ``exc``, met creating the new file beside ``path``, when
    the place refused it rather than the disk failing: its folder is gone
    (NotFound, exit 7), takes no new files, as /proc (UsageError), or may not
    be written (NoAccess); None for anything else (a failing write)."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        if not path.parent.is_dir():
            return NotFound(f"no such folder: {path.parent}")
        return UsageError(f"cannot write {path}: no new file can be created in {path.parent}")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return NoAccess(
            f"cannot write {path}: no new file can be created in {path.parent} ({exc.strerror})"
        )
    return None


def _resolved(path: Path) -> Path:
    """``path`` with its links followed (as far as they lead), else itself."""
    if not os.path.islink(path):
        return path
    try:
        return Path(os.path.realpath(path))
    except OSError:
        return path


def open_in_place(path: Path) -> int:
    """Open a device, FIFO or socket named by the user for writing (never
    creating or truncating anything)."""
    return os.open(path, os.O_WRONLY | os.O_CLOEXEC)


def output_failed(action: str, path: Path, exc: OSError) -> StateQueueError:
    """The error for a failed write of an output file the user named (`export
    -o`, `report -o`): as any durability error, but a full disk says to free
    space where ``path`` is, not how to shrink the queue (not its disk)."""
    error = durability_error(action, str(path), exc)
    if isinstance(error, DiskFull):
        return DiskFull(f"{error.message} (free space on the disk of {path})")
    return error
