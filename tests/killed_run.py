"""A real `statequeue run -j2` killed with -9 while it runs two items, on
either store: for tests of what the views say after the crash, before the
next run recovers the items (`status`: interrupted)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from statequeue import Queue
from statequeue.core.views import ActiveRunner
from tests.conftest import STATEQUEUE
from tests.waiting import until


def _queue(sq_home: Path, store_url: str) -> Queue:
    return Queue(home=sq_home, store=store_url or None, create=False)


@contextmanager
def run_killed_running_two(
    sq_env: dict[str, str], sq_home: Path, store_url: str, tmp_path: Path, items: list[str]
) -> Iterator[ActiveRunner]:
    """Enqueue ``items``, start `run -j2` on them, kill -9 the pid the shell
    knows once items 1 and 2 run, and wait until `status` lists both as
    interrupted. Yields the runner as `status` showed it while it lived. The
    items' own processes (which may outlive the run) are stopped by their
    pids at the end."""
    with Queue(home=sq_home, store=store_url or None) as q:
        q.enqueue(items)
    pids = tmp_path / "item-pids"
    store = ["--store", store_url] if store_url else []
    command = ["sh", "-c", f"echo $$ >> {pids}; exec sleep 60", "sh", "{}"]
    proc = subprocess.Popen(
        [STATEQUEUE, *store, "run", "-j2", "--", *command],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with _queue(sq_home, store_url) as q:
            until(
                lambda: q.status().counts["running"] == 2 and len(q.status().runners) == 1,
                "two items to run",
            )
            (runner,) = q.status().runners
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        with _queue(sq_home, store_url) as q:
            until(lambda: q.status().interrupted == (1, 2), "status to list 1 and 2 interrupted")
            assert q.status().runners == ()
        yield runner
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for line in pids.read_text().split() if pids.exists() else ():
            with suppress(ProcessLookupError):
                os.kill(int(line), signal.SIGKILL)
