"""Issue 21, point 3 and two exit codes: the PostgreSQL store refuses a
``statequeue`` schema (or anything in it) that another role owns, and any
trigger on its tables (exit 9); its functions pin their search_path; a
missing grant exits 11, an import value out of range 2.

Real server (tests/pg.py), with real login roles over its unix socket (the
throwaway cluster trusts local connections). Roles are cluster-wide, so each
test names its own after its database.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE
from tests.pg import sql

pytest.importorskip("psycopg")


def _db(url: str) -> str:
    return url.split("@/", 1)[1].split("?", 1)[0]


def _role(url: str, name: str, *options: str) -> tuple[str, str]:
    """A new login role for this test's database: (its name, its URL)."""
    role = f"{name}_{_db(url)}"
    sql(url, f'CREATE ROLE "{role}" LOGIN {" ".join(options)}')
    return role, url.replace("postgres@", f"{role}@", 1)


def _cli(env: dict[str, str], url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args, "--store", url], env=env, capture_output=True, text=True, timeout=60
    )


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


def _bob_owns_and_shares(pg_url: str, env: dict[str, str]) -> tuple[str, str, str]:
    """Bob migrates first and grants alice everything; (bob, alice, alice's URL)."""
    bob, bob_url = _role(pg_url, "bob")
    alice, alice_url = _role(pg_url, "alice")
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{bob}"')
    assert _cli(env, bob_url, "db", "migrate").returncode == 0
    # What bob would grant so that alice uses his schema without noticing.
    sql(bob_url, f'GRANT USAGE ON SCHEMA statequeue TO "{alice}"')
    sql(bob_url, f'GRANT ALL ON ALL TABLES IN SCHEMA statequeue TO "{alice}"')
    sql(bob_url, f'GRANT ALL ON ALL SEQUENCES IN SCHEMA statequeue TO "{alice}"')
    return bob, alice, alice_url


def test_a_schema_another_role_owns_is_refused_naming_it(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    bob, alice, alice_url = _bob_owns_and_shares(pg_url, sq_env)
    for args in (["enqueue", "secret"], ["status"], ["queues"], ["db", "migrate"]):
        done = _cli(sq_env, alice_url, *args)
        assert done.returncode == 9, (args, done.stderr)
        line = _one_line(done.stderr)
        assert f"owned by role {bob}" in line and f"role {alice}" in line, line
    # Nothing of alice's went into bob's schema.
    assert sql(pg_url, "SELECT count(*) FROM statequeue.items") == [(0,)]


def test_a_table_another_role_put_in_your_schema_is_refused(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    alice, alice_url = _role(pg_url, "alice")
    bob, bob_url = _role(pg_url, "bob")
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{alice}"')
    assert _cli(sq_env, alice_url, "enqueue", "a").returncode == 0
    # Alice let bob create in her schema: what he makes there is his.
    sql(alice_url, f'GRANT CREATE, USAGE ON SCHEMA statequeue TO "{bob}"')
    sql(bob_url, "CREATE TABLE statequeue.spy (x int)")
    done = _cli(sq_env, alice_url, "enqueue", "b")
    assert done.returncode == 9, done.stderr
    assert f"table statequeue.spy is owned by role {bob}" in _one_line(done.stderr)


def test_a_trigger_another_role_planted_is_refused(pg_url: str, sq_env: dict[str, str]) -> None:
    alice, alice_url = _role(pg_url, "alice")
    bob, bob_url = _role(pg_url, "bob")
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{alice}", "{bob}"')
    assert _cli(sq_env, alice_url, "enqueue", "a").returncode == 0
    # TRIGGER is all bob needs on alice's table to hang his code on it.
    sql(alice_url, f'GRANT USAGE ON SCHEMA statequeue TO "{bob}"')
    sql(alice_url, f'GRANT TRIGGER ON statequeue.items TO "{bob}"')
    sql(bob_url, "CREATE SCHEMA bobs")
    sql(bob_url, "CREATE TABLE bobs.seen (who text, item bytea)")
    sql(bob_url, "GRANT USAGE ON SCHEMA bobs TO PUBLIC; GRANT INSERT ON bobs.seen TO PUBLIC")
    sql(
        bob_url,
        "CREATE FUNCTION bobs.copy() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN INSERT INTO bobs.seen VALUES (current_user, NEW.item); RETURN NEW; END$$",
    )
    sql(
        bob_url,
        "CREATE TRIGGER copy AFTER INSERT ON statequeue.items"
        " FOR EACH ROW EXECUTE FUNCTION bobs.copy()",
    )
    done = _cli(sq_env, alice_url, "enqueue", "secret")
    assert done.returncode == 9, done.stderr
    line = _one_line(done.stderr)
    assert "trigger copy on statequeue.items" in line and f"role {bob}" in line, line
    assert sql(pg_url, "SELECT count(*) FROM bobs.seen") == [(0,)]  # it never ran as alice


def test_the_functions_pin_their_search_path(pg_url: str, sq_env: dict[str, str]) -> None:
    assert _cli(sq_env, pg_url, "db", "migrate").returncode == 0
    found = """
        SELECT p.proname, p.proconfig FROM pg_proc p
        WHERE p.pronamespace = 'statequeue'::regnamespace ORDER BY 1"""
    pinned = ["search_path=pg_catalog, pg_temp"]
    rows = sql(pg_url, found)
    names = ["claim", "finish", "finish_and_claim", "finish_and_claim_retried", "save_log"]
    assert [r[0] for r in rows] == names
    assert all(r[1] == pinned for r in rows), rows
    # A database at version 5 (its functions unpinned) is pinned on upgrade.
    from statequeue.store.postgres.connection import connect
    from statequeue.store.postgres.schema import MIGRATIONS, migrate

    older = pg_url.replace("?", "_v5?", 1)
    sql(pg_url, f'CREATE DATABASE "{_db(older)}" TEMPLATE template0')
    conn = connect(older)
    try:
        migrate(conn, upto=5)
    finally:
        conn.close()
    assert all(r[1] is None for r in sql(older, found))
    migrated = _cli(sq_env, older, "db", "migrate").stdout
    assert f"from version 5 to {len(MIGRATIONS)}" in migrated
    assert [(r[0], r[1]) for r in sql(older, found)] == [(n, pinned) for n in names]


def test_sharing_through_a_group_role_works(pg_url: str, sq_env: dict[str, str]) -> None:
    """The README's recipe: the schema belongs to a group role, and each
    member connects with ``options=-c role=GROUP``."""
    team = f"team_{_db(pg_url)}"
    sql(pg_url, f'CREATE ROLE "{team}" NOLOGIN')
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{team}"')
    urls = []
    for name in ("alice", "carol"):
        role, url = _role(pg_url, name)
        sql(pg_url, f'GRANT "{team}" TO "{role}"')
        urls.append(f"{url}&options=-c%20role%3D{team}")
    assert _cli(sq_env, urls[0], "enqueue", "a").returncode == 0
    done = _cli(sq_env, urls[1], "enqueue", "b")
    assert done.returncode == 0, done.stderr
    assert sql(
        pg_url, "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'statequeue'"
    ) == [(team,)]


def test_permission_denied_for_the_schema_exits_11(pg_url: str, sq_env: dict[str, str]) -> None:
    """A member of the owning role without its rights (NOINHERIT: it must SET
    ROLE) passes the owner check and is then denied: a missing grant, not an
    item that failed (exit 1)."""
    team = f"team_{_db(pg_url)}"
    sql(pg_url, f'CREATE ROLE "{team}" NOLOGIN')
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{team}"')
    owner_url = pg_url + f"&options=-c%20role%3D{team}"
    assert _cli(sq_env, owner_url, "db", "migrate").returncode == 0
    alice, alice_url = _role(pg_url, "alice", "NOINHERIT")
    sql(pg_url, f'GRANT "{team}" TO "{alice}"')
    done = _cli(sq_env, alice_url, "enqueue", "a")
    assert done.returncode == 11, done.stderr
    line = _one_line(done.stderr)
    assert "permission denied for schema statequeue" in line, line


def test_permission_denied_for_the_database_exits_11(pg_url: str, sq_env: dict[str, str]) -> None:
    _, alice_url = _role(pg_url, "alice")  # no CREATE on the database: cannot migrate
    done = _cli(sq_env, alice_url, "db", "migrate")
    assert done.returncode == 11, done.stderr
    assert "permission denied for database" in _one_line(done.stderr)


@pytest.mark.parametrize("command", [["status"], ["enqueue", "a"]])
def test_a_read_only_session_exits_11_in_one_line(
    pg_url: str, sq_env: dict[str, str], command: list[str]
) -> None:
    """A standby, or a session with default_transaction_read_only: a command
    that writes (`status` folds the counters) was refused with exit 1, the
    code of an item that failed. `list` only reads, and still works."""
    assert _cli(sq_env, pg_url, "enqueue", "x").returncode == 0
    read_only = pg_url + "&options=-c%20default_transaction_read_only%3Don"
    done = _cli(sq_env, read_only, *command)
    assert done.returncode == 11, done.stderr
    line = _one_line(done.stderr)
    assert "is read-only" in line and "read-only transaction" in line, line
    assert _cli(sq_env, read_only, "list").returncode == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("id", 2**63),
        ("attempts", 2**31),
        ("failures", 2**40),
        ("history", [{"t": "end", "attempt": 2**31, "state": "done", "ok": True, "at": 1.0}]),
        ("history", [{"t": "end", "attempt": 1, "exit": -(2**31) - 1, "ok": False, "at": 1.0}]),
    ],
)
def test_an_import_value_out_of_range_exits_2_changing_nothing(
    pg_url: str, sq_env: dict[str, str], tmp_path: Path, field: str, value: object
) -> None:
    good = {"id": 1, "item": "a", "state": "pending"}
    bad = {"id": 2, "item": "b", "state": "failed", field: value}
    export = tmp_path / "export.jsonl"
    lines = [{"statequeue_export": 1, "queue": "q", "items": 2}, good, bad]
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = _cli(sq_env, pg_url, "import", "-q", "q", str(export))
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert "line 3: bad item entry" in line, line
    assert sql(pg_url, "SELECT to_regclass('statequeue.items') IS NULL") == [(True,)]


def test_an_unexpected_store_error_exits_11_not_1(pg_url: str, sq_env: dict[str, str]) -> None:
    """A statement the server fails (here: a table gone from an up-to-date
    schema; in a tester's attack, another role's function) is the store's
    failure, exit 11: exit 1 is for items that failed or are held."""
    assert _cli(sq_env, pg_url, "enqueue", "a").returncode == 0
    sql(pg_url, "DROP TABLE statequeue.items CASCADE")
    done = _cli(sq_env, pg_url, "enqueue", "b")
    assert done.returncode == 11, done.stderr
    line = _one_line(done.stderr)
    assert "the PostgreSQL store failed" in line and "does not exist" in line, line
