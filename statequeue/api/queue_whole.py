"""The whole-queue side of ``Queue``: check, drop, export and import, the
same functions the CLI calls, on a local journal and on PostgreSQL alike."""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from statequeue.core.errors import UsageError
from statequeue.store.base import Store

if TYPE_CHECKING:
    from statequeue.api.queue import Queue
    from statequeue.api.transfer import CheckedExport, ImportResult
    from statequeue.core.views import QueueCheck


class QueueWhole:
    """Queue's whole-queue methods (a mixin: Queue provides ``_using``,
    ``name`` and ``close``)."""

    name: str

    def _using(self) -> AbstractContextManager[Store]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def _queue(self) -> Queue:
        return cast("Queue", self)  # only Queue uses this mixin

    def fsck(self, *, repair: bool = False) -> QueueCheck:
        """Check the queue; ``repair`` salvages (journal) or corrects (counters).

        A local journal gets a ``FsckReport`` (every record's checksum and
        sequence; see ``statequeue.api.maintenance.fsck_queue`` for a queue too
        damaged to open), a PostgreSQL store a ``StoreCheck`` (its counters
        against a recount). Both are ``QueueCheck``s: ``damaged``,
        ``repaired``, ``report_lines()``, ``to_json()``."""
        from statequeue.api.maintenance import check_store

        with self._using() as store:
            return check_store(store, repair=repair)

    def drop(self) -> None:
        """Delete the queue with all its items, results and logs, then close it.
        UsageError while a runner is active on it."""
        from statequeue.api.maintenance import drop_store

        with self._using() as store:
            drop_store(self.name, store, before=self.close)

    def export(self, to: IO[bytes] | str | os.PathLike[str]) -> int:
        """Write the queue as NDJSON (see ``statequeue.api.transfer``) to a binary
        stream, or to a file path whole or not at all; returns the item count."""
        from statequeue.api.transfer import export_queue, export_to_file

        if isinstance(to, str | os.PathLike):
            return export_to_file(self._queue, Path(to))
        return export_queue(self._queue, to)

    def import_(
        self, source: Iterable[bytes] | CheckedExport, *, merge: bool = False
    ) -> ImportResult:
        """Read an export (its lines, each ending in a newline, or one checked
        by ``transfer.read_export``) into the queue, keeping ids, states and
        results. The whole input is checked before anything changes; a queue
        holding items the export lacks is refused (ImportRefused) unless ``merge``."""
        from statequeue.api.transfer import CheckedExport, import_entries, read_export

        if isinstance(source, str | bytes | bytearray):
            raise UsageError(
                "import_ takes an export's lines (an open binary file, or "
                "data.splitlines(keepends=True)), not one str or bytes"
            )
        checked = source if isinstance(source, CheckedExport) else read_export(source)
        return import_entries(self._queue, checked.header, checked.entries, merge=merge)
