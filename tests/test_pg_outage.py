"""A PostgreSQL runner and a database outage longer than its leases (issue 21,
point 11), on a throwaway cluster of its own (tests/pg.py) that is really
stopped and started with pg_ctl: the runner fences what was in flight,
reconnects with backoff and finishes the queue; ``--give-up-after`` makes it
exit 11 once the outage has lasted that long. Processes are stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.errors import StoreUnreachable
from statequeue.core.exitcodes import ExitCode
from statequeue.run.outage import DEFAULT_GIVE_UP, Outage, outage_limit
from tests.conftest import STATEQUEUE
from tests.pg import PgCluster, throwaway_cluster
from tests.pg import sql as _sql
from tests.waiting import gone as _gone
from tests.waiting import until as _until

DEADLINE = 60.0  # generous: the machine is shared
LEASE = 3.0
# $0 is the item. Its first attempt writes its pid and waits for $GO (item b)
# or for a minute (item a: it is in flight all through the outage); a later
# attempt ends at once.
WORK = (
    'echo $$ > "$PIDS/$0.$STATEQUEUE_ATTEMPT"; '
    'if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then n=0; '
    'while [ $n -lt 1200 ] && { [ "$0" = a ] || [ ! -e "$GO" ]; }; '
    "do sleep 0.05; n=$((n+1)); done; "
    "fi"
)


@pytest.fixture
def cluster() -> Iterator[PgCluster]:
    with throwaway_cluster() as c:
        yield c


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(DEADLINE)


def _runner(
    env: dict[str, str], err: Path, *args: str, procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    with open(err, "wb") as f:
        proc = subprocess.Popen(
            [STATEQUEUE, "run", "--no-live", "--lease", f"{LEASE:g}s", *args],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=f,
            start_new_session=True,
        )
    procs.append(proc)
    return proc


def _pid(path: Path) -> int:
    _until(lambda: path.exists() and path.read_text().strip(), f"{path.name} to start")
    return int(path.read_text())


@pytest.mark.parametrize("follow", [False, True])
def test_runner_rides_out_an_outage_longer_than_its_lease_and_finishes(
    cluster: PgCluster,
    tmp_path: Path,
    sq_env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
    follow: bool,
) -> None:
    """-j2: item a is in flight all through the outage, item b ends during it
    (its result can only be written once the server is back). The server is
    down for longer than the lease: the runner fences a (its child is dead
    before the server is back), keeps b's result, reconnects, records b, runs
    a again and exits 0 (with --follow: goes on until its SIGTERM, then exits 0)."""
    url = cluster.new_database()
    pids, go = tmp_path / "pids", tmp_path / "go"
    pids.mkdir()
    env = dict(sq_env, STATEQUEUE_STORE=url, PIDS=str(pids), GO=str(go))
    subprocess.run([STATEQUEUE, "enqueue", "a", "b"], env=env, check=True, timeout=60)
    err = tmp_path / "run.err"
    args = ("-j2", *(["--follow"] if follow else []), "--", "sh", "-c", WORK, "{}")
    runner = _runner(env, err, *args, procs=procs)
    first_a = _pid(pids / "a.1")
    _pid(pids / "b.1")
    cluster.stop("fast")
    stopped = time.monotonic()
    go.touch()  # b's child ends now, while the server is down
    _until(lambda: _gone(first_a), "item a's child to be fenced")
    # Keep the server down for longer than the whole lease (3/4 is the fence).
    time.sleep(max(0.0, stopped + LEASE + 0.5 - time.monotonic()))
    assert runner.poll() is None, err.read_text()
    cluster.start()
    if follow:
        done = "SELECT count(*) FROM statequeue.items WHERE state = 'done'"
        _until(lambda: _sql(url, done) == [(2,)], "both items done")
        os.kill(runner.pid, signal.SIGTERM)
    assert runner.wait(DEADLINE) == 0, err.read_text()
    text = err.read_text()
    assert "item 1: lease lost" in text
    assert "reconnecting" in text and "reachable again" in text
    assert "Traceback" not in text
    rows = _sql(
        url,
        "SELECT i.item, r.attempt FROM statequeue.results r JOIN statequeue.items i"
        " ON i.queue = r.queue AND i.id = r.id ORDER BY i.item",
    )
    assert [(bytes(item).decode(), attempt) for item, attempt in rows] == [("a", 2), ("b", 1)]
    assert _sql(url, "SELECT count(*) FROM statequeue.items WHERE state = 'done'") == [(2,)]


def test_give_up_after_ends_the_run_with_exit_11_once_the_outage_lasted_that_long(
    cluster: PgCluster,
    tmp_path: Path,
    sq_env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
) -> None:
    url = cluster.new_database()
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(sq_env, STATEQUEUE_STORE=url, PIDS=str(pids), GO=str(tmp_path / "go"))
    (tmp_path / "go").touch()
    subprocess.run([STATEQUEUE, "enqueue", "b"], env=env, check=True, timeout=60)
    err = tmp_path / "run.err"
    args = ("--follow", "--give-up-after", "2s", "--", "sh", "-c", WORK, "{}")
    runner = _runner(env, err, *args, procs=procs)
    _until(
        lambda: _sql(url, "SELECT count(*) FROM statequeue.items WHERE state = 'done'") == [(1,)],
        "item b to be done",
    )
    # From before the stop: the server refuses connections from the stop's
    # start, and pg_ctl returns later (a flake at 1.93 s of 2 under load).
    stopping = time.monotonic()
    cluster.stop("fast")
    code = runner.wait(DEADLINE)
    lasted = time.monotonic() - stopping
    cluster.start()
    text = err.read_text()
    assert code == ExitCode.STORE_UNREACHABLE, text
    assert lasted >= 2.0  # not before the outage lasted --give-up-after (a bound, not a speed)
    last = text.strip().splitlines()[-1]
    assert last.startswith("statequeue: ") and "--give-up-after 2s" in last, text
    # What it did before giving up is said first (item b), without asking the lost store.
    assert any(line.startswith("statequeue: items: 1 ok") for line in text.splitlines()), text
    assert "Traceback" not in text


def test_a_signal_ends_a_run_during_an_outage(
    cluster: PgCluster,
    tmp_path: Path,
    sq_env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """SIGTERM while the server is down: the run stops as it would otherwise
    (a --follow runner's TERM is its normal stop: exit 0), leaving its item in
    flight to recovery, rather than waiting for the server."""
    url = cluster.new_database()
    pids = tmp_path / "pids"
    pids.mkdir()
    env = dict(sq_env, STATEQUEUE_STORE=url, PIDS=str(pids), GO=str(tmp_path / "go"))
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=60)
    err = tmp_path / "run.err"
    runner = _runner(env, err, "--follow", "--", "sh", "-c", WORK, "{}", procs=procs)
    child = _pid(pids / "a.1")
    cluster.stop("fast")
    _until(lambda: "reconnecting" in err.read_text() or _gone(child), "the outage to be met")
    os.kill(runner.pid, signal.SIGTERM)
    code = runner.wait(DEADLINE)
    cluster.start()
    text = err.read_text()
    assert code == 0, text
    assert _gone(child)
    assert "Traceback" not in text
    assert _sql(url, "SELECT count(*) FROM statequeue.results") == [(0,)]


@pytest.mark.parametrize("value", ["soon", "-1s"])
def test_invalid_give_up_after_is_a_usage_error(sq_env: dict[str, str], value: str) -> None:
    run = subprocess.run(
        [STATEQUEUE, "run", f"--give-up-after={value}", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == ExitCode.USAGE
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), run.stderr


def test_the_default_outage_limit_is_never_with_follow_and_ten_minutes_without() -> None:
    assert outage_limit(None, follow=True) is None
    assert outage_limit(None, follow=False) == DEFAULT_GIVE_UP == 600.0
    assert outage_limit(0.0, follow=False) is None  # 0: never
    assert outage_limit(5.0, follow=True) == 5.0
    outage = Outage(100.0, 5.0, StoreUnreachable("cannot reach the PostgreSQL store x: down"))
    outage.check(104.9, out_of_time=False)
    with pytest.raises(StoreUnreachable, match="--give-up-after 5s"):
        outage.check(105.0, out_of_time=False)
    with pytest.raises(StoreUnreachable, match="--max-time"):
        Outage(100.0, None, outage.error).check(1e9, out_of_time=True)


def test_a_follow_run_started_while_the_server_is_down_waits_for_it(
    cluster: PgCluster,
    tmp_path: Path,
    sq_env: dict[str, str],
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """A service started before its database: `run --follow` once exited 11
    at once, whatever --give-up-after said. It now tries again with backoff,
    and runs the queue once the server is up; without --follow (and no
    --give-up-after) a cron job is still told at once."""
    url = cluster.new_database()
    env = dict(sq_env, STATEQUEUE_STORE=url)
    subprocess.run([STATEQUEUE, "enqueue", "b"], env=env, check=True, timeout=60)
    cluster.stop("fast")
    told = subprocess.run(
        [STATEQUEUE, "run", "--", "true"], env=env, capture_output=True, timeout=60
    )
    assert told.returncode == ExitCode.STORE_UNREACHABLE
    assert b"trying again" not in told.stderr
    err = tmp_path / "run.err"
    runner = _runner(env, err, "--follow", "--", "true", procs=procs)
    _until(lambda: b"trying again with backoff" in err.read_bytes(), "the run to wait")
    assert runner.poll() is None, err.read_text()
    cluster.start()
    done = "SELECT count(*) FROM statequeue.items WHERE state = 'done'"
    _until(lambda: _sql(url, done) == [(1,)], "the item done once the server is up")
    os.kill(runner.pid, signal.SIGTERM)
    assert runner.wait(DEADLINE) == 0, err.read_text()
    assert "Traceback" not in err.read_text()
