"""Self-fencing of a PostgreSQL runner's items (issue 21, point 2), on the real
server (tests/pg.py) with real SIGSTOPs and SIGKILLs: a frozen runner's keeper
kills every process of the item by the lease's end, a detached (setsid)
descendant included, and a reaper on the same host leaves an expired item
alone while a process of it holds its claim lock. Processes are stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from tests.conftest import STATEQUEUE
from tests.pg import sql as _sql

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)
from tests.waiting import gone as _gone  # noqa: E402
from tests.waiting import until as _until  # noqa: E402

DEADLINE = 60.0  # generous: the machine is shared

# The item's child starts a descendant in a new session (so no group kill
# reaches it), which writes its pid to $DESC_PID and sleeps. The child then
# waits for $GO (or 60 s) and exits, leaving the descendant behind.
DETACHING = textwrap.dedent(
    """\
    setsid sh -c 'echo $$ > "$DESC_PID.tmp"; mv "$DESC_PID.tmp" "$DESC_PID"; exec sleep 60' &
    n=0
    while [ ! -e "$GO" ] && [ $n -lt 1200 ]; do sleep 0.05; n=$((n+1)); done
    """
)


def _lease_over(url: str, item_id: int) -> bool:
    rows = _sql(
        url,
        "SELECT lease_until IS NULL OR lease_until < clock_timestamp() FROM statequeue.live"
        " WHERE id = %s",
        item_id,
    )
    return not rows or bool(rows[0][0])


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(DEADLINE)


@pytest.mark.parametrize("leader", ["running", "exited"])
def test_a_frozen_runners_setsid_descendant_is_dead_by_the_lease_end(
    tmp_path: Path,
    sq_env: dict[str, str],
    pg_url: str,
    procs: list[subprocess.Popen[bytes]],
    leader: str,
) -> None:
    """SIGSTOP a runner whose item left a descendant in a new session: by the
    time the lease has ended on the database clock (before any other runner
    can claim the item), the keeper has killed the descendant too, whether
    the item's own process was still running or had exited meanwhile (its
    result unrecorded: the runner is frozen)."""
    desc, go = tmp_path / "desc.pid", tmp_path / "go"
    env = dict(sq_env, STATEQUEUE_STORE=pg_url, DESC_PID=str(desc), GO=str(go))
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=60)
    with open(tmp_path / "alpha.err", "wb") as err:
        first = subprocess.Popen(
            [STATEQUEUE, "run", "--no-live", "--lease", "2s", "--", "sh", "-c", DETACHING],
            env=dict(env, STATEQUEUE_HOST="alpha"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    procs.append(first)
    _until(desc.exists, "the detached descendant to start")
    descendant = int(desc.read_text())
    os.kill(first.pid, signal.SIGSTOP)
    if leader == "exited":
        go.touch()  # the item's process exits; its descendant stays
    _until(lambda: _lease_over(pg_url, 1), "the frozen runner's lease to end")
    assert _gone(descendant), "a detached descendant outlived its frozen runner's lease"
    second = subprocess.run(
        [STATEQUEUE, "run", "--no-live", "--lease", "2s", "--", "true"],
        env=dict(env, STATEQUEUE_HOST="beta"),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert second.returncode == 0, second.stderr
    assert _sql(pg_url, "SELECT attempt FROM statequeue.results") == [(2,)]
    os.kill(first.pid, signal.SIGCONT)
    assert first.wait(DEADLINE) == 0
    assert "item 1: lease lost" in (tmp_path / "alpha.err").read_text()
    assert _sql(pg_url, "SELECT attempt FROM statequeue.results") == [(2,)]


_DIE_HOLDING = textwrap.dedent(
    """
    import os, signal, subprocess, sys
    from pathlib import Path
    from statequeue.core.identity import new_runner
    from statequeue.store.postgres import PostgresStore

    store = PostgresStore(sys.argv[1], "q", scratch=Path(sys.argv[2]), lease=1.0)
    runner = new_runner()
    store.register_runner(runner)
    claim = store.claim(runner)
    # A process of the item holding its claim lock, as the keeper's children do.
    child = subprocess.Popen(
        ["sleep", "60"], pass_fds=claim.inherit_fds,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    print(child.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_reaping_an_expired_lease_respects_this_hosts_claim_lock(
    pg_url: str, tmp_path: Path
) -> None:
    """The lease of an item ends while a process of it still holds its claim
    lock on this host: a reaper on this host does not hand the item out until
    that process is gone."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    reaper = PostgresStore(pg_url, "q", scratch=scratch)
    try:
        reaper.enqueue(["a"])
        died = subprocess.run(
            [sys.executable, "-c", _DIE_HOLDING, pg_url, str(scratch)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert died.returncode == -signal.SIGKILL, died.stderr
        child = int(died.stdout.split()[0])
        try:
            _until(lambda: _lease_over(pg_url, 1), "the lease to end")
            _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")  # a reaper's turn
            assert reaper.claim(new_runner()) is None, "handed out while its process holds it"
            assert _state(pg_url) == "running"
        finally:
            os.kill(child, signal.SIGKILL)
            _until(lambda: _gone(child), "the item's process to end")
        _sql(pg_url, "UPDATE statequeue.queues SET last_reap_at = NULL")
        again = reaper.claim(new_runner())
        assert again is not None and (again.attempt, again.interrupted) == (2, True)
    finally:
        reaper.close()


def _state(url: str) -> str:
    rows = _sql(url, "SELECT state FROM statequeue.live WHERE id = 1")
    return str(rows[0][0]) if rows else "gone"


def test_a_leftover_of_an_item_recorded_done_may_go_on_past_its_lease(
    tmp_path: Path, sq_env: dict[str, str], pg_url: str
) -> None:
    """Once the item is recorded done, its lease's deadline no longer applies
    to what it left behind: a detached leftover outlives the (short) lease,
    as it would with any store."""
    desc, survived = tmp_path / "desc.pid", tmp_path / "survived"
    env = dict(sq_env, STATEQUEUE_STORE=pg_url, DESC_PID=str(desc), SURVIVED=str(survived))
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=60)
    leftover = 'echo $$ > "$DESC_PID"; sleep 2; touch "$SURVIVED"'
    run = subprocess.run(
        [
            STATEQUEUE,
            "run",
            "--no-live",
            "--lease",
            "1s",
            "--",
            "sh",
            "-c",
            f"setsid sh -c '{leftover}' &",
            "{}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert run.returncode == 0, run.stderr
    _until(desc.exists, "the leftover to start")
    _until(lambda: desc.read_text().strip(), "the leftover's pid")
    pid = int(desc.read_text())
    _until(lambda: _gone(pid), "the leftover to end")
    assert survived.exists(), "the leftover of a done item was killed at its lease's end"


def test_a_runner_frozen_while_its_queue_was_dropped_and_made_again_claims_nothing(
    tmp_path: Path,
    sq_env: dict[str, str],
    pg_url: str,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """Frozen past its lease, the runner is no longer alive, so `drop` goes
    ahead; a queue made again under the name is another queue. The runner,
    resumed, worked its items unregistered, unseen by `status` and `drop`
    (an outside tester's finding): it now stops, claiming nothing of it."""
    env = dict(sq_env, STATEQUEUE_STORE=pg_url)
    log = tmp_path / "log"
    subprocess.run([STATEQUEUE, "enqueue", "old1", "old2"], env=env, check=True, timeout=60)
    work = f'echo "$1" >> {log}; sleep 1'
    with open(tmp_path / "runner.err", "wb") as err:
        runner = subprocess.Popen(
            [STATEQUEUE, "run", "--no-live", "--lease", "2s", "--", "sh", "-c", work, "sh", "{}"],
            env=dict(env, STATEQUEUE_HOST="alpha"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    procs.append(runner)
    _until(lambda: log.exists() and "old1" in log.read_text(), "the first item to start")
    os.kill(runner.pid, signal.SIGSTOP)
    _until(lambda: _lease_over(pg_url, 1), "the frozen runner's lease to end")
    dropped = subprocess.run(
        [STATEQUEUE, "drop", "default", "--yes"], env=env, capture_output=True, timeout=60
    )
    assert dropped.returncode == 0, dropped.stderr
    subprocess.run([STATEQUEUE, "enqueue", "new1", "new2"], env=env, check=True, timeout=60)
    os.kill(runner.pid, signal.SIGCONT)
    code = runner.wait(DEADLINE)
    said = (tmp_path / "runner.err").read_text()
    assert "new" not in log.read_text(), (log.read_text(), said)
    assert code == 7 and "was dropped while runner" in said, (code, said)  # NOT_FOUND
    status = subprocess.run(
        [STATEQUEUE, "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert '"pending": 2' in status.stdout.replace('"pending":2', '"pending": 2'), status.stdout
