"""What the cache files beside the journal (state.ckpt, keys.ckpt,
stats.ckpt) share: how they are written, framed, and tied to the journal.

A cache is never the truth, and losing it costs only time, so it is written
to a temp name and renamed, without fsync: a crash leaves an old, empty or
torn file, which its reader's checks (checksums, the journal position it
names) refuse. The same code for all three, so they fail the same way.

A cache names the journal position it covers (inode, the checksum of the
first record, the last bytes before the position), and is used only while
the open journal still has that position (``compare_position``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from collections.abc import Iterable
from enum import Enum
from typing import TYPE_CHECKING, Any

import orjson

from statequeue.core.errors import StateQueueError
from statequeue.store.journal.journal_file import JournalFile, read_line

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder

_TAIL = 32  # bytes of the journal just before the position (ends with the last crc)


def write_cache(
    folder: QueueFolder, name: str, parts: Iterable[bytes], *, staged: str | None = None
) -> bool:
    """Write ``parts`` to ``name`` (temp + rename), or leave them under the
    temp name ``staged`` for a compaction to rename with the journal they
    name. False if it could not be written: the queue works the same."""
    # The thread too: a `stats` and the refresh after a checkpoint (a thread,
    # store/stats_refresh.py) may write the same cache at once in one process.
    tmp = staged or f".{name}.{os.getpid()}-{threading.get_native_id()}.tmp"
    try:
        fd = folder.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for data in parts:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        if staged is None:
            os.replace(tmp, name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    except (OSError, StateQueueError):  # a link or no access: the queue works without it
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        return False
    return True


def write_framed(
    folder: QueueFolder,
    name: str,
    magic: bytes,
    header: dict[str, Any],
    parts: tuple[bytes, ...],
    *,
    staged: str | None = None,
) -> bool:
    """Write ``magic``, the 8-byte length of ``header``'s JSON, that JSON,
    ``parts`` and a CRC32 of all of it, as ``write_cache`` does."""
    encoded = orjson.dumps(header)
    body = b"".join((magic, len(encoded).to_bytes(8, "little"), encoded, *parts))
    payload = body + zlib.crc32(body).to_bytes(4, "little")
    return write_cache(folder, name, (payload,), staged=staged)


def read_framed(
    folder: QueueFolder, name: str, magic: bytes
) -> tuple[dict[str, Any], memoryview] | None:
    """The header and (a view of) the bytes after it, if the file is intact.
    Views, not slices: a 1M-item state is 9 MB, and each copy of it costs
    every `status` a few milliseconds."""
    try:
        data = folder.read_bytes(name)
    except (OSError, StateQueueError):
        return None
    if len(data) < len(magic) + 12 or not data.startswith(magic):
        return None
    body = memoryview(data)[:-4]
    if zlib.crc32(body) != int.from_bytes(data[-4:], "little"):
        return None
    start = len(magic) + 8
    size = int.from_bytes(data[len(magic) : start], "little")
    try:
        header = orjson.loads(body[start : start + size])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(header, dict):
        return None
    return header, body[start + size :]


def journal_position(journal: JournalFile) -> dict[str, Any] | None:
    """What identifies ``journal`` and its read position, for ``compare_position``."""
    try:
        head = _first_line_crc(journal.fd)
        tail = os.pread(journal.fd, _TAIL, max(0, journal.offset - _TAIL))
    except OSError:
        return None
    if head is None or not tail:
        return None
    return {
        "inode": journal.inode,
        "offset": journal.offset,
        "lines": journal.lines,
        "last_seq": journal.last_seq,
        "head": head,
        "tail": tail.hex(),
    }


class Found(Enum):
    """What ``checkpoint.restore`` made of the state checkpoint (and
    ``compare_position`` of the position a cache names)."""

    NONE = "none"  # there is none
    RESTORED = "restored"  # it matched: the state and read position are its
    STALE = "stale"  # damaged, or of another journal: remove it once the journal opened
    AHEAD = "ahead"  # of this journal, at a position it no longer has: records were lost


def position_matches(journal: JournalFile, where: dict[str, Any]) -> bool:
    """Whether ``where`` names ``journal`` at a position it still has."""
    return compare_position(journal, where) is Found.RESTORED


def compare_position(journal: JournalFile, where: dict[str, Any]) -> Found:
    """RESTORED if ``where`` names ``journal`` at a position it still has,
    AHEAD if it names this journal (inode and first record) at a position it
    no longer has, else STALE."""
    offset = int(where["offset"])
    if where["inode"] != journal.inode or offset <= 0:
        return Found.STALE
    if _first_line_crc(journal.fd) != where["head"]:
        return Found.STALE
    if os.fstat(journal.fd).st_size < offset:
        return Found.AHEAD
    tail = os.pread(journal.fd, _TAIL, max(0, offset - _TAIL))
    return Found.RESTORED if tail.hex() == where["tail"] else Found.AHEAD


def _first_line_crc(fd: int) -> str | None:
    """The checksum field of the journal's first record (its snapshot header,
    which may be long: it carries the last commands run)."""
    line = read_line(fd, 0)
    if len(line) < 11 or not line.endswith(b"\n"):
        return None
    return line[-11:-3].decode("ascii", "replace")
