"""Logs on PostgreSQL (issue 12, promise 11): a finished attempt's output is
stored in the database, fenced by its claim's token, and read from any host."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from statequeue.core.errors import StoreUnreachable
from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, Outcome
from statequeue.run.attempt_logs import hand_over_log
from statequeue.store.memory import MemoryStore
from tests.conftest import STATEQUEUE
from tests.pg import sql as _rows
from tests.test_store_contract import age_leases

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore  # noqa: E402  (needs psycopg)

# Non-UTF-8 bytes on stderr, a line on stdout: the stored log must keep them exactly.
JOB = r"""printf 'out %s\n' "$1"; printf '\377\376raw\n' >&2"""


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, timeout=120)


def _host(sq_env: dict[str, str], tmp_path: Path, name: str, url: str) -> dict[str, str]:
    """The environment of one "host": its own home folder and host name."""
    home = tmp_path / f"home-{name}"
    return {
        **sq_env,
        "STATEQUEUE_HOME": str(home),
        "STATEQUEUE_HOST": name,
        "STATEQUEUE_STORE": url,
    }


def _sq(cap: pytest.CaptureFixture[bytes], *args: str) -> tuple[int, bytes]:
    """Run the CLI in this process: exit code and stdout."""
    from statequeue.cli.app import main

    cap.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    return int(exited.value.code or 0), cap.readouterr().out


def test_logs_and_show_work_from_another_host(
    pg_url: str,
    sq_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:
    host_a = _host(sq_env, tmp_path, "host-a", pg_url)
    host_b = _host(sq_env, tmp_path, "host-b", pg_url)
    assert _cli(host_a, "enqueue", "x1", "x2").returncode == 0
    ran = _cli(host_a, "run", "--", "sh", "-c", JOB, "job", "{}")
    assert ran.returncode == 0, ran.stderr
    # Stored, so the runner's scratch copy is gone.
    scratch = Path(host_a["STATEQUEUE_HOME"]) / ".postgres" / "default" / "logs"
    assert sorted(p.name for p in scratch.iterdir() if p.name.endswith(".log")) == []
    # Host B reads them, in this process: another home, another host name.
    for key in ("STATEQUEUE_HOME", "STATEQUEUE_HOST", "STATEQUEUE_STORE"):
        monkeypatch.setenv(key, host_b[key])
    code, logged = _sq(capfdbinary, "logs", "2")
    assert code == 0
    assert sorted(logged.splitlines()) == sorted([b"out x2", b"\xff\xferaw"])
    code, shown = _sq(capfdbinary, "show", "2", "--json")
    assert code == 0 and json.loads(shown)["logs"] == ["database:logs/2.1.log"]
    assert _sq(capfdbinary, "logs", "2", "--attempt", "1") == (0, logged)


def test_stored_log_is_capped_by_log_limit(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    env = _host(sq_env, tmp_path, "host-a", pg_url)
    assert _cli(env, "enqueue", "big").returncode == 0
    ran = _cli(
        env, "run", "--log-limit", "100", "--", "sh", "-c", "head -c 5000 /dev/zero | tr '\\0' a"
    )
    assert ran.returncode == 0, ran.stderr
    [(data,)] = _rows(pg_url, "SELECT data FROM statequeue.logs")
    stored = bytes(data)  # type: ignore[arg-type]
    # Its start and its end (a quarter of the limit), and what was left out between.
    assert (
        stored
        == b"a" * 75 + b"\n[statequeue: log limit reached; 4900 bytes left out here]\n" + b"a" * 25
    )


def test_stale_claim_stores_no_log(pg_url: str) -> None:
    first = PostgresStore(pg_url, "q")
    first.enqueue(["a"])
    stale = first.claim(new_runner())
    assert stale is not None
    first.close()
    age_leases(pg_url)  # its lease ran out: the item may be taken over
    second = PostgresStore(pg_url, "q")
    try:
        fresh = second.claim(new_runner())
        assert fresh is not None and fresh.item_id == stale.item_id
        assert second.save_log(stale, b"stale output") is False
        assert _rows(pg_url, "SELECT count(*) FROM statequeue.logs") == [(0,)]
        assert second.save_log(fresh, b"fresh \x00\xff") is True
        assert second.save_log(fresh, b"fresh \x00\xff") is True  # a retried call is idempotent
        second.finish(fresh, Outcome(ok=True))
        assert second.read_log(fresh.item_id, fresh.attempt) == b"fresh \x00\xff"
        assert second.read_log(fresh.item_id, fresh.attempt, 6) == b"\x00\xff"
        assert second.read_log(fresh.item_id, stale.attempt) is None
    finally:
        second.close()


class _LogKeepingStore(MemoryStore):
    stores_logs = True

    def __init__(self, fails: bool) -> None:
        super().__init__("q")
        self.fails = fails
        self.saved: list[bytes] = []

    def save_log(self, claim: Claim, data: bytes) -> bool:
        if self.fails:
            raise StoreUnreachable(
                "cannot reach the PostgreSQL store: server closed the connection"
            )
        self.saved.append(data)
        return True


@pytest.mark.parametrize("fails", [False, True])
def test_hand_over_log_removes_the_file_once_stored_and_never_raises(
    tmp_path: Path, fails: bool
) -> None:
    store = _LogKeepingStore(fails)
    store.enqueue(["a"])
    claim = store.claim(new_runner())
    assert claim is not None
    log = tmp_path / "1.1.log"
    log.write_bytes(b"output\xff")
    hand_over_log(store, claim, log)  # a lost connection is for finish to report
    assert log.exists() is fails
    assert store.saved == ([] if fails else [b"output\xff"])


def test_a_quiet_run_stores_its_logs_too(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    """--quiet silences the progress lines, not the logs `logs` reads from any host."""
    host_a = _host(sq_env, tmp_path, "host-a", pg_url)
    host_b = _host(sq_env, tmp_path, "host-b", pg_url)
    assert _cli(host_a, "enqueue", "q1").returncode == 0
    ran = _cli(host_a, "run", "--quiet", "--", "sh", "-c", JOB, "job", "{}")
    assert ran.returncode == 0, ran.stderr
    logged = _cli(host_b, "logs", "1")
    assert logged.returncode == 0, logged.stderr
    assert sorted(logged.stdout.splitlines()) == sorted([b"out q1", b"\xff\xferaw"])


def test_logs_follow_prints_each_line_once_as_the_log_moves_into_the_database(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path
) -> None:
    """`logs ID --follow` read this host's file while the attempt ran, then
    (the log stored at its end, under another name) the stored copy from
    byte 0: every line came twice."""
    env = _host(sq_env, tmp_path, "host-a", pg_url)
    marks = tmp_path / "marks"
    marks.mkdir()
    assert _cli(env, "enqueue", "lf").returncode == 0
    job = 'for i in 1 2 3; do echo "line$i $1"; [ $i = 1 ] && touch "$2/started"; sleep 0.4; done'
    runner = subprocess.Popen(
        [STATEQUEUE, "run", "--", "sh", "-c", job, "sh", "{}", str(marks)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (marks / "started").exists():
            assert time.monotonic() < deadline and runner.poll() is None, "never started"
            time.sleep(0.02)
        followed = _cli(env, "logs", "1", "--follow")
    finally:
        runner.wait(timeout=60)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout == b"line1 lf\nline2 lf\nline3 lf\n"
