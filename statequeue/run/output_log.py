"""An attempt's output log: its start and its end, within ``--log-limit``.

A command's last lines are most often why it failed, and a log that kept only
its first ``--log-limit`` bytes lost them. The start of the output goes to the
file as it comes; past that, the last ``TAIL_MAX`` bytes at most (a quarter of
the limit for a small one) are kept in memory, and when the attempt ends
(``close``) they are written after a line saying how many bytes were left
out. The file never holds more than the limit and that line. A log is
best effort: a file that cannot be opened or written (a full disk, EIO) stops
the logging of that attempt, never the run (the result and its stderr tail
still go to the journal), and never the reading of the child's pipes (a child
blocked on a full pipe would hang). ``lost`` then says why, for the warning
and the end record's ``logcut`` (jobs.py), and ``kept`` how much is in the file.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from statequeue.core.errors import UnsafeFolder

TAIL_MAX = 1 << 18  # memory per running attempt for its tail: 256 KiB
MARK = b"\n[statequeue: log limit reached; %d bytes left out here]\n"


class OutputLog:
    """What a child writes on stdout and stderr, kept within ``limit`` bytes."""

    def __init__(self, limit: int, open_file: Callable[[], int]) -> None:
        self._tail_room = min(limit // 4, TAIL_MAX)
        self._head_room = limit - self._tail_room
        self._open_file = open_file  # opened at the first output: no output, no file
        self.fd = -1
        self.opened = False
        self._written = 0
        self._tail = bytearray()
        self._left_out = 0
        self._failed = False
        self.lost = ""
        """Why the log stopped short of the output ("disk full"), or "" while it is whole."""

    @property
    def kept(self) -> int:
        """The bytes of output in the file so far (where a cut log ends)."""
        return self._written

    def add(self, data: bytes) -> None:
        """Log ``data``: to the file while the start has room, else into the tail."""
        if self._failed:
            return
        if self.fd < 0:
            try:
                self.fd = self._open_file()
            except OSError as exc:  # e.g. a folder at its name (or no inode left)
                self._stop(exc)
                return
            except UnsafeFolder:  # the folder was put back meanwhile
                self._stop(None)
                return
            self.opened = True
        room = self._head_room - self._written
        if room > 0:
            head = data[:room]
            if not self._write(head):
                return
            data = data[room:]
            if not data:
                return
        tail = self._tail
        tail += data
        over = len(tail) - self._tail_room
        if over > 0:
            del tail[:over]
            self._left_out += over

    def close(self) -> None:
        """Write the tail (after the line saying what was left out) and close the file."""
        if self.fd < 0:
            return
        if self._left_out or self._tail:
            mark = MARK % self._left_out if self._left_out else b""
            self._write(mark + bytes(self._tail))
        self._tail = bytearray()
        os.close(self.fd)
        self.fd = -1

    def _write(self, data: bytes) -> bool:
        """Write all of ``data`` (a short write, as a disk fills, is followed
        by a write of the rest, which then fails and says why)."""
        if self._failed:
            return False
        view = memoryview(data)
        try:
            while view:
                done = os.write(self.fd, view)
                self._written += done
                view = view[done:]
        except OSError as exc:
            # A full disk must not stop the runner over a log: the result (and
            # its stderr tail) still go to the journal, which reports its own
            # errors; the item is told of (jobs.py), the rest of its output read and dropped.
            self._stop(exc)
            return False
        return True

    def _stop(self, exc: OSError | None) -> None:
        """Log no more of this attempt's output, and keep why."""
        self._failed = True
        self._tail = bytearray()
        self.lost = log_error_text(exc)


def log_error_text(exc: OSError | None) -> str:
    """Why a log could not be written, in the words `run`, `show` and `logs` use."""
    if exc is None:
        return "its folder was replaced"
    if exc.errno == errno.ENOSPC:
        return "disk full"
    if exc.errno == errno.EDQUOT:
        return "disk quota exceeded"
    if exc.errno == errno.EIO:
        return "I/O error"
    return exc.strerror or str(exc)
