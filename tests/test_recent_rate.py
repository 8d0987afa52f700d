"""The current rate (items finished per second) is measured from when the work
it counts began, in every view and on every store, not from the first finish.

4 runners taking 4 items of 3 s each: the 4 finishes come together, 3 s after
the 4 starts. `status` divided them by the time since the first finish (1 ms
at least): "594.8 items/min, ETA 3.6s" where 80 a minute were finishing, and
`stats` and `status --watch` (since the first finish, 1 s at least) gave two
more figures. The start rate counted a first batch of starts as an instant rate
too. Each test builds that state and asks each store's rate function and the
shared estimator (``core.recent_rate``) for 4/3 a second.
"""

from __future__ import annotations

import time
import uuid

import pytest

from statequeue.stats.figures import StatsBuilder
from statequeue.stats.rates import RecentRate
from statequeue.store.records.state import QueueState

T0 = 1_800_000_000.0
EACH = 4 / 3  # 4 items every 3 s


def test_the_shared_estimator_measures_from_when_the_work_began() -> None:
    from statequeue.core.recent_rate import began_of, rate_span, recent_rate

    assert recent_rate(4, T0, T0 + 3, 60.0) == pytest.approx(EACH)
    assert rate_span(T0, T0 + 3, 60.0) == pytest.approx(3.0)
    assert rate_span(T0, T0 + 0.001, 60.0) == 1.0  # never a division by about 0
    assert rate_span(T0 - 3600, T0, 60.0) == 60.0  # at most the window
    # Unpaired starts and finishes: a finish before any start of the window
    # belongs to an attempt that began before it.
    assert began_of([T0, T0 + 3], T0 + 3, T0 - 57) == T0
    assert began_of([T0 + 3.1], T0 + 3, T0 - 57) == T0 - 57


def test_the_journal_state_rate_counts_from_the_first_start() -> None:
    state = QueueState()
    state.recent_starts.extend([T0] * 4)
    state.recent_ends.extend([T0 + 3] * 4)
    state.recent_starts.extend([T0 + 3] * 4)  # the next batch, started at once
    assert state.rate(T0 + 3) == pytest.approx(EACH)
    assert state.rate(T0 + 6) == pytest.approx(4 / 6)  # the next batch is not done yet


def test_the_journal_state_rate_in_a_full_window_is_the_window() -> None:
    state = QueueState()
    for k in range(40):  # 4 every 3 s for two minutes: the window is full
        state.recent_starts.extend([T0 + 3 * k + 0.002] * 4)  # just after the batch before ended
        state.recent_ends.extend([T0 + 3 * k + 3] * 4)
    now = T0 + 120.5
    assert state.rate(now) == pytest.approx(80 / 60.0)


def test_the_journal_state_rate_is_not_capped_by_the_times_it_keeps() -> None:
    """Only the last 2,000 starts and ends are kept: 11,000 items a second
    filled them in under 0.2 s, and a span of 1 s at least showed 2,000/s."""
    from statequeue.store.records.state import RATE_WINDOW_ITEMS

    state = QueueState()
    every = 1 / 11_000
    for k in range(3 * RATE_WINDOW_ITEMS):  # three times what is kept
        state.recent_starts.append(T0 + k * every)
        state.recent_ends.append(T0 + k * every + every / 2)
    now = T0 + 3 * RATE_WINDOW_ITEMS * every
    assert state.rate(now) == pytest.approx(11_000, rel=0.01)
    starts = state.starts(now, 60.0)
    assert starts is not None and starts.per_second == pytest.approx(11_000, rel=0.01)
    # A few finishes after a full window of starts are still a slow rate.
    slow = QueueState()
    slow.recent_starts.extend(T0 + k * every for k in range(RATE_WINDOW_ITEMS))
    slow.recent_ends.extend([T0 + 0.2, T0 + 0.3])
    assert slow.rate(T0 + 0.3) == pytest.approx(2.0)


def test_the_stats_rate_counts_from_the_attempts_starts() -> None:
    """`stats` and `status --watch` (``LiveRate``: a ``RecentRate``)."""
    from statequeue.stats.attempts import Attempt, batches_of

    b = StatsBuilder(now=T0 + 3)
    b.add_all(
        batches_of(
            [
                Attempt(i, 1, "done", True, 3.0, "", 0, None, False, "r", "h", T0 + 3)
                for i in range(4)
            ]
        )
    )
    assert b.recent.span(T0 + 3) == pytest.approx(3.0)
    assert b.build(queue="q", counts={}).rate == pytest.approx(EACH)
    recent = RecentRate()
    for _ in range(4):
        recent.add(T0 + 3, 3.0)
    assert recent.rate(T0 + 3) == pytest.approx(EACH)


def test_stats_and_status_give_one_rate() -> None:
    """The `stats` summary (what `status --watch` shows) and the journal
    state's status rate agree on the same run."""
    from statequeue.stats.attempts import Attempt, batches_of

    b = StatsBuilder(now=T0 + 6)
    attempts = [
        Attempt(i, 1, "done", True, 3.0, "", 0, None, False, "r", "h", T0 + 3 * (1 + i // 4))
        for i in range(8)
    ]
    b.add_all(batches_of(attempts))
    stats = b.build(queue="q", counts={"pending": 4})
    state = QueueState()
    for k in range(3):
        state.recent_starts.extend([T0 + 3 * k] * 4)
    state.recent_ends.extend([T0 + 3] * 4 + [T0 + 6] * 4)
    assert stats.rate == pytest.approx(8 / 6)
    assert state.rate(T0 + 6) == pytest.approx(stats.rate)


def test_the_start_rate_leaves_out_the_batch_that_began_it() -> None:
    from statequeue.core.recent_rate import start_rate

    assert start_rate(8, 4, T0, T0 + 3.25) == pytest.approx(4 / 3.25)
    assert start_rate(4, 4, T0, T0 + 0.001) is None  # one batch: no rate yet
    assert start_rate(2, 1, T0, T0 + 0.001) == 1.0  # never a division by about 0


def test_the_journal_status_start_rate_leaves_out_the_first_batch() -> None:
    # 4 starts, then 4 more 3 s later: 4 per 3 s, not 8 in 3.25 s.
    from statequeue.store.records.listing import status_view

    state = QueueState()
    t0 = time.time() - 3.25
    state.recent_starts.extend([t0] * 4 + [t0 + 3] * 4)
    starts = status_view("q", state, [], ()).starts
    assert starts is not None and starts.count == 8
    assert starts.per_second == pytest.approx(4 / 3.25, rel=0.05)  # was 8 / 3.25


# -- PostgreSQL ------------------------------------------------------------------


def test_the_postgres_status_rate_counts_from_the_attempts_starts(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from statequeue.store.postgres import PostgresStore

    queue = f"r{uuid.uuid4().hex[:8]}"
    store = PostgresStore(pg_url, queue)
    try:
        now = time.time()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for i in range(4):  # 4 attempts of 3 s that finished together, now
                conn.execute(
                    "INSERT INTO statequeue.results (token, queue, id, attempt, state, ok,"
                    " duration, at) VALUES (%s, %s, %s, 1, 'done', true, 3.0, %s)",
                    (10_000_000 + i, queue, i + 1, now),
                )
        assert store.status().rate == pytest.approx(EACH, rel=0.05)
    finally:
        store.close()


_START = """
INSERT INTO statequeue.events (queue, id, body)
VALUES (%s, %s, jsonb_build_object('t', 'start', 'id', %s, 'attempt', 1, 'at', %s::float8))
"""


def test_the_postgres_start_rate_leaves_out_the_first_batch(pg_url: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from statequeue.store.postgres import PostgresStore

    queue = f"s{uuid.uuid4().hex[:8]}"
    store = PostgresStore(pg_url, queue)
    try:
        t0 = time.time() - 3.25
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for i in range(8):
                conn.execute(_START, (queue, i + 1, i + 1, t0 + (3.0 if i >= 4 else 0.0)))
        starts = store.status().starts
        assert starts is not None and starts.count == 8
        assert starts.per_second == pytest.approx(4 / 3.25, rel=0.1)  # was 8 / 3.25
    finally:
        store.close()
