"""The dedupe keys index (``keys.ckpt``): every item's bytes, findable by a
binary search, so that enqueueing a few items into a million-item queue reads
a few pages instead of building a million-entry dict.

Like ``state.ckpt`` it is a cache, never the truth: it names the journal
position it covers (``cache_file.journal_position``) and is used only while that
position still matches; the records after it (the journal tail) are scanned.
Stale, torn or damaged: ignored, and rebuilt the slow way.

Layout (little-endian; every section starts 8-byte aligned)::

    MAGIC, u64 header length, header JSON (padded), u32 crc32 of all before it
    offsets  u64 x (count + 1)  where item i's bytes start in the blob
                                 (offsets[count] = blob length + 1)
    blob     the items' UTF-8 bytes (surrogate escapes kept), NUL-separated
    table    u64 x entries      sorted (crc32(item bytes) << 32 | item id); none
                                 (header "table": false) in an index left by the
                                 bulk enqueue that filled a new queue
    crcs     u32 per chunk of CHUNK ids (their offsets and bytes), then u32 per
             block of CHUNK table entries; the header holds the crc of this list

A probe verifies only the chunks and blocks it reads (once each), so it costs
O(log n) and a few kilobytes of checksumming, and dedupe stays exact: a table
hit is confirmed by comparing the item's bytes, and any checksum that fails
makes the caller fall back to the slow path. It is written temp + rename
without fsync, as ``state.ckpt``: a crash leaves an old file, or one whose
checksums fail.

The table is what costs to write (a sort of every item's digest): the bulk
enqueue that fills a new queue leaves it out, since the re-enqueue of a cron
job loads the texts and never reads it. The first small enqueue that would
probe such an index sorts its items into a table and writes it whole
(``with_table``) first.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from array import array
from bisect import bisect_left
from itertools import accumulate, compress, repeat
from operator import lshift, or_
from typing import TYPE_CHECKING, Any

import orjson

from statequeue.core.errors import StateQueueError
from statequeue.store.journal.cache_file import (
    journal_position,
    position_matches,
    read_framed,
    write_cache,
)

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.journal.journal_file import JournalFile

KEYS_NAME = "keys.ckpt"
MAGIC = b"SQKEYS3\n"
# Always a table (read as such). The magic changed with tableless files, so
# that an older statequeue discards one rather than probing its empty table.
_V2_MAGIC = b"SQKEYS2\n"
_OLD_MAGIC = b"SQKEYS1\n"  # every text NUL-separated, one CRC32 (read only by ``known_count``)
CHUNK = 1024  # ids (or table entries) per checksummed chunk
_ID_BITS = 32
_ID_MASK = (1 << _ID_BITS) - 1


class IndexDamaged(Exception):
    """A checksum or a bound of the index failed: not to be trusted."""


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def save(
    folder: QueueFolder,
    journal: JournalFile,
    texts: list[str],
    *,
    staged: str | None = None,
    table: bool = True,
) -> bool:
    """Write the index of ``texts`` (``texts[i]`` is item ``i + 1``'s, "" for
    an id without one) as of ``journal.offset``. False if it could not be
    written (the queue works without it). ``staged``: write it to that temp
    name and leave it there, for a compaction to rename into place.
    ``table=False``: without the sorted table (texts only, not probeable)."""
    where = journal_position(journal)
    if where is None or len(texts) > _ID_MASK:
        return False
    if not table and texts:
        return _write_without_table(folder, where, texts, staged=staged)
    return _write(folder, where, _encode_all(texts), staged=staged, table=table)


def _write_without_table(
    folder: QueueFolder, where: dict[str, Any], texts: list[str], *, staged: str | None
) -> bool:
    """The index of ``texts`` (at least one) without its table. The blob is
    one encode; when it has a byte per character (every character is one
    byte, as in file names and numbers: none encodes to fewer), each text's
    byte length is its length, and no list of encoded items is made."""
    blob = "\0".join(texts).encode("utf-8", "surrogateescape")
    if len(blob) == sum(map(len, texts)) + len(texts) - 1:
        lengths = map(len, texts)
    else:
        lengths = map(len, blob.split(b"\0"))
    offsets = array("Q", accumulate(map((1).__add__, lengths), initial=0))
    return _write_sections(folder, where, offsets, blob, None, staged=staged)


def _encode_all(texts: list[str]) -> list[bytes]:
    """Each text's bytes, as ``_encode`` makes them."""
    if not texts:
        return []
    # One encode of them all, split back apart at the NULs no item holds
    # (check_item refuses them): a C-level pass instead of a call per item.
    encoded = "\0".join(texts).encode("utf-8", "surrogateescape").split(b"\0")
    return encoded if len(encoded) == len(texts) else [_encode(t) for t in texts]


def _write(
    folder: QueueFolder,
    where: dict[str, Any],
    encoded: list[bytes],
    *,
    staged: str | None,
    table: bool,
) -> bool:
    offsets = array("Q", accumulate(map((1).__add__, map(len, encoded)), initial=0))
    blob = b"\0".join(encoded)
    entries = _table_of(encoded) if table else None
    return _write_sections(folder, where, offsets, blob, entries, staged=staged)


def _table_of(encoded: list[bytes]) -> array[int]:
    """The sorted table of the items ``encoded`` (item ``i + 1``'s bytes at ``i``)."""
    # Sorting ints whose high half is the digest groups equal digests, ids
    # ascending. Built by maps (no Python frame per item), ids without a text left out.
    keyed = map(
        or_, map(lshift, map(zlib.crc32, encoded), repeat(_ID_BITS)), range(1, len(encoded) + 1)
    )
    return array("Q", sorted(compress(keyed, encoded)))


def with_table(folder: QueueFolder, index: KeyIndex) -> bool:
    """Write ``index`` (one without a table) whole, covering the same journal
    position: its table sorted from its own items (no journal read, no dict
    of every key). False if it could not be written; IndexDamaged if a
    checksum fails."""
    index.verify()
    blob = bytes(index._blob)
    encoded = blob.split(b"\0") if index.count else []
    if len(encoded) != index.count:
        raise IndexDamaged("count")
    offsets = array("Q", index._offsets)
    return _write_sections(folder, index.where, offsets, blob, _table_of(encoded), staged=None)


def save_extended(
    folder: QueueFolder,
    journal: JournalFile,
    index: KeyIndex,
    keys: dict[str, int],
    next_id: int,
    *,
    staged: str | None = None,
) -> bool | None:
    """Write the index of ``index``'s items plus ``keys`` (text -> id, the
    items after it) as of ``journal.offset``, reusing its sorted table (a
    merge, not a sort of every item). None if ``keys`` changes an item the
    index holds (the caller then writes a whole new one)."""
    where = journal_position(journal)
    if where is None or next_id - 1 > _ID_MASK:
        return False
    count = index.count
    added = [b""] * max(0, next_id - 1 - count)
    for text, item_id in keys.items():
        data = _encode(text)
        if item_id > count:
            added[item_id - count - 1] = data
        elif index.item_bytes(item_id) != data:
            return None
    index.verify()
    offsets = array("Q", index._offsets)
    crc32 = zlib.crc32
    if added:
        base = offsets.pop()  # the old end (0 if none), where the next item starts
        offsets.extend(accumulate((len(b) + 1 for b in added), initial=base))
    blob = b"\0".join([bytes(index._blob), *added]) if count else b"\0".join(added)
    table = None
    if index.has_table:  # else it stays without one: no sort of every item here either
        # Two sorted runs: the sort merges them in one pass.
        fresh = [crc32(b) << _ID_BITS | i for i, b in enumerate(added, count + 1) if b]
        table = array("Q", sorted([*index._table, *fresh]))
    return _write_sections(folder, where, offsets, blob, table, staged=staged)


def _write_sections(
    folder: QueueFolder,
    where: dict[str, Any],
    offsets: array[int],
    blob: bytes,
    table: array[int] | None,
    *,
    staged: str | None,
) -> bool:
    """``table`` None: an index without one (header "table": false)."""
    count = len(offsets) - 1
    tabled = table is not None
    if table is None:
        table = array("Q")
    crc32 = zlib.crc32
    raw_offsets = offsets.tobytes()
    crcs = array("I")
    for first in range(0, count, CHUNK):
        last = min(first + CHUNK, count)
        part = raw_offsets[first * 8 : (last + 1) * 8]
        crcs.append(crc32(blob[offsets[first] : offsets[last] - 1], crc32(part)))
    raw_table = table.tobytes()
    for first in range(0, len(table), CHUNK):
        crcs.append(crc32(raw_table[first * 8 : (first + CHUNK) * 8]))
    header = {
        "journal": where,
        "count": count,
        "entries": len(table),
        "blob": len(blob),
        "crcs": crc32(crcs.tobytes()),
        "table": tabled,
    }
    parts = (raw_offsets, _padded(blob), raw_table, crcs.tobytes())
    return _write_file(folder, _head(header), parts, staged=staged)


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 8)


def _head(header: dict[str, Any]) -> bytes:
    encoded = orjson.dumps(header)
    encoded += b" " * (-(len(MAGIC) + 8 + len(encoded) + 4) % 8)
    head = MAGIC + len(encoded).to_bytes(8, "little") + encoded
    return head + zlib.crc32(head).to_bytes(4, "little")


def _write_file(
    folder: QueueFolder, head: bytes, parts: tuple[bytes, ...], *, staged: str | None
) -> bool:
    return write_cache(folder, KEYS_NAME, (head, *parts), staged=staged)


class KeyIndex:
    """An open index: ``get(text)`` is the id of the item with exactly those
    bytes among the ``count`` ids it covers, or None. Raises IndexDamaged when
    what it reads fails its checksum."""

    def __init__(self, data: mmap.mmap, header: dict[str, Any], start: int) -> None:
        self.count = int(header["count"])
        self.has_table = header.get("table", True) is not False  # absent: a v2 index
        self.where: dict[str, Any] = header["journal"]  # the journal position it covers
        self.covers = int(self.where["offset"])
        entries, blob = int(header["entries"]), int(header["blob"])
        nchunks = -(-self.count // CHUNK)
        nblocks = -(-entries // CHUNK)
        at_blob = start + (self.count + 1) * 8
        at_table = at_blob + blob + (-blob % 8)
        at_crcs = at_table + entries * 8
        if len(data) != at_crcs + 4 * (nchunks + nblocks):
            raise IndexDamaged("size")
        raw_crcs = data[at_crcs:]
        if zlib.crc32(raw_crcs) != int(header["crcs"]):
            raise IndexDamaged("crcs")
        crcs = array("I")
        crcs.frombytes(raw_crcs)
        self._chunk_crcs, self._block_crcs = crcs[:nchunks], crcs[nchunks:]
        self._data = data
        view = memoryview(data)  # views of the map: no copy, pages read when touched
        self._offsets = view[start:at_blob].cast("Q")
        self._blob = view[at_blob : at_blob + blob]
        self._table = view[at_table:at_crcs].cast("Q")
        self._chunks_ok: set[int] = set()
        self._blocks_ok: set[int] = set()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def get(self, text: str) -> int | None:
        """The id of item ``text``, or None if the index holds no such item."""
        if not self.has_table:  # its empty table would answer None for every item
            raise IndexDamaged("no table")
        wanted = _encode(text)
        digest = zlib.crc32(wanted)
        table = self._table
        low = digest << _ID_BITS
        i = bisect_left(table, low)
        # Both neighbours of the insertion point verified: bisect was not
        # misled by a damaged entry, so no entry with this digest lies elsewhere.
        if i > 0:
            self._check_block(i - 1)
            if table[i - 1] >= low:
                raise IndexDamaged("order")
        while i < len(table):
            self._check_block(i)
            entry = table[i]
            if entry >> _ID_BITS != digest:
                return None
            item_id = entry & _ID_MASK
            if self.item_bytes(item_id) == wanted:
                return item_id
            i += 1
        return None

    def item_bytes(self, item_id: int) -> bytes:
        """The bytes of item ``item_id`` (1..count), checksum verified."""
        if not 0 < item_id <= self.count:
            raise IndexDamaged("id")
        chunk = (item_id - 1) // CHUNK
        if chunk not in self._chunks_ok:
            first = chunk * CHUNK
            last = min(first + CHUNK, self.count)
            offsets = self._offsets
            if not offsets[first] <= offsets[last] - 1 <= len(self._blob):
                raise IndexDamaged("offsets")
            part = self._offsets[first : last + 1].tobytes()
            blob = self._blob[offsets[first] : offsets[last] - 1]
            if zlib.crc32(blob, zlib.crc32(part)) != self._chunk_crcs[chunk]:
                raise IndexDamaged("chunk")
            self._chunks_ok.add(chunk)
        start, end = self._offsets[item_id - 1], self._offsets[item_id] - 1
        if not start <= end:
            raise IndexDamaged("offsets")
        return bytes(self._blob[start:end])

    def _check_block(self, i: int) -> None:
        block = i // CHUNK
        if block in self._blocks_ok:
            return
        raw = self._table[block * CHUNK : (block + 1) * CHUNK].tobytes()
        if zlib.crc32(raw) != self._block_crcs[block]:
            raise IndexDamaged("block")
        self._blocks_ok.add(block)

    def verify(self) -> None:
        """Check every checksum (before the whole index is used)."""
        for chunk in range(len(self._chunk_crcs)):
            self.item_bytes(chunk * CHUNK + 1)
        for block in range(len(self._block_crcs)):
            self._check_block(block * CHUNK)

    def texts(self) -> list[str]:
        """Every item text in id order ("" for an id without one), all
        checksums verified (for a bulk enqueue)."""
        self.verify()
        blob = bytes(self._blob)
        found = blob.decode("utf-8", "surrogateescape").split("\0") if self.count else []
        if len(found) != self.count:
            raise IndexDamaged("count")
        return found

    def close(self) -> None:
        for view in (self._offsets, self._blob, self._table):
            view.release()
        # A traceback may still hold a slice of the map (an IndexDamaged being
        # handled): then the map closes when that goes.
        with contextlib.suppress(BufferError):
            self._data.close()


def open_index(folder: QueueFolder, journal: JournalFile) -> KeyIndex | None:
    """The index, if there is one that matches ``journal`` and its header and
    size check out (else it is removed, if ours to remove, and None)."""
    if not folder.exists(KEYS_NAME):
        return None
    try:
        fd = folder.open_file(KEYS_NAME, os.O_RDONLY)
    except (OSError, StateQueueError):
        return None
    try:
        data = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    except (OSError, ValueError):  # empty, or a special file
        os.close(fd)
        discard(folder)
        return None
    os.close(fd)
    try:
        header, start = _read_head(data)
        if not position_matches(journal, header["journal"]):
            raise IndexDamaged("stale")
        return KeyIndex(data, header, start)
    except (IndexDamaged, KeyError, TypeError, ValueError, OSError):
        data.close()
        discard(folder)
        return None


def _read_head(data: mmap.mmap | bytes) -> tuple[dict[str, Any], int]:
    if data[: len(MAGIC)] not in (MAGIC, _V2_MAGIC) or len(data) < len(MAGIC) + 12:
        raise IndexDamaged("magic")
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    end = len(MAGIC) + 8 + size
    if end + 4 > len(data) or zlib.crc32(data[:end]) != int.from_bytes(
        data[end : end + 4], "little"
    ):
        raise IndexDamaged("header")
    header = orjson.loads(data[len(MAGIC) + 8 : end])
    if not isinstance(header, dict):
        raise IndexDamaged("header")
    return header, end + 4


def load_texts(folder: QueueFolder, journal: JournalFile) -> tuple[list[str], int] | None:
    """Every item text in id order and the journal offset the index covers,
    if a matching, intact index exists."""
    index = open_index(folder, journal)
    if index is None:
        return None
    try:
        return index.texts(), index.covers
    except IndexDamaged:
        discard(folder)
        return None
    finally:
        index.close()


def load_keys(folder: QueueFolder, journal: JournalFile) -> tuple[dict[str, int], int] | None:
    """Every item text (text -> id) and the journal offset the index covers,
    if a matching, intact index exists (for a bulk enqueue)."""
    found = load_texts(folder, journal)
    if found is None:
        return None
    texts, covers = found
    keys = dict(zip(texts, range(1, len(texts) + 1), strict=True))
    keys.pop("", None)
    return keys, covers


def known_count(folder: QueueFolder) -> int:
    """How many ids the index names, matching or not (0 if unreadable)."""
    with contextlib.suppress(
        OSError, StateQueueError, IndexDamaged, ValueError, KeyError, TypeError
    ):
        fd = folder.open_file(KEYS_NAME, os.O_RDONLY)
        try:
            head = os.pread(fd, 1 << 16, 0)
        finally:
            os.close(fd)
        if head.startswith(_OLD_MAGIC):  # written before the index: a plain list
            old = read_framed(folder, KEYS_NAME, _OLD_MAGIC)
            return int(old[0]["count"]) if old else 0
        header, _ = _read_head(head)
        return int(header["count"])
    return 0


def discard(folder: QueueFolder) -> None:
    """Remove the index (stale or damaged); not ours to remove: it stays, unused."""
    with contextlib.suppress(OSError):
        folder.unlink(KEYS_NAME)
