"""The PostgreSQL store's connection plumbing and every read: what
``PostgresStore`` shares with nothing that writes (kept apart so that the
store module holds the claim, finish, lease and user-action paths).

Reads go through ``_guard`` (errors become StoreUnreachable) or, where a
runner must survive a restart of the server, through ``_patiently``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from statequeue.core.errors import ItemNotFound
from statequeue.core.models import ItemState
from statequeue.core.records import Record
from statequeue.store.base import Store
from statequeue.store.postgres import check as checking
from statequeue.store.postgres import events, logs, reads, transfer
from statequeue.store.postgres.connection import Connection, guarded
from statequeue.store.postgres.session import Session

if TYPE_CHECKING:
    from statequeue.core.exported import ExportedItem
    from statequeue.core.views import (
        ActiveRunner,
        ItemHistory,
        ItemResult,
        ItemView,
        Status,
        StoreCheck,
    )
    from statequeue.stats.attempts import Attempt
    from statequeue.store.journal.folder import QueueFolder

T = TypeVar("T")


class PostgresReading(Store):
    """The connection of a PostgreSQL store, and its reads (see the module docstring)."""

    url: str  # always set: the database holds the queue
    folder: Path | None
    scratch: QueueFolder | None
    """``folder`` held open and checked (folder.py), or None without one."""
    _session: Session

    @property
    def logs_fd(self) -> int:
        """The scratch folder's ``logs``, held open: the runner opens each
        attempt's log relative to it, never through a link (-1: no folder)."""
        if self.scratch is None:
            return -1
        return self.scratch.subfolder(logs.SUBFOLDER, create=True)

    def _patiently(self, action: Callable[[Connection], T]) -> T:
        """``action(connection)``, run again on a new connection if a runner's
        connection is lost (see session.py)."""
        return self._session.patiently(action)

    @property
    def _conn(self) -> Connection:
        return self._session.conn

    @contextmanager
    def _guard(self) -> Iterator[None]:
        with guarded(self.url):
            yield

    @contextmanager
    def _tx(self, *, sync: bool = True) -> Iterator[Connection]:
        with self._guard(), self._conn.transaction():
            if not sync:
                # Group commit: a later synchronous commit (``sync``) flushes
                # the WAL past this one too.
                self._conn.execute("SET LOCAL synchronous_commit = off")
            yield self._conn

    def active_runners(self) -> list[ActiveRunner]:
        with self._guard():
            return reads.active_runners(self._conn, self.name)

    def commands(self) -> list[list[str]]:
        rows = self._patiently(
            lambda conn: conn.execute(
                "SELECT command FROM statequeue.runners WHERE queue = %s ORDER BY since",
                (self.name,),
            ).fetchall()
        )
        found: list[list[str]] = []
        for (command,) in rows:
            if command and (not found or found[-1] != command):
                found.append(list(command))
        return found

    def is_paused(self) -> bool:
        row = self._patiently(
            lambda conn: conn.execute(
                "SELECT paused FROM statequeue.queues WHERE name = %s", (self.name,)
            ).fetchone()
        )
        return bool(row and row[0])

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        row = self._patiently(
            lambda conn: conn.execute(
                "SELECT min(coalesce(retry_at, 0)) FROM statequeue.live"
                " WHERE queue = %(q)s AND state = 'pending' AND ("
                " (%(among)s::bigint[] IS NULL AND retry_at IS NOT NULL)"
                " OR id = ANY(%(among)s::bigint[]))",
                {"q": self.name, "among": sorted(among) if among is not None else None},
            ).fetchone()
        )
        return float(row[0]) if row and row[0] is not None else None

    def status(self) -> Status:
        with self._guard():
            return reads.status(self._conn, self.name, self.is_paused())

    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        with self._guard():
            yield from reads.items(self._conn, self.name, state)

    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        with self._guard():
            yield from reads.results(self._conn, self.name, state)

    def result(self, item_id: int) -> ItemResult | None:
        with self._guard():
            return reads.result(self._conn, self.name, item_id)

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        with self._guard():
            return reads.find_ids(self._conn, self.name, texts)

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        with self._guard():
            return reads.states(self._conn, self.name, ids)

    def history(self, item_id: int) -> ItemHistory:
        with self._guard():
            found = reads.history(self._conn, self.name, item_id)
            if found is None:
                raise ItemNotFound(f"no item {item_id} in queue {self.name!r}")
            paths = logs.log_paths(self._conn, self.name, item_id, self.scratch)
        return dataclasses.replace(found, log_paths=paths)

    def check(self, *, repair: bool = False) -> StoreCheck:
        with self._guard():
            return checking.check(self._conn, self.name, repair=repair)

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        """From the database once the attempt ended; before that, from this
        host's scratch file (for `logs --follow` on the runner's host)."""
        with self._guard():
            found = logs.read(self._conn, self.name, item_id, attempt, offset)
            if found is None:
                found = logs.read_local(self.scratch, item_id, attempt, offset)
            if found is None:  # stored and removed between the two reads
                found = logs.read(self._conn, self.name, item_id, attempt, offset)
        return found

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        with self._guard():
            return events.read_events(self._conn, self.name, cursor)

    def notices(self) -> list[str]:
        return []

    def export_items(self) -> Iterator[ExportedItem]:
        with self._guard():
            yield from transfer.export_items(self._conn, self.name)

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        from statequeue.store.postgres import stats

        with self._guard():
            yield from stats.iter_attempts(self._conn, self.name, since)
