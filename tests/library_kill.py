"""Kill -9 a process running map / map_async / work_async / work part-way, run it
again, and check what the issue asks: every item's function ran to completion
exactly once, except those in flight at the kill, and results in input order."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

from statequeue import ItemState, Queue

ITEMS = [f"item-{i:03d}" for i in range(60)]

# The function under test: logs "start RUN X" and "end RUN X" (O_APPEND and
# fsync: each line is on disk before the function returns), and sleeps a
# little so that several items are in flight when the kill comes.
PRELUDE = """
import asyncio, os, sys, time
LOG, RUN = sys.argv[1], sys.argv[2]

def note(what, item):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{what} {RUN} {item}\\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)

def work(item):
    note("start", item)
    time.sleep(0.01)
    note("end", item)
    return item.upper()

async def awork(item):
    note("start", item)
    await asyncio.sleep(0.01)
    note("end", item)
    return item.upper()
"""

SCRIPTS = {
    "map": """
import statequeue
print(statequeue.map(work, ITEMS, queue="crash", jobs=4))
""",
    "map_async": """
import statequeue
print(asyncio.run(statequeue.map_async(awork, ITEMS, queue="crash", concurrency=4)))
""",
    "work_async": """
from statequeue import Queue

async def main():
    async def handle(item):
        async with item:
            await item.done(await awork(item.item))
    with Queue("crash") as q:
        q.enqueue(ITEMS)
        async with asyncio.TaskGroup() as tg:
            async for item in q.work_async(concurrency=4):
                tg.create_task(handle(item))
    print("done")

asyncio.run(main())
""",
    # done() also claims the loop's next item (one store step): a kill can
    # leave that one claimed but never started.
    "work": """
from statequeue import Queue

with Queue("crash") as q:
    q.enqueue(ITEMS)
    for item in q.work():
        with item:
            item.done(work(item.item))
print("done")
""",
}


def write_script(folder: Path, kind: str) -> Path:
    script = folder / f"{kind}_script.py"
    body = PRELUDE + f"ITEMS = {ITEMS!r}\n" + textwrap.dedent(SCRIPTS[kind])
    script.write_text(body)
    return script


def log_lines(log: Path) -> list[tuple[str, str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split(" ", 2)) for line in log.read_text().splitlines()]  # type: ignore[misc]


def run_kill_and_resume(tmp_path: Path, env: dict[str, str], kind: str) -> None:
    """The whole check (see the module docstring) for one kind of loop."""
    script, log = write_script(tmp_path, kind), tmp_path / "calls.log"
    proc = subprocess.Popen([sys.executable, str(script), str(log), "1"], env=env)
    try:
        deadline = time.monotonic() + 60
        while sum(1 for w, _, _ in log_lines(log) if w == "end") < 12:
            assert proc.poll() is None, "the run ended before the kill"
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.01)  # polling the log file for progress, not a synchronisation
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    first = log_lines(log)
    with Queue("crash", home=env["STATEQUEUE_HOME"], create=False) as q:
        done_first = {v.item for v in q.items(ItemState.DONE)}
    started_first = {item for what, _, item in first if what == "start"}
    in_flight = started_first - done_first
    assert done_first, "nothing was done before the kill"
    assert len(done_first) < len(ITEMS), "everything was done before the kill"

    again = subprocess.run(
        [sys.executable, str(script), str(log), "2"], env=env, capture_output=True, timeout=120
    )
    assert again.returncode == 0, again.stderr.decode()
    if kind not in ("work_async", "work"):  # results in input order
        assert again.stdout.decode().strip() == repr([i.upper() for i in ITEMS])
    lines = log_lines(log)
    second = [(w, item) for w, run, item in lines if run == "2"]
    ends = Counter(item for w, item in second if w == "end")
    starts = Counter(item for w, item in second if w == "start")
    for item in ITEMS:
        ran_first = sum(1 for w, _, i in first if w == "end" and i == item)
        if item in done_first:
            assert starts[item] == 0, f"{item} was done, yet ran again"
            assert ran_first == 1
        elif item in in_flight:
            assert starts[item] == ends[item] == 1, f"{item} (in flight) ran {ends[item]}x"
        else:
            assert ran_first == 0
            assert starts[item] == ends[item] == 1, f"{item} ran {ends[item]} times"
    with Queue("crash", home=env["STATEQUEUE_HOME"], create=False) as q:
        assert {v.item for v in q.items(ItemState.DONE)} == set(ITEMS)
        assert [r.result for r in q.results()] == [i.upper() for i in ITEMS]
