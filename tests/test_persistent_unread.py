"""`run --persistent`: a worker that ends, or stops reading its stdin, with a
request it never read. Nothing of that attempt ran: the item goes back to
pending uncounted (no crash, no attempt) and a new worker gets it. A worker
that closed its stdin but lives on is stopped instead of holding the run for
good. Real CLI, real workers (tests/test_persistent_run.py has the rest).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState
from tests.conftest import STATEQUEUE

RUN_TIMEOUT = 60

# Answers PER items (reading each request whole, and nothing more), then
# does what argv[1] says: "exit" (status 0, the next request unread) or
# "close" (closes its stdin and lives on, for a minute at most).
WORKER = r"""
import json, os, sys, time

reply = os.fdopen(int(os.environ["STATEQUEUE_REPLY_FD"]), "w")
for _ in range(int(sys.argv[2])):
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            sys.exit(0)
        line += byte
    req = json.loads(line)
    reply.write(json.dumps({"id": req["id"], "ok": True, "result": os.getpid()}) + "\n")
    reply.flush()
print("worker leaving", flush=True)
if sys.argv[1] == "close":
    os.close(0)
    time.sleep(60)
"""


def _run(
    env: dict[str, str], tmp_path: Path, then: str, per: int
) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "worker.py"
    program.write_text(WORKER)
    argv = [STATEQUEUE, "run", "--persistent", "--", sys.executable, str(program), then, str(per)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def _states(sq_home: Path) -> dict[str, tuple[ItemState, int]]:
    with Queue(home=sq_home) as q:
        return {v.item: (v.state, v.attempts) for v in q.items()}


def _no_crash_anywhere(sq_home: Path, items: list[str]) -> None:
    with Queue(home=sq_home) as q:
        for item in items:
            history = str(q.history(item).events)
            assert "interrupted" not in history and "crash" not in history, history


def test_a_worker_that_exits_between_items_costs_the_next_item_nothing(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    """It answers two items and exits 0: the third, which it never read, was
    charged a crash (then held after --max-crashes); now it goes to a new worker."""
    items = [f"i{n}" for n in range(5)]
    with Queue(home=sq_home) as q:
        q.enqueue(items)
    done = _run(sq_env, tmp_path, "exit", 2)
    assert done.returncode == ExitCode.OK, done.stderr
    assert _states(sq_home) == {i: (ItemState.DONE, 1) for i in items}, done.stderr
    _no_crash_anywhere(sq_home, items)
    # (Whether a request was sent to the exiting worker, and given back with a
    # line on stderr, or its end was seen first, is a race: either costs nothing.)
    with Queue(home=sq_home) as q:
        pids = [q.result(i).result for i in items]  # type: ignore[union-attr]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4]


def test_a_worker_that_closes_its_stdin_and_lives_on_is_stopped_not_waited_for(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    """It answers one item, closes its stdin and sleeps: the run waited for its
    reply for good (a hang); now it is stopped and the item goes to a new worker."""
    items = ["a", "b", "c"]
    with Queue(home=sq_home) as q:
        q.enqueue(items)
    done = _run(sq_env, tmp_path, "close", 1)
    assert done.returncode == ExitCode.OK, done.stderr
    assert _states(sq_home) == {i: (ItemState.DONE, 1) for i in items}, done.stderr
    _no_crash_anywhere(sq_home, items)
    with Queue(home=sq_home) as q:
        pids = {q.result(i).result for i in items}  # type: ignore[union-attr]
    assert len(pids) == 3
    for pid in pids:  # every one of them stopped by the run's end
        assert isinstance(pid, int)
        gone = not os.path.exists(f"/proc/{pid}")
        assert gone or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"
