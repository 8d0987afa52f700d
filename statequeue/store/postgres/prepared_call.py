"""One statement called per item through libpq's prepared-statement call,
without psycopg's cursor machinery (issue 21 point 14).

``finish_and_claim`` is the one statement a runner or a library loop sends
per item. Through a cursor, psycopg looks the query up in its prepared
cache, adapts each of its 20 parameters through its dumpers, and loads the
row through its loaders: measured, a fifth of the loop's own CPU per item
(0.140 -> 0.116 ms at one loop, 0.443 -> 0.388 ms at 16 loops on 2 CPUs).
Here the statement is prepared once per connection under a name of its own,
its parameters are sent as text (each one's SQL is cast to its type) and
its row comes back in binary, decoded by the result's declared types.

What a cursor gives is kept: the connection's lock is held for the call,
and the wait is psycopg's ``Connection.wait``, so a Ctrl-C cancels the
statement on the server as ``execute`` does; an error result raises
psycopg's exception for its SQLSTATE (``connection.guarded`` maps them as
before), and a lost connection is seen as before (``is_lost``: the pgconn's
status). A connection whose client encoding is not UTF-8 goes through a
cursor, as before (``usable``).
"""

from __future__ import annotations

import json
import re
import struct
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg
from psycopg import errors, generators
from psycopg.pq import ExecStatus, Format
from psycopg.types.json import Jsonb

from statequeue.store.postgres.connection import Connection

Decode = Callable[[bytes], Any]

_INT8 = struct.Struct("!q").unpack
_INT4 = struct.Struct("!i").unpack


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int8(data: bytes) -> int:
    return int(_INT8(data)[0])


def _int4(data: bytes) -> int:
    return int(_INT4(data)[0])


def _bool(data: bytes) -> bool:
    return data != b"\x00"


def _bytea(data: bytes) -> bytes:
    return data


DECODERS: dict[str, Decode] = {
    "text": _text,
    "bigint": _int8,
    "integer": _int4,
    "boolean": _bool,
    "bytea": _bytea,
}
"""Binary decoders by SQL type name, for ``PreparedCall``'s result columns."""


def _put_str(value: str) -> bytes:
    data = value.encode("utf-8")
    if "\0" in value:  # libpq sends C strings: as psycopg's dumpers, refuse rather than cut
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return data


def _put_int(value: int) -> bytes:
    return str(int(value)).encode("ascii")  # int(): an IntEnum's repr is no number


def _put_float(value: float) -> bytes:
    # repr: the shortest text that reads back as the same float (and "inf"
    # and "nan", which float8 reads too).
    return repr(float(value)).encode("ascii")


def _put_bool(value: bool) -> bytes:
    return b"t" if value else b"f"


def _put_jsonb(value: Jsonb) -> bytes:
    dumped = (value.dumps or json.dumps)(value.obj)
    return dumped.encode("utf-8") if isinstance(dumped, str) else bytes(dumped)


def _put_array(value: list[int] | tuple[int, ...]) -> bytes:
    return ("{" + ",".join(str(int(v)) for v in value) + "}").encode("ascii")


_ENCODERS: dict[type, Callable[[Any], bytes]] = {
    str: _put_str,
    int: _put_int,
    float: _put_float,
    bool: _put_bool,
    Jsonb: _put_jsonb,
    list: _put_array,
    tuple: _put_array,
}
"""By exact type: one lookup per parameter (20 per item); a subclass
(an IntEnum, a str subclass) is looked up by ``isinstance`` instead."""


def encode(value: Any) -> bytes | None:
    """``value`` as a text-format parameter (its SQL casts it to its type)."""
    if value is None:
        return None
    found = _ENCODERS.get(type(value))
    if found is None:
        found = next((f for t, f in _ENCODERS.items() if isinstance(value, t)), None)
        if found is None:
            raise TypeError(f"no text form for a parameter of type {type(value).__name__}")
    return found(value)


_NAMED = re.compile(r"%\((\w+)\)s")


class PreparedCall:
    """A statement with ``%(name)s`` parameters, prepared on each connection
    it is called on as ``name``, returning at most one row of ``columns``
    (SQL type names of ``DECODERS``)."""

    def __init__(self, name: str, query: str, columns: Sequence[str]) -> None:
        self.name = name.encode("ascii")
        order: list[str] = []

        def numbered(found: re.Match[str]) -> str:
            if found.group(1) not in order:
                order.append(found.group(1))
            return f"${order.index(found.group(1)) + 1}"

        self.sql = _NAMED.sub(numbered, query).encode("utf-8")
        self.order = tuple(order)
        self.decoders = tuple(DECODERS[c] for c in columns)
        self._prepared: weakref.WeakSet[Connection] = weakref.WeakSet()

    def usable(self, conn: Connection) -> bool:
        """Whether the connection's client encoding is UTF-8 (else: a cursor),
        looked up once per connection: a prepared one was."""
        return conn in self._prepared or conn.info.encoding == "utf-8"

    def __call__(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        get = _ENCODERS.get
        values = [
            None if v is None else (get(type(v)) or encode)(v)
            for v in map(params.__getitem__, self.order)
        ]
        if conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        with conn.lock:
            if conn not in self._prepared:
                self._prepare(conn)
            try:
                result = self._execute(conn, values)
            except errors.InvalidSqlStatementName:
                # Gone from the session, never run: psycopg sends DEALLOCATE
                # ALL after a rolled-back transaction where it holds prepared
                # statements of its own, and a pooler or a DISCARD ALL drops
                # them too. Prepared again, and called once more.
                self._prepared.discard(conn)
                self._prepare(conn)
                result = self._execute(conn, values)
        if result.ntuples == 0:
            return None
        row = (result.get_value(0, i) for i in range(len(self.decoders)))
        return tuple(
            None if data is None else decode(data)
            for decode, data in zip(self.decoders, row, strict=True)
        )

    def _prepare(self, conn: Connection) -> None:
        pgconn = conn.pgconn
        pgconn.send_prepare(self.name, self.sql)
        try:
            self._check(conn, conn.wait(generators.execute(pgconn)), ExecStatus.COMMAND_OK)
        except errors.DuplicatePreparedStatement:
            # Made by a Parse whose answer this process never took (an
            # interrupt during the wait): replaced, as its text may be older.
            pgconn.send_query(b"DEALLOCATE " + self.name)
            self._check(conn, conn.wait(generators.execute(pgconn)), ExecStatus.COMMAND_OK)
            pgconn.send_prepare(self.name, self.sql)
            self._check(conn, conn.wait(generators.execute(pgconn)), ExecStatus.COMMAND_OK)
        self._prepared.add(conn)

    def _execute(self, conn: Connection, values: list[bytes | None]) -> Any:
        pgconn = conn.pgconn
        pgconn.send_query_prepared(self.name, values, result_format=Format.BINARY)
        return self._check(conn, conn.wait(generators.execute(pgconn)), ExecStatus.TUPLES_OK)

    @staticmethod
    def _check(conn: Connection, results: list[Any], wanted: ExecStatus) -> Any:
        result = results[-1]
        if result.status != wanted:
            raise errors.error_from_result(result, encoding=conn.info.encoding)
        return result
