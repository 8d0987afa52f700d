"""The PostgreSQL store's reads: every Store-contract method that only reads
one queue, each through the store's session (``PostgresStore`` holds a
``Reader`` and hands these calls to it).

Reads go through ``Session.guard`` (errors become StoreUnreachable) or, where
a runner must survive a restart of the server, through ``Session.patiently``.
The queries themselves are in queries.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from statequeue.core.errors import ItemNotFound
from statequeue.core.models import ItemState
from statequeue.core.records import Record
from statequeue.store.postgres import attempt_rows, events, logs, queries, transfer
from statequeue.store.postgres import check as checking
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


class Reader:
    """The reads of queue ``name`` (see the module docstring); ``scratch`` is
    this host's scratch folder, where logs of running attempts are."""

    def __init__(self, session: Session, name: str, scratch: QueueFolder | None) -> None:
        self._session = session
        self.name = name
        self.scratch = scratch

    def active_runners(self) -> list[ActiveRunner]:
        with self._session.guard():
            return queries.active_runners(self._session.conn, self.name)

    def commands(self) -> list[list[str]]:
        rows = self._session.patiently(
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
        row = self._session.patiently(
            lambda conn: conn.execute(
                "SELECT paused FROM statequeue.queues WHERE name = %s", (self.name,)
            ).fetchone()
        )
        return bool(row and row[0])

    def next_due(self, among: Collection[int] | None = None) -> float | None:
        row = self._session.patiently(
            lambda conn: conn.execute(
                "SELECT min(coalesce(retry_at, 0)) FROM statequeue.live"
                " WHERE queue = %(q)s AND state = 'pending' AND ("
                " (%(among)s::bigint[] IS NULL AND retry_at IS NOT NULL)"
                " OR id = ANY(%(among)s::bigint[]))",
                {"q": self.name, "among": sorted(among) if among is not None else None},
            ).fetchone()
        )
        return float(row[0]) if row and row[0] is not None else None

    def status(self, held: queries.HeldHere) -> Status:
        with self._session.guard():
            return queries.status(self._session.conn, self.name, self.is_paused(), held)

    def runner_gone(self, held: queries.HeldHere) -> tuple[tuple[int, ...], tuple[int, ...]]:
        with self._session.guard():
            return queries.runner_gone(self._session.conn, self.name, held)

    def runner_hosts(self, runner_ids: Collection[str]) -> dict[str, str]:
        with self._session.guard():
            return queries.runner_hosts(self._session.conn, self.name, runner_ids)

    def items(self, state: ItemState | None = None) -> Iterator[ItemView]:
        with self._session.guard():
            yield from queries.items(self._session.conn, self.name, state)

    def results(self, state: ItemState | None = None) -> Iterator[ItemResult]:
        with self._session.guard():
            yield from queries.results(self._session.conn, self.name, state)

    def result(self, item_id: int) -> ItemResult | None:
        with self._session.guard():
            return queries.result(self._session.conn, self.name, item_id)

    def results_of(self, ids: Collection[int]) -> dict[int, ItemResult]:
        with self._session.guard():
            return queries.results_of(self._session.conn, self.name, ids)

    def find_ids(self, texts: Collection[str]) -> dict[str, int]:
        with self._session.guard():
            return queries.find_ids(self._session.conn, self.name, texts)

    def states(self, ids: Collection[int]) -> dict[int, ItemState]:
        with self._session.guard():
            return queries.states(self._session.conn, self.name, ids)

    def history(self, item_id: int) -> ItemHistory:
        with self._session.guard():
            conn = self._session.conn
            found = queries.history(conn, self.name, item_id)
            if found is None:
                raise ItemNotFound(f"no item {item_id} in queue {self.name!r}")
            paths = logs.log_paths(conn, self.name, item_id, self.scratch)
        return dataclasses.replace(found, log_paths=paths)

    def check(self, *, repair: bool = False) -> StoreCheck:
        with self._session.guard():
            return checking.check(self._session.conn, self.name, repair=repair)

    def read_log(self, item_id: int, attempt: int, offset: int = 0) -> bytes | None:
        """From the database once the attempt ended; before that, from this
        host's scratch file (for `logs --follow` on the runner's host)."""
        with self._session.guard():
            conn = self._session.conn
            found = logs.read(conn, self.name, item_id, attempt, offset)
            if found is None:
                found = logs.read_local(self.scratch, item_id, attempt, offset)
            if found is None:  # stored and removed between the two reads
                found = logs.read(conn, self.name, item_id, attempt, offset)
        return found

    def read_events(self, cursor: object | None) -> tuple[list[Record], object]:
        with self._session.guard():
            return events.read_events(self._session.conn, self.name, cursor)

    def export_items(self) -> Iterator[ExportedItem]:
        with self._session.guard():
            yield from transfer.export_items(self._session.conn, self.name)

    def iter_attempts(self, since: float | None = None) -> Iterator[Attempt]:
        with self._session.guard():
            yield from attempt_rows.iter_attempts(self._session.conn, self.name, since)
