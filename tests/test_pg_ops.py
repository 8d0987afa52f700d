"""Operator commands on PostgreSQL (issue 12): fsck, queues, drop and path,
status from the counters (promise 8), and the bad input the issue lists."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from tests.conftest import STATEQUEUE
from tests.pg import PgCluster
from tests.pg import sql as _sql

psycopg = pytest.importorskip("psycopg")
from statequeue.store.postgres import PostgresStore, check  # noqa: E402  (needs psycopg)
from statequeue.store.postgres.ops import QUEUE_TABLES  # noqa: E402

USAGE, RUNNER_ACTIVE, DAMAGED, NOT_FOUND, UNREACHABLE = 2, 4, 5, 7, 11
PW_ROLE = "sq_pw_user"
PASSWORD = "Right-pw-7"
WRONG = "Wrong-pw-9"


def _cli(
    env: dict[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, timeout=120
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode()
    )


def _sq(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process (no interpreter start-up): exit code, stdout, stderr."""
    from statequeue.cli.app import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def _one_line(done: subprocess.CompletedProcess[str] | tuple[int, str, str], code: int) -> None:
    if isinstance(done, tuple):
        done = subprocess.CompletedProcess([], *done)
    assert done.returncode == code, (done.returncode, done.stderr)
    assert done.stderr.startswith("statequeue: ") and done.stderr.count("\n") == 1, done.stderr


@pytest.fixture
def env(pg_url: str, sq_env: dict[str, str]) -> dict[str, str]:
    return {**sq_env, "STATEQUEUE_STORE": pg_url}


@pytest.fixture
def in_store(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """STATEQUEUE_STORE set for commands run in this process; returns the URL."""
    monkeypatch.setenv("STATEQUEUE_STORE", pg_url)
    return pg_url


def _run_some(url: str, queue: str, items: list[str], finish: int) -> None:
    store = PostgresStore(url, queue)
    try:
        store.enqueue(items)
        runner = new_runner()
        for _ in range(finish):
            claim = store.claim(runner)
            assert claim is not None
            store.save_log(claim, b"out")
            store.finish(claim, Outcome(ok=True, result=1))
    finally:
        store.close()


# -- fsck and status ---------------------------------------------------------------


def test_status_reads_the_counters_and_fsck_recounts_and_repairs(
    in_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_some(in_store, "default", ["a", "b", "c", "d", "e"], finish=2)
    code, out, _ = _sq(capsys, "fsck", "--json")
    assert code == 0
    report = json.loads(out)
    assert report["counts"]["done"] == 2 and report["counts"]["pending"] == 3
    assert report["mismatches"] == [] and report["damaged"] is False
    # A wrong counter: status shows it (it never scans the items), fsck finds it.
    _sql(in_store, "INSERT INTO statequeue.count_deltas VALUES ('default', 'done', 7)")
    assert json.loads(_sq(capsys, "status", "--json")[1])["counts"]["done"] == 9
    code, out, err = _sq(capsys, "fsck")
    assert code == DAMAGED
    assert "done: the counter says 9, the items say 2" in out and "fsck --repair" in err
    code, out, _ = _sq(capsys, "fsck", "--repair")
    assert code == 0 and "repaired" in out
    assert json.loads(_sq(capsys, "status", "--json")[1])["counts"]["done"] == 2
    assert json.loads(_sq(capsys, "fsck", "--json")[1])["mismatches"] == []


def test_fsck_reports_an_old_open_transaction(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = PostgresStore(pg_url, "q")
    holder = psycopg.connect(pg_url)  # not autocommit: its transaction stays open
    try:
        holder.execute("SELECT txid_current()")
        pid = holder.info.backend_pid
        assert store.check().warnings == ()  # younger than OLD_TRANSACTION
        monkeypatch.setattr(check, "OLD_TRANSACTION", 0.0)
        [warning] = store.check().warnings
        assert f"pid {pid}" in warning and "holds back vacuum" in warning
        holder.rollback()
        assert store.check().warnings == ()
    finally:
        holder.close()
        store.close()


# -- queues, path, drop ------------------------------------------------------------


def test_queues_lists_the_queues_in_the_database(
    in_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_some(in_store, "alpha", ["a", "b"], finish=1)
    _run_some(in_store, "beta", ["c"], finish=0)
    code, out, _ = _sq(capsys, "queues", "--json")
    assert code == 0
    listed = json.loads(out)
    assert [(q["queue"], q["total"], q["counts"]["done"]) for q in listed["queues"]] == [
        ("alpha", 2, 1),
        ("beta", 1, 0),
    ]
    assert [line.split("\t")[0] for line in _sq(capsys, "queues")[1].splitlines()] == [
        "alpha",
        "beta",
    ]
    # Listing opened no queue: no "default" was created.
    assert _sql(in_store, "SELECT name FROM statequeue.queues ORDER BY name") == [
        ("alpha",),
        ("beta",),
    ]


def test_path_prints_the_masked_url_and_the_queue(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_some(pg_url, "q", ["a"], finish=0)
    secret = pg_url.replace("postgres@", "postgres:Hidden-pw@")  # trust auth ignores it
    code, out, _ = _sq(capsys, "path", "--store", secret, "-q", "q")
    assert code == 0
    assert out == pg_url.replace("postgres@", "postgres:***@") + "\tq\n"


def _rows_of(url: str, queue: str) -> dict[str, int]:
    counts = {
        t: _sql(url, f"SELECT count(*) FROM statequeue.{t} WHERE queue = %s", queue)[0][0]
        for t in QUEUE_TABLES
    }
    return {t: int(str(n)) for t, n in counts.items()}


def test_drop_refuses_an_active_runner_then_deletes_every_row(
    in_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_some(in_store, "gone", ["a", "b", "c"], finish=2)
    _run_some(in_store, "kept", ["a"], finish=1)
    kept_before = _rows_of(in_store, "kept")
    store = PostgresStore(in_store, "gone")
    runner = new_runner()
    store.register_runner(runner)
    try:
        _one_line(_sq(capsys, "drop", "gone", "--yes"), RUNNER_ACTIVE)
        assert _rows_of(in_store, "gone")["items"] == 3
        store.unregister_runner(runner.runner_id)
    finally:
        store.close()
    _one_line(_sq(capsys, "drop", "gone"), USAGE)  # no terminal, no --yes
    assert _sq(capsys, "drop", "gone", "--yes")[0] == 0
    assert set(_rows_of(in_store, "gone").values()) == {0}
    assert _sql(in_store, "SELECT count(*) FROM statequeue.queues WHERE name = 'gone'") == [(0,)]
    assert _rows_of(in_store, "kept") == kept_before
    _one_line(_sq(capsys, "status", "-q", "gone", "--json"), NOT_FOUND)
    _one_line(_sq(capsys, "drop", "gone", "--yes"), NOT_FOUND)


def test_an_interrupted_drop_keeps_the_queue_closed_until_finished(
    in_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_some(in_store, "q", ["a", "b"], finish=1)
    # As a drop that stopped after marking the queue and deleting some rows.
    _sql(in_store, "UPDATE statequeue.queues SET dropping = true WHERE name = 'q'")
    _sql(in_store, "DELETE FROM statequeue.live WHERE queue = 'q'")
    for args in (["enqueue", "-q", "q", "x"], ["status", "-q", "q"]):
        done = _sq(capsys, *args)
        _one_line(done, NOT_FOUND)
        assert "is being dropped" in done[2]
    assert "q" not in _sq(capsys, "queues")[1].split()
    assert _sq(capsys, "drop", "q", "--yes")[0] == 0
    assert set(_rows_of(in_store, "q").values()) == {0}
    assert _sq(capsys, "enqueue", "-q", "q", "x")[0] == 0  # a new, empty queue


# -- bad input -----------------------------------------------------------------------


@pytest.fixture
def password_role(pg_cluster: PgCluster, pg_url: str) -> Iterator[str]:
    """A role that must log in with a password (scram), in this test's database:
    returns the URL for it, with ``{pw}`` in place of the password."""
    hba = pg_cluster.data_dir / "pg_hba.conf"
    rule = f"local all {PW_ROLE} scram-sha-256\n"
    text = hba.read_text()
    if rule not in text:  # before the trust lines: the first matching line wins
        hba.write_text(rule + text)
        pg_cluster.pg_ctl("reload")
    if not _sql(pg_url, "SELECT 1 FROM pg_roles WHERE rolname = %s", PW_ROLE):
        _sql(pg_url, f"CREATE ROLE {PW_ROLE} LOGIN PASSWORD '{PASSWORD}'")
    dbname = pg_url.split("@/")[1].split("?")[0]
    _sql(pg_url, f'GRANT ALL ON DATABASE "{dbname}" TO {PW_ROLE}')
    yield pg_url.replace("postgres@", PW_ROLE + ":{pw}@")


def test_wrong_password_is_one_line_exit_11_and_never_printed(
    password_role: str, pg_url: str, sq_env: dict[str, str]
) -> None:
    wrong = password_role.format(pw=WRONG)
    for args in (["enqueue", "x"], ["queues"], ["fsck"], ["drop", "q", "--yes"]):
        done = _cli(sq_env, "--store", wrong, *args)
        _one_line(done, UNREACHABLE)
        assert "password authentication failed" in done.stderr
        assert WRONG not in done.stdout + done.stderr
    # Nothing was created; the right password works, so the password was the problem.
    assert _sql(pg_url, "SELECT to_regclass('statequeue.queues')") == [(None,)]
    right = _cli(sq_env, "--store", password_role.format(pw=PASSWORD), "enqueue", "x")
    assert right.returncode == 0, right.stderr
    assert PASSWORD not in right.stdout + right.stderr


def test_queue_names_and_items_that_would_break_naive_sql(env: dict[str, str], pg_url: str) -> None:
    assert _cli(env, "enqueue", "first").returncode == 0
    before = _sql(pg_url, "SELECT queue, id, item FROM statequeue.items ORDER BY queue, id")
    for name in ("x'; DROP TABLE statequeue.items; --", "a\\b"):
        _one_line(_cli(env, "enqueue", "-q", name, "item"), USAGE)
    # A NUL cannot be an argument: refused from stdin, as for a local queue.
    _one_line(_cli(env, "enqueue", stdin=b"ok\nnul\0inside\n"), USAGE)
    assert _sql(pg_url, "SELECT queue, id, item FROM statequeue.items ORDER BY queue, id") == before
    nasty = ["it's", "'; DROP TABLE statequeue.items; --", "back\\slash", "%s %(q)s", '"q"']
    assert _cli(env, "enqueue", *nasty).returncode == 0
    listed = _cli(env, "list", "--json").stdout.splitlines()
    assert [json.loads(line)["item"] for line in listed] == ["first", *nasty]


def test_empty_database_is_migrated_on_first_use(
    in_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from statequeue.store.postgres.schema import MIGRATIONS

    assert _sql(in_store, "SELECT to_regclass('statequeue.queues')") == [(None,)]
    code, out, _ = _sq(capsys, "queues", "--json")
    assert code == 0 and json.loads(out)["queues"] == []
    # A look builds nothing (test_pg_look_writes_nothing.py); the first write does.
    assert _sql(in_store, "SELECT to_regclass('statequeue.queues')") == [(None,)]
    code, _, err = _sq(capsys, "-q", "q", "enqueue", "a")
    assert code == 0, err
    assert _sql(in_store, "SELECT max(version) FROM statequeue.schema_version") == [
        (len(MIGRATIONS),)
    ]


@pytest.mark.parametrize("verb", ["cancel", "retry", "show", "logs"])
def test_an_id_past_a_bigint_is_no_item_not_a_store_failure(
    in_store: str, capsys: pytest.CaptureFixture[str], verb: str
) -> None:
    """`cancel 99999999999999999999999` once exited 11 ("the PostgreSQL store
    failed: bigint out of range"); `show` said no item (7), as the local store does."""
    _run_some(in_store, "q", ["a"], finish=0)
    huge = str(10**23)
    done = _sq(capsys, "-q", "q", verb, huge)
    _one_line(done, NOT_FOUND)
    assert f"no item {huge}" in done[2]
    done = _sq(capsys, "-q", "q", verb, str(1 << 63))
    _one_line(done, NOT_FOUND)


@pytest.mark.parametrize(
    "setting", ["port=abc", "sslmode=bogus", "connect_timeout=x"], ids=lambda s: s.split("=")[0]
)
def test_a_setting_libpq_cannot_take_is_bad_input_not_an_unreachable_store(
    pg_url: str, capsys: pytest.CaptureFixture[str], setting: str
) -> None:
    """`port=abc` once exited 11, "cannot reach the PostgreSQL store", while
    an equally malformed URL was "invalid store URL" (2)."""
    url = f"{pg_url}&{setting}"
    done = _sq(capsys, "--store", url, "status")
    _one_line(done, USAGE)
    assert "invalid store URL" in done[2] and setting.split("=")[1] in done[2]
