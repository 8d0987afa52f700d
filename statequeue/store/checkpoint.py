"""A cache of the queue's state at a journal position, so that opening a big
queue replays only the records written after it.

``state.ckpt`` is never the truth: the journal is. The checkpoint names the
journal it was taken from (inode, the checksum of its first record, and the
last bytes before its position), and is used only when all of them still match
and its own checksum holds; anything else (a compaction, a repaired or
truncated journal, a torn write, a newer format) means a full replay, after
which a fresh checkpoint is written. Because losing it costs only time, it is
written temp + rename without fsync: a crash can leave an old or empty file,
never one that passes the checks with the wrong state.

Layout: ``MAGIC``, 8-byte header length, header JSON, state codes, record
locators, CRC32 of everything before it.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from pathlib import Path
from typing import Any

import orjson

from statequeue.journal import JournalFile
from statequeue.location import FILE_MODE
from statequeue.state import QueueState

NAME = "state.ckpt"
MAGIC = b"SQCKPT1\n"
_TAIL = 32  # bytes of the journal just before the position (ends with the last crc)
_HEAD = 4096  # enough to hold the snapshot header line


def save(folder: Path, journal: JournalFile, state: QueueState) -> bool:
    """Write a checkpoint of ``state`` as of ``journal.offset`` (caller holds the
    queue lock and has applied every record up to there). False if it could not
    be written; the queue works the same without it."""
    try:
        head = _first_line_crc(journal.fd)
        tail = os.pread(journal.fd, _TAIL, max(0, journal.offset - _TAIL))
    except OSError:
        return False
    if head is None or not tail:
        return False
    meta, codes, locs = state.export()
    header = orjson.dumps(
        {
            "journal": {
                "inode": journal.inode,
                "offset": journal.offset,
                "lines": journal.lines,
                "last_seq": journal.last_seq,
                "head": head,
                "tail": tail.hex(),
            },
            "codes": len(codes),
            "locs": len(locs),
            "state": meta,
        }
    )
    body = b"".join((MAGIC, len(header).to_bytes(8, "little"), header, codes, locs))
    payload = body + zlib.crc32(body).to_bytes(4, "little")
    tmp = folder / f".{NAME}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(tmp, folder / NAME)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    return True


def restore(folder: Path, journal: JournalFile, state: QueueState) -> bool:
    """Load the checkpoint into ``state`` and move ``journal``'s read position to
    it, if it matches the open journal; else leave both untouched and return False."""
    try:
        data = (folder / NAME).read_bytes()
    except OSError:
        return False
    parsed = _parse(data)
    if parsed is None:
        return False
    header, codes, locs = parsed
    try:
        where = header["journal"]
        if not _matches(journal, where):
            return False
        state.restore(header["state"], codes, locs)
    except (KeyError, TypeError, ValueError, OSError):
        state.reset()
        return False
    journal.offset = where["offset"]
    journal.lines = where["lines"]
    journal.last_seq = where["last_seq"]
    return True


def discard(folder: Path) -> None:
    """Remove the checkpoint (after a repair rewrote the journal)."""
    with contextlib.suppress(FileNotFoundError):
        (folder / NAME).unlink()


def _parse(data: bytes) -> tuple[dict[str, Any], bytes, bytes] | None:
    if len(data) < len(MAGIC) + 12 or not data.startswith(MAGIC):
        return None
    body, crc = data[:-4], data[-4:]
    if zlib.crc32(body) != int.from_bytes(crc, "little"):
        return None
    start = len(MAGIC) + 8
    size = int.from_bytes(data[len(MAGIC) : start], "little")
    try:
        header = orjson.loads(body[start : start + size])
        ncodes, nlocs = int(header["codes"]), int(header["locs"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None
    arrays = body[start + size :]
    if len(arrays) != ncodes + nlocs:
        return None
    return header, arrays[:ncodes], arrays[ncodes:]


def _matches(journal: JournalFile, where: dict[str, Any]) -> bool:
    offset = int(where["offset"])
    if where["inode"] != journal.inode or offset <= 0:
        return False
    if os.fstat(journal.fd).st_size < offset:
        return False
    tail = os.pread(journal.fd, _TAIL, max(0, offset - _TAIL))
    return bool(tail.hex() == where["tail"] and _first_line_crc(journal.fd) == where["head"])


def _first_line_crc(fd: int) -> str | None:
    """The checksum field of the journal's first record (its snapshot header)."""
    data = os.pread(fd, _HEAD, 0)
    end = data.find(b"\n")
    if end < 10:
        return None
    return data[end - 10 : end - 2].decode("ascii", "replace")
