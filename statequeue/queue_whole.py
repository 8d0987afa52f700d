"""The whole-queue side of ``Queue``: check and drop, the
same functions the CLI calls, on a local journal and on PostgreSQL alike."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.views import QueueCheck


class QueueWhole:
    """Queue's whole-queue methods (a mixin: Queue provides ``_using``,
    ``name`` and ``close``)."""

    name: str

    def _using(self) -> AbstractContextManager[Store]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def fsck(self, *, repair: bool = False) -> QueueCheck:
        """Check the queue; ``repair`` salvages (journal) or corrects (counters).

        A local journal gets a ``FsckReport`` (every record's checksum and
        sequence; see ``statequeue.maintenance.fsck_queue`` for a queue too
        damaged to open), a PostgreSQL store a ``StoreCheck`` (its counters
        against a recount). Both are ``QueueCheck``s: ``damaged``,
        ``repaired``, ``report_lines()``, ``to_json()``."""
        from statequeue.maintenance import check_store

        with self._using() as store:
            return check_store(store, repair=repair)

    def drop(self) -> None:
        """Delete the queue with all its items, results and logs, then close it.
        UsageError while a runner is active on it."""
        from statequeue.maintenance import drop_store

        with self._using() as store:
            drop_store(self.name, store, before=self.close)
