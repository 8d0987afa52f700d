"""`stats` and `report` count the attempts that `compact` archived, on
PostgreSQL as on the journal store: the same figures before and after
`compact`, with and without a `--since` window that crosses the archive
boundary, and the same figures on both stores for the same history.

(An outside tester's report: on PostgreSQL, `stats` said "0 finished
attempts (20 done)" after `compact`, and a 400-item queue compacted five
times while runners worked said 134 where its workers' log said 426: the
archived results and events were never read.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import Claim, OnInterrupted, Outcome, RunnerInfo
from statequeue.stats.report_model import Report
from tests.test_store_contract import age_leases

ITEMS = [f"item-{i}" for i in range(1, 11)]


def _runner(runner_id: str, host: str) -> RunnerInfo:
    return RunnerInfo(runner_id, os.getpid(), host, "", time.time())


def _done(duration: float) -> Outcome:
    return Outcome(ok=True, exit_code=0, duration=duration)


def _failed(code: int, duration: float) -> Outcome:
    return Outcome(ok=False, exit_code=code, duration=duration, reason=f"exit code {code}")


class History:
    """One history, played on a queue of any store (``open_queue`` gives a
    new handle on it): see ``play``."""

    def __init__(self, open_queue: Callable[[], Queue]) -> None:
        self.open_queue = open_queue
        self.q = open_queue()
        self.a = _runner("runner-a", "host-1")
        self.b = _runner("runner-b", "host-2")

    def claim(self, runner: RunnerInfo, item_id: int) -> Claim:
        claim = self.q.store.claim(runner)
        assert claim is not None and claim.item_id == item_id
        return claim

    def crash(self, item_id: int) -> None:
        """A runner on host-2 dies during ``item_id``'s attempt; recovery retries it."""
        dying = self.open_queue()
        lost = _runner("runner-c", "host-2")
        dying.store.register_runner(lost)
        claim = dying.store.claim(lost)
        assert claim is not None and claim.item_id == item_id
        url = getattr(dying.store, "url", None)
        dying.close()
        if url:  # PostgreSQL: a closed store's claim lives until its lease ends
            age_leases(url)
        deadline = time.monotonic() + 30
        while item_id not in self.q.store.recover(on_interrupted=OnInterrupted.RETRY).retried:
            assert time.monotonic() < deadline, "the dead runner's claim was never recovered"
            time.sleep(0.05)

    def play(self) -> float:
        """Items 1-10; returns the time between its two halves.

        Before it: 1's runner dies (crash recovery), then 1 is done; 2 done;
        3 asks to be tried later, then is done; 4 fails for good (it stays
        out of the archive); 5 fails and is cancelled (archived); 6 fails,
        due for a retry. After it: 6 is done (an archived item with an
        attempt on each side), 7 and 8 done, 9 fails for good; 10 stays
        pending."""
        store = self.q.store
        self.q.enqueue(ITEMS)
        self.crash(1)
        for r in (self.a, self.b):
            store.register_runner(r)
        store.finish(self.claim(self.a, 1), _done(0.5))
        store.finish(self.claim(self.b, 2), _done(0.2))
        store.defer(self.claim(self.a, 3), _done(0.05), delay=0.0, max_deferrals=5)
        store.finish(self.claim(self.b, 3), _done(0.3))
        store.finish(self.claim(self.a, 4), _failed(1, 0.4))
        store.finish(self.claim(self.b, 5), _failed(2, 0.6), retry_at=time.time() + 3600)
        assert self.q.cancel([5]) == [5]
        store.finish(self.claim(self.a, 6), _failed(3, 0.7), retry_at=time.time() - 1)
        middle = _between_halves()
        store.finish(self.claim(self.b, 6), _done(1.0))
        store.finish(self.claim(self.a, 7), _done(0.7))
        store.finish(self.claim(self.b, 8), _done(0.8))
        store.finish(self.claim(self.a, 9), _failed(1, 0.9))
        return middle


def _between_halves() -> float:
    """A time that no attempt's recorded end is within 10 ms of: the journal
    rounds its records' times to the millisecond (core/records.py)."""
    time.sleep(0.01)
    middle = time.time()
    time.sleep(0.01)
    return middle


def _stats(q: Queue, since: float | None, now: float) -> dict[str, Any]:
    """`stats --json`'s figures (as the CLI prints them: ``Stats.to_json``),
    those that do not depend on when they were computed."""
    found = q.stats(since, now=now).to_json()
    return {k: v for k, v in found.items() if k not in ("generated_at", "rate", "eta")}


def _report(q: Queue, since: float | None, now: float) -> dict[str, Any]:
    """The report's data (what `report` renders), as plain values."""
    found: Report = q.report(since, now=now)
    return asdict(found)


def _same_on_every_store(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures that do not depend on the times each store saw (each
    store stamps an attempt's end with its own clock)."""
    varying = ("queue", "throughput", "store", "since_seconds", "since", "now")
    kept = {k: v for k, v in figures.items() if k not in varying}
    if "figures" in figures:  # a report
        f = dict(figures["figures"])
        for key in ("first_start", "last_end", "throughput", "timeline"):
            f.pop(key)
        f["failures"] = [
            {k: v for k, v in g.items() if k not in ("first_seen", "last_seen")}
            for g in f["failures"]
        ]
        # Each store's own times, but each knows an interrupted attempt's start.
        f["interrupted"] = [
            {**r, "value": None, "started": r["started"] is not None} for r in f["interrupted"]
        ]
        kept["figures"] = f
    return kept


def _read_all(q: Queue, middle: float, now: float) -> dict[str, Any]:
    window = now - middle
    return {
        "stats": _stats(q, None, now),
        "stats since": _stats(q, window, now),
        "report": _report(q, None, now),
        "report since": _report(q, window, now),
    }


def _played(open_queue: Callable[[], Queue]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The history played, read before and after `compact` (same ``now``)."""
    history = History(open_queue)
    middle = history.play()
    now = time.time() + 1
    with history.q as q:
        before = _read_all(q, middle, now)
        # The done items 1, 2, 3, 6, 7, 8; PostgreSQL's archive takes the
        # cancelled 5 too, the journal keeps it (with its attempt) in its snapshot.
        assert q.compact().archived in (6, 7)
        # A new handle (nothing remembered from before), while the first
        # one's runners are still alive: `report` counts the live runners.
        with open_queue() as fresh:
            after = _read_all(fresh, middle, now)
    return before, after


def test_compact_changes_no_figure_of_stats_or_report(store_url: str) -> None:
    if store_url:
        pytest.importorskip("psycopg")
    before, after = _played(lambda: Queue("parity", store=store_url or None))
    for read in before:
        assert after[read] == before[read], read
    whole, window = after["stats"], after["stats since"]
    # 1's crash and its retry, 2, 3 (its deferral is no attempt), 4, 5, 6 twice, 7, 8, 9.
    assert whole["attempts"] == 11 and whole["failures"]["attempts"] == 5
    assert whole["durations"]["count"] == 6 and whole["durations"]["max"] == 1.0
    assert whole["deferred"] == 1 and whole["failures"]["retried_items"] == 3
    assert {g["runner"]: g["attempts"] for g in whole["runners"]} == {
        "runner-a": 5,
        "runner-b": 5,
        "runner-c": 1,
    }
    assert {g["host"]: g["attempts"] for g in whole["hosts"]} == {"host-1": 5, "host-2": 6}
    # The window holds the second half: 6's retry (archived), 7, 8 (archived), 9 (live).
    assert window["attempts"] == 4 and window["failures"]["attempts"] == 1
    assert window["durations"]["count"] == 3 and window["deferred"] == 0
    report, report_window = after["report"]["figures"], after["report since"]["figures"]
    assert report["attempts"] == 11 and report_window["attempts"] == 4
    assert report["interrupted_total"] == 1 and after["report"]["deferred"] == 1
    assert {r: n for r, _, n in report["runners"]} == {"runner-a": 5, "runner-b": 5, "runner-c": 1}


def test_postgres_counts_its_archive_as_the_journal_does(pg_url: str) -> None:
    pytest.importorskip("psycopg")
    journal_before, journal_after = _played(lambda: Queue("parity"))
    pg_before, pg_after = _played(lambda: Queue("parity", store=pg_url))
    for read in journal_before:
        journal = _same_on_every_store(journal_after[read])
        assert _same_on_every_store(pg_after[read]) == journal, read
        assert _same_on_every_store(pg_before[read]) == journal, read
