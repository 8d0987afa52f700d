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

from statequeue.store.postgres import writes  # noqa: E402
from statequeue.store.postgres.connection import connect  # noqa: E402
from statequeue.store.postgres.prepared_call import PreparedCall, encode  # noqa: E402


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
