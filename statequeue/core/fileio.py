"""The file operations the durable store uses, behind one swappable object.

Everything that touches the disk on the durability path goes through a
``FileOps``: tests swap in a layer that records operations, fails them, or
simulates a power cut. A test-only crash hook (``STATEQUEUE_TEST_CRASH``, off
unless a test sets it) SIGKILLs the process at the k-th operation of a kind.
"""

from __future__ import annotations

import errno
import os
import signal
import stat

from statequeue.core.errors import (
    DiskFull,
    DurabilityError,
    FolderAtFileName,
    ShortOfResources,
    UnsafeFolder,
    shortage_remedy,
)

CRASH_ENV = "STATEQUEUE_TEST_CRASH"
CRASH_KINDS = ("write", "fsync", "rename", "dirfsync", "spawn", "recorded")


class CrashPoints:
    """Test-only: SIGKILL this process at the k-th operation of a given kind.

    Configured by ``STATEQUEUE_TEST_CRASH=KIND:K`` (for example ``fsync:3``).
    When the variable is unset, ``hit`` is a dictionary lookup and nothing more.
    """

    def __init__(self, spec: str | None) -> None:
        self.kind = ""
        self.target = 0
        self.count = 0
        if spec:
            kind, _, k = spec.partition(":")
            if kind in CRASH_KINDS and k.isdigit():
                self.kind, self.target = kind, int(k)

    def hit(self, kind: str) -> None:
        if kind != self.kind:
            return
        self.count += 1
        if self.count == self.target:
            os.kill(os.getpid(), signal.SIGKILL)


CRASH = CrashPoints(os.environ.get(CRASH_ENV))


class FolderEntry(str):
    """A name relative to an open folder fd, shown (and compared) as its full path.

    A ``str``, so that it passes through ``FileOps``, whose test layers take and
    inspect plain paths, while ``FileOps`` itself acts relative to ``dir_fd``
    (so no component of the path can be swapped for a link meanwhile).
    ``name`` "." is the folder itself.
    """

    dir_fd: int
    name: str

    def __new__(cls, shown: str, dir_fd: int, name: str) -> FolderEntry:
        entry = super().__new__(cls, shown)
        entry.dir_fd = dir_fd
        entry.name = name
        return entry


class FileOps:
    """Plain POSIX file operations, following DESIGN.md's durability recipe."""

    def write_all(self, fd: int, data: bytes) -> None:
        """Write every byte of ``data`` (looping on short writes)."""
        view = memoryview(data)
        while view:
            CRASH.hit("write")
            written = os.write(fd, view)
            view = view[written:]

    def fsync(self, fd: int) -> None:
        """fsync ``fd``. A failure is final: it is never retried."""
        CRASH.hit("fsync")
        os.fsync(fd)

    def fsync_dir(self, path: str) -> None:
        """fsync the folder ``path`` so that a create or rename in it is durable."""
        CRASH.hit("dirfsync")
        if isinstance(path, FolderEntry) and path.name == ".":
            os.fsync(path.dir_fd)  # the folder is held open already
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        """Atomically rename ``src`` over ``dst``."""
        CRASH.hit("rename")
        if isinstance(src, FolderEntry) and isinstance(dst, FolderEntry):
            os.replace(src.name, dst.name, src_dir_fd=src.dir_fd, dst_dir_fd=dst.dir_fd)
            return
        os.replace(src, dst)

    def truncate(self, fd: int, size: int) -> None:
        """Cut the file open as ``fd`` back to ``size`` bytes."""
        os.ftruncate(fd, size)


DEFAULT_OPS = FileOps()


def durability_error(action: str, path: str, exc: OSError) -> DurabilityError:
    """The error raised when a write or fsync fails; the caller must stop."""
    reason = "disk full" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    said = f"{action} {path} failed: {reason}; stopped without acknowledging"
    if (remedy := shortage_remedy(exc)) is not None:  # exit 10, not 6: not the disk's fault
        return ShortOfResources(f"{said} ({remedy})")
    if exc.errno == errno.ENOSPC:  # a caller that knows what frees space says so
        full = DiskFull(said)
        full.path = path
        return full
    return DurabilityError(said)


_OWN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


def open_own(name: str, flags: int, dir_fd: int | None, mode: int = 0o600, shown: str = "") -> int:
    """os.open of ``name`` (relative to ``dir_fd``) for a file of statequeue's
    own in a checked folder: never through a link (ELOOP), never blocking on
    a FIFO (O_NONBLOCK, which a regular file ignores), and only a regular
    file this user owns, or UnsafeFolder naming ``shown`` (else ``name``).

    The one check of every file opened in a queue folder or a scratch folder
    (sshd's StrictModes for authorized_keys): a file planted there while the
    folder was open to others is refused, never read, written or locked. One
    fstat per open, nothing more: the runner opens claims and logs per item."""
    # O_TRUNC only after the check: another user's file is refused, not emptied.
    truncate = flags & os.O_TRUNC
    try:
        fd = os.open(name, (flags & ~os.O_TRUNC) | _OWN_FLAGS, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.EISDIR:  # opened to write: a folder at the name
            raise folder_at(shown or name) from None
        if exc.errno != errno.ENXIO:  # a FIFO with no reader (O_WRONLY), a socket
            raise
        raise UnsafeFolder(
            f"{shown or name} is not a regular file; statequeue refuses to use it (remove it)"
        ) from None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
        if truncate and st.st_size:
            try:
                os.ftruncate(fd, 0)
            except BaseException:
                os.close(fd)
                raise
        return fd
    os.close(fd)
    raise UnsafeFolder(foreign_file(shown or name, st))


def folder_at(shown: str) -> FolderAtFileName:
    """The refusal of a folder standing where statequeue keeps the file ``shown``."""
    return FolderAtFileName(
        f"{shown} is a folder, not a regular file; statequeue refuses to use it (remove it)"
    )


def foreign_file(shown: str, st: os.stat_result) -> str:
    """Why the file ``shown`` (with status ``st``) is refused by ``open_own``."""
    if not stat.S_ISREG(st.st_mode):
        kind = _KINDS.get(stat.S_IFMT(st.st_mode), "not a regular file")
        return f"{shown} is {kind}, not a regular file; statequeue refuses to use it (remove it)"
    me = os.geteuid()
    return (
        f"{shown} is owned by uid {st.st_uid}, not by you (uid {me}); statequeue refuses to "
        f"use it (remove it)"
    )


def create_own(name: str, dir_fd: int | None, shown: str = "") -> int:
    """``name`` (relative to ``dir_fd``) created or truncated for writing by
    ``open_own``. Whatever is at the name (a link, a FIFO, another user's
    file, put there by a child or while the folder was open to others; or an
    older file of ours) is removed, the link itself, never its target, and a
    file of our own is created in its place (O_EXCL): nothing at the name is
    ever opened. For a
    file statequeue makes afresh in a folder it checked (an attempt's log):
    nobody else can put anything back. A folder there raises OSError."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return open_own(name, flags, dir_fd, shown=shown)
    except FileExistsError:  # a link too: O_EXCL never follows one
        pass
    os.unlink(name, dir_fd=dir_fd)  # a folder: OSError, no log
    return open_own(name, flags, dir_fd, shown=shown)
