"""Opening a connection from a store URL, with the password kept out of every message.

A URL is ``postgresql://...`` (or ``postgres://``) or a libpq conninfo
(``host=... dbname=...``); the ``PG*`` variables, ``.pgpass`` and ``sslmode``
work as libpq defines them, since libpq itself parses what is given here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import psycopg.conninfo
import psycopg.errors

from statequeue.core.errors import (
    InvalidStoreUrl,
    StateQueueError,
    StoreDenied,
    StoreFailed,
    StoreUnreachable,
)
from statequeue.store import urls

Connection = psycopg.Connection[tuple[Any, ...]]


def mask(text: str, url: str = "") -> str:
    """``text`` with any password shown as ***, including ``url``'s wherever it appears."""
    return urls.mask(text, _password_of(url))


def _password_of(url: str) -> str:
    try:
        return str(psycopg.conninfo.conninfo_to_dict(url).get("password") or "")
    except psycopg.Error:
        return ""


def check_url(url: str) -> None:
    """InvalidStoreUrl, naming the problem (never the password), if libpq cannot parse it."""
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        reason = _said(exc, url)
        raise InvalidStoreUrl(f"invalid store URL {mask(url)!r}: {reason}") from None


# Over TCP, a peer that vanishes (partition, dead host) must not hang a call
# for the kernel's ~15 minutes: the runner has leases to keep or fence. The
# URL's own settings win over these.
NETWORK_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "2",
    "tcp_user_timeout": "5000",
}
BACKOFF_FIRST = 0.05
SEARCH_PATH = "pg_catalog, pg_temp"
"""The search_path of every session statequeue opens (and of its functions).

With the default ``"$user", public`` another role that may create schemas
makes one named like the user's role and plants an overload there that
matches a call's argument types better than pg_catalog's (an advisory lock
call with a smallint key): it ran as the user. With this path an unqualified
function, operator or type resolves in pg_catalog, and every statequeue
object is named with its schema (``statequeue.``)."""
BACKOFF_MAX = 2.0


def connect(url: str) -> Connection:
    """An autocommit connection (transactions are always explicit) whose
    search_path is SEARCH_PATH before any other statement, or StoreUnreachable.

    Every connection statequeue opens (a reconnect too) comes from here."""
    check_url(url)
    given = psycopg.conninfo.conninfo_to_dict(url)
    extra = {k: v for k, v in NETWORK_DEFAULTS.items() if k not in given}
    try:
        conninfo = psycopg.conninfo.make_conninfo(url, **extra)
        conn = psycopg.connect(conninfo, autocommit=True, application_name="statequeue")
    except psycopg.Error as exc:
        if _BAD_SETTING.search(str(exc)):  # libpq's check of the URL's values: never transient
            raise InvalidStoreUrl(f"invalid store URL {mask(url)!r}: {_said(exc, url)}") from None
        raise unreachable(exc, url) from None
    try:
        # A SET, not the URL's ``options``: those stay the user's (``-c
        # role=...``), and poolers in session mode pass a SET through. It
        # calls no function, so nothing can be resolved before it.
        conn.execute(f"SET search_path = {SEARCH_PATH}")
    except psycopg.Error as exc:
        conn.close()
        raise unreachable(exc, url) from None
    return conn


# What libpq says of a setting in the URL it cannot take (`port=abc`,
# `sslmode=bogus`), before it tries any connection: bad input, exit 2, not
# "cannot reach" (exit 11).
_BAD_SETTING = re.compile(
    r"invalid \w+ value|invalid connection option|for connection option"
    r"|^bad value for \w+:"
)


def is_lost(conn: Connection) -> bool:
    """True when the connection itself is gone (server restart, terminated
    backend, network), as opposed to a statement that failed on it."""
    return bool(conn.closed or conn.broken)


def unreachable(exc: BaseException, url: str) -> StoreUnreachable:
    reason = _said(exc, url) or type(exc).__name__
    return StoreUnreachable(f"cannot reach the PostgreSQL store {mask(url)}: {reason}")


def _said(exc: BaseException, url: str) -> str:
    """What the server or driver said, on one line, the password masked."""
    return " ".join(mask(str(exc), url).split())


@contextmanager
def guarded(url: str) -> Iterator[None]:
    """Turn a lost connection into StoreUnreachable and any other database
    error into a StateQueueError, both with the password masked."""
    try:
        yield
    except StateQueueError:
        raise
    except psycopg.OperationalError as exc:
        raise unreachable(exc, url) from None
    except psycopg.errors.InsufficientPrivilege as exc:
        # Not an item's failure (exit 1): the role lacks a grant (USAGE on
        # the schema, CREATE on the database for the first migration).
        reason = _said(exc, url)
        raise StoreDenied(
            f"the PostgreSQL store {mask(url)} refused: {reason} (a grant this role lacks; "
            'see "Sharing a database between roles" in `statequeue help postgres`)'
        ) from None
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        # Not an item's failure (exit 1): a standby, or a session made
        # read-only (default_transaction_read_only); most commands write
        # (even `status` folds the counters).
        reason = _said(exc, url)
        raise StoreDenied(
            f"the PostgreSQL store {mask(url)} is read-only: {reason} (a standby, or "
            "default_transaction_read_only; point --store at a writable primary)"
        ) from None
    except psycopg.Error as exc:
        # Anything else the server or driver raised (a missing table, an
        # error in a function): the store's failure, exit 11, not an item's (1).
        reason = _said(exc, url)
        raise StoreFailed(f"the PostgreSQL store failed: {reason}") from None
