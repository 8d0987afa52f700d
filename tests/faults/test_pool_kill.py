"""Issue 21 point 1: ``statequeue.map(..., processes=True)`` after kill -9.

A real program maps slow items over a process pool and is SIGKILLed while
every worker is inside ``fn``, each of which has started a detached
descendant (new session, no fds). Then (a) no process of the pool outlives
it: workers, their forkserver and sentinels, the descendants; and (b) a
second program started right away never starts an item while a copy of it
from the first still runs: ``fn`` and its descendant each hold an flock on a
file of the item for as long as they live, so a second copy that finds one
taken writes an ``overlap`` line. Also: a worker killed on its own takes its
item's descendants with it before the map goes on (its item's attempt counted
as a crash, and no copy started while they live), and an item given back on Ctrl-C stays claimed
while the worker that runs it goes on.

Processes are found by the pids ``fn`` writes, watched through pidfds
opened while they are certainly alive, and any survivor (only on a broken
build) is killed through its pidfd, never by name.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue import ItemState, Queue

JOBS = 3
ITEMS = [f"slow-{i}" for i in range(6)]
EXIT_WAIT = 20.0
"""Seconds a killed program's pool gets to vanish (it takes milliseconds)."""

SCRIPT = """
import fcntl, os, subprocess, sys, time
import statequeue

LOG, RUN, MARKS, STORE = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] or None
ITEMS = {items!r}

# A descendant that detaches from fn's worker: a new session, no fds of its own.
CHILD = \"\"\"
import fcntl, os, sys, time
lock, log, run, item = sys.argv[1:5]
fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
out = os.open(log, os.O_WRONLY | os.O_APPEND)
os.write(out, f"child {{run}} {{item}} {{os.getpid()}} {{os.getppid()}}{{chr(10)}}".encode())
os.fsync(out)
time.sleep(300)
\"\"\"

def note(line):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)

def taken(path):
    \"\"\"True if a live process holds ``path``'s flock (a copy of the item that runs).\"\"\"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False

def work(item):
    mine = os.path.join(MARKS, item)
    if taken(mine) or taken(mine + ".child"):
        note(f"overlap {{RUN}} {{item}} {{os.getpid()}} {{os.getppid()}}")
    fd = os.open(mine, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    note(f"start {{RUN}} {{item}} {{os.getpid()}} {{os.getppid()}}")
    if RUN == "1" and not os.path.exists(os.path.join(MARKS, "go")):
        me = os.getpid()
        with open(f"/proc/{{me}}/task/{{me}}/children") as f:  # the worker's own helpers
            for kid in f.read().split():
                note(f"helper {{RUN}} {{item}} {{kid}} {{me}}")
        subprocess.Popen(
            [sys.executable, "-c", CHILD, mine + ".child", LOG, RUN, item],
            start_new_session=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        time.sleep(300)  # killed long before
    note(f"end {{RUN}} {{item}} {{os.getpid()}} {{os.getppid()}}")
    os.close(fd)
    return item.upper()

if __name__ == "__main__":
    print(statequeue.map(work, ITEMS, queue="pool", jobs={jobs}, processes=True, store=STORE))
"""


def lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


@contextlib.contextmanager
def watched(pids: set[int]) -> Iterator[dict[int, int]]:
    """pidfds of ``pids``; whatever is still alive at the end is SIGKILLed through them."""
    fds = {pid: os.pidfd_open(pid) for pid in pids}
    try:
        yield fds
    finally:
        for fd in fds.values():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            os.close(fd)


def survivors(fds: dict[int, int], within: float) -> set[int]:
    """The pids whose process has not exited after waiting up to ``within`` seconds."""
    left = dict(fds)
    deadline = time.monotonic() + within
    while left and (wait := deadline - time.monotonic()) > 0:
        ready = select.poll()  # not select(): a test process's fds may pass FD_SETSIZE
        for fd in left.values():
            ready.register(fd, select.POLLIN)
        gone = {fd for fd, _ in ready.poll(wait * 1000)}
        left = {pid: fd for pid, fd in left.items() if fd not in gone}
    return set(left)


@pytest.fixture(params=["journal", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    if request.param == "journal":
        return ""
    pytest.importorskip("psycopg")
    return str(request.getfixturevalue("pg_url"))


@contextlib.contextmanager
def killed_mid_map(
    tmp_path: Path, store: str, victim: str = "program"
) -> Iterator[tuple[Path, Path, dict[int, int]]]:
    """Run the program until every worker is inside ``fn``, watch the pool's
    processes (alive now, so their pids are theirs), kill the program -9 (or
    one worker: its item's attempt is a crash, and the map goes on with a
    fresh pool, whose calls of ``fn`` end at once); the script, the log and
    the pidfds."""
    script, log, marks = tmp_path / "pool_script.py", tmp_path / "calls.log", tmp_path / "marks"
    marks.mkdir()
    script.write_text(SCRIPT.format(items=ITEMS, jobs=JOBS))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log), "1", str(marks), store], stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while len([w for w in lines(log) if w[0] == "child"]) < JOBS:
            assert proc.poll() is None, "the program ended before the kill"
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.01)  # polling the log file for progress, not a synchronisation
        started = [w for w in lines(log) if w[0] in ("start", "helper", "child")]
        pool = {int(w[3]) for w in started} | {int(w[4]) for w in started}
        # The workers (parents of the children), their forkserver and helpers, the children.
        assert proc.pid not in pool and len(pool) >= 2 * JOBS + 1
        with watched(pool) as fds:
            if victim == "program":
                proc.send_signal(signal.SIGKILL)
            else:
                # The newest worker: the one a manager thread that took its
                # list of workers too early would not watch (see _start_workers).
                worker = max(int(w[3]) for w in started if w[0] == "start")
                (marks / "go").touch()  # the items' next calls end at once
                signal.pidfd_send_signal(fds[worker], signal.SIGKILL)
            _, err = proc.communicate(timeout=60)
            if victim == "program":
                assert proc.returncode == -signal.SIGKILL
            else:
                assert proc.returncode == 0, err.decode()
            yield script, log, fds
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def test_killed_map_leaves_no_pool_process_behind(tmp_path: Path, store: str) -> None:
    with killed_mid_map(tmp_path, store) as (_, _, fds):
        assert survivors(fds, EXIT_WAIT) == set(), "pool processes outlived the killed program"


def test_a_killed_worker_leaves_nothing_of_its_item_behind(tmp_path: Path, store: str) -> None:
    """A worker killed on its own (the OOM killer, say): its sentinel kills
    what fn started; its item's attempt counts as a crash (the others in
    flight, whose workers the pool terminates, are given back, no crash);
    and the map goes on with a fresh pool, never starting an item while a
    copy of it (or what it started) from the broken pool still runs."""
    with killed_mid_map(tmp_path, store, victim="worker") as (_, log, fds):
        assert survivors(fds, EXIT_WAIT) == set(), "processes of the map outlived it"
        started = [w for w in lines(log) if w[0] == "start"]
    victim = max(started[:JOBS], key=lambda w: int(w[3]))[2]
    assert [w for w in lines(log) if w[0] == "overlap"] == []
    assert sorted(w[2] for w in lines(log) if w[0] == "end") == sorted(ITEMS)
    with Queue("pool", store=store or None, create=False) as q:
        assert {v.item for v in q.items(ItemState.DONE)} == set(ITEMS)
        for w in started[:JOBS]:
            crashes = [e for e in q.history(w[2]).events if e["t"] == "intr" and e.get("crashes")]
            if w[2] == victim:
                assert len(crashes) == 1, crashes
                assert "was killed by signal 9" in crashes[0]["reason"], crashes
            else:
                assert crashes == [], f"{w[2]} was counted a crash: {crashes}"


def test_map_after_kill_never_starts_an_item_while_its_old_copy_runs(
    tmp_path: Path, store: str
) -> None:
    with killed_mid_map(tmp_path, store) as (script, log, _):
        again = subprocess.run(
            [sys.executable, str(script), str(log), "2", str(tmp_path / "marks"), store],
            capture_output=True,
            timeout=180,
        )
        overlaps = [w for w in lines(log) if w[0] == "overlap"]
    assert overlaps == [], f"started while its old copy ran: {overlaps}"
    assert again.returncode == 0, again.stderr.decode()
    assert again.stdout.decode().strip() == repr([i.upper() for i in ITEMS])
    in_flight = {w[2] for w in lines(log) if w[0] == "start" and w[1] == "1"}
    second = [w[2] for w in lines(log) if w[0] == "end" and w[1] == "2"]
    assert sorted(second) == sorted(ITEMS)  # nothing finished in the first run
    assert in_flight <= set(second)
    with Queue("pool", store=store or None, create=False) as q:
        assert {v.item for v in q.items(ItemState.DONE)} == set(ITEMS)


HANDBACK_SCRIPT = """
import fcntl, os, sys
import statequeue

LOG, RUN, MARKS, FIFO = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]

def note(line):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)

def work(item):
    fd = os.open(os.path.join(MARKS, item), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note(f"overlap {RUN} {item}")
    note(f"start {RUN} {item}")
    if RUN == "1":
        with open(FIFO) as f:  # until the test lets it end
            f.read()
    note(f"end {RUN} {item}")
    os.close(fd)
    return item.upper()

if __name__ == "__main__":
    items = ["held"] if RUN == "1" else ["held", "other"]
    print(statequeue.map(work, items, queue="pool", jobs=1, processes=True))
"""


def test_an_item_given_back_on_ctrl_c_stays_claimed_while_its_worker_runs(
    tmp_path: Path, sq_home: Path
) -> None:
    """Ctrl-C gives the item back at once, while the pool still finishes the
    call that runs it: another program must not start it meanwhile."""
    script, log, marks = tmp_path / "handback.py", tmp_path / "calls.log", tmp_path / "marks"
    fifo = tmp_path / "go"
    marks.mkdir()
    os.mkfifo(fifo)
    script.write_text(HANDBACK_SCRIPT)
    args = [sys.executable, str(script), str(log)]
    first = subprocess.Popen([*args, "1", str(marks), str(fifo)], stderr=subprocess.DEVNULL)
    second: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 120
        while ["start", "1", "held"] not in lines(log):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)  # polling the log file for progress, not a synchronisation
        first.send_signal(signal.SIGINT)
        with Queue("pool") as q:
            while q.states(q.find_ids(["held"]).values()) != {1: ItemState.PENDING}:
                assert first.poll() is None and time.monotonic() < deadline
                time.sleep(0.01)  # polling the queue: given back, its worker still runs
        second = subprocess.Popen(
            [*args, "2", str(marks), str(fifo)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        # The second program tries "held" (id 1) before it takes "other".
        while ["end", "2", "other"] not in lines(log):
            assert second.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)  # polling the log file for progress, not a synchronisation
        with open(fifo, "w") as go:  # the first program's worker may end now
            go.write("go")
        out, err = second.communicate(timeout=120)
        first.wait(timeout=120)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    assert [w for w in lines(log) if w[0] == "overlap"] == []
    assert second.returncode == 0, err.decode()
    assert out.decode().strip() == repr(["HELD", "OTHER"])
    order = [" ".join(w[:2]) for w in lines(log) if w[2] == "held"]
    assert order == ["start 1", "end 1", "start 2", "end 2"]
