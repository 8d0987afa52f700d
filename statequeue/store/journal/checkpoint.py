"""A cache of the queue's state at a journal position, so that opening a big
queue replays only the records written after it.

``state.ckpt`` is never the truth: the journal is. The checkpoint names the
journal it was taken from (inode, the checksum of its first record, and the
last bytes before its position), and is used only when all of them still match
and its own checksum holds; anything else (a compaction, a repaired journal, a
torn write, a newer format) means a full replay, after which a fresh
checkpoint is written. Because losing it costs only time, it is written temp +
rename without fsync: a crash can leave an old or empty file, never one that
passes the checks with the wrong state.

It is also evidence. It covers only fsynced records, and the bytes of a
journal up to there never change while its inode and first record stay the
same; so a checkpoint of this very journal at a position the journal no longer
has proves that acknowledged records were lost (``Found.AHEAD``).

Layout: ``MAGIC``, 8-byte header length, header JSON, state codes, record
locators, CRC32 of everything before it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from statequeue.store.journal.cache_file import (
    Found,
    compare_position,
    journal_position,
    read_framed,
    write_framed,
)
from statequeue.store.journal.journal_file import JournalFile
from statequeue.store.journal.key_index import KEYS_NAME, known_count
from statequeue.store.records.state import QueueState

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder

NAME = "state.ckpt"
MAGIC = b"SQCKPT1\n"


def save(
    folder: QueueFolder, journal: JournalFile, state: QueueState, *, staged: str | None = None
) -> bool:
    """Write a checkpoint of ``state`` as of ``journal.offset`` (caller holds the
    queue lock and has applied every record up to there). False if it could not
    be written; the queue works the same without it.

    ``staged``: write it to that temp name instead and leave it there, for a
    compaction to rename into place with the journal it names (``journal`` is
    then the new journal's temp file, which no lock covers yet)."""
    where = journal_position(journal)
    if where is None:
        return False
    meta, codes, locs = state.export()
    header = {"journal": where, "codes": len(codes), "locs": len(locs), "state": meta}
    return write_framed(folder, NAME, MAGIC, header, (codes, locs), staged=staged)


def texts_by_id(keys: dict[str, int], next_id: int) -> list[str]:
    """``keys`` (text -> id) as the list ``key_index.save`` takes."""
    texts = [""] * (next_id - 1)
    for text, item_id in keys.items():
        if 0 < item_id < next_id:
            texts[item_id - 1] = text
    return texts


class Restore:
    """The verdict on the checkpoint, and the journal position it names."""

    # A plain class, not a dataclass: every open imports this module, and a
    # dataclass costs a compile per generated method (start-up of `enqueue`).
    __slots__ = ("found", "lines", "offset")

    def __init__(self, found: Found, offset: int = 0, lines: int = 0) -> None:
        self.found = found
        self.offset = offset
        self.lines = lines


def restore(folder: QueueFolder, journal: JournalFile, state: QueueState) -> Restore:
    """Load the checkpoint into ``state`` and move ``journal``'s read position to
    it, if it matches the open journal; else leave both untouched. Never
    changes a file: a checkpoint the journal cannot be opened without is
    evidence for `fsck` (``remove_stale`` drops it after a clean open)."""
    if not folder.exists(NAME):
        return Restore(Found.NONE)
    parsed = _parse(folder, NAME)
    try:
        if parsed is None:
            raise ValueError("damaged")
        header, codes, locs = parsed
        where = header["journal"]
        offset, lines, last_seq = int(where["offset"]), int(where["lines"]), where["last_seq"]
        found = compare_position(journal, where)
        if found is not Found.RESTORED or not isinstance(last_seq, int):
            return Restore(found if found is Found.AHEAD else Found.STALE, offset, lines)
        state.restore(header["state"], codes, locs)
    except (KeyError, TypeError, ValueError, IndexError, OSError):
        state.reset()
        return Restore(Found.STALE)
    journal.offset, journal.lines, journal.last_seq = offset, lines, last_seq
    return Restore(Found.RESTORED, offset, lines)


def remove_stale(folder: QueueFolder) -> None:
    """Remove a state checkpoint that no longer matches (after the journal
    opened cleanly without it), so that it can never match a journal that
    grows back. Not ours to remove (a read-only queue): it stays stale."""
    with contextlib.suppress(OSError):
        folder.unlink(NAME)


def known_ids(folder: QueueFolder) -> int:
    """The highest item id either checkpoint knows of, matching or not (0 if
    none can be read): a repair must never hand such an id out again."""
    best = 0
    parsed = read_framed(folder, NAME, MAGIC)
    with contextlib.suppress(KeyError, TypeError, ValueError):
        best = int(parsed[0]["state"]["next_id"]) - 1 if parsed else 0
    return max(best, known_count(folder))


def discard(folder: QueueFolder) -> None:
    """Remove the checkpoints (after a repair rewrote the journal)."""
    for name in (NAME, KEYS_NAME):
        # Not there, or not ours to remove (a read-only queue): a stale
        # checkpoint never matches the journal it did not come from.
        with contextlib.suppress(OSError):
            folder.unlink(name)


def _parse(folder: QueueFolder, name: str) -> tuple[dict[str, Any], memoryview, memoryview] | None:
    parsed = read_framed(folder, name, MAGIC)
    if parsed is None:
        return None
    header, arrays = parsed
    try:
        ncodes, nlocs = int(header["codes"]), int(header["locs"])
    except (KeyError, TypeError, ValueError):
        return None
    if len(arrays) != ncodes + nlocs:
        return None
    return header, arrays[:ncodes], arrays[ncodes:]
