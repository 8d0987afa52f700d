"""Issue 26, point 8, on a real PostgreSQL server: a runner not heard from is
said to be so, with its lease's end; `events` words a runner lost by its
lease as such; a result discarded for a lost lease is recorded as an event;
scripts/pg-dev.sh prints a line the shell can `eval`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from statequeue.core.errors import ClaimLost
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from tests.conftest import STATEQUEUE
from tests.test_store_contract import age_leases

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)

ROOT = Path(__file__).parent.parent


def _sq(env: dict[str, str], url: str, *args: str) -> str:
    out = subprocess.run(
        [STATEQUEUE, "--store", url, "-q", "q", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_silent_runner_is_not_called_active(pg_url: str, sq_env: dict[str, str]) -> None:
    store = PostgresStore(pg_url, "q")
    try:
        store.use_lease(30.0)
        runner = new_runner(command=("./crawl", "{}"))
        store.register_runner(runner)
        store.enqueue(["a"])
        assert store.claim(runner) is not None
        assert "runner: active (" in _sq(sq_env, pg_url, "status")
        with psycopg.connect(pg_url, autocommit=True) as conn:  # 20 s without a heartbeat
            conn.execute("UPDATE statequeue.runners SET seen_at = seen_at - interval '20 s'")
        shown = _sq(sq_env, pg_url, "status")
        found = re.search(
            r"runner: not heard from for (\d+) s; its lease ends at (\S+ \S+) \(", shown
        )
        assert found is not None, shown
        assert 19 <= int(found.group(1)) <= 60, shown
        runner_json = json.loads(_sq(sq_env, pg_url, "status", "--json"))["runners"][0]
        assert runner_json["heard_ago"] >= 19 and runner_json["lease_ends_at"] > 0, runner_json
    finally:
        store.close()


def test_a_result_thrown_away_for_a_lost_lease_is_an_event(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    first, second = PostgresStore(pg_url, "q"), PostgresStore(pg_url, "q")
    try:
        for s in (first, second):
            s.use_lease(30.0)
        gone_runner, next_runner = new_runner(), new_runner()
        first.register_runner(gone_runner)
        first.enqueue(["a"])
        stale = first.claim(gone_runner)
        assert stale is not None
        age_leases(pg_url)  # as if the first runner had been silent past its lease
        second.register_runner(next_runner)
        taken = second.claim(next_runner)
        assert taken is not None and taken.item_id == stale.item_id
        with pytest.raises(ClaimLost):
            first.finish(stale, Outcome(ok=True, exit_code=0))
    finally:
        first.close()
        second.close()
    events = _sq(sq_env, pg_url, "events")
    assert f"runner {gone_runner.runner_id[:8]} lost (its lease ended unrenewed" in events, events
    assert "its lock was released" not in events, events
    discarded = (
        f"result of #1 attempt 1 discarded: runner {gone_runner.runner_id[:8]} had lost its lease"
    )
    assert discarded in events, events
    assert discarded in _sq(sq_env, pg_url, "show", "1")


@pytest.mark.skipif(shutil.which("bash") is None, reason="the script is bash")
def test_pg_dev_prints_an_export_line(sq_env: dict[str, str]) -> None:
    # Its own temp folder (the postgres user must reach it), removed by the stop line.
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "pg-dev.sh")],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert out.returncode == 0, out.stderr
        line = out.stdout.strip().splitlines()[-1]
        assert line.startswith("export STATEQUEUE_STORE="), line
        shell = subprocess.run(
            ["bash", "-c", 'eval "$1"; printf %s "$STATEQUEUE_STORE"', "sh", line],
            capture_output=True,
            text=True,
            check=True,
        )
        assert shell.stdout.startswith("postgresql://") and "?host=" in shell.stdout, shell.stdout
    finally:
        stop = next((x for x in out.stderr.splitlines() if x.startswith("# stop: ")), None)
        if stop is not None:
            subprocess.run(
                ["bash", "-c", stop.removeprefix("# stop: ")], check=False, capture_output=True
            )
