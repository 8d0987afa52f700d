"""A queue's folder, held open: every file beneath it is reached through it.

The folder is opened once, O_DIRECTORY|O_NOFOLLOW relative to a checked home,
and every file and subfolder beneath it is opened, created, renamed, unlinked
and listed relative to that fd with O_NOFOLLOW. So a symbolic link planted in
the folder is never followed, and no component of the path can be swapped
for another folder after the check.

The check is sshd's StrictModes for ``~/.ssh``: the home, the queue folder
and its subfolders must be owned by the user (or root) and not writable by
group or others, or nobody but the user could have planted anything there.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from contextlib import suppress
from pathlib import Path

from statequeue.core.errors import (
    NoAccess,
    QueueNotFound,
    StateQueueError,
    UnsafeFolder,
    UsageError,
)
from statequeue.core.fileio import (
    DEFAULT_OPS,
    FileOps,
    FolderEntry,
    durability_error,
    open_own,
)
from statequeue.core.location import DIR_MODE, FILE_MODE, ensure_dir

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)
SUBFOLDERS = ("claims", "runners", "logs")


class QueueFolder:
    """The open folder of one queue. Not thread-safe; ``close`` releases it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd
        self._subs: dict[str, int] = {}

    @classmethod
    def open(cls, path: Path, *, create: bool, ops: FileOps = DEFAULT_OPS) -> QueueFolder:
        """Open (with ``create``, make) the queue folder ``path`` after checking
        its home and itself; QueueNotFound if it is missing and not ``create``."""
        home_fd = open_home(path.parent, create=create)
        try:
            fd = _open_queue_dir(home_fd, path, create=create, ops=ops)
        finally:
            os.close(home_fd)
        try:
            check_owner(os.fstat(fd), path, "queue folder")
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    @classmethod
    def open_nested(cls, home: Path, *names: str, ops: FileOps = DEFAULT_OPS) -> QueueFolder:
        """Open (making what is missing, 0700) ``home/names[0]/.../names[-1]``:
        the home checked as ``open_home`` does, each folder below it opened
        relative to the one above, never through a link, and checked like a
        queue folder. For folders outside a queue's, such as a database
        queue's scratch folder on this host."""
        fd = open_home(home, create=True)
        path = home
        try:
            for name in names:
                path = path / name
                parent, fd = fd, -1
                try:
                    fd = _open_queue_dir(parent, path, create=True, ops=ops)
                finally:
                    os.close(parent)
                check_owner(os.fstat(fd), path, "folder")
        except BaseException:
            if fd >= 0:
                os.close(fd)
            raise
        return cls(path, fd)

    # -- names -------------------------------------------------------------------

    def entry(self, name: str, *, sub: str | None = None) -> FolderEntry:
        """``name`` (in subfolder ``sub``) for FileOps.replace, shown as its full path."""
        shown = self.path / name if sub is None else self.path / sub / name
        return FolderEntry(str(shown), self.subfolder(sub), name)

    def itself(self) -> FolderEntry:
        """The folder itself, for FileOps.fsync_dir."""
        return FolderEntry(str(self.path), self.fd, ".")

    def shown(self, name: str, sub: str | None = None) -> str:
        """The full path of ``name``, for messages."""
        return str(self.path / name if sub is None else self.path / sub / name)

    # -- files -------------------------------------------------------------------

    def open_file(
        self, name: str, flags: int, *, sub: str | None = None, mode: int = FILE_MODE
    ) -> int:
        """os.open of ``name`` relative to the folder, never following a link.

        A link, or anything but a regular file this user owns (a FIFO, a file
        planted by another user while the folder was open to them), raises
        UnsafeFolder (``fileio.open_own``: never blocking on a FIFO); a
        permission error NoAccess naming the file; a missing file
        QueueNotFound if the folder itself was removed (the queue was dropped
        meanwhile); other errors (FileNotFoundError, ...) pass through."""
        try:
            return open_own(name, flags, self.subfolder(sub), mode, shown="")
        except UnsafeFolder as exc:  # the same kind, naming the file in full
            raise type(exc)(exc.message.replace(name, self.shown(name, sub), 1)) from None
        except OSError as exc:
            raise self._explain(exc, name, sub, writing=bool(flags & _WRITING)) from None

    def _explain(self, exc: OSError, name: str, sub: str | None, *, writing: bool) -> Exception:
        shown = self.shown(name, sub)
        if exc.errno == errno.ELOOP:
            return UnsafeFolder(
                f"{shown} is a symbolic link; statequeue does not follow links in a queue "
                "folder (remove it)"
            )
        if exc.errno in _DENIED:
            action = "write" if writing else "read"
            denied = NoAccess(f"cannot {action} {shown}: {exc.strerror}")
            denied.why = exc.strerror or denied.why
            return denied
        if exc.errno == errno.ENOENT and self.removed():
            return self.gone()
        exc.filename = shown
        return exc

    def removed(self, *, settle: float = 0.0) -> bool:
        """True when the folder was deleted since it was opened (a `drop` by
        another process, or an ``rm -r``), or its name now holds another
        folder (dropped and made again): every file it had is gone.

        ``settle``: seconds to keep looking while it is not (yet): a `drop`
        removes the journal, then at once the folder."""
        end = time.monotonic() + settle
        while not self._removed():
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)
        return True

    def _removed(self) -> bool:
        try:
            held = os.fstat(self.fd)
        except OSError:
            return False
        if held.st_nlink == 0:  # a removed folder has no name left
            return True
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino)

    def gone(self) -> QueueNotFound:
        """The error for using a queue whose folder was removed meanwhile."""
        return QueueNotFound(
            f"queue {self.path.name!r} was dropped: its folder {self.path} was removed "
            "after this process opened it"
        )

    def read_bytes(self, name: str) -> bytes:
        """The whole content of ``name``."""
        fd = self.open_file(name, os.O_RDONLY)
        with open(fd, "rb") as f:
            return f.read()

    def stat(self, name: str, *, sub: str | None = None) -> os.stat_result:
        """lstat of ``name`` (FileNotFoundError if missing)."""
        return os.stat(name, dir_fd=self.subfolder(sub), follow_symlinks=False)

    def exists(self, name: str, *, sub: str | None = None) -> bool:
        try:
            self.stat(name, sub=sub)
        except FileNotFoundError:
            return False
        return True

    def unlink(self, name: str, *, sub: str | None = None) -> None:
        """Remove ``name`` (a link itself, never its target); FileNotFoundError if missing."""
        os.unlink(name, dir_fd=self.subfolder(sub))

    def link(self, src: str, dst: str) -> None:
        """Hard-link ``src`` as ``dst`` (both in the folder), not following links."""
        os.link(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd, follow_symlinks=False)

    def names(self, sub: str | None = None) -> list[str]:
        """The names in the folder (or subfolder ``sub``; [] if it is missing)."""
        try:
            fd = self.subfolder(sub)
        except FileNotFoundError:
            return []
        return os.listdir(fd)

    # -- subfolders --------------------------------------------------------------

    def subfolder(self, sub: str | None, *, create: bool = False) -> int:
        """The fd of subfolder ``sub`` (the folder itself for None), opened once,
        O_NOFOLLOW, and checked like the folder. FileNotFoundError if it is
        missing and not ``create``."""
        if sub is None:
            return self.fd
        fd = self._subs.get(sub)
        if fd is None:
            fd = self._subs[sub] = self._open_sub(sub, create=create)
        return fd

    def _open_sub(self, sub: str, *, create: bool) -> int:
        try:
            fd = os.open(sub, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        except FileNotFoundError:
            if not create:
                raise
            _make_dir(self.fd, sub, self.shown(sub))
            fd = os.open(sub, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=self.fd)
        except OSError as exc:
            raise _not_a_folder(exc, self.path / sub) from None
        try:
            check_owner(os.fstat(fd), self.path / sub, "folder")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self) -> None:
        for fd in self._subs.values():
            os.close(fd)
        self._subs.clear()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_home(home: Path, *, create: bool) -> int:
    """An fd of the home folder, after checking it. The home itself may be a
    link (the user chose it); only what is beneath it must not be."""
    try:
        try:
            fd = os.open(home, _DIR_FLAGS)
        except FileNotFoundError:
            if os.path.islink(home):  # a link to nothing: said so, not "not a folder"
                gone = f"{home} links to {os.readlink(home)}, which does not exist"
                if not create:
                    raise QueueNotFound(f"no queues in {home} ({gone})") from None
                raise UsageError(f"home {gone}: make that folder, or choose another home") from None
            if not create:
                raise QueueNotFound(f"no queues in {home} (the folder does not exist)") from None
            ensure_dir(home)
            fd = os.open(home, _DIR_FLAGS)
    except NotADirectoryError:
        raise UsageError(f"home {home} exists and is not a folder") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # the library raised it bare (the CLI said exit 6)
            raise UsageError(f"home {home} is a loop of symbolic links") from None
        if exc.errno not in _DENIED:
            raise
        raise home_refused(home, exc) from None
    try:
        check_owner(os.fstat(fd), home, "home folder")
    except BaseException:
        os.close(fd)
        raise
    return fd


def home_refused(home: Path, exc: OSError) -> StateQueueError:
    """The error for a home this user may not open (``exc``: EACCES, EPERM,
    EROFS): another user's folder is unsafe (exit 9, as when it can be
    opened); else one this user may not read, or reach (exit 2), never a
    failing disk (exit 6)."""
    try:
        st = os.stat(home)
    except OSError:
        st = None  # not even reachable: a folder above it is closed to this user
    if st is not None:
        try:
            check_owner(st, home, "home folder")
        except UnsafeFolder as unsafe:
            return unsafe
    return NoAccess(
        f"cannot read home folder {home}: {exc.strerror} (fix: use a --home you may read and write)"
    )


def check_owner(st: os.stat_result, path: Path, what: str) -> None:
    """Refuse a folder that someone other than the user (or root) could write."""
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        raise UnsafeFolder(
            f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {me}); refusing to "
            f"use it (fix: chown {me} {path}, or use another --home)"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeFolder(
            f"{what} {path} is writable by group or others (mode {st.st_mode & 0o7777:04o}); "
            f"refusing to use it (fix: chmod 700 {path})"
        )


def remove_queue_folder(path: Path, *, last: str | None = None) -> None:
    """Delete the queue folder ``path`` and everything in it, relative to its
    checked home, never following a link (a linked queue folder is refused).

    ``last``: a file removed only after everything else, just before the
    folder itself (the journal: a process that has the queue open sees it
    gone only as the folder goes, and so tells a drop from damage)."""
    home_fd = open_home(path.parent, create=False)
    try:
        try:
            st = os.stat(path.name, dir_fd=home_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise QueueNotFound(f"no queue named {path.name!r} in {path.parent}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise _not_a_folder(OSError(errno.ENOTDIR, ""), path, link=stat.S_ISLNK(st.st_mode))
        import shutil  # lazy: start-up time (only removing a queue needs it)

        # rmtree with dir_fd walks by fds (O_NOFOLLOW): nothing outside is touched.
        try:
            if last is not None:
                _remove_all_but(home_fd, path.name, last)
            shutil.rmtree(path.name, dir_fd=home_fd)
        except OSError as exc:  # as every other write to a queue one may not change
            if exc.errno not in _DENIED:  # EROFS too: a read-only mount is not a failing disk
                raise
            entry = f" ({exc.filename})" if exc.filename else ""
            raise NoAccess(f"cannot write {path}: {exc.strerror}{entry}") from None
        os.fsync(home_fd)
    finally:
        os.close(home_fd)


def _remove_all_but(home_fd: int, name: str, last: str) -> None:
    """Delete everything in folder ``name`` (of the home ``home_fd``) but
    ``last``, never following a link."""
    import shutil  # lazy: start-up time (only removing a queue needs it)

    fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=home_fd)
    try:
        for entry in os.listdir(fd):
            if entry == last:
                continue
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry, dir_fd=fd)
            else:
                with suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)


def _open_queue_dir(home_fd: int, path: Path, *, create: bool, ops: FileOps) -> int:
    name = path.name
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=home_fd)
    except FileNotFoundError:
        if not create:
            raise QueueNotFound(f"no queue named {name!r} in {path.parent}") from None
    except OSError as exc:
        raise _not_a_folder(exc, path) from None
    _make_dir(home_fd, name, str(path))
    try:
        # The new folder's name is durable before anything in it is acknowledged.
        ops.fsync_dir(FolderEntry(str(path.parent), home_fd, "."))
    except OSError as exc:
        raise durability_error("creating", str(path), exc) from None
    try:
        return os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=home_fd)
    except OSError as exc:
        raise _not_a_folder(exc, path) from None


def _make_dir(parent_fd: int, name: str, shown: str) -> None:
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
    except FileExistsError:
        return  # made by another process meanwhile; opened and checked next
    except OSError as exc:
        raise NoAccess(f"cannot create {shown}: {exc.strerror}") from None
    with suppress(OSError):
        os.chmod(name, DIR_MODE, dir_fd=parent_fd)  # mkdir's mode is filtered by the umask


def _not_a_folder(exc: OSError, path: Path, *, link: bool | None = None) -> Exception:
    """The error for ``path`` failing an O_DIRECTORY|O_NOFOLLOW open."""
    if link is None:
        link = exc.errno == errno.ELOOP or os.path.islink(path)
    if link:
        return UnsafeFolder(
            f"{path} is a symbolic link; statequeue does not follow links to queue folders "
            f"(remove the link with `rm {path}`, or point --home at the real folder)"
        )
    if exc.errno == errno.ENOTDIR:
        return UsageError(f"{path} exists and is not a folder")
    if exc.errno in _DENIED:
        return NoAccess(f"cannot read {path}: {exc.strerror}")
    exc.filename = str(path)
    return exc
