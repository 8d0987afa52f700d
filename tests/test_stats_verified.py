"""`stats` and items --verify settled done without running: each is still an
attempt (as `list` and `show` count it, attempt 1), but it ran nothing, so
its recorded 0 s is no duration: it used to drag p50 and the mean down. The
same on the journal (live, cached in stats.ckpt, and archived), the memory
store and PostgreSQL."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.models import Outcome, RunnerInfo
from statequeue.stats.figures import Stats
from statequeue.store.memory import MemoryStore
from tests.conftest import STATEQUEUE

RAN = [2.0, 3.0, 4.0]


def fill(q: Queue) -> None:
    """Items 1-3 ran for 2, 3 and 4 s; 4 and 5 were verified done, not run."""
    runner = RunnerInfo("runner-a", 1, "host-1", "boot", 1.0, ("./work", "{}"))
    q.store.register_runner(runner)
    q.enqueue([f"item-{i}" for i in range(1, 6)])
    # As the records hold them (core.models.VERIFIED_REASONS), old ones included.
    reasons = ["verified before run", "verified: finished before its runner died"]
    for i in range(1, 6):
        claim = q.store.claim(runner)
        assert claim is not None and claim.item_id == i
        if i <= len(RAN):
            outcome = Outcome(ok=True, exit_code=0, duration=RAN[i - 1])
        else:
            outcome = Outcome(ok=True, reason=reasons[i - 4])
        q.store.finish(claim, outcome)


def check(s: Stats) -> None:
    assert s.attempts == 5  # as `list` shows them: each done in attempt 1
    assert s.counts["done"] == 5
    d = s.durations
    assert (d.count, d.min, d.max, d.mean) == (3, 2.0, 4.0, 3.0)
    assert [x.item_id for x in s.slowest] == [3, 2, 1]


def test_the_journal_leaves_verified_attempts_out_of_durations(sq_home: Path) -> None:
    with Queue("v", home=sq_home) as q:
        fill(q)
        check(q.stats())
    with Queue("v", home=sq_home) as q:
        check(q.stats())  # from stats.ckpt
        assert q.compact().archived == 5
    with Queue("v", home=sq_home) as q:
        check(q.stats())  # from the archive
    (sq_home / "v" / "stats.ckpt").unlink()
    with Queue("v", home=sq_home) as q:
        check(q.stats())  # the archive read again


def test_the_memory_store_too() -> None:
    q = Queue(store=MemoryStore("v"))
    fill(q)
    check(q.stats())


def test_postgres_too(pg_url: str) -> None:
    pytest.importorskip("psycopg")
    with Queue("v", store=pg_url) as q:
        fill(q)
        check(q.stats())


def test_stats_after_run_verify_first(sq_env: dict[str, str], tmp_path: Path) -> None:
    run: Callable[..., subprocess.CompletedProcess[str]] = lambda *args: subprocess.run(  # noqa: E731
        [STATEQUEUE, *args], env=sq_env, capture_output=True, text=True, timeout=60, check=False
    )
    assert run("enqueue", "a", "b", "c").returncode == 0
    done = run("run", "--verify-first", "--verify", "test {} != c", "--", "true")
    assert done.returncode == 0, done.stderr
    shown = run("stats")
    assert shown.returncode == 0, shown.stderr
    assert "queue default: 3 finished attempts (3 done)\n" in shown.stdout
    assert "durations of 1 done item " in shown.stdout
