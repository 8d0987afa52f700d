"""``map(processes=True)``: one worker dies while the others run calls of
``fn`` that ignore SIGTERM (and have started a child that ignores it too).

The executor fails every task in flight, SIGTERMs the other workers and
joins them with no timeout; the map once waited there for as long as those
calls ran (here 300 s, for good with a call that never returns). Now the
workers still alive a short grace after SIGTERM are SIGKILLed, their
sentinels kill what their ``fn`` started, and the map goes on with a fresh
pool and finishes: the item that killed its worker counted as a crash, the
others given back uncounted and run again, never two copies of an item at
once (``fn`` holds an flock on a file of its item; a copy that finds it
taken writes an ``overlap`` line).

At the normal end of a map, a worker that does not exit (a thread ``fn``
left running, in a worker that ignores SIGTERM) once held the map for as
long as that thread ran; it is now ended the same way.

Ctrl-C lets the calls in flight run on (they hold their items' claims); a
second Ctrl-C once waited for them all the same, as did a third. It now
ends the workers the same way, and the map stops.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from statequeue import ItemState, Queue
from tests.faults.test_pool_kill import EXIT_WAIT, lines, survivors, watched

ITEMS = ["boom", "deaf-1", "deaf-2"]
MAP_END = 60.0
"""Seconds the map gets to finish after the crash (it takes the grace, seconds)."""

SCRIPT = """
import fcntl, os, signal, subprocess, sys, time
import statequeue

LOG, MARKS, STORE = sys.argv[1], sys.argv[2], sys.argv[3] or None

# fn's child: ignores SIGTERM too, and holds what fn's fds hold while it lives.
CHILD = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"

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
    except BlockingIOError:  # a copy of this item still runs
        note(f"overlap {item} {os.getpid()}")
        fcntl.flock(fd, fcntl.LOCK_EX)
    note(f"start {item} {os.getpid()}")
    first = not os.path.exists(os.path.join(MARKS, "go"))
    if first and item == "boom":
        while not os.path.exists(os.path.join(MARKS, "go")):
            time.sleep(0.01)  # until the test has watched every process
        os._exit(3)
    if first:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", CHILD])
        note(f"deaf {item} {os.getpid()} {child.pid}")
        time.sleep(300)
    note(f"end {item} {os.getpid()}")
    os.close(fd)
    return item.upper()

if __name__ == "__main__":
    jobs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    items = ITEMS if jobs == 3 else ["deaf-1"]
    print(statequeue.map(work, items, queue="deaf", jobs=jobs, processes=True, store=STORE))
"""


@pytest.fixture(params=["journal", "postgres"])
def store(request: pytest.FixtureRequest) -> str:
    if request.param == "journal":
        return ""
    pytest.importorskip("psycopg")
    return str(request.getfixturevalue("pg_url"))


@pytest.mark.timeout(240)
def test_a_broken_pool_ends_workers_that_ignore_sigterm(tmp_path: Path, store: str) -> None:
    script, log, marks = tmp_path / "deaf.py", tmp_path / "calls.log", tmp_path / "marks"
    marks.mkdir()
    script.write_text(SCRIPT.replace("ITEMS if", f"{ITEMS!r} if"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log), str(marks), store],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while len([w for w in lines(log) if w[0] == "deaf"]) < 2 or ["start", "boom"] not in [
            w[:2] for w in lines(log)
        ]:
            assert proc.poll() is None, "the program ended before the crash"
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.01)  # polling the log file for progress, not a synchronisation
        deaf = [w for w in lines(log) if w[0] == "deaf"]
        pids = {int(w[2]) for w in deaf} | {int(w[3]) for w in deaf}  # the workers, their children
        with watched(pids) as fds:
            (marks / "go").touch()  # boom's worker dies now; every next call ends at once
            try:
                out, err = proc.communicate(timeout=MAP_END)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the map still ran {MAP_END:.0f} s after its worker died")
            assert proc.returncode == 0, err.decode()
            assert survivors(fds, EXIT_WAIT) == set(), "workers ignoring SIGTERM outlived it"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert out.decode().strip() == repr([i.upper() for i in ITEMS])
    assert [w for w in lines(log) if w[0] == "overlap"] == []
    assert sorted(w[1] for w in lines(log) if w[0] == "end") == sorted(ITEMS)
    with Queue("deaf", store=store or None, create=False) as q:
        assert {v.item: v.state for v in q.items()} == {i: ItemState.DONE for i in ITEMS}
        for item in ITEMS:
            events = q.history(item).events
            crashes = [e for e in events if e["t"] == "intr" and e.get("crashes")]
            if item == "boom":
                assert len(crashes) == 1 and "exited with code 3" in crashes[0]["reason"], events
            else:  # killed by the pool, after its grace: given back, no crash
                assert crashes == [], f"{item} was counted a crash: {crashes}"


@pytest.mark.timeout(240)
def test_a_second_ctrl_c_ends_workers_that_ignore_sigterm(tmp_path: Path) -> None:
    """The first Ctrl-C gives the item back (its worker, holding the claim,
    runs on); the second ends the worker and its child, and the map stops."""
    script, log, marks = tmp_path / "deaf.py", tmp_path / "calls.log", tmp_path / "marks"
    marks.mkdir()
    script.write_text(SCRIPT.replace("ITEMS if", f"{ITEMS!r} if"))
    proc = subprocess.Popen(
        [sys.executable, str(script), str(log), str(marks), "", "1"], stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while not [w for w in lines(log) if w[0] == "deaf"]:
            assert proc.poll() is None, "the program ended before Ctrl-C"
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.01)  # polling the log file for progress, not a synchronisation
        deaf = [w for w in lines(log) if w[0] == "deaf"]
        with watched({int(deaf[0][2]), int(deaf[0][3])}) as fds:
            proc.send_signal(signal.SIGINT)
            with Queue("deaf") as q:
                while q.states(q.find_ids(["deaf-1"]).values()) != {1: ItemState.PENDING}:
                    assert proc.poll() is None and time.monotonic() < deadline
                    time.sleep(0.01)  # polling the queue: given back, its worker still runs
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=MAP_END)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the map still ran {MAP_END:.0f} s after a second Ctrl-C")
            assert b"KeyboardInterrupt" in err, err.decode()
            assert survivors(fds, EXIT_WAIT) == set(), "the worker or its child outlived the map"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert [w[0] for w in lines(log)] == ["start", "deaf"]  # no other copy started
    with Queue("deaf") as q:
        assert [v.state for v in q.items()] == [ItemState.PENDING]
        assert [e for e in q.history("deaf-1").events if e.get("crashes")] == []


LEFTOVER_SCRIPT = """
import os, signal, sys, threading, time
import statequeue

def work(item):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=time.sleep, args=(300,)).start()  # not a daemon: holds the exit
    os.write(2, f"worker {os.getpid()}\\n".encode())  # one write: two workers' lines never mix
    return item.upper()

if __name__ == "__main__":
    print(statequeue.map(work, ["a", "b"], queue="leftover", jobs=2, processes=True))
"""


@pytest.mark.timeout(240)
def test_the_normal_end_of_a_map_ends_workers_that_do_not_exit(tmp_path: Path) -> None:
    script = tmp_path / "leftover.py"
    script.write_text(LEFTOVER_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        out, err = proc.communicate(timeout=MAP_END)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the map still ran after {MAP_END:.0f} s")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == repr(["A", "B"])
    workers = {
        int(w[1])
        for w in (line.split() for line in err.decode().splitlines())
        if w[:1] == ["worker"]
    }
    assert workers and all(not Path(f"/proc/{pid}").exists() for pid in workers), workers
    with Queue("leftover") as q:
        assert [v.state for v in q.items()] == [ItemState.DONE, ItemState.DONE]
