"""Issue 21 point 14: the per-item statement is called through libpq's
prepared-statement call, without a cursor (store/postgres/prepared_call.py).
What must hold, on a real server (tests/pg.py): each parameter reaches the
server as the value it is (text parameters, cast by the SQL), each column
comes back as the value it is (binary), a NULL either way is a NULL, the
statement is prepared once per connection and again on a new one, and an
error is psycopg's exception for its SQLSTATE, as through a cursor."""

from __future__ import annotations

import enum
import math

import pytest

psycopg = pytest.importorskip("psycopg")
from psycopg.types.json import Jsonb  # noqa: E402  (needs psycopg)

from statequeue.core.errors import ClaimLost  # noqa: E402
from statequeue.core.identity import new_runner  # noqa: E402
from statequeue.core.models import ItemState, Outcome  # noqa: E402
from statequeue.store.postgres import PostgresStore, writes  # noqa: E402
from statequeue.store.postgres.connection import connect  # noqa: E402
from statequeue.store.postgres.prepared_call import PreparedCall, encode  # noqa: E402

OK = Outcome(ok=True, exit_code=0)


class _Code(enum.IntEnum):
    TWO = 2


def test_parameters_are_sent_as_their_text() -> None:
    assert encode(None) is None
    assert (encode(True), encode(False)) == (b"t", b"f")
    assert encode(-(2**62)) == b"-4611686018427387904"
    assert encode(_Code.TWO) == b"2"  # never "<_Code.TWO: 2>"
    assert encode(0.1) == b"0.1"
    assert encode(math.inf) == b"inf"
    assert encode("é\u2603") == "é\u2603".encode()
    assert encode([3, 1]) == b"{3,1}"
    assert encode(writes.jsonb({"a": [1, "é"]})) == '{"a":[1,"é"]}'.encode()
    with pytest.raises(psycopg.DataError):
        encode("a\0b")  # libpq would cut it at the NUL
    with pytest.raises(TypeError):
        encode(object())


_ECHO = PreparedCall(
    "statequeue_test_echo",
    "SELECT %(t)s::text, %(big)s::bigint, %(small)s::integer, %(yes)s::boolean,"
    " %(raw)s::bytea, %(f)s::float8::text, (%(j)s::jsonb)->>'k', cardinality(%(ids)s::bigint[])",
    ("text", "bigint", "integer", "boolean", "bytea", "text", "text", "integer"),
)


def _params(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "t": "item é \u2603",
        "big": 2**62,
        "small": -7,
        "yes": True,
        "raw": "\\xff00fe",  # bytea's own text form
        "f": 0.1 + 0.2,
        "j": Jsonb({"k": "v é"}, dumps=None),
        "ids": [5, 6, 7],
    }
    base.update(changes)
    return base


def test_values_and_nulls_round_trip(pg_url: str) -> None:
    conn = connect(pg_url)
    try:
        row = _ECHO(conn, _params())
        assert row == ("item é \u2603", 2**62, -7, True, b"\xff\x00\xfe", repr(0.1 + 0.2), "v é", 3)
        assert float(row[5]) == 0.1 + 0.2  # the same float, every bit
        nulls = _ECHO(conn, dict.fromkeys(_params()))
        assert nulls == (None,) * 8
        assert _ECHO(conn, _params(yes=False, small=0))[2:4] == (0, False)
    finally:
        conn.close()


def test_prepared_once_per_connection(pg_url: str) -> None:
    first, second = connect(pg_url), connect(pg_url)
    try:
        for conn in (first, first, second):
            assert _ECHO(conn, _params())[1] == 2**62
        for conn in (first, second):
            names = conn.execute(
                "SELECT name FROM pg_prepared_statements WHERE name = 'statequeue_test_echo'"
            ).fetchall()
            assert names == [("statequeue_test_echo",)]
    finally:
        first.close()
        second.close()


def test_an_error_is_psycopgs_exception_for_its_sqlstate(pg_url: str) -> None:
    failing = PreparedCall("statequeue_test_fail", "SELECT 1 / %(n)s::integer", ("integer",))
    conn = connect(pg_url)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            failing(conn, {"n": 0})
        assert failing(conn, {"n": 1}) == (1,)  # the connection is usable after it
    finally:
        conn.close()


def test_a_statement_deallocated_under_it_is_prepared_again(pg_url: str) -> None:
    conn = connect(pg_url)
    try:
        assert _ECHO(conn, _params())[2] == -7
        conn.execute("DEALLOCATE ALL")  # as a pooler, or DISCARD ALL, would
        assert _ECHO(conn, _params(small=8))[2] == 8
    finally:
        conn.close()


def test_a_rolled_back_transaction_does_not_break_the_next_item(pg_url: str) -> None:
    """psycopg sends DEALLOCATE ALL after a rolled-back transaction where it
    holds prepared statements of its own: a stale give-back (ClaimLost, rolled
    back) wiped the per-item statement, and every later item failed (exit 11)."""
    store = PostgresStore(pg_url, "q")
    try:
        store.enqueue([f"i{n}" for n in range(12)])
        runner = new_runner()
        store.register_runner(runner)
        claim = store.claim(runner)
        assert claim is not None
        _, claim = store.finish_and_claim(claim, OK, runner=runner)  # prepared here
        for _ in range(6):  # psycopg prepares the statements it sees five times
            assert claim is not None
            store.release(claim, "back")
            claim = store.claim(runner)
        assert claim is not None
        store.release(claim, "back")
        with pytest.raises(ClaimLost):
            store.release(claim, "again")  # stale: rolled back
        for _ in range(3):
            claim = store.claim(runner)
            assert claim is not None
            assert store.finish_and_claim(claim, OK, runner=runner)[0] is ItemState.DONE
    finally:
        store.close()


def test_a_statement_of_the_same_name_already_there_is_replaced(pg_url: str) -> None:
    """A Parse whose answer the process never took (an interrupt in the wait)
    leaves the name taken: the call replaces it, never runs another text."""
    conn = connect(pg_url)
    try:
        conn.execute("PREPARE statequeue_test_echo AS SELECT 'stale'::text")
        assert _ECHO(conn, _params())[0] == "item é \u2603"
    finally:
        conn.close()
