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


def encode(value: Any) -> bytes | None:
    """``value`` as a text-format parameter (its SQL casts it to its type)."""
    if value is None:
        return None
    if value is True:
        return b"t"
    if value is False:
        return b"f"
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, int):
        data = str(int(value)).encode("ascii")  # int(): an IntEnum's repr is no number
    elif isinstance(value, float):
        # repr: the shortest text that reads back as the same float (and
        # "inf" and "nan", which float8 reads too).
        data = repr(float(value)).encode("ascii")
    elif isinstance(value, Jsonb):
        dumped = (value.dumps or json.dumps)(value.obj)
        data = dumped.encode("utf-8") if isinstance(dumped, str) else bytes(dumped)
    elif isinstance(value, list | tuple):
        data = ("{" + ",".join(str(int(v)) for v in value) + "}").encode("ascii")
    else:
        raise TypeError(f"no text form for a parameter of type {type(value).__name__}")
    if b"\0" in data:  # libpq sends C strings: as psycopg's dumpers, refuse rather than cut
        raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
    return data


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

    @staticmethod
    def usable(conn: Connection) -> bool:
        """Whether the connection's client encoding is UTF-8 (else: a cursor)."""
        return conn.info.encoding == "utf-8"

    def __call__(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        values = [encode(params[name]) for name in self.order]
        if conn.closed:
            raise psycopg.OperationalError("the connection is closed")
        pgconn = conn.pgconn
        with conn.lock:
            if conn not in self._prepared:
                pgconn.send_prepare(self.name, self.sql)
                self._check(conn, conn.wait(generators.execute(pgconn)), ExecStatus.COMMAND_OK)
                self._prepared.add(conn)
            pgconn.send_query_prepared(self.name, values, result_format=Format.BINARY)
            result = self._check(conn, conn.wait(generators.execute(pgconn)), ExecStatus.TUPLES_OK)
        if result.ntuples == 0:
            return None
        row = (result.get_value(0, i) for i in range(len(self.decoders)))
        return tuple(
            None if data is None else decode(data)
            for decode, data in zip(self.decoders, row, strict=True)
        )

    @staticmethod
    def _check(conn: Connection, results: list[Any], wanted: ExecStatus) -> Any:
        result = results[-1]
        if result.status != wanted:
            raise errors.error_from_result(result, encoding=conn.info.encoding)
        return result
