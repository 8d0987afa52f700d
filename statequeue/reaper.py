"""Children die with their runner: a small watchdog process per run.

The runner tells the reaper, through a pipe, the process group of every child
it starts ("+PGID") and, just before it reaps one, that it is gone ("-PGID";
an unreaped child keeps its pid, so the group id cannot be reused in
between). When the pipe closes -- the runner exited, or was killed with -9 --
the reaper SIGKILLs every group still listed, then exits.

This costs one process per run, not one per item (PR_SET_PDEATHSIG needs a
pre-exec hook, which rules out posix_spawn, and reaches only the direct
child; a group kill reaches its descendants too). A descendant that leaves
its group (setsid) escapes; it still holds the item's claim lock, so the item
is not run again while it lives.
"""

from __future__ import annotations

import contextlib
import os
import sys

REAPER_CODE = """
import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
live = set()
for line in sys.stdin.buffer:
    try:
        group = int(line[1:])
    except ValueError:
        continue
    if line[:1] == b"+":
        live.add(group)
    else:
        live.discard(group)
for group in live:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class Reaper:
    """The runner's side of the watchdog. Every method is best effort: if the
    reaper cannot start or has gone, runs go on without it."""

    def __init__(self) -> None:
        self._fd = -1
        self.pid = 0
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", REAPER_CODE],
                os.environ,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, read_end, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                ],
                setsid=True,  # terminal signals must not reach it
            )
            self._fd = write_end
        except OSError:
            os.close(write_end)
        finally:
            os.close(read_end)

    def _send(self, line: bytes) -> None:
        if self._fd < 0:
            return
        try:
            os.write(self._fd, line)
        except OSError:  # it died: carry on without it
            os.close(self._fd)
            self._fd = -1

    def watch(self, pgid: int) -> None:
        self._send(b"+%d\n" % pgid)

    def forget(self, pgid: int) -> None:
        self._send(b"-%d\n" % pgid)

    def close(self) -> None:
        """The run is over: the reaper kills what is still listed, and exits."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = 0
