"""Runners on "several hosts" sharing one PostgreSQL queue (issue 12, promises
3, 4, 6 and 7): each runner is a real `statequeue run` process with its own
STATEQUEUE_HOST, with short leases. Processes are stopped by pid."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.killloop import Harness
from tests.conftest import STATEQUEUE
from tests.pg import PgCluster, throwaway_cluster
from tests.pg import sql as _sql

psycopg = pytest.importorskip("psycopg")
from tests.pg_proxy import proxy_for  # noqa: E402
from tests.waiting import gone as _gone  # noqa: E402
from tests.waiting import until as _until  # noqa: E402

DEADLINE = 60.0  # generous: the machine is shared
# $0 is the item. One O_APPEND write per line; the pid file names the child.
WORK = (
    'echo "start $0 $STATEQUEUE_ATTEMPT $$ $STATEQUEUE_HOST" >> "$WORK_LOG"; '
    'echo $$ > "$WORK_PIDS/$0.$STATEQUEUE_ATTEMPT"; '
    'sleep "$WORK_SECONDS"; '
    'echo "end $0 $STATEQUEUE_ATTEMPT $$ $STATEQUEUE_HOST" >> "$WORK_LOG"'
)


class Fleet:
    """Runner processes playing different hosts, and the work they did."""

    def __init__(self, tmp: Path, env: dict[str, str], url: str) -> None:
        self.tmp = tmp
        self.url = url
        self.log = tmp / "work.log"
        self.pids = tmp / "pids"
        self.pids.mkdir()
        self.env = dict(env, STATEQUEUE_STORE=url, WORK_LOG=str(self.log))
        self.env.update(WORK_PIDS=str(self.pids), WORK_SECONDS="0")
        self.procs: list[subprocess.Popen[bytes]] = []

    def enqueue(self, *items: str) -> None:
        subprocess.run([STATEQUEUE, "enqueue", *items], env=self.env, check=True, timeout=60)

    def run(
        self, host: str, *args: str, work: float = 0.0, url: str = ""
    ) -> subprocess.Popen[bytes]:
        env = dict(self.env, STATEQUEUE_HOST=host, WORK_SECONDS=str(work))
        if url:
            env["STATEQUEUE_STORE"] = url
        with open(self.tmp / f"{host}.err", "ab") as err:
            proc = subprocess.Popen(
                [STATEQUEUE, "run", "--no-live", *args, "--", "sh", "-c", WORK, "{}"],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def stderr(self, host: str) -> str:
        return (self.tmp / f"{host}.err").read_text("utf-8", "replace")

    def child(self, item: str, attempt: int) -> int:
        path = self.pids / f"{item}.{attempt}"
        _until(lambda: path.exists() and path.read_text().strip(), f"{item}'s child to start")
        return int(path.read_text())

    def lines(self) -> list[list[str]]:
        text = self.log.read_text() if self.log.exists() else ""
        return [line.split() for line in text.splitlines()]

    def done(self) -> int:
        rows = _sql(self.url, "SELECT count(*) FROM statequeue.items WHERE state = 'done'")
        return int(str(rows[0][0]))

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
            os.kill(proc.pid, signal.SIGTERM)
        return proc.wait(DEADLINE)

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(DEADLINE)


@pytest.fixture
def fleet(tmp_path: Path, sq_env: dict[str, str], pg_url: str) -> Iterator[Fleet]:
    f = Fleet(tmp_path, sq_env, pg_url)
    yield f
    f.close()


def _lease_over(url: str, item_id: int) -> bool:
    rows = _sql(
        url,
        "SELECT lease_until IS NULL OR lease_until < clock_timestamp() FROM statequeue.live"
        " WHERE id = %s",
        item_id,
    )
    return not rows or bool(rows[0][0])


def test_stopped_runner_is_taken_over_and_its_stale_work_records_nothing(fleet: Fleet) -> None:
    """SIGSTOP a runner past its lease: its child is dead by the lease's end
    (the keeper's backstop); another host takes the item and finishes it;
    SIGCONT the first: it reports the takeover and records nothing."""
    fleet.enqueue("a")
    first = fleet.run("alpha", "--lease", "2s", work=60)
    child = fleet.child("a", 1)
    os.kill(first.pid, signal.SIGSTOP)
    _until(lambda: _lease_over(fleet.url, 1), "the frozen runner's lease to end")
    # Its keeper killed the child by the lease's end, the runner being frozen.
    assert _gone(child), "the frozen runner's child outlived its lease"
    second = fleet.run("beta", "--lease", "2s")
    assert second.wait(DEADLINE) == 0, fleet.stderr("beta")
    assert fleet.done() == 1
    os.kill(first.pid, signal.SIGCONT)
    assert first.wait(DEADLINE) == 0, fleet.stderr("alpha")
    assert _gone(child)
    assert "item 1: lease lost" in fleet.stderr("alpha")
    rows = _sql(fleet.url, "SELECT attempt FROM statequeue.results")
    assert rows == [(2,)]  # beta's attempt only


def test_partitioned_runner_stops_its_child_before_its_lease_ends(
    fleet: Fleet, pg_cluster: PgCluster
) -> None:
    """The runner's connections go through a proxy that stalls (a partition):
    by the time the database sees the lease expired, the child is dead."""
    fleet.enqueue("a")
    with proxy_for(pg_cluster) as proxy:
        runner = fleet.run("gamma", "--lease", "4s", work=60, url=proxy.url(fleet.url))
        child = fleet.child("a", 1)
        proxy.pause()
        _until(lambda: _lease_over(fleet.url, 1), "the lease to end on the database clock")
        assert _gone(child), "the child outlived its runner's lease"
        assert "item 1: lease lost" in fleet.stderr("gamma")
        proxy.resume()
        fleet.stop(runner)
    assert _sql(fleet.url, "SELECT count(*) FROM statequeue.results") == [(0,)]


def _acknowledged(text: str) -> set[str]:
    return set(re.findall(r"^\[ok\] #\d+ (\S+)", text, re.MULTILINE))


def test_runners_survive_an_immediate_server_stop_and_lose_no_acknowledged_result(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    with throwaway_cluster() as cluster:
        f = Fleet(tmp_path, sq_env, cluster.new_database())
        try:
            items = [f"i{n:02d}" for n in range(24)]
            f.enqueue(*items)
            runners = [f.run(h, "-j2", "--follow", "--lease", "6s", work=0.1) for h in "ab"]
            _until(lambda: sum(w[0] == "end" for w in f.lines()) >= 6, "some results")
            cluster.stop("immediate")
            cluster.start()
            try:
                _until(lambda: f.done() == len(items), "every item done after the restart")
            except AssertionError as exc:  # seen twice under heavy load: say what the runners said
                said = {h: f.stderr(h)[-2000:] for h in "ab"}
                raise AssertionError(f"{exc}; {f.done()} done; runners said: {said}") from None
            codes = [f.stop(r) for r in runners]
            assert codes == [0, 0], {h: f.stderr(h)[-2000:] for h in "ab"}
        finally:
            f.close()
    acked = _acknowledged(f.stderr("a") + f.stderr("b"))
    assert acked == set(items)
    starts = Counter(w[1] for w in f.lines() if w[0] == "start")
    # An acknowledged result that was lost would have run its item again;
    # only attempts cut off by the crash (at most -j2 x 2 runners) start twice.
    assert sum(n - 1 for n in starts.values()) <= 4


def test_runner_carries_on_after_its_backends_are_terminated(fleet: Fleet) -> None:
    items = [f"t{n}" for n in range(8)]
    fleet.enqueue(*items)
    runner = fleet.run("delta", "--follow", "--lease", "4s", work=0.2)
    _until(lambda: sum(w[0] == "end" for w in fleet.lines()) >= 2, "some results")
    killed = _sql(
        fleet.url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'statequeue' AND pid <> pg_backend_pid()",
    )
    assert killed and all(ok for (ok,) in killed)
    _until(lambda: fleet.done() == len(items), "every item done")
    assert fleet.stop(runner) == 0, fleet.stderr("delta")
    assert Counter(w[1] for w in fleet.lines() if w[0] == "start") == Counter(items)
    assert "Traceback" not in fleet.stderr("delta")


def _kill_loop(
    tmp_path: Path, sq_home: Path, pg_url: str, *, kills: int, items: int, verify: bool = False
) -> None:
    h = Harness(
        tmp_path / "loop", home=sq_home, store=pg_url, hosts=3, lease="2s", jobs=2, verify=verify
    )
    with h:
        h.enqueue(items)
        h.kill_loop(kills=kills, runners=3)
        fig = h.check()
        print(f"\n{fig.line('postgres, 3 hosts -j2')} [seed {h.seed}]")
        assert fig.run_kills >= kills
        assert fig.overlaps == 0
        # A kill may catch both -j2 slots between their work's last action and
        # its durable result; with --verify no work completes twice.
        assert fig.duplicates <= (0 if verify else 2 * fig.run_kills)


def test_kill_loop_three_hosts_on_one_postgres_queue(
    tmp_path: Path, sq_home: Path, pg_url: str
) -> None:
    """3 runners -j2, each another host, SIGKILLed at random: 0 lost, 0
    skipped, 0 overlaps, duplicates <= kills x jobs (Harness.check asserts the rest)."""
    _kill_loop(tmp_path, sq_home, pg_url, kills=6, items=60)


@pytest.mark.crash
@pytest.mark.parametrize("verify", [False, True])
def test_kill_loop_three_hosts_long(
    tmp_path: Path, sq_home: Path, pg_url: str, verify: bool
) -> None:
    _kill_loop(tmp_path, sq_home, pg_url, kills=150, items=600, verify=verify)
