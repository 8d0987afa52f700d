"""Children die with their runner: a small watchdog process per run.

The runner lists the process group of every child it starts in a small
shared file (a memfd), one 8-byte slot per running child, and zeroes the
slot just before it reaps that child (an unreaped child keeps its pid, so
the group id cannot be reused in between). The reaper itself only waits for
a pipe from the runner to close -- the runner exited, or was killed with -9
-- then reads the file and SIGKILLs every group still listed, and exits.

Nothing is ever written to that pipe: a pipe write per watch and per forget
woke the reaper twice per item, ~45 us each on the runner's side plus a
reaper wakeup competing for a CPU with the child. A slot write (pwrite) wakes
nobody and lands in the page cache at once, where the reaper reads it.

This costs one process per run, not one per item (PR_SET_PDEATHSIG needs a
pre-exec hook, which rules out posix_spawn, and reaches only the direct
child; a group kill reaches its descendants too). A descendant that leaves
its group (setsid) escapes; it still holds the item's claim lock, so the item
is not run again while it lives.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import sys

_SLOT = struct.Struct("<q")
_SLOTS_FD = 3  # where the reaper finds the slot file

REAPER_CODE = """
import os, signal, struct
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
while True:
    try:
        if not os.read(0, 512):
            break
    except InterruptedError:
        continue
data = b""
while chunk := os.pread(3, 65536, len(data)):
    data += chunk
for (group,) in struct.iter_unpack("<q", data[: len(data) // 8 * 8]):
    if group > 0:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
"""


class Reaper:
    """The runner's side of the watchdog. Every method is best effort: if the
    reaper cannot start, runs go on without it."""

    def __init__(self) -> None:
        self._pipe = -1
        self._slots = -1
        self.pid = 0
        self._where: dict[int, int] = {}  # pgid -> its slot's offset
        self._free: list[int] = []  # offsets of zeroed slots
        self._end = 0  # offset past the last slot ever used
        try:
            self._slots = _slot_file()
            read_end, write_end = os.pipe2(os.O_CLOEXEC)
        except OSError:
            self._close_slots()
            return
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", REAPER_CODE],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read_end, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, self._slots, _SLOTS_FD),
                ],
                setsid=True,  # terminal signals must not reach it
            )
            self._pipe = write_end
        except OSError:
            os.close(write_end)
            self._close_slots()
        finally:
            os.close(read_end)

    def watch(self, pgid: int) -> None:
        """List ``pgid``: it is killed if the runner dies from now on."""
        if self._slots < 0:
            return
        if self._free:
            offset = self._free.pop()
        else:
            offset, self._end = self._end, self._end + _SLOT.size
        self._where[pgid] = offset
        self._put(offset, pgid)

    def forget(self, pgid: int) -> None:
        """Unlist ``pgid`` (before its leader is reaped and the id freed)."""
        offset = self._where.pop(pgid, None)
        if offset is None:
            return
        self._put(offset, 0)
        self._free.append(offset)

    def _put(self, offset: int, pgid: int) -> None:
        try:
            os.pwrite(self._slots, _SLOT.pack(pgid), offset)
        except OSError:  # no memory for a slot: carry on without the reaper
            self._abandon()

    def _abandon(self) -> None:
        # A slot it could not clear may name a group id that gets reused:
        # the reaper must never act on it, so it dies without reading any.
        self._close_slots()
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def _close_slots(self) -> None:
        if self._slots >= 0:
            os.close(self._slots)
            self._slots = -1

    def close(self) -> None:
        """The run is over: the reaper kills what is still listed, and exits."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        if self.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0
        self._close_slots()


def _slot_file() -> int:
    """An anonymous file shared with the reaper (close-on-exec in the runner)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("statequeue-reaper", os.MFD_CLOEXEC)
    else:  # no memfd here: an unlinked temp file does the same
        import tempfile

        fd, path = tempfile.mkstemp(prefix="statequeue-reaper-")
        os.unlink(path)
    if fd > 2:
        return fd
    # With a standard stream closed it could be fd 0, which the spawn's
    # file actions overwrite before they copy it to fd 3.
    high: int = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _SLOTS_FD + 1)
    os.close(fd)
    return high
