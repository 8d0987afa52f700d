"""Who this process is: runner ids, host and boot id (never the environment)."""

from __future__ import annotations

import os
import socket
import time
import uuid

from statequeue.models import RunnerInfo


def boot_id() -> str:
    """The kernel's boot id, or "" where the platform has none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def new_runner(command: tuple[str, ...] = ()) -> RunnerInfo:
    """A fresh identity for a runner starting now in this process."""
    return RunnerInfo(
        runner_id=uuid.uuid4().hex[:16],
        pid=os.getpid(),
        host=socket.gethostname(),
        boot_id=boot_id(),
        started_at=time.time(),
        command=command,
    )
