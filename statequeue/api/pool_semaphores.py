"""The process pool's named semaphores, unlinked once every worker has them open.

Under forkserver (or spawn) the queues of a ``ProcessPoolExecutor`` use
POSIX named semaphores (five: the call queue's two locks and its bound, the
result queue's two locks), each registered with multiprocessing's resource
tracker, a process of its own that unlinks them however the program ends.
After a kill -9 of the program it does, and says so on the program's
stderr: "resource_tracker: There appear to be 5 leaked semaphore objects to
clean up at shutdown", a warning about statequeue's pool that the user can
do nothing about.

A worker needs a semaphore's name only to open it as it starts. The pool
starts every worker up front and never starts another (a dead worker breaks
it), so once each worker has them all open (their files are mapped in its
``/proc/PID/maps``) the names are unlinked and unregistered at once, as
multiprocessing itself would at the end: the semaphores live on, open in
every process that uses them, and a kill -9 later leaves no name behind and
nothing to say. Best effort, Linux only: where the executor's internals or
``/proc`` differ, or a worker is slow to start (``WAIT``), the names are
left as they were, and the tracker still cleans up.
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import synchronize, util

WAIT = 10.0
"""Seconds to wait for every worker to have the semaphores open."""


def unlink_once_open(executor: ProcessPoolExecutor) -> bool:
    """Unlink the pool's semaphore names once every worker has them open;
    False (nothing done) if that could not be seen."""
    names = _names(executor)
    pids = list(getattr(executor, "_processes", None) or ())
    if not names or not pids or _maps(0) is None:
        return False
    files = {f"/dev/shm/sem.{name.lstrip('/')}" for name in names}
    end = time.monotonic() + WAIT
    while not all(_open_in(pid, files) for pid in pids):
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    registry = getattr(util, "_finalizer_registry", {})
    cleanup = getattr(synchronize.SemLock, "_cleanup", None)
    if cleanup is None:
        return False
    for finalizer in list(registry.values()):
        args = getattr(finalizer, "_args", None) or ()
        if getattr(finalizer, "_callback", None) is cleanup and (args and args[0] in names):
            finalizer()  # unlinks the name and unregisters it, once (as at exit)
    return True


def _names(executor: ProcessPoolExecutor) -> set[str]:
    found = set()
    for queue in (getattr(executor, "_call_queue", None), getattr(executor, "_result_queue", None)):
        for attr in ("_rlock", "_wlock", "_sem"):
            lock = getattr(queue, attr, None)
            name = getattr(getattr(lock, "_semlock", None), "name", None)
            if isinstance(lock, synchronize.SemLock) and isinstance(name, str):
                found.add(name)
    return found


def _maps(pid: int) -> str | None:
    """``/proc/PID/maps`` (0: this process's), None if unreadable."""
    with contextlib.suppress(OSError), open(f"/proc/{pid or 'self'}/maps") as f:
        return f.read()
    return None


def _open_in(pid: int, files: set[str]) -> bool:
    maps = _maps(pid)
    return maps is not None and all(f in maps for f in files)
