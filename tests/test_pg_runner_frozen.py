"""PostgreSQL: a runner frozen past its lease (SIGSTOP, a suspended machine)
that resumes and works on.

Found by outside testing: the resumed runner's first claim reaped before its
heartbeat renewed, and recorded its own runner lost; or another runner's
reaper had. Either way it went on claiming under a runner row marked
stopped: `status` said no runner was active, and `drop` deleted the queue
under it. Now a reaper never records its own store's runners lost (their
expired claims are recovered all the same), and a heartbeat that finds its
runner's row marked lost revives it, unless that runner was unregistered.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from tests.pg import sql
from tests.test_store_contract import age_leases

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)


def _stopped(url: str, runner_id: str) -> bool:
    query = "SELECT stopped_at IS NOT NULL FROM statequeue.runners WHERE runner_id = %s"
    (row,) = sql(url, query, runner_id)
    return bool(row[0])


def _lost_events(url: str, runner_id: str) -> int:
    (row,) = sql(
        url,
        "SELECT count(*) FROM statequeue.events WHERE body->>'t' = 'stop'"
        " AND body->>'reason' = 'died' AND body->>'runner' = %s",
        runner_id,
    )
    return int(row[0])


def test_a_frozen_runner_is_not_recorded_lost_by_its_own_reaper(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEQUEUE_HOME", str(tmp_path))
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue(["a", "b"])
        runner = new_runner(("true",))
        store.register_runner(runner)
        claim = store.claim(runner)
        assert claim is not None
        age_leases(pg_url)  # frozen past its lease: the claim and the heartbeat ran out
        store.recover()  # its first step on resuming: a reap
        assert not _stopped(pg_url, runner.runner_id), "it recorded itself lost"
        assert _lost_events(pg_url, runner.runner_id) == 0
        # Its expired claim is recovered all the same (fenced: another may run it).
        state = sql(pg_url, "SELECT state FROM statequeue.live WHERE id = %s", claim.item_id)
        assert state == [("pending",)]
        # Its heartbeat: the row is renewed, the expired claim reported lost.
        assert store._leases.renew_now() == {claim.token}
        assert [r.runner_id for r in store.active_runners()] == [runner.runner_id]
    finally:
        store.close()


def test_a_runner_another_reaper_recorded_lost_is_alive_again_at_its_next_heartbeat(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STATEQUEUE_HOME", str(tmp_path))
    frozen, other = PostgresStore(pg_url, "q"), PostgresStore(pg_url, "q")
    try:
        frozen.enqueue(["a", "b"])
        runner = new_runner(("true",))
        frozen.register_runner(runner)
        assert frozen.claim(runner) is not None
        age_leases(pg_url)
        other.recover()  # another runner's reaper, while the first is frozen
        assert _stopped(pg_url, runner.runner_id)
        assert _lost_events(pg_url, runner.runner_id) == 1
        assert other.active_runners() == []

        frozen._leases.renew_now()  # it resumes: its heartbeat
        assert not _stopped(pg_url, runner.runner_id)
        assert [r.runner_id for r in other.active_runners()] == [runner.runner_id]
        assert frozen.claim(runner) is not None  # and it works on, seen as active

        # A runner unregistered (a clean stop) is never revived.
        frozen.unregister_runner(runner.runner_id)
        frozen._leases.renew_now()
        assert _stopped(pg_url, runner.runner_id)
        assert other.active_runners() == []
    finally:
        frozen.close()
        other.close()


def test_a_work_item_whose_claim_was_lost_records_one_discarded_result(
    pg_url: str, tmp_path: Path
) -> None:
    """done() of an item whose lease ran out (another runner holds it now)
    raises ClaimLost, its result discarded; leaving the `with` block then
    recorded a second discarded result (the ClaimLost, as a failure)."""
    from statequeue import Queue
    from statequeue.core.errors import ClaimLost
    from statequeue.core.models import Outcome

    with Queue("lost", home=tmp_path, store=pg_url) as q:
        q.enqueue(["a"])
        loop = q.work()
        item = next(loop)
        age_leases(pg_url)
        other = PostgresStore(pg_url, "lost")
        try:
            runner = new_runner(("true",))
            other.register_runner(runner)
            taken = other.claim(runner)  # recovers the expired claim, and takes it
            assert taken is not None and taken.item_id == item.id
            with pytest.raises(ClaimLost), item:
                item.done(1)
            (row,) = sql(
                pg_url, "SELECT count(*) FROM statequeue.events WHERE body->>'t' = 'discard'"
            )
            assert row[0] == 1
            other.finish(taken, Outcome(ok=True, exit_code=0))
        finally:
            other.close()
        loop.close()
