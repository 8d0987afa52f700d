"""Issue 26, point 5: the numbers do not mislead.

`status` never rounds to 100% while anything is left and counts failures in
its headline, and names running items; `stats` names the window it measured;
a failed attempt that waits for a retry says so."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

from statequeue import Queue
from statequeue.cli.render import status_text
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.core.records import enqueue_times
from statequeue.core.views import ActiveRunner, Status
from tests.conftest import STATEQUEUE
from tests.test_store_contract import Harness, harness  # noqa: F401  (the fixture: every store)
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


def _enqueue_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "enqueued" in line]


def test_enqueue_time_is_recorded_once_per_batch(sq_env: dict[str, str], sq_home: Path) -> None:
    _sq(sq_env, "enqueue", stdin="a\nb\nc\n")
    lines = (sq_home / "default" / "journal.jsonl").read_text().splitlines()
    enq = [json.loads(line) for line in lines if '"t":"enq"' in line]
    assert ["at" in r for r in enq] == [True, False, False]  # one timestamp per batch
    shown = _enqueue_lines(_sq(sq_env, "show", "3").stdout)
    assert len(shown) == 1 and "~" not in shown[0], shown  # the batch's time, not a guess
    events = _enqueue_lines(_sq(sq_env, "events").stdout)
    assert len(events) == 3 and not any("~" in line for line in events), events


def test_a_journal_without_enqueue_times_still_reads() -> None:
    old = [
        {"t": "enq", "id": 1, "item": "a", "seq": 2},
        {"t": "enq", "id": 2, "item": "b", "seq": 3},
    ]
    assert list(enqueue_times(old)) == old
    new = [
        {**old[0], "at": 5.0},
        old[1],
        {"t": "start", "id": 1, "seq": 4},
        {"t": "enq", "id": 3, "seq": 5},
    ]
    assert [r.get("at") for r in enqueue_times(new)] == [5.0, 5.0, None, None]


def test_show_after_compact_keeps_the_outcome(sq_env: dict[str, str]) -> None:
    _sq(sq_env, "enqueue", stdin="a\n")
    _sq(sq_env, "run", "--", "true")
    _sq(sq_env, "compact")
    shown = _sq(sq_env, "show", "1").stdout
    assert re.search(r"#1 archived: attempt 1 done \(exit 0, took \d", shown), shown


def test_postgresql_enqueue_lines_have_a_seq_and_a_time(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    _sq(env, "enqueue", stdin="a\nb\nc\n")
    shown = _enqueue_lines(_sq(env, "show", "2").stdout)
    assert len(shown) == 1 and re.match(r"\s*seq \d+  \d{4}-", shown[0]), shown
    events = _enqueue_lines(_sq(env, "events").stdout)
    assert len(events) == 1 and "enqueued 3 items #1..#3" in events[0], events


def test_live_texts_names_items_not_done_in_every_store(harness: Harness) -> None:  # noqa: F811
    store = harness.open()
    store.enqueue(["a", "b c", "done one"])
    runner = new_runner()
    store.register_runner(runner)
    claims = [store.claim(runner) for _ in range(3)]
    assert all(c is not None for c in claims)
    store.finish(claims[2], Outcome(ok=True))  # type: ignore[arg-type]
    assert store.live_texts([1, 2, 3, 99]) == {1: "a", 2: "b c"}
    assert store.live_texts([]) == {}


def test_compaction_keeps_a_live_items_enqueue_time(sq_env: dict[str, str]) -> None:
    _sq(sq_env, "enqueue", stdin="a\nb\nc\n")
    _sq(sq_env, "run", "--limit", "1", "--", "true")  # #1 done and archived, #2 and #3 carried over
    before = _enqueue_lines(_sq(sq_env, "show", "3").stdout)[0]
    when = re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", before)
    assert when is not None, before
    for _ in range(2):  # carried over twice: the time goes with the item
        _sq(sq_env, "compact")
        shown = _sq(sq_env, "show", "3").stdout
        assert f"#3 carried over by compaction: pending (enqueued {when.group(0)})" in shown, shown
