"""Where each archived item's record starts in the archive (``archive.ckpt``),
so that ``result(id)`` of an item compaction moved out reads one line of the
archive instead of all of it.

A cache, never the truth (as ``keys.ckpt``): it names the archive it indexes
(inode, the bytes it covers and the last bytes before that), is used only
while those match the archive up to the size the snapshot vouches for, and
every hit is checked against the line it points to (its checksum, its type
and its id). Compaction only appends to the archive, so after one the index
no longer matches: the next lookup rebuilds it from one scan of the archive
(the ids found by a byte search on the usual layout, not by decoding) and
saves it for the next process. Written temp + rename without fsync: a crash
leaves an old file, or one whose checks fail.

Layout (little-endian): MAGIC, u64 header length, header JSON (padded to 8
bytes), u64 x count item ids (sorted), u64 x count line offsets, u32 crc32
of all before it.
"""

from __future__ import annotations

import os
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterator
from typing import TYPE_CHECKING

import orjson

from statequeue.core.errors import StateQueueError
from statequeue.core.models import ItemState
from statequeue.core.records import Record, decode, item_text
from statequeue.store.journal.cache_file import write_cache
from statequeue.store.journal.integrity import ARCHIVE, ARCHIVE_INDEX, archive_missing
from statequeue.store.journal.journal_file import read_line
from statequeue.store.records.history import result_from

if TYPE_CHECKING:
    from statequeue.core.views import ItemResult
    from statequeue.store.journal.folder import QueueFolder

NAME = ARCHIVE_INDEX
MAGIC = b"SQARIX1\n"
_TAIL = 32  # bytes of the archive just before what the index covers
_CHUNK = 4 << 20
_ARCH = b'{"t":"arch","id":'  # how the encoder starts an ``arch`` line


class ArchiveIndex:
    """The archived item ids in order, each with its line's offset, for the
    archive with inode ``inode`` up to byte ``covers``."""

    def __init__(self, inode: int, covers: int, ids: array[int], offsets: array[int]) -> None:
        self.inode = inode
        self.covers = covers
        self.ids = ids
        self.offsets = offsets

    def fits(self, inode: int, size: int) -> bool:
        """True if this index covers exactly the archive ``inode`` up to ``size``."""
        return self.inode == inode and self.covers == size

    def find(self, item_id: int) -> int | None:
        """The offset of item ``item_id``'s ``arch`` line, None if not archived."""
        at = bisect_left(self.ids, item_id)
        if at < len(self.ids) and self.ids[at] == item_id:
            return self.offsets[at]
        return None


def archived_result(
    folder: QueueFolder, size: int, item_id: int, known: ArchiveIndex | None, *, save: bool
) -> tuple[ItemResult | None, ArchiveIndex | None]:
    """The result of item ``item_id`` from the first ``size`` bytes of the
    archive (what the snapshot vouches for; None: not archived there), and
    the index to pass as ``known`` next time (see ``archived_record``)."""
    if size == 0:
        return None, known
    try:
        fd = folder.open_file(ARCHIVE, os.O_RDONLY)
    except FileNotFoundError:
        name = folder.path / ARCHIVE
        raise archive_missing(name) from None
    try:
        rec, index = archived_record(folder, fd, size, item_id, known, save=save)
    finally:
        os.close(fd)
    if rec is None:
        return None, index
    return result_from(rec, item_text(rec), ItemState.DONE, archived=True), index


def archived_record(
    folder: QueueFolder, fd: int, size: int, item_id: int, known: ArchiveIndex | None, *, save: bool
) -> tuple[Record | None, ArchiveIndex]:
    """The ``arch`` record of ``item_id`` in the first ``size`` bytes of the
    archive open on ``fd`` (None: not archived), and the index that found it
    (``known`` if it still fits; else the saved one, else one built now)."""
    inode = os.fstat(fd).st_ino
    index = known if known is not None and known.fits(inode, size) else None
    if index is None:
        index = _load(folder, fd, inode, size) or _build(folder, fd, inode, size, save=save)
    found = _checked(fd, size, item_id, index.find(item_id))
    if found is False:  # the index points elsewhere: never trusted, rebuilt
        index = _build(folder, fd, inode, size, save=save)
        found = _checked(fd, size, item_id, index.find(item_id))
    return (found if isinstance(found, dict) else None), index


def _checked(fd: int, size: int, item_id: int, offset: int | None) -> Record | bool | None:
    """The ``arch`` record of ``item_id`` at ``offset``; None if no offset;
    False if the line there is not that record (the index is wrong)."""
    if offset is None:
        return None
    if not 0 <= offset < size:
        return False
    line = read_line(fd, offset)
    rec = decode(line.removesuffix(b"\n")) if offset + len(line) <= size else None
    if rec is None or rec.get("t") != "arch" or rec.get("id") != item_id:
        return False
    return rec


def _lines(fd: int, size: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) of every whole line before ``size``."""
    offset = 0
    while offset < size:
        data = os.pread(fd, min(_CHUNK, size - offset), offset)
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # one line longer than a chunk
            data = os.pread(fd, size - offset, offset)
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                return
        at = 0
        for line in data[:cut].split(b"\n")[:-1]:
            yield offset + at, line
            at += len(line) + 1
        offset += cut


def _id_of(line: bytes) -> int | None:
    """The id of an ``arch`` line (the usual layout by a byte search; any
    other by decoding it), None for another record or a damaged line."""
    if line.startswith(_ARCH):
        end = line.find(b",", len(_ARCH))
        digits = line[len(_ARCH) : end]
        if end > 0 and digits.isdigit():
            return int(digits)  # a wrong one is caught when the hit is checked
    rec = decode(line)
    if rec is None or rec.get("t") != "arch" or not isinstance(rec.get("id"), int):
        return None
    item_id: int = rec["id"]
    return item_id


def _build(folder: QueueFolder, fd: int, inode: int, size: int, *, save: bool) -> ArchiveIndex:
    """The index of the archive's first ``size`` bytes, from one scan; saved
    when ``save`` (a read-only queue keeps it in memory only)."""
    pairs = sorted(
        (item_id, offset)
        for offset, line in _lines(fd, size)
        if (item_id := _id_of(line)) is not None
    )
    index = ArchiveIndex(
        inode, size, array("Q", (p[0] for p in pairs)), array("Q", (p[1] for p in pairs))
    )
    if save:
        _save(folder, fd, index)
    return index


def _fingerprint(fd: int, covers: int) -> str:
    return os.pread(fd, _TAIL, max(0, covers - _TAIL)).hex()


def _save(folder: QueueFolder, fd: int, index: ArchiveIndex) -> None:
    header = {
        "inode": index.inode,
        "covers": index.covers,
        "tail": _fingerprint(fd, index.covers),
        "count": len(index.ids),
    }
    encoded = orjson.dumps(header)
    encoded += b" " * (-len(encoded) % 8)
    body = b"".join(
        (
            MAGIC,
            len(encoded).to_bytes(8, "little"),
            encoded,
            index.ids.tobytes(),
            index.offsets.tobytes(),
        )
    )
    write_cache(folder, NAME, (body, zlib.crc32(body).to_bytes(4, "little")))


def _load(folder: QueueFolder, fd: int, inode: int, size: int) -> ArchiveIndex | None:
    """The saved index, if it is intact and names this archive up to ``size``."""
    try:
        data = folder.read_bytes(NAME)
    except (OSError, StateQueueError):
        return None
    start = len(MAGIC) + 8
    if len(data) < start + 4 or not data.startswith(MAGIC):
        return None
    body = memoryview(data)[:-4]
    if zlib.crc32(body) != int.from_bytes(data[-4:], "little"):
        return None
    length = int.from_bytes(data[len(MAGIC) : start], "little")
    try:
        header = orjson.loads(body[start : start + length])
        count = int(header["count"])
        if header["inode"] != inode or header["covers"] != size:
            return None
        if header["tail"] != _fingerprint(fd, size):
            return None
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    arrays = body[start + length :]
    if len(arrays) != 16 * count:
        return None
    ids, offsets = array("Q"), array("Q")
    ids.frombytes(arrays[: 8 * count])
    offsets.frombytes(arrays[8 * count :])
    return ArchiveIndex(inode, size, ids, offsets)
