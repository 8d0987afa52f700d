"""What a process of this host is doing, where `status` tells it: stopped by
a signal (SIGSTOP, ctrl-Z, a debugger), and since when it runs. From
/proc; where there is none, a process is never said to be stopped."""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the name (the state first); None if unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    end = stat.rfind(b")")  # the name, in parentheses, may hold anything
    return stat[end + 2 :].split()


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state T) or by a tracer (t)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[:1] in ([b"T"], [b"t"])


def started_at(pid: int) -> float | None:
    """When process ``pid`` started (Unix time), to tell it from a later
    process given the same pid; None if unknown."""
    fields = _stat_fields(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        with open("/proc/stat", "rb") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith(b"btime "))
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, ValueError):
        return None
