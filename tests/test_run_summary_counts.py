"""The run's closing summary counts each item once, by where it ended up.

Found by an outside tester: held items (poison after --max-crashes, a
persistent worker's crash under --on-interrupted hold) were counted as
failed ("9 ok, 5 failed" with 3 failed and 2 held), an item held after
--verify under --on-interrupted hold was not counted at all, and an item
cancelled during its retry wait was still "waiting for a retry". Held items
now have their own count (text and --json), exit 1 as a failure does
(exit 0 says every item this run took succeeded), and keep --quiet's summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState
from statequeue.run.events import RunSummary
from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker
from tests.waiting import until

RUN_TIMEOUT = 120


def test_a_held_item_is_counted_held_not_failed() -> None:
    s = RunSummary(attempts=6)
    s.record(1, ItemState.DONE)
    s.record(2, ItemState.FAILED)
    s.record(3, ItemState.PENDING)
    s.record(3, ItemState.HELD)
    s.hand_back(4)
    assert (s.succeeded, s.failed, s.held, s.retried, s.released) == (1, 1, 1, 0, 1)
    assert s.text() == "items: 1 ok, 1 failed, 1 held, 1 handed back (stopped); 6 attempts started"


def test_an_item_held_without_an_attempt_is_no_idle_run() -> None:
    s = RunSummary()
    s.record(1, ItemState.HELD)  # --verify, then --on-interrupted hold: no attempt counted
    assert s.text() == "items: 0 ok, 0 failed, 1 held; 0 attempts started"


def _persistent_run(
    env: dict[str, str], tmp_path: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    worker, marks = write_worker(tmp_path)
    argv = [STATEQUEUE, "run", "--persistent", *options, "--", sys.executable, worker, str(marks)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def test_a_poison_item_is_summed_up_as_held(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["ok-1", "die-1", "fail-1", "ok-2"])
    done = _persistent_run(sq_env, tmp_path, "--max-crashes", "2", "--quiet")
    with Queue(home=sq_home) as q:
        states = {v.item: v.state for v in q.items()}
    assert states["die-1"] is ItemState.HELD and states["fail-1"] is ItemState.FAILED, done.stderr
    assert done.returncode == ExitCode.FAILED, done.stderr
    # --quiet keeps the warning and the summary.
    assert "during attempt 2; held" in done.stderr, done.stderr
    assert "statequeue: items: 2 ok, 1 failed, 1 held; 5 attempts started" in done.stderr


def test_the_json_summary_has_a_held_count(
    sq_home: Path, sq_env: dict[str, str], tmp_path: Path
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["ok-1", "die-1"])
    done = _persistent_run(sq_env, tmp_path, "--on-interrupted", "hold", "--json")
    summary = json.loads(done.stdout)
    assert (summary["succeeded"], summary["failed"], summary["held"]) == (1, 0, 1), done.stderr
    assert summary["exit_code"] == done.returncode == ExitCode.FAILED


def test_an_item_cancelled_during_its_retry_wait_is_not_waiting(
    sq_home: Path, sq_env: dict[str, str]
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    argv = [STATEQUEUE, "run", "--json", "--retries", "1", "--retry-delay", "5s", "--", "false"]
    with subprocess.Popen(argv, env=sq_env, stdout=subprocess.PIPE, text=True) as run:
        with Queue(home=sq_home) as q:

            def waiting() -> bool:  # its first attempt failed: it waits for its retry
                return [(v.state, v.attempts) for v in q.items()] == [(ItemState.PENDING, 1)]

            until(waiting, "the failed attempt")
            assert q.cancel([1]) == [1]
        out, _ = run.communicate(timeout=RUN_TIMEOUT)
    summary = json.loads(out)
    assert (summary["retry_pending"], summary["failed"], summary["attempts"]) == (0, 0, 1), out
