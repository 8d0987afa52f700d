"""Rate limits and deferrals on a PostgreSQL queue (a real throwaway server):
runners on two "hosts" (their own STATEQUEUE_HOST and home, as in
test_pg_crosshost.py) take their starts from one bucket in the database."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import STATEQUEUE
from tests.waiting import until

psycopg = pytest.importorskip("psycopg")

Env = dict[str, str]


def host_env(sq_env: Env, tmp_path: Path, pg_url: str, host: str) -> Env:
    return dict(
        sq_env, STATEQUEUE_STORE=pg_url, STATEQUEUE_HOST=host, STATEQUEUE_HOME=str(tmp_path / host)
    )


def sq(env: Env, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )


def events(env: Env) -> list[dict[str, Any]]:
    done = sq(env, "events", "--json")
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.slow
def test_runners_on_two_hosts_share_one_rate(sq_env: Env, tmp_path: Path, pg_url: str) -> None:
    one, two = (host_env(sq_env, tmp_path, pg_url, h) for h in ("host-a", "host-b"))
    assert sq(one, "enqueue", stdin="".join(f"i{n}\n" for n in range(61))).returncode == 0
    assert sq(one, "pause").returncode == 0  # both runners are up before work starts
    args = [STATEQUEUE, "run", "-j4", "--rate", "20/s", "--quiet", "--", "true"]
    procs = [subprocess.Popen(args, env=env, stderr=subprocess.PIPE) for env in (one, two)]
    until(lambda: len(json.loads(sq(one, "status", "--json").stdout)["runners"]) == 2, "2 runners")
    assert sq(one, "resume").returncode == 0
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    records = events(one)
    starts = sorted(r["at"] for r in records if r["t"] == "start")
    assert len(starts) == 61
    rate = (len(starts) - 1) / (starts[-1] - starts[0])
    assert 18.0 <= rate <= 22.0, rate  # 20/s between the two hosts, not 20/s each
    hosts = {r["host"] for r in records if r["t"] == "run"}
    runners = {r["runner"] for r in records if r["t"] == "start"}
    assert hosts == {"host-a", "host-b"} and len(runners) == 2


TRY_LATER_ONCE = """#!/bin/sh
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
    echo '{"retry_after": 0.5}' > "$STATEQUEUE_RESULT"
    exit 75
fi
[ "$1" = never ] && exit 75
exit 0
"""


def test_deferrals_and_max_deferrals_on_postgres(sq_env: Env, tmp_path: Path, pg_url: str) -> None:
    env = host_env(sq_env, tmp_path, pg_url, "host-a")
    worker = tmp_path / "worker.sh"
    worker.write_text(TRY_LATER_ONCE)
    worker.chmod(0o755)
    assert sq(env, "enqueue", "fine", "never").returncode == 0
    args = ["run", "--rate", "50/s", "--retries", "0", "--max-deferrals", "2", "--retry-delay", "0"]
    done = sq(env, *args, "--", str(worker), "{}")
    assert done.returncode == 1, done.stderr  # "never" failed: past --max-deferrals
    records = events(env)
    fine = [r for r in records if r.get("id") == 1 and r["t"] in ("start", "defer", "end")]
    assert [r["t"] for r in fine] == ["start", "defer", "start", "end"]
    assert fine[1]["delay"] == 0.5 and fine[2]["at"] >= fine[1]["at"] + 0.5 - 0.002
    assert fine[3]["state"] == "done"
    never = [r["t"] for r in records if r.get("id") == 2 and r["t"] in ("defer", "end")]
    assert never == ["defer", "defer", "end"]
    status = json.loads(sq(env, "status", "--json").stdout)
    assert status["counts"]["done"] == 1 and status["counts"]["failed"] == 1
    assert status["rate_limit"]["limit_per_second"] == 50.0
    assert status["rate_limit"]["current_per_second"] < 50.0  # deferrals lowered it
    (failure,) = status["recent_failures"]
    assert failure["reason"] == "deferred 3 times, more than --max-deferrals 2"
    figures = json.loads(sq(env, "stats", "--json").stdout)
    assert figures["deferred"] == 3
    # A user's retry of the item that failed so gives it a new count.
    assert sq(env, "retry", "2").returncode == 0
    again = sq(env, *args, "--", str(worker), "{}")
    assert again.returncode == 1, again.stderr
    kinds = [r["t"] for r in events(env) if r.get("id") == 2 and r["t"] in ("defer", "end")]
    assert kinds == ["defer", "defer", "end"] * 2
