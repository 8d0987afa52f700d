"""A role that may create schemas must not get its code run as another role
through the client's own statements: every connection statequeue opens sets
``search_path = pg_catalog, pg_temp`` before any statement, so an unqualified
function or operator always resolves in pg_catalog.

The tester's attack: bob makes a schema named like alice's role (first on the
default ``"$user", public`` search path) holding an overload of a function the
first migration calls, with an exact type match; alice's first `enqueue` ran
it as alice. Real server and real roles (tests/pg.py).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import STATEQUEUE
from tests.pg import sql
from tests.test_pg_security import _cli, _db, _role

pytest.importorskip("psycopg")


def _plant(pg_url: str, bob_url: str, alice: str) -> None:
    """Bob's schema ``alice`` with overloads that record who ran them in bob's table."""
    sql(bob_url, f'CREATE SCHEMA "{alice}"')
    sql(bob_url, "CREATE SCHEMA bobs")
    sql(bob_url, "CREATE TABLE bobs.seen (who text, what text)")
    sql(bob_url, f'GRANT USAGE ON SCHEMA "{alice}", bobs TO PUBLIC')
    sql(bob_url, "GRANT INSERT ON bobs.seen TO PUBLIC")
    body = "BEGIN INSERT INTO bobs.seen VALUES (current_user, '{what}'); END"
    for what, args, returns in [
        ("pg_advisory_xact_lock", "a integer, b smallint", "void"),
        ("pg_advisory_xact_lock", "a integer, b integer", "void"),
        ("pg_advisory_xact_lock", "a bigint", "void"),
    ]:
        sql(
            bob_url,
            f'CREATE FUNCTION "{alice}".{what}({args}) RETURNS {returns}'
            f" LANGUAGE plpgsql AS $${body.format(what=what)}$$",
        )
        sql(bob_url, f'GRANT EXECUTE ON FUNCTION "{alice}".{what}({args}) TO PUBLIC')


def test_a_planted_overload_in_a_schema_named_like_the_user_never_runs(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    alice, alice_url = _role(pg_url, "alice")
    bob, bob_url = _role(pg_url, "bob")
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{alice}", "{bob}"')
    _plant(pg_url, bob_url, alice)
    for args in (["enqueue", "secret"], ["status"], ["list"], ["db", "migrate"]):
        done = _cli(sq_env, alice_url, *args)
        assert done.returncode == 0, (args, done.stderr)
    assert sql(pg_url, "SELECT who, what FROM bobs.seen") == []  # never ran as alice
    assert sql(pg_url, "SELECT count(*) FROM statequeue.items") == [(1,)]


def test_a_run_with_the_overload_planted_runs_nothing_of_bobs(
    pg_url: str, sq_env: dict[str, str]
) -> None:
    alice, alice_url = _role(pg_url, "alice")
    bob, bob_url = _role(pg_url, "bob")
    sql(pg_url, f'GRANT CREATE ON DATABASE "{_db(pg_url)}" TO "{alice}", "{bob}"')
    _plant(pg_url, bob_url, alice)
    assert _cli(sq_env, alice_url, "enqueue", "a", "b").returncode == 0
    run = [STATEQUEUE, "run", "--store", alice_url, "--", "true", "{}"]
    done = subprocess.run(run, env=sq_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sql(pg_url, "SELECT who, what FROM bobs.seen") == []
    assert sql(pg_url, "SELECT count(*) FROM statequeue.items WHERE state = 'done'") == [(2,)]


def test_the_runners_other_connections_use_the_pinned_search_path(pg_url: str) -> None:
    """The lease keeper's and the follower's LISTEN connection open their own."""
    from statequeue.store.postgres.leases import Leases
    from statequeue.store.postgres.notify import Listener

    leases = Leases(pg_url, "q")
    listener = Listener(pg_url, "q")
    try:
        assert listener.fileno() is not None
        conns = [leases._connection(), listener._conn]
        for conn in conns:
            assert conn is not None
            row = conn.execute("SELECT current_setting('search_path')").fetchone()
            assert row == ("pg_catalog, pg_temp",)
    finally:
        listener.close()
        leases._reset()


def test_every_connection_uses_the_pinned_search_path(pg_url: str) -> None:
    from statequeue.store.postgres.connection import connect

    team = f"team_{_db(pg_url)}"
    sql(pg_url, f'CREATE ROLE "{team}" NOLOGIN')
    conn = connect(pg_url + f"&options=-c%20role%3D{team}%20-c%20search_path%3Dpublic")
    try:
        row = conn.execute("SELECT current_setting('search_path'), current_user").fetchone()
    finally:
        conn.close()
    assert row == ("pg_catalog, pg_temp", team)  # the URL's role kept, its path not
