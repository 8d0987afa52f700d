"""`statequeue stats` (issue 15): known durations and failures in, exact figures out
(quantiles within the sketch's stated error), for the journal, the archive and
PostgreSQL alike."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.core.models import OnInterrupted, Outcome, RunnerInfo
from statequeue.stats.attempts import Attempt
from statequeue.stats.figures import compute_stats
from tests.conftest import STATEQUEUE
from tests.test_store_contract import age_leases

ALPHA = 0.01


def _runner(runner_id: str, host: str) -> RunnerInfo:
    return RunnerInfo(runner_id, os.getpid(), host, "", time.time())


@dataclass
class Expected:
    durations: list[float] = field(default_factory=list)
    per_runner: dict[str, list[int]] = field(default_factory=dict)  # runner -> [attempts, failed]

    def count(self, runner: str, ok: bool) -> None:
        n = self.per_runner.setdefault(runner, [0, 0])
        n[0] += 1
        n[1] += 0 if ok else 1


_EXIT_1 = Outcome(ok=False, exit_code=1, duration=0.2, reason="exit code 1")
_FAILURES: dict[int, Outcome] = {
    **dict.fromkeys(range(31, 35), _EXIT_1),
    35: Outcome(ok=False, signal=15, duration=1.0, timed_out=True, reason="timed out after 1s"),
    36: Outcome(ok=False, signal=15, duration=1.0, timed_out=True, reason="timed out after 1s"),
    37: Outcome(ok=False, signal=9, duration=0.5, reason="killed by signal 9 (SIGKILL)"),
}


def fill(open_queue: Callable[[], Queue]) -> Expected:
    """40 items: 1-30 done in i/10 s by two runners on two hosts; 31-34 exit 1;
    35-36 time out; 37 is killed; 38 exits 2, is retried, then done in 10 s;
    39's runner dies during it (held by recovery); 40 stays pending."""
    q = open_queue()
    store = q.store
    runners = [_runner("runner-a", "host-1"), _runner("runner-b", "host-2")]
    for r in runners:
        store.register_runner(r)
    q.enqueue([f"item-{i}" for i in range(1, 41)])
    want = Expected()
    for i in range(1, 39):
        runner = runners[i % 2]
        claim = store.claim(runner)
        assert claim is not None and claim.item_id == i
        if i == 38:
            first = Outcome(ok=False, exit_code=2, duration=0.1, reason="exit code 2")
            store.finish(claim, first, retry_at=time.time() - 1)
            want.count(runner.runner_id, False)
            claim = store.claim(runner)
            assert claim is not None and claim.item_id == 38 and claim.attempt == 2
            outcome = Outcome(ok=True, exit_code=0, duration=10.0)
        else:
            outcome = _FAILURES.get(i) or Outcome(ok=True, exit_code=0, duration=i / 10)
        store.finish(claim, outcome)
        want.count(runner.runner_id, outcome.ok)
        if outcome.ok:
            want.durations.append(outcome.duration)
    dying = open_queue()  # its runner and claim die with it
    lost = _runner("runner-c", "host-2")
    dying.store.register_runner(lost)
    claim = dying.store.claim(lost)
    assert claim is not None and claim.item_id == 39
    url = getattr(dying.store, "url", None)
    dying.close()
    if url:  # PostgreSQL: a closed store's claim lives until its lease ends
        age_leases(url)
    deadline = time.monotonic() + 30
    while not store.recover(on_interrupted=OnInterrupted.HOLD).held:
        assert time.monotonic() < deadline, "the dead runner's claim was never recovered"
        time.sleep(0.05)
    want.count("runner-c", False)
    return want


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered)) - 1]


def check_figures(q: Queue, want: Expected) -> dict[str, Any]:
    s = q.stats()
    d = s.durations
    assert d.count == 31 and d.max == 10.0 and d.min == pytest.approx(0.1)
    for name, quantile in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        exact = _nearest_rank(want.durations, quantile)
        assert d.quantiles[name] == pytest.approx(exact, rel=ALPHA), name
    assert sum(n for _, _, n in d.histogram) == 31
    assert [(x.item_id, x.attempt, x.duration) for x in s.slowest] == [
        (38, 2, 10.0),
        (30, 1, 3.0),
        (29, 1, 2.9),
        (28, 1, 2.8),
        (27, 1, 2.7),
    ]
    reasons = {g.reason: (g.count, g.example_id) for g in s.reasons}
    assert reasons == {
        "exit code 1": (4, 31),
        "timed out": (2, 35),
        "killed by SIGKILL": (1, 37),
        "exit code 2": (1, 38),
        "interrupted": (1, 39),
    }
    assert s.attempts == 40 and s.failed_attempts == 9
    assert s.retried_items == 1
    assert s.held == (39,)
    assert {g.name: [g.attempts, g.failed] for g in s.runners} == want.per_runner
    assert {g.name: g.host for g in s.runners} == {
        "runner-a": "host-1",
        "runner-b": "host-2",
        "runner-c": "host-2",
    }
    hosts = {g.name: (g.attempts, g.failed) for g in s.hosts}
    a, b, c = (want.per_runner[r] for r in ("runner-a", "runner-b", "runner-c"))
    assert hosts == {"host-1": (a[0], a[1]), "host-2": (b[0] + c[0], b[1] + c[1])}
    assert s.counts["pending"] == 1 and s.counts["held"] == 1 and s.counts["done"] == 31
    return _comparable(s.to_json())


def _comparable(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures that do not depend on when they were computed."""
    return {k: v for k, v in figures.items() if k not in ("generated_at", "rate", "eta")}


def test_known_durations_and_failures_give_exact_figures_also_once_archived() -> None:
    want = fill(lambda: Queue("known"))
    q = Queue("known")
    before = check_figures(q, want)
    assert q.compact().archived == 31
    after = check_figures(Queue("known"), want)
    assert after == before


def test_the_memory_store_gives_the_same_figures() -> None:
    from statequeue.store.memory import MemoryStore

    local = fill(lambda: Queue("same"))
    figures = _comparable(Queue("same").stats().to_json())
    store = MemoryStore("same")
    shared = Queue(store=store)
    memory_want = fill(lambda: _CrashOnClose(store, shared))
    assert memory_want.per_runner == local.per_runner
    got = _comparable(shared.stats().to_json())
    assert got == {**figures, "queue": "same"}


class _CrashOnClose(Queue):
    """A second handle on a memory store whose close() is a process death."""

    def __init__(self, store: Any, first: Queue) -> None:
        self._first = first
        super().__init__(store=store)

    def close(self) -> None:
        self.store.crash()  # type: ignore[attr-defined]
        # The first handle's runners are alive: register them again.
        for r in ("runner-a", "runner-b"):
            self.store._runners.add(r)  # type: ignore[attr-defined]


def test_postgres_gives_the_same_figures_as_the_journal(pg_url: str) -> None:
    pytest.importorskip("psycopg")
    local_want = fill(lambda: Queue("pgsame"))
    local = _comparable(Queue("pgsame").stats().to_json())
    queues: list[Queue] = []

    def open_pg() -> Queue:
        queues.append(Queue("pgsame", store=pg_url))
        return queues[-1]

    want = fill(open_pg)
    assert want.per_runner == local_want.per_runner
    got = check_figures(queues[0], want)
    # The throughput buckets hold the same finishes, at the times each store saw.
    for figures in (got, local):
        figures["throughput"] = sum(figures["throughput"]["finished"])
    assert got == local


def _attempt(item_id: int, ended_at: float, *, ok: bool = True, state: str = "done") -> Attempt:
    return Attempt(item_id, 1, state, ok, 1.0, "", 0, None, False, "r", "h", ended_at)


def test_eta_is_the_left_items_over_the_rate_of_the_last_ten_minutes() -> None:
    # One finish a second for 20 minutes; the window (600 s) holds 600 of them.
    attempts = [_attempt(i, 1000.0 + i) for i in range(1, 1201)]
    s = compute_stats(attempts, counts={"pending": 290, "running": 10}, now=2200.0)
    assert s.rate_window == 600 and s.recent_finishes == 600
    assert s.rate == pytest.approx(1.0)
    assert s.eta == pytest.approx(300.0)
    figures = s.to_json()
    assert figures["rate"] == {"window_seconds": 600, "finished_in_window": 600, "per_minute": 60.0}
    eta = {"left": 300, "seconds": 300.0, "runner_active": None, "paused": False}
    assert figures["eta"] == eta
    # Throughput over the span: 20 full one-minute buckets of 60 finishes.
    assert figures["throughput"]["bucket_seconds"] == 60
    assert sum(figures["throughput"]["finished"]) == 1200
    idle = compute_stats(attempts, counts={"pending": 5}, now=9000.0)
    assert idle.rate == 0 and idle.eta is None


def test_throughput_buckets_stay_few_on_a_long_run() -> None:
    # A finish a minute for 3 days: 4320 minutes, merged into at most 120 buckets.
    attempts = [_attempt(i, 60.0 * i) for i in range(1, 4321)]
    s = compute_stats(attempts, now=60.0 * 4321)
    assert len(s.throughput.counts) <= 120
    assert s.throughput.bucket_seconds == 60 * 64
    assert sum(s.throughput.counts) == 4320


def test_since_counts_only_attempts_that_ended_in_the_window() -> None:
    attempts = [_attempt(i, float(i)) for i in range(1, 101)]
    s = compute_stats(attempts, now=100.0, since=10.5)
    assert s.attempts == 11 and s.durations.count == 11  # ended at 90 ... 100
    assert s.to_json()["since_seconds"] == 10.5


def test_since_through_the_queue() -> None:
    fill(lambda: Queue("window"))
    q = Queue("window")
    assert q.stats(since=3600).attempts == 40
    assert q.stats(since=60, now=time.time() + 3600).attempts == 0


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_json_schema_and_plain_output(sq_env: dict[str, str]) -> None:
    fill(lambda: Queue("cli"))
    done = _sq(sq_env, "-q", "cli", "stats", "--json", "--since", "1d")
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["schema"] == "statequeue.stats/1"
    assert set(figures) == {
        "schema",
        "queue",
        "generated_at",
        "since_seconds",
        "counts",
        "attempts",
        "durations",
        "throughput",
        "rate",
        "eta",
        "failures",
        "slowest",
        "runners",
        "hosts",
        "deferred",
    }
    assert set(figures["durations"]) >= {"count", "p50", "p90", "p99", "max", "relative_error"}
    assert figures["durations"]["relative_error"] == ALPHA
    assert figures["since_seconds"] == 86400
    assert figures["failures"]["reasons"][0] == {
        "reason": "exit code 1",
        "count": 4,
        "example": {"id": 31, "attempt": 1},
    }
    plain = _sq(sq_env, "-q", "cli", "stats")
    assert plain.returncode == 0
    assert "p50" in plain.stdout and "exit code 1" in plain.stdout and "#38 " in plain.stdout
    assert "\x1b[" not in plain.stdout  # not a terminal: no colour, no bars


def test_empty_queue_and_bad_input(sq_env: dict[str, str]) -> None:
    Queue("empty").enqueue(["a"])
    empty = _sq(sq_env, "-q", "empty", "stats")
    assert empty.returncode == 0
    assert "no finished attempts yet" in empty.stdout
    assert json.loads(_sq(sq_env, "-q", "empty", "stats", "--json").stdout)["attempts"] == 0
    bad = _sq(sq_env, "-q", "empty", "stats", "--since", "soon")
    assert bad.returncode == 2 and bad.stderr.startswith("statequeue: invalid duration")
    assert len(bad.stderr.splitlines()) == 1
    missing = _sq(sq_env, "-q", "nope", "stats")
    assert missing.returncode == 7 and missing.stderr.startswith("statequeue: no queue")


def test_end_records_of_an_older_statequeue_take_their_runner_from_the_start() -> None:
    # Before issue 15 an `end` named neither runner nor host: the scan joins
    # the attempt's `start` (kept undecoded until its end) and the `run` record.
    q = Queue("legacy")
    q.enqueue(["a", "b"])
    store = q.store
    with store._locked():  # type: ignore[attr-defined]
        store._write(  # type: ignore[attr-defined]
            [
                {"t": "run", "runner": "old", "pid": 1, "host": "box", "boot": "", "since": 1.0},
                {"t": "start", "id": 1, "attempt": 1, "runner": "old", "at": 5.0},
                {"t": "start", "id": 2, "attempt": 1, "runner": "old", "at": 5.0},
                {"t": "end", "id": 2, "attempt": 1, "state": "failed", "ok": False, "at": 6.0},
                {"t": "end", "id": 1, "attempt": 1, "state": "done", "ok": True, "at": 7.0},
            ],
            sync=True,
        )
    s = Queue("legacy").stats()
    assert [(g.name, g.host, g.attempts, g.failed) for g in s.runners] == [("old", "box", 2, 1)]


def test_watch_rate_folds_only_new_events() -> None:
    from statequeue.stats.rates import LiveRate
    from statequeue.store.memory import MemoryStore

    store = MemoryStore("watch")
    read: list[int] = []
    real = store.read_events

    def counting(cursor: object | None) -> tuple[list[Any], object]:
        found, new = real(cursor)
        read.append(len(found))
        return found, new

    store.read_events = counting  # type: ignore[method-assign]
    runner = _runner("r", "h")
    store.register_runner(runner)
    store.enqueue(["a", "b", "c", "d"])

    def run_one(ok: bool = True) -> None:
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=ok, duration=1.0, exit_code=0 if ok else 1))

    live = LiveRate(store)
    run_one()
    run_one(ok=False)
    live.update()
    assert live.recent.count(time.time()) == 2
    run_one()
    live.update()
    assert live.recent.count(time.time()) == 3
    assert sum(read) == len(store.records)  # every record read once, none again
    assert live.rate(time.time()) is not None


def test_status_watch_shows_the_rate_and_eta_lines(sq_env: dict[str, str]) -> None:
    q = Queue("watched")
    store = q.store
    runner = _runner("r", "h")
    store.register_runner(runner)
    q.enqueue(["a", "b", "c", "d", "e"])
    for _ in range(3):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, duration=0.5, exit_code=0))
    # The runner stays active (registered, its lock held) while the watch looks.
    proc = subprocess.Popen(
        [STATEQUEUE, "-q", "watched", "status", "--watch", "--interval", "0.2"],
        env=sq_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        seen = ""
        while "ETA" not in seen and time.monotonic() < deadline:
            seen += proc.stdout.readline()
        assert "rate: " in seen and "(3 finished)" in seen
        assert "over the last 10m00s" not in seen  # the window measured: since the first finish
        assert "ETA " in seen and "for 2 items left" in seen
    finally:
        proc.kill()  # by its pid
        proc.wait()
        q.close()


def test_iter_attempts_yields_one_record_per_finished_attempt() -> None:
    fill(lambda: Queue("each"))
    q = Queue("each")
    for _ in range(2):  # live journal, then archive and carried-over tries
        found = sorted((a.item_id, a.attempt, a.ok, a.interrupted) for a in q.store.iter_attempts())
        assert len(found) == 40
        assert (38, 1, False, False) in found and (38, 2, True, False) in found
        assert (39, 1, False, True) in found
        batched = [
            row
            for b in q.store.iter_attempt_batches()
            for row in zip(b.item_id, b.attempt, b.ok, strict=True)
        ]
        assert sorted(batched) == [(i, n, ok) for i, n, ok, _ in found]
        q.compact()


def test_zero_durations_get_a_first_bin_from_zero() -> None:
    attempts = [_attempt(i, 1.0)._replace(duration=d) for i, d in enumerate([0.0, 0.0, 0.3, 0.5])]
    s = compute_stats(attempts, now=2.0)
    assert s.durations.histogram[0][:2] == (0.0, 0.2) and s.durations.histogram[0][2] == 2
    assert sum(n for _, _, n in s.durations.histogram) == 4
