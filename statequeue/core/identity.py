"""Who this process is: runner ids, host and boot id (never the environment)."""

from __future__ import annotations

import os
import time

from statequeue.core.errors import UsageError
from statequeue.core.models import RunnerInfo
from statequeue.core.textsafe import json_text


def boot_id() -> str:
    """The kernel's boot id, or "" where the platform has none."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return ""


def host_name() -> str:
    """$STATEQUEUE_HOST, else the machine's host name. The override is for
    containers that share a host name, and tests that play several hosts."""
    import socket  # lazy: start-up time (enqueue never needs it)

    chosen = os.environ.get("STATEQUEUE_HOST")
    if chosen and not chosen.isascii():
        try:
            chosen.encode()
        except UnicodeEncodeError:  # a byte that is not UTF-8: no record could hold it
            raise UsageError("STATEQUEUE_HOST must be UTF-8 text") from None
    return chosen or socket.gethostname()


def new_runner(
    command: tuple[str, ...] = (), *, guarded: bool = False, in_process: bool = False
) -> RunnerInfo:
    """A fresh identity for a runner starting now in this process. Its
    ``command`` is kept to be shown, so an argument that is not UTF-8
    (`run -- ./convert {} /mnt/caf\\xe9`) is kept as ``json_text`` makes it:
    as it is, the runner's record could not be written at all."""
    import uuid  # lazy: start-up time (enqueue never needs it)

    return RunnerInfo(
        runner_id=uuid.uuid4().hex[:16],
        pid=os.getpid(),
        host=host_name(),
        boot_id=boot_id(),
        started_at=time.time(),
        command=tuple(map(json_text, command)),
        guarded=guarded,
        in_process=in_process,
    )
