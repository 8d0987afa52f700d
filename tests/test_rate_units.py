"""Rate limits and "try later", in process: the parser and its bad input, the
token bucket and its AIMD control, the deferral in every record store (replay,
checkpoint, compaction), and the library's TryLater, later() and rate=."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import statequeue
from statequeue import Queue, TryLater
from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded
from statequeue.core.errors import UsageError
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.core.rates import RateLimit, as_rate, parse_rate
from statequeue.core.recent_rate import FIRST_BATCH
from statequeue.run.options import RunOptions
from statequeue.run.pacing import Pacing
from statequeue.store import rate_bucket
from statequeue.store.base import Store
from statequeue.store.journal.store import JournalStore
from statequeue.store.memory import MemoryStore
from statequeue.store.records.state import QueueState
from statequeue.store.transitions import deferral_reason

# -- parsing, and bad input at the CLI -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "per_second"),
    [
        ("20/s", 20.0),
        ("90/m", 1.5),
        ("1800/h", 0.5),
        (" 2.5 / s ", 2.5),
        ("0.5/s", 0.5),
        ("1e3/s", 1000.0),  # was refused while 1000000000000000000000/s passed
        ("1.5E-2/s", 0.015),
        ("5", 5.0),  # per second, as the library's rate=5 (was refused)
        (" 2.5 ", 2.5),
    ],
)
def test_rates_parse_per_second_minute_and_hour(text: str, per_second: float) -> None:
    assert parse_rate(text).per_second == pytest.approx(per_second)


@pytest.mark.parametrize(
    "text", ["0", "0/s", "-1/s", "5/parsec", "5/", "", "/s", "inf/s", "1e/s", "e3/s", "1e400/s"]
)
def test_a_bad_rate_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("0", "above 0"),
        ("-1/s", "above 0"),
        ("0/m", "above 0"),
        ("5/parsec", "per second, minute or hour"),
        ("99999999999999999999999/s", "at most 1e[+]09/s"),
        ("1e400/s", "at most 1e[+]09/s, not inf"),  # said "must be above 0"
    ],
)
def test_a_bad_rate_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse_rate(text)


def test_the_library_takes_text_a_number_or_a_rate_limit() -> None:
    assert as_rate("20/s") == parse_rate("20/s")
    assert as_rate(5).per_second == 5.0  # type: ignore[union-attr]
    assert as_rate(None) is None
    for bad in (0, -1, "5/parsec", True, float("inf"), float("nan"), 1e10):
        with pytest.raises(UsageError):
            as_rate(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args",
    [
        ["--rate", "0"],
        ["--rate", "-1/s"],
        ["--rate", "5/parsec"],
        ["--rate", "5/s", "--burst", "0"],
        ["--burst", "3"],
        ["--max-deferrals", "-1"],
    ],
)
def test_bad_rate_options_exit_2_in_one_line_and_leave_the_queue_alone(
    sq_home: Path, capfd: pytest.CaptureFixture[str], args: list[str]
) -> None:
    with Queue("default", create=True) as q:
        q.enqueue(["a", "b"])
        before = q.store.read_events(None)[0]
    capfd.readouterr()
    code = run_guarded(_invoke, ["run", *args, "--", "true"])
    sys.stdout.flush()
    _, err = capfd.readouterr()
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), err
    assert "Traceback" not in err
    with Queue("default") as q:
        assert q.store.read_events(None)[0] == before  # not even a runner record
        assert not (sq_home / "default" / "rate").exists()


# -- the bucket --------------------------------------------------------------------------


def test_the_bucket_gives_one_start_per_interval_after_its_burst() -> None:
    limit = RateLimit(10.0, burst=3)
    bucket = rate_bucket.configured(None, limit, now=100.0)
    assert [rate_bucket.take(bucket, 100.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate_bucket.take(bucket, 100.0) == pytest.approx(0.1)  # nothing taken
    assert rate_bucket.take(bucket, 100.05) == pytest.approx(0.05)
    assert rate_bucket.take(bucket, 100.1) == 0.0
    # A pause refills the burst, no more: the 4th start waits a whole interval.
    assert [rate_bucket.take(bucket, 200.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rate_bucket.take(bucket, 200.0) == pytest.approx(0.1)
    assert rate_bucket.take(bucket, 200.1) == 0.0
    assert rate_bucket.take(bucket, 200.15) == pytest.approx(0.05)


@pytest.mark.parametrize("per_second", [1.0, 2.0, 5.0])
def test_after_a_pause_the_first_two_starts_are_a_whole_interval_apart(per_second: float) -> None:
    # The tester's `--rate 1/s` run after an idle spell: the first two starts
    # came 0.5 s apart (half a start of slack held by an idle bucket).
    interval = 1 / per_second
    bucket = rate_bucket.configured(None, RateLimit(per_second), now=100.0)
    assert rate_bucket.take(bucket, 100.0) == 0.0
    assert rate_bucket.take(bucket, 103.0) == 0.0  # after 3 s idle
    assert rate_bucket.take(bucket, 103.0 + interval / 2) == pytest.approx(interval / 2)
    assert rate_bucket.take(bucket, 103.0 + interval * 0.99) > 0.0
    assert rate_bucket.take(bucket, 103.0 + interval) == 0.0
    # The same after an idle spell that other bucket updates (AIMD) looked at:
    rate_bucket.on_deferral(bucket, 110.0)  # halves the rate, refills the bucket
    rate_bucket.on_deferral(bucket, 112.0)
    slower = 1 / bucket.current
    assert rate_bucket.take(bucket, 112.01) == 0.0
    assert rate_bucket.take(bucket, 112.01 + slower / 2) == pytest.approx(slower / 2)


def test_a_late_taker_keeps_what_it_earned_but_only_while_late() -> None:
    bucket = rate_bucket.configured(None, RateLimit(10.0), now=100.0)
    assert rate_bucket.take(bucket, 100.0) == 0.0
    assert rate_bucket.take(bucket, 100.05) == pytest.approx(0.05)  # told: at 100.1
    assert rate_bucket.take(bucket, 100.12) == 0.0  # woke 20 ms late: kept, not lost
    assert rate_bucket.take(bucket, 100.2) == 0.0  # on the original schedule
    # Never more than the late window: a bucket full for longer holds the burst.
    late = 0.1 + rate_bucket.LATE_WINDOW + 0.01
    assert rate_bucket.take(bucket, 100.2 + late) == 0.0
    assert rate_bucket.take(bucket, 100.2 + late + 0.09) > 0.0


def test_a_deferral_halves_the_rate_once_per_hold_and_successes_raise_it_to_the_limit() -> None:
    limit = RateLimit(20.0)
    bucket = rate_bucket.configured(None, limit, now=0.0)
    rate_bucket.on_deferral(bucket, 1.0)
    assert bucket.current == 10.0
    hold = rate_bucket.cut_hold(bucket)
    assert hold == pytest.approx(rate_bucket.HOLD_STARTS / 10.0)  # 4 starts at 10/s
    rate_bucket.on_deferral(bucket, 1.0 + hold / 2)  # the same congestion
    assert bucket.current == 10.0
    rate_bucket.on_deferral(bucket, 1.0 + hold + 1e-9)
    assert bucket.current == 5.0
    slow = rate_bucket.configured(None, RateLimit(1.0), now=0.0)
    assert rate_bucket.cut_hold(slow) == rate_bucket.CUT_HOLD  # at most a second
    seen = []
    for n in range(2000):
        rate_bucket.on_success(bucket, 10.0 + n / 100)
        seen.append(bucket.current)
    assert seen == sorted(seen)  # step by step, never down
    assert seen[0] < 10.0 and seen[-1] == 20.0 and max(seen) == 20.0  # never above the limit
    for _ in range(40):
        rate_bucket.on_deferral(bucket, bucket.cut_at + rate_bucket.CUT_HOLD)
    assert bucket.current == pytest.approx(20.0 * rate_bucket.FLOOR_SHARE)  # a floor, not 0


def test_a_runner_with_another_limit_sets_the_queues_and_a_torn_bucket_starts_afresh() -> None:
    bucket = rate_bucket.configured(None, RateLimit(20.0), now=0.0)
    rate_bucket.configured(bucket, RateLimit(5.0), now=1.0)
    assert (bucket.limit, bucket.current) == (5.0, 5.0)
    assert rate_bucket.bucket_from({"limit": 1}) is None
    assert rate_bucket.bucket_from(bucket.as_dict()) == bucket


@pytest.mark.parametrize("kind", ["journal", "postgres"])
def test_two_opens_of_one_queue_share_the_bucket(
    sq_home: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    one, two = (_open_again(kind, sq_home, request) for _ in range(2))
    limit = RateLimit(1.0, burst=2)
    try:
        assert one.take_start(limit)[0] == 0.0
        assert two.take_start(limit)[0] == 0.0
        assert one.take_start(limit)[0] > 0.5  # the burst is spent, for both
        two.rate_feedback(limit, deferred=True)
        pace = one.pace()
        assert pace is not None and (pace.current, pace.limit) == (0.5, 1.0)
    finally:
        one.close()
        two.close()


@pytest.mark.parametrize("kind", ["journal", "postgres"])
def test_the_runner_that_starts_with_a_new_rate_sets_it_and_the_others_keep_to_it(
    sq_home: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """Each take set the bucket to the taker's limit: two runners with
    different rates rewrote it in turn, and the one at 1/s held the other
    (the last to take) to 1/s as well: starved. A limit is set by a runner's
    first start; later takes keep the queue's limit."""
    slow, fast = (_open_again(kind, sq_home, request) for _ in range(2))
    try:
        assert slow.take_start(RateLimit(1.0))[0] == 0.0  # sets 1/s
        assert fast.take_start(RateLimit(100.0, burst=5))[0] < 0.05  # starts later: 100/s
        for _ in range(3):  # the slow runner's next starts come from the queue's bucket
            assert slow.take_start(RateLimit(1.0))[0] < 0.05
        pace = fast.pace()
        assert pace is not None and (pace.limit, pace.burst) == (100.0, 5)
        slow.rate_feedback(RateLimit(1.0), deferred=False)  # feedback sets no limit either
        pace = slow.pace()
        assert pace is not None and pace.limit == 100.0
    finally:
        slow.close()
        fast.close()


@pytest.mark.parametrize("kind", ["memory", "journal", "postgres"])
def test_each_store_starts_one_per_interval_after_an_idle_spell(
    sq_home: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    store = MemoryStore() if kind == "memory" else _open_again(kind, sq_home, request)
    limit = RateLimit(2.0)  # burst 1: one start per 0.5 s
    try:
        assert store.take_start(limit)[0] == 0.0
        time.sleep(0.8)  # idle: over an interval and a half
        assert store.take_start(limit)[0] == 0.0
        # Half a start of slack in an idle bucket made this 0.25 s or less:
        assert store.take_start(limit)[0] > 0.4
    finally:
        store.close()


def _open_again(kind: str, home: Path, request: pytest.FixtureRequest) -> Store:
    if kind == "postgres":
        from statequeue.store.postgres import PostgresStore  # lazy: psycopg

        return PostgresStore(request.getfixturevalue("pg_url"), "shared")
    Queue("shared", create=True).close()
    return JournalStore(home / "shared", create=False)


# -- the deferral in each store -----------------------------------------------------------


@pytest.fixture(params=["memory", "journal", "postgres"])
def store(request: pytest.FixtureRequest, sq_home: Path) -> Iterator[Store]:
    """One store of each kind: the deferral is the same transition in each."""
    opened: Store
    if request.param == "postgres":
        from statequeue.store.postgres import PostgresStore  # lazy: psycopg

        opened = PostgresStore(request.getfixturevalue("pg_url"), "j")
    elif request.param == "journal":
        Queue("j", create=True).close()
        opened = JournalStore(sq_home / "j", create=False)
    else:
        opened = MemoryStore()
    yield opened
    opened.close()


def test_status_counts_the_starts_of_the_last_minute_in_every_store(store: Store) -> None:
    store.enqueue(["a", "b", "c"])
    assert store.status().starts is None  # none yet
    runner = new_runner()
    store.register_runner(runner)
    for _ in range(3):
        assert store.claim(runner) is not None
    starts = store.status().starts
    assert starts is not None and starts.count == 3
    # Starts that came together with the first one mark when starting began:
    # no rate from them alone (a batch is not an instant rate).
    together = starts.last - starts.first <= FIRST_BATCH
    assert starts.per_second is None if together else starts.per_second > 0
    assert starts.first <= starts.last <= time.time() + 1


def test_status_is_over_the_limit_only_with_more_starts_than_the_bucket_lets_through() -> None:
    from statequeue.core.rates import Pace
    from statequeue.core.views import Starts, Status

    pace = Pace(current=4.0, limit=4.0, burst=1)
    paced = Status("q", {}, pace=pace, starts=Starts(13, 100.0, 103.0, 4.0))  # 1 + 4 * 3
    assert not paced.over_limit
    assert Status("q", {}, pace=pace, starts=Starts(40, 100.0, 103.0, 12.0)).over_limit
    assert not Status("q", {}, starts=Starts(40, 100.0, 103.0, 12.0)).over_limit  # no --rate
    # The limit was set (lowered) after the first of the minute's starts:
    # they came under two limits, and are not judged against the new one.
    lowered = Pace(current=4.0, limit=4.0, burst=1, set_at=101.0)
    assert not Status("q", {}, pace=lowered, starts=Starts(40, 100.0, 103.0, 12.0)).over_limit


def _claim_and_defer(store: Store, *, delay: float, max_deferrals: int = 100) -> ItemState:
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    assert claim is not None
    outcome = Outcome(ok=False, exit_code=75, reason="exit code 75")
    return store.defer(claim, outcome, delay=delay, max_deferrals=max_deferrals)


def test_a_deferral_is_pending_again_without_a_failure(store: Store) -> None:
    store.enqueue(["a"])
    assert _claim_and_defer(store, delay=0.0) is ItemState.PENDING
    claim = store.claim(new_runner())
    assert claim is not None and claim.attempt == 2
    assert claim.failures == 0  # --retries is not spent
    events = [r for r in store.read_events(None)[0] if r["t"] == "defer"]
    assert [(r["delay"], r["deferrals"], r["state"]) for r in events] == [(0.0, 1, "pending")]
    assert store.deferrals() == 1


def test_a_deferral_waits_for_its_delay(store: Store) -> None:
    store.enqueue(["a"])
    _claim_and_defer(store, delay=3600.0)
    assert store.claim(new_runner()) is None
    due = store.next_due()
    assert due is not None and due > 3000 + (store.read_events(None)[0][-1]["at"])
    assert store.status().deferred == 1


def test_past_max_deferrals_the_item_fails_saying_so(store: Store) -> None:
    store.enqueue(["a"])
    states = [_claim_and_defer(store, delay=0.0, max_deferrals=2) for _ in range(3)]
    assert states == [ItemState.PENDING, ItemState.PENDING, ItemState.FAILED]
    (found,) = store.results(ItemState.FAILED)
    assert found.reason == "deferred 3 times, more than --max-deferrals 2"
    assert deferral_reason(1, 0) == "deferred 1 time, more than --max-deferrals 0"


def test_the_journal_keeps_the_count_across_reopen_checkpoint_and_compaction(
    sq_home: Path,
) -> None:
    Queue("j", create=True).close()
    store = JournalStore(sq_home / "j", create=False)
    store.enqueue(["a"])
    _claim_and_defer(store, delay=0.0)
    store.close()
    for step in ("reopen", "compact"):
        store = JournalStore(sq_home / "j", create=False)
        if step == "compact":
            store.compact()
            store.close()
            store = JournalStore(sq_home / "j", create=False)
        live = store.state.get(1)
        assert live is not None and live.deferrals == 1, step
        store.close()
    store = JournalStore(sq_home / "j", create=False)
    assert store.deferrals() == 1  # kept in the item's record by compaction
    assert _claim_and_defer(store, delay=0.0, max_deferrals=1) is ItemState.FAILED
    store.close()


def test_stats_count_the_deferrals_of_archived_items(sq_home: Path) -> None:
    with Queue("arch", create=True) as q:
        q.enqueue(["a"])
        for item in q.work():
            with item:
                if item.attempt == 1:
                    raise TryLater(0)
        assert q.stats().deferred == 1
        q.compact()  # the done item moves to the archive
        assert q.stats().deferred == 1
        assert q.stats(since=3600).deferred == 1


def test_a_checkpoint_keeps_the_count() -> None:
    store = MemoryStore()
    store.enqueue(["a"])
    _claim_and_defer(store, delay=0.0)
    restored = QueueState()
    restored.restore(*store.state.export())
    live = restored.get(1)
    assert live is not None and live.deferrals == 1


def test_a_users_retry_starts_a_new_count(sq_home: Path) -> None:
    store = MemoryStore()
    store.enqueue(["a"])
    _claim_and_defer(store, delay=0.0, max_deferrals=0)
    store.retry([1])
    assert _claim_and_defer(store, delay=0.0, max_deferrals=1) is ItemState.PENDING


# -- the library -----------------------------------------------------------------------------


def test_try_later_and_later_put_the_item_back_without_spending_a_retry(sq_home: Path) -> None:
    with Queue("lib", create=True) as q:
        q.enqueue(["a", "b", "c"])
        seen = []
        for item in q.work(retries=0, max_deferrals=5):
            with item:
                seen.append((item.item, item.attempt))
                if item.attempt == 1 and item.item == "a":
                    raise TryLater(0.05)
                if item.attempt == 1 and item.item == "b":
                    assert item.later(0.0) is ItemState.PENDING
        assert sorted(seen) == [("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1)]
        assert {v.item: v.state for v in q.items()} == dict.fromkeys("abc", ItemState.DONE)
        defers = [r for r in q.store.read_events(None)[0] if r["t"] == "defer"]
        assert sorted(r["delay"] for r in defers) == [0.0, 0.05]
        assert q.stats().deferred == 2


def test_the_library_fails_an_item_past_max_deferrals(sq_home: Path) -> None:
    with Queue("lib", create=True) as q:
        q.enqueue(["a"])
        for item in q.work(max_deferrals=1):
            with item:
                raise TryLater(0)
        (view,) = q.items()
        assert view.state is ItemState.FAILED
        assert "more than --max-deferrals 1" in view.reason


def test_rate_is_taken_from_the_queues_bucket_by_work_and_map(sq_home: Path) -> None:
    with Queue("lib", create=True) as q:
        q.enqueue(["a"])
        for item in q.work(rate="7/s"):
            item.done()
        assert q.status().pace is not None
        assert q.status().pace.limit == 7.0  # type: ignore[union-attr]
    assert statequeue.map(str.upper, ["x", "y"], queue="m", rate="600/m") is not None
    with Queue("m") as q:
        assert q.status().pace.limit == pytest.approx(10.0)  # type: ignore[union-attr]


def test_work_and_map_start_no_faster_than_their_rate(sq_home: Path) -> None:
    with Queue("paced", create=True) as q:
        q.enqueue(["a", "b", "c", "d"])
        for item in q.work(rate="20/s"):
            item.done()
    statequeue.map(str.upper, ["e", "f", "g", "h"], queue="paced", jobs=4, rate=20)
    with Queue("paced") as q:
        starts = [r["at"] for r in q.store.read_events(None)[0] if r["t"] == "start"]
    assert len(starts) == 8
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # A late taker may start up to LATE_SLACK of an interval early; never more,
    # and never faster over the run (the records keep milliseconds):
    slack = rate_bucket.LATE_SLACK
    assert min(gaps) >= (1 - slack) / 20 - 0.002, gaps
    assert starts[-1] - starts[0] >= (len(gaps) - slack) / 20 - 0.002, gaps


def test_map_defers_an_item_whose_function_raises_try_later(sq_home: Path) -> None:
    calls: dict[str, int] = {}

    def fn(text: str) -> str:
        calls[text] = calls.get(text, 0) + 1
        if calls[text] == 1:
            raise TryLater(0.01)
        return text * 2

    assert statequeue.map(fn, ["a", "b"], queue="m", jobs=2, retries=0) == ["aa", "bb"]
    assert calls == {"a": 2, "b": 2}


def test_work_async_and_map_async_defer_on_try_later(sq_home: Path) -> None:
    import asyncio  # lazy: only this test needs an event loop

    async def main() -> list[str]:
        with Queue("aw", create=True) as q:
            q.enqueue(["a", "b"])
            async for item in q.work_async(concurrency=2):
                async with item:
                    if item.attempt == 1 and item.item == "a":
                        raise TryLater(0)
                    if item.attempt == 1:
                        await item.later(0)
                    else:
                        await item.done()
            assert {v.state for v in q.items()} == {ItemState.DONE}
            assert q.stats().deferred == 2

        async def fn(text: str) -> str:
            if text not in seen:
                seen.add(text)
                raise TryLater(0)
            return text

        seen: set[str] = set()
        return await statequeue.map_async(fn, ["x", "y"], queue="am", rate="100/s")

    assert asyncio.run(main()) == ["x", "y"]


class _SlowBucket:
    """A store's bucket that has no start for 10 ms, then one."""

    def __init__(self) -> None:
        self.calls = 0

    def take_start(self, limit: RateLimit) -> tuple[float, float]:
        self.calls += 1
        return (0.01 if self.calls == 1 else 0.0), limit.per_second


def test_a_refused_start_is_looked_for_again_even_once_its_time_has_passed() -> None:
    # A loaded machine: by the time the runner asks when to look again, the
    # refused start's time has passed. It must still be told to look (a time),
    # not that nothing is due, which ended the run with items pending.
    bucket = _SlowBucket()
    pacing = Pacing(bucket, RunOptions(command=("true",), rate=parse_rate("20/s", 1)))  # type: ignore[arg-type]
    assert not pacing.may_start()
    time.sleep(0.02)
    assert pacing.due(None) is not None
    assert pacing.may_start()
    assert pacing.due(None) is None  # taken: nothing to wake for
