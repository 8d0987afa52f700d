"""`report` after a kill -9 of a run, before the next run recovers its items.

Found by an outside tester: the page contradicted itself. Its header said
"wall time 1ms" and "runners 0 (0 alive now): - hosts -" while it listed two
attempts in flight when their runner died, and the timeline drew that
runner's lane with both attempts in slot #1 although the run was -j2: the
in-flight attempts ran only to the latest start (the last moment the store
knows of), so they did not overlap, and their runner was counted from ended
attempts only. Now an attempt in flight with no end runs to the time of the
report (said so in the page): the wall time covers it, the two attempts
take slots #1 and #2, and their runner is counted, with its host.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.cli.report_charts import clock
from statequeue.cli.report_page import render_report
from statequeue.stats.report_fold import ReportFold
from statequeue.stats.report_model import INTERRUPTED
from tests.conftest import STATEQUEUE
from tests.killed_run import run_killed_running_two


def test_in_flight_attempts_run_to_the_report_and_take_their_own_slots() -> None:
    fold = ReportFold(now=1000.0)
    fold.add_in_flight(1, 1, "r", 100.0, "h1")
    fold.add_in_flight(2, 1, "r", 100.001, "h1")
    f = fold.build()
    assert (f.first_start, f.last_end) == (100.0, 1000.0)
    assert f.runners == (("r", "h1", 2),)
    assert f.timeline.lanes == ("r #1", "r #2")
    assert sorted((b.lane, b.item_id, b.end) for b in f.timeline.bars) == [
        (0, 1, 1000.0),
        (1, 2, 1000.0),
    ]


def test_attempts_started_at_the_same_time_take_slots_in_item_order() -> None:
    """Starts recorded with one time (a batch): slot #1 is the lower item's,
    whatever order they were read in (the kill test above flaked so)."""
    fold = ReportFold(now=1000.0)
    fold.add_in_flight(2, 1, "r", 100.0, "h1")
    fold.add_in_flight(1, 1, "r", 100.0, "h1")
    fold.add_in_flight(3, 1, "r", 100.0, "h1")
    bars = fold.build().timeline.bars
    assert sorted((b.item_id, b.lane) for b in bars) == [(1, 0), (2, 1), (3, 2)]


def test_report_after_a_kill_of_the_run(
    sq_env: dict[str, str], sq_home: Path, store_url: str, tmp_path: Path
) -> None:
    with (
        run_killed_running_two(sq_env, sq_home, store_url, tmp_path, ["a", "b", "c"]) as runner,
        Queue(home=sq_home, store=store_url or None, create=False) as q,
    ):
        r = q.report(now=time.time() + 30)
    f = r.figures
    assert f.in_flight_total == 2 and r.active_runners == 0
    assert f.runners == ((runner.runner_id, runner.host, 2),)
    assert r.hosts == (runner.host,)
    assert f.last_end == r.now  # in flight, no end: up to the report
    assert r.wall_seconds is not None and r.wall_seconds >= 30
    assert f.timeline.lanes == (f"{runner.runner_id} #1", f"{runner.runner_id} #2")
    flying = sorted((b.item_id, b.lane, b.end) for b in f.timeline.bars if b.in_flight)
    assert flying == [(1, 0, r.now), (2, 1, r.now)]
    page = render_report(r)
    assert f"1 (0 alive now): {runner.runner_id} ({runner.host}): 2" in page
    assert "to the time of this report: attempts in flight when their runner died" in page
    assert f"<dt>hosts</dt><dd>{runner.host}</dd>" in page


def test_a_recovered_attempt_spans_from_its_start_to_its_recovery(
    sq_env: dict[str, str], sq_home: Path, store_url: str, tmp_path: Path
) -> None:
    """Found by an outside review: an attempt whose runner was killed (-9)
    and that the next run recovered was drawn at the recovery's time, 0 s
    long, and the table's "interrupted at" was the recovery's time: the
    attempt ran from its ``start`` record's time. It still does after a
    compaction (its start carried in the recovery's record)."""
    with run_killed_running_two(sq_env, sq_home, store_url, tmp_path, ["a", "b", "c"]):
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            starts = {
                i: next(e["at"] for e in q.history(i).events if e.get("t") == "start")
                for i in (1, 2)
            }
        time.sleep(1.0)  # the recovery comes a second or more after the starts
        store = ["--store", store_url] if store_url else []
        done = subprocess.run(
            [STATEQUEUE, *store, "run", "--", "true"], env=sq_env, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
    for compacted in (False, True):
        if compacted:
            subprocess.run([STATEQUEUE, *store, "compact"], env=sq_env, check=True, timeout=60)
        with Queue(home=sq_home, store=store_url or None, create=False) as q:
            r = q.report()
        f = r.figures
        bars = {b.item_id: b for b in f.timeline.bars if b.kind == INTERRUPTED}
        assert sorted(bars) == [1, 2], compacted
        rows = {x.item_id: x for x in f.interrupted}
        page = render_report(r)
        for i in (1, 2):
            assert bars[i].start == pytest.approx(starts[i], abs=0.01), compacted
            assert bars[i].end - bars[i].start >= 1.0, compacted
            assert rows[i].started == pytest.approx(starts[i], abs=0.01)
            assert rows[i].value == pytest.approx(bars[i].end)
            assert f"<td class='n'>{clock(starts[i])}</td>" in page
        assert f.first_start is not None and f.first_start <= min(starts.values()) + 0.01
