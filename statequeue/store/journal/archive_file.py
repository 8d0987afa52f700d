"""The archive file: read up to the size the snapshot vouches for, and opened
by compaction, checked against the snapshot header before anything is cut or
appended (see ``compaction.py``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from statequeue.core.errors import DamagedState
from statequeue.core.fileio import FileOps
from statequeue.core.records import Record
from statequeue.store.journal.integrity import archive_missing
from statequeue.store.journal.journal_file import JournalFile, line_chunks, parse
from statequeue.store.records.state import QueueState

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder


def _ignore(record: Record, loc: int) -> None:
    """Replay callback for a file read only to validate it."""


class _ArchiveCheck:
    """Replay callback that checks the archive against the snapshot header:
    ``archived`` records up to ``archive_size``, then only items the journal
    still names (locator >= 0: it holds their record)."""

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.vouched = 0
        self.strangers = 0

    def __call__(self, record: Record, loc: int) -> None:
        if record.get("t") != "arch":
            return
        if loc < self.state.archive_size:
            self.vouched += 1
            return
        item_id = record.get("id", 0)
        locs = self.state.locs
        if not (isinstance(item_id, int) and 0 < item_id < len(locs) and locs[item_id] >= 0):
            self.strangers += 1


def open_archive(folder: QueueFolder, name: str, state: QueueState, *, ops: FileOps) -> JournalFile:
    """The archive, open for appending after the ``archive_size`` bytes the
    current snapshot vouches for (a crashed compaction's tail is cut away,
    once it is shown to be one)."""
    size = state.archive_size
    path = folder.path / name
    if not folder.exists(name):
        if size:
            raise archive_missing(path)
        fd = folder.open_file(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
        ops.fsync_dir(folder.itself())
    archive = JournalFile(folder, name, ops=ops)
    archive.open()
    try:
        check = _ArchiveCheck(state)
        archive.replay(check, repair=False)
        if archive.offset < size:
            raise DamagedState(f"{path}: shorter than the journal says ({archive.offset} < {size})")
        if check.vouched != state.archived or check.strangers:
            raise DamagedState(
                f"{path}: holds {check.vouched} record(s) where the journal says "
                f"{state.archived}, and {check.strangers} it does not name; refusing to "
                "compact (run `statequeue fsck`)"
            )
        if os.fstat(archive.fd).st_size != size:
            # A compaction crashed after appending here (its journal never took
            # effect, so those items are archived again), or a torn tail.
            ops.truncate(archive.fd, size)
            ops.fsync(archive.fd)
            archive.open()
            archive.replay(_ignore, repair=False)
    except BaseException:
        archive.close()
        raise
    return archive


def open_vouched(folder: QueueFolder, name: str) -> int:
    """The archive open for reading; DamagedState when it is missing (the
    caller asks only when the snapshot vouches for some of it)."""
    try:
        return folder.open_file(name, os.O_RDONLY)
    except FileNotFoundError:
        raise archive_missing(folder.path / name) from None


def read_archive(folder: QueueFolder, name: str, size: int) -> Iterator[Record]:
    """The archived item records, up to ``size`` bytes (what the snapshot
    vouches for), read a chunk at a time: read whole, 200,000 archived items
    held 300 MB of records for `results`, `list` or `export`. DamagedState
    (after the records before it) where it does not parse to ``size``."""
    if size == 0:
        return
    path = folder.path / name
    fd = open_vouched(folder, name)
    used = lines = 0
    try:
        # Only the first ``size`` bytes count: a compaction that died after
        # appending here but before its journal took effect left the rest.
        for data in line_chunks(fd, 0, size):
            found, taken, _ = parse(data, path=str(path), first_line=lines + 1, last_seq=None)
            used, lines = used + taken, lines + len(found)
            for record in found:
                if record.get("t") == "arch":
                    yield record
            if taken < len(data):
                break
    finally:
        os.close(fd)
    if used < size:
        raise DamagedState(f"{path}: damaged or shorter than the journal says ({used} < {size})")
