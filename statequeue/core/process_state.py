"""What a process of this host is doing, read from /proc/PID/stat: its
state (stopped by a signal: SIGSTOP, ctrl-Z, a debugger; a zombie), its
parent, and when it began. Where there is no /proc, nothing is known: a
process is never said to be stopped."""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the name (the state first, then the
    parent's pid); None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    end = stat.rfind(b")")  # the name, in parentheses, may hold anything
    return stat[end + 2 :].split()


def state(pid: int) -> bytes:
    """Process ``pid``'s state letter (b"R", b"S", b"T", b"Z", ...); b"" if unknown."""
    fields = stat_fields(pid)
    return fields[0] if fields else b""


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (Unix time), to tell it from a later
    process given the same pid; None if unknown."""
    fields = stat_fields(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None


def stopped_since(pid: int, since: float) -> bool:
    """Whether the process that registered at ``since`` as ``pid`` is stopped
    by a signal (state T) or a tracer (t): not a later process given the same
    pid, which began after (the clock's tick rounds its start: a second's
    slack). Both stores' `status` ask it of their runners on this host."""
    if state(pid) not in (b"T", b"t"):
        return False
    began = started_at(pid)
    return began is not None and began <= since + 1.0
