"""A real `statequeue run -j2` killed with -9 while it runs two items, on
either store: for tests of what the views say after the crash, before the
next run recovers the items (`status`: interrupted); or with its keeper, so
that the items' processes live on and hold their claims (`status`: held by
a dead runner)."""

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


def _run_processes(top: int) -> list[int]:
    """``top`` and its descendants that are Python (statequeue's processes:
    the runner and its keeper, not the items' shells), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, look = [top], [top]
    while look:
        pid = look.pop()
        kids = [child for child, parent in parents.items() if parent == pid]
        tree += kids
        look += kids
    found = []
    for pid in tree:
        with suppress(OSError):
            if "python" in os.readlink(f"/proc/{pid}/exe"):
                found.append(pid)
    return found


@contextmanager
def run_killed_running_two(
    sq_env: dict[str, str],
    sq_home: Path,
    store_url: str,
    tmp_path: Path,
    items: list[str],
    *,
    keeper_too: bool = False,
) -> Iterator[ActiveRunner]:
    """Enqueue ``items``, start `run -j2` on them, kill -9 the pid the shell
    knows once items 1 and 2 run, and wait until `status` lists both as
    interrupted. Yields the runner as `status` showed it while it lived. The
    items' own processes (which may outlive the run) are stopped by their
    pids at the end.

    ``keeper_too``: every process of the run is stopped, then killed (the
    runner and its keeper, at once: neither can stop the items' processes
    first), and the wait is until `status` lists no runner: the items'
    processes live on, holding their claims."""
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
        # Both items' processes have started (their claim fds inherited).
        until(lambda: pids.exists() and len(pids.read_text().split()) == 2, "both items' pids")
        if keeper_too:
            run = _run_processes(proc.pid)
            assert len(run) >= 2, run  # the runner and its keeper (journal: and the waiter)
            for pid in run:
                os.kill(pid, signal.SIGSTOP)
            for pid in run:
                os.kill(pid, signal.SIGKILL)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        with _queue(sq_home, store_url) as q:
            if keeper_too:
                until(lambda: q.status().runners == (), "the runner to be gone")
            else:
                until(lambda: q.status().interrupted == (1, 2), "1 and 2 interrupted")
            assert q.status().runners == ()
        yield runner
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_item_processes(tmp_path)


def stop_item_processes(tmp_path: Path) -> None:
    """Kill the items' processes ``run_killed_running_two`` started, by pid."""
    pids = tmp_path / "item-pids"
    for line in pids.read_text().split() if pids.exists() else ():
        with suppress(ProcessLookupError):
            os.kill(int(line), signal.SIGKILL)
