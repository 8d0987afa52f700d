"""Issue 23 on every store: ``Store.interrupt`` (a persistent worker died
mid-item), and `run --persistent` on a real PostgreSQL server (tests/pg.py):
the fencing token in each request, a worker killed -9, and a partitioned
runner (tests/pg_proxy.py) whose worker is dead before its lease ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.errors import StateQueueError
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, OnInterrupted
from tests.conftest import STATEQUEUE
from tests.persistent_worker import write_worker
from tests.pg import PgCluster
from tests.pg import sql as _sql
from tests.test_store_contract import STORES, Harness
from tests.waiting import gone, until

DEADLINE = 60.0  # generous: the machine is shared


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    url = request.getfixturevalue("pg_url") if request.param == "postgres" else ""
    h = Harness(request.param, tmp_path / "q", url)
    yield h
    h.close()


def test_interrupt_counts_a_crash_applies_the_policy_and_holds_poison(harness: Harness) -> None:
    store = harness.open()
    store.enqueue(["a", "b"])
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    assert claim is not None and claim.item == "a"
    why = "interrupted: its persistent worker was killed by signal 9 during attempt 1"
    assert store.interrupt(claim, why, max_crashes=2) is ItemState.PENDING
    with pytest.raises(StateQueueError):  # the claim is released: a second write is refused
        store.interrupt(claim, why, max_crashes=2)
    again = store.claim(runner)
    assert again is not None and (again.item, again.attempt, again.interrupted) == ("a", 2, True)
    assert store.interrupt(again, why, max_crashes=2) is ItemState.HELD
    views = {v.item: v for v in store.items()}
    assert (views["a"].state, views["a"].attempts) == (ItemState.HELD, 2)
    assert views["a"].reason == "poison: in flight during 2 runner crashes; held"
    other = store.claim(runner)
    assert other is not None and other.item == "b"
    assert store.interrupt(other, why, on_interrupted=OnInterrupted.FAIL) is ItemState.FAILED
    assert {v.item: v.reason for v in store.items()}["b"] == why


# -- a real run on PostgreSQL ------------------------------------------------------


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(DEADLINE)


def _start(
    env: dict[str, str], tmp_path: Path, url: str, *options: str
) -> tuple[subprocess.Popen[bytes], Path]:
    program, marks = write_worker(tmp_path)
    argv = [STATEQUEUE, "run", "--no-live", "--persistent", *options, "--"]
    with open(tmp_path / "run.err", "wb") as err:
        proc = subprocess.Popen(
            [*argv, sys.executable, program, str(marks)],
            env=dict(env, STATEQUEUE_STORE=url),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    return proc, marks


def _pid_of(marks: Path, item: str) -> int:
    path = marks / f"{item}.pid"
    found = until(lambda: path.exists() and path.read_text().split(), f"{item} to start")
    return int(found[-1])  # type: ignore[index]


def _results(url: str) -> dict[str, tuple[int, object]]:
    rows = _sql(
        url,
        "SELECT i.item, r.attempt, r.result FROM statequeue.results r"
        " JOIN statequeue.items i ON i.id = r.id AND i.queue = r.queue",
    )
    return {bytes(item).decode(): (int(str(attempt)), result) for item, attempt, result in rows}  # type: ignore[arg-type]


def test_a_worker_killed_on_postgresql_is_interrupted_and_retried_with_a_token(
    tmp_path: Path, sq_env: dict[str, str], pg_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "ok-1", "slow-1", "ok-2"], env=env, check=True)
    run, marks = _start(sq_env, tmp_path, pg_url, "--lease", "3s")
    procs.append(run)
    os.kill(_pid_of(marks, "slow-1"), signal.SIGKILL)
    assert run.wait(DEADLINE) == 0, (tmp_path / "run.err").read_text()
    results = _results(pg_url)
    assert {item: attempt for item, (attempt, _) in results.items()} == {
        "ok-1": 1,
        "slow-1": 2,
        "ok-2": 1,
    }
    for _, result in results.values():
        assert isinstance(result, dict) and isinstance(result["token"], int)
    retried = results["slow-1"][1]
    assert isinstance(retried, dict) and retried["interrupted"] is True
    assert not (marks / "overlap").exists()


def test_the_lease_of_the_item_in_flight_is_renewed_while_the_worker_works(
    tmp_path: Path, sq_env: dict[str, str], pg_url: str, procs: list[subprocess.Popen[bytes]]
) -> None:
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "nap-1"], env=env, check=True)
    run, _ = _start(sq_env, tmp_path, pg_url, "--lease", "1s")  # the item takes 3 s
    procs.append(run)
    assert run.wait(DEADLINE) == 0, (tmp_path / "run.err").read_text()
    assert {item: attempt for item, (attempt, _) in _results(pg_url).items()} == {"nap-1": 1}
    assert "lease lost" not in (tmp_path / "run.err").read_text()


def test_a_partitioned_runners_worker_is_dead_before_its_lease_ends(
    tmp_path: Path,
    sq_env: dict[str, str],
    pg_url: str,
    pg_cluster: PgCluster,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    from tests.pg_proxy import proxy_for  # lazy: psycopg-free collection of the rest

    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    subprocess.run([STATEQUEUE, "enqueue", "hang-1"], env=env, check=True)
    with proxy_for(pg_cluster) as proxy:
        run, marks = _start(sq_env, tmp_path, proxy.url(pg_url), "--lease", "4s")
        procs.append(run)
        worker = _pid_of(marks, "hang-1")
        proxy.pause()
        until(lambda: _lease_over(pg_url, 1), "the lease to end on the database clock")
        assert gone(worker), "the worker outlived its runner's lease"
        assert "item 1: lease lost" in (tmp_path / "run.err").read_text()
        proxy.resume()
        os.kill(run.pid, signal.SIGTERM)
        run.wait(DEADLINE)
    assert _sql(pg_url, "SELECT count(*) FROM statequeue.results") == [(0,)]


def _lease_over(url: str, item_id: int) -> bool:
    rows = _sql(
        url,
        "SELECT lease_until IS NULL OR lease_until < clock_timestamp() FROM statequeue.live"
        " WHERE id = %s",
        item_id,
    )
    return not rows or bool(rows[0][0])
