"""Issue 26, point 5: the numbers do not mislead.

`status` never rounds to 100% while anything is left and counts failures in
its headline, and names running items; `stats` names the window it measured;
a failed attempt that waits for a retry says so."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

from statequeue import Queue
from statequeue.cli.render import status_text
from statequeue.core.views import ActiveRunner, Status
from tests.conftest import STATEQUEUE
from tests.waiting import gone, until

STATES = ("pending", "running", "done", "failed", "cancelled", "held")


def _counts(**given: int) -> dict[str, int]:
    return {state: given.get(state, 0) for state in STATES}


def _sq(env: dict[str, str], *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )


def test_one_failure_in_2000_is_not_100_percent_done() -> None:
    head = status_text(Status("q", _counts(done=1999, failed=1))).splitlines()[0]
    assert head == "queue q: 2000 items (99.9% done, 1 failed)"
    head = status_text(Status("q", _counts(done=19999, pending=1))).splitlines()[0]
    assert head == "queue q: 20000 items (99.9% done)"
    head = status_text(Status("q", _counts(done=3))).splitlines()[0]
    assert head == "queue q: 3 items (100.0% done)"


def test_running_items_are_named_not_counted() -> None:
    runner = ActiveRunner("r1", 42, "vm", 0.0, (2, 9))
    text = status_text(
        Status("q", _counts(running=2), runners=(runner,)), {2: "a.pdf", 9: "b c.pdf"}
    )
    assert "running 2 items: #2 a.pdf, #9 b c.pdf" in text
    assert "running items: 2" not in text


def test_status_names_what_a_live_runner_runs(tmp_path: Path, sq_env: dict[str, str]) -> None:
    _sq(sq_env, "enqueue", stdin="report-17.pdf\n")
    job = f'touch "{tmp_path}/started"; exec sleep 60'
    runner = subprocess.Popen(
        [STATEQUEUE, "run", "--", "sh", "-c", job, "sh", "{}"],
        env=sq_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        until(lambda: (tmp_path / "started").exists(), "the item to start")
        shown = _sq(sq_env, "status").stdout
        assert "running 1 item: #1 report-17.pdf" in shown, shown
    finally:
        os.kill(runner.pid, signal.SIGTERM)
        runner.wait(timeout=60)
        assert gone(runner.pid)


def test_stats_names_the_window_it_measured(sq_env: dict[str, str]) -> None:
    _sq(sq_env, "enqueue", stdin="a\nb\n")
    _sq(sq_env, "run", "--", "true")
    rate = next(
        line for line in _sq(sq_env, "stats").stdout.splitlines() if line.startswith("rate:")
    )
    window = re.search(r"over the last (\S+) ", rate)
    assert window is not None, rate
    assert window.group(1) != "10m00s", rate  # a run of a second was not measured over 10 minutes
    assert window.group(1).endswith("s") and "m" not in window.group(1), rate


def test_a_failed_attempt_waiting_for_its_retry_says_failed(sq_env: dict[str, str]) -> None:
    with Queue() as queue:
        queue.enqueue(["a"])
        for item in queue.work(retries=1, retry_delay=3600):
            with item:
                raise ValueError("not yet")
            break  # the retry is due in an hour
    shown = _sq(sq_env, "show", "1").stdout
    end = next(line for line in shown.splitlines() if " end #1 " in line)
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"
    assert re.search(
        rf"end #1 attempt 1: failed, retry due at {when} \(ValueError: not yet\)", end
    ), end
