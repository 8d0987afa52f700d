"""`report` agrees with `status` after a runner died (a kill -9 of the run):
the attempts in flight then, not recovered yet, are shown as such (in the
header, their own table and the timeline), not left out as if nothing had
been running; once recovered they are counted as interrupted attempts."""

from __future__ import annotations

import os
import time

from statequeue.api.queue import Queue
from statequeue.cli.report_page import render_report
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.stats.attempts import Attempt, batches_of
from statequeue.stats.report_fold import ReportFold
from statequeue.stats.report_model import INTERRUPTED, KIND_NAMES


def _runner_died_holding_two() -> None:
    """Item a done; b and c in flight when their runner went (its locks let go
    without a word, as a kill -9 leaves them); d pending."""
    q = Queue("k")
    q.enqueue(["a", "b", "c", "d"])
    runner = RunnerInfo("gone", os.getpid(), "h", "", time.time())
    q.register_runner(runner)
    claim = q.claim(runner)
    assert claim is not None
    q.store.finish(claim, Outcome(ok=True, duration=0.1, exit_code=0))
    q.claim(runner)
    q.claim(runner)
    q.close()


def test_the_report_shows_what_status_lists_as_interrupted() -> None:
    _runner_died_holding_two()
    with Queue("k") as q:
        assert q.status().interrupted == (2, 3)
        r = q.report()
    f = r.figures
    assert f.in_flight_total == 2
    assert [(x.item_id, x.attempt, x.text, x.state) for x in f.in_flight] == [
        (3, 1, "c", "running"),
        (2, 1, "b", "running"),
    ]
    assert f.kinds[INTERRUPTED] == 0 and f.attempts == 1  # none has ended yet
    flying = [b for b in f.timeline.bars if b.in_flight]
    assert sorted(b.item_id for b in flying) == [2, 3]
    assert all(b.kind == INTERRUPTED and b.end >= b.start for b in flying)
    assert f.timeline.total == 3 and f.timeline.shown == 3
    page = render_report(r)
    assert "; and 2 in flight when their runner died, not recovered yet" in page
    assert "Interrupted, not recovered yet" in page and "2 in all" in page
    for item_id in (2, 3):  # its bar's hover text says so
        assert f'data-tip="item {item_id} attempt 1: in flight when its runner died' in page


def test_once_recovered_they_are_interrupted_attempts_and_no_longer_in_flight() -> None:
    _runner_died_holding_two()
    with Queue("k") as q:
        q.store.recover()
        assert q.status().interrupted == ()
        f = q.report().figures
    assert f.in_flight_total == 0 and f.in_flight == ()
    assert f.kinds[INTERRUPTED] == 2 and f.interrupted_total == 2
    assert not any(b.in_flight for b in f.timeline.bars)


def test_an_attempt_recovered_while_the_report_reads_is_counted_once() -> None:
    fold = ReportFold()
    fold.add_in_flight(7, 1, "r", 100.0)  # in flight as `status` saw it...
    ended = Attempt(7, 1, "pending", False, None, "interrupted", None, None, False, "r", "h", 105.0)
    fold.add_all(batches_of([ended._replace(interrupted=True)]))  # ...recovered by the read
    f = fold.build()
    assert f.in_flight_total == 0 and f.interrupted_total == 1
    assert [KIND_NAMES[b.kind] for b in f.timeline.bars] == ["interrupted"]
