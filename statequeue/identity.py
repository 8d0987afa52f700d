"""Who this process is: runner ids, host and boot id (never the environment)."""

from __future__ import annotations

import os
import time

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
    import socket  # here, not at the top: enqueue never needs them
    import uuid

    return RunnerInfo(
        runner_id=uuid.uuid4().hex[:16],
        pid=os.getpid(),
        host=socket.gethostname(),
        boot_id=boot_id(),
        started_at=time.time(),
        command=command,
    )
