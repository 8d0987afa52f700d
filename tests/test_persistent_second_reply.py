"""`run --persistent`: a worker that replies twice to one request. The first
reply stands; the worker is stopped as out of step; no item fails for it. It
failed the item it had answered correctly (both replies in one read), or the
next item, innocent, when the second reply came during it ("reply names id
1, not 2"). Real CLI, real workers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker

RUN_TIMEOUT = 60

# Replies to each request; "late-" items get their reply again 0.5 s later
# (from a timer thread), while "slow-" items take 2 s before their reply.
LATE = r"""
import json, os, sys, threading, time

reply = os.fdopen(int(os.environ["STATEQUEUE_REPLY_FD"]), "w")
lock = threading.Lock()

def send(obj):
    with lock:
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

for line in sys.stdin:
    req = json.loads(line)
    answer = {"id": req["id"], "ok": True, "result": {"pid": os.getpid(), "n": req["attempt"]}}
    if req["item"].startswith("slow-"):
        time.sleep(2)
    send(answer)
    if req["item"].startswith("late-"):
        threading.Timer(0.5, send, [answer]).start()
"""


def _states(sq_home: Path) -> dict[str, tuple[ItemState, int]]:
    with Queue(home=sq_home) as q:
        return {v.item: (v.state, v.attempts) for v in q.items()}


def _results(sq_home: Path) -> dict[str, object]:
    with Queue(home=sq_home) as q:
        return {v.item: q.result(v.item).result for v in q.items()}  # type: ignore[union-attr]


def test_two_replies_read_together_keep_the_first_and_stop_the_worker(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    program, marks = write_worker(tmp_path)  # twice-: both replies in one write
    with Queue(home=sq_home) as q:
        q.enqueue(["ok-1", "twice-1", "ok-2"])
    argv = [STATEQUEUE, "run", "--persistent", "--", sys.executable, program, str(marks)]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == ExitCode.OK, done.stderr
    assert _states(sq_home) == {
        "ok-1": (ItemState.DONE, 1),
        "twice-1": (ItemState.DONE, 1),
        "ok-2": (ItemState.DONE, 1),
    }
    assert "sent a second reply" in done.stderr and "it was stopped" in done.stderr
    results = _results(sq_home)
    assert results["ok-1"]["pid"] != results["ok-2"]["pid"]  # type: ignore[index]


def test_a_late_second_reply_fails_neither_item_and_the_next_runs_on_a_new_worker(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    program = tmp_path / "late.py"
    program.write_text(LATE)
    with Queue(home=sq_home) as q:
        q.enqueue(["late-1", "slow-1", "ok-1"])
    argv = [STATEQUEUE, "run", "--persistent", "--", sys.executable, str(program)]
    done = subprocess.run(argv, env=sq_env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == ExitCode.OK, done.stderr
    states = _states(sq_home)
    assert states["late-1"] == (ItemState.DONE, 1), done.stderr
    assert states["ok-1"] == (ItemState.DONE, 1), done.stderr
    # slow-1 was running when its worker was stopped: back to pending with
    # no crash counted, then done on a new worker.
    assert states["slow-1"][0] is ItemState.DONE, done.stderr
    results = _results(sq_home)
    assert results["late-1"]["pid"] != results["slow-1"]["pid"]  # type: ignore[index]
    with Queue(home=sq_home) as q:
        history = str(q.history("slow-1").events)
        late = q.history("late-1")
    assert "crash" not in history and "during attempt" not in history, history
    ends = [e for e in late.events if e["t"] == "end"]
    assert len(ends) == 1 and ends[0]["state"] == "done"
    # Seen while slow-1 runs, as a rule; on a slow machine, perhaps before its request.
    assert "a second reply to item 1" in done.stderr or "not asked for" in done.stderr
