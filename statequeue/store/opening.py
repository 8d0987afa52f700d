"""Choosing and opening a queue's store: the local journal, or PostgreSQL by URL."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core.errors import InvalidStoreUrl, UsageError
from statequeue.store.base import Store
from statequeue.store.urls import ENV_STORE, is_store_url, mask

if TYPE_CHECKING:
    from statequeue.core.views import Status


def chosen_url(store: str | None) -> str | None:
    """The store URL given (``--store``), else $STATEQUEUE_STORE; None: the local journal."""
    spec = store if store is not None else os.environ.get(ENV_STORE, "")
    return spec or None


def _check_driver(url: str) -> None:
    """InvalidStoreUrl unless ``url`` names a PostgreSQL store; UsageError
    unless psycopg (the ``postgres`` extra) is installed."""
    if not is_store_url(url):
        raise InvalidStoreUrl(
            f"invalid store URL {mask(url)!r}: expected postgresql://... or a libpq conninfo"
        )
    try:
        import psycopg  # noqa: F401  (only whether it is there)
    except ImportError as exc:
        raise UsageError(
            f"the PostgreSQL store needs psycopg ({exc.name} is missing): "
            "pip install 'statequeue[postgres]'"
        ) from None


def postgres_queues(url: str) -> list[Status]:
    """The status of every queue in the PostgreSQL database at ``url``, by name."""
    _check_driver(url)
    from statequeue.store.postgres.ops import statuses

    return statuses(url)


def drop_postgres_queue(url: str, name: str) -> None:
    """Delete queue ``name`` from the PostgreSQL database at ``url`` (see ops.drop)."""
    _check_driver(url)
    from statequeue.store.postgres.ops import drop

    drop(url, name)


def migrate_postgres(url: str) -> tuple[int, int]:
    """Create or upgrade the schema in the PostgreSQL database at ``url``
    (`statequeue db migrate`); returns (version before, version after)."""
    # lazy: optional dependency psycopg (imported by these modules)
    from statequeue.store.postgres.connection import connect, guarded
    from statequeue.store.postgres.schema import migrate

    conn = connect(url)
    try:
        with guarded(url):
            return migrate(conn)
    finally:
        conn.close()


def open_postgres(url: str, name: str, *, create: bool, scratch: Path) -> Store:
    """The PostgreSQL store at ``url`` for queue ``name`` (psycopg is imported only here)."""
    _check_driver(url)
    from statequeue.store.postgres import PostgresStore

    # Logs of attempts running on this host are written in ``scratch``, then
    # stored in the database when the attempt ends; hidden from `queues` by
    # the leading dot. The store makes and checks it (0700, yours, no link).
    return PostgresStore(url, name, create=create, scratch=scratch)
