"""One append-only file of checksummed records: scan, repair a torn tail, append.

The journal store keeps its live journal and its archive in this format. A
``JournalFile`` is not thread-safe and assumes its caller holds the queue lock
for every call that reads new records or appends.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core import records
from statequeue.core.errors import CorruptJournal, DamagedState, NoAccess
from statequeue.core.fileio import DEFAULT_OPS, FileOps, durability_error
from statequeue.core.gcpause import gc_paused

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder

SAME, GROWN, REPLACED = 0, 1, 2  # what JournalFile.look found
_READ_CHUNK = 1 << 20
# Bounds the decoded records held at once: 1 MB of records is ~8k dicts,
# ~10 MB; 4 MB (as before) held ~40 MB more at the peak of a replay of 1M
# items' records and was no faster (issue 15's 100 MB goal for `stats`).
_REPLAY_CHUNK = 1 << 20


class TornTail:
    """Bytes cut from the end of a file on open: a crash mid-append left them."""

    # A plain class, not a dataclass: every open imports this module, and a
    # dataclass costs a compile per generated method (start-up of `enqueue`).
    __slots__ = ("length", "offset", "path")

    def __init__(self, path: str, offset: int, length: int) -> None:
        self.path = path
        self.offset = offset
        self.length = length

    def describe(self, *, cut: bool = True) -> str:
        """The notice for it: ``cut`` says whether it was cut (a read-only
        queue leaves it for the next writer, and must not claim a repair).
        It says only what is known: a crash mid-append leaves such a tail and
        acknowledged nothing in it, but a file cut short looks the same, and
        past the last checkpoint nothing tells the two apart."""
        where = f"{self.length} byte(s) at offset {self.offset}"
        if not cut:
            return (
                f"{self.path}: found a torn tail of {where} ({TORN_TAIL_KNOWN}); left in "
                "place: the queue is read-only for you, its next writer cuts it"
            )
        return f"{self.path}: repaired a torn tail: cut {where} ({TORN_TAIL_KNOWN})"


TORN_TAIL_KNOWN = (
    "an unfinished record, as a crash mid-append leaves, never acknowledged; whether "
    "acknowledged records followed it cannot be known past the last checkpoint"
)


def read_from(fd: int, offset: int) -> bytes:
    """Every byte of ``fd`` from ``offset`` to its end."""
    parts: list[bytes] = []
    while True:
        chunk = os.pread(fd, _READ_CHUNK, offset)
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        offset += len(chunk)


def read_line(fd: int, offset: int) -> bytes:
    """The line of ``fd`` that starts at ``offset``, with its newline (without
    one if the file ends first)."""
    data = os.pread(fd, 4096, offset)
    while (end := data.find(b"\n")) < 0:
        more = os.pread(fd, _READ_CHUNK, offset + len(data))
        if not more:
            return data
        data += more
    return data[: end + 1]


def line_chunks(fd: int, start: int, end: int) -> Iterator[bytes]:
    """Bytes ``start``..``end`` of ``fd`` (which start and end on record
    boundaries) in bounded chunks of whole lines, each ending in a newline."""
    offset = start
    while offset < end:
        data = os.pread(fd, min(_REPLAY_CHUNK, end - offset), offset)
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # one record longer than a chunk, or nothing left
            data = os.pread(fd, end - offset, offset)
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                return
        yield data[:cut]
        offset += cut


def iter_records(fd: int, end: int, *, path: str) -> Iterator[records.Record]:
    """The records in the first ``end`` bytes of ``fd`` (already validated by a
    replay), read a chunk at a time. Works on a duplicate of ``fd`` taken now,
    so the caller may iterate after releasing the lock or reopening ``fd``."""
    return _iter_own(os.dup(fd), end, path)


def _iter_own(own: int, end: int, path: str) -> Iterator[records.Record]:
    try:
        for data in line_chunks(own, 0, end):
            found, used, _ = parse(data, path=path, first_line=1, last_seq=None)
            yield from found
            if used < len(data):
                return
    finally:
        os.close(own)


def iter_marked(fd: int, end: int, marker: bytes, *, path: str) -> Iterator[records.Record]:
    """The records in the first ``end`` bytes of ``fd`` whose line holds
    ``marker`` (bytes only such records hold: ``b'"t":"defer"'``), read a
    chunk at a time and decoding no other line: counting the deferrals of a
    200,000-item archive decoded all of it at once (300 MB for `stats`). On
    a duplicate of ``fd`` taken now, as ``iter_records``."""
    return _marked_own(os.dup(fd), end, marker, path)


def _marked_own(own: int, end: int, marker: bytes, path: str) -> Iterator[records.Record]:
    try:
        for data in line_chunks(own, 0, end):
            if marker not in data:
                continue
            for line in data.split(b"\n")[:-1]:
                if marker in line:
                    record = records.decode(line)
                    if record is None:
                        raise DamagedState(
                            f"{path}: a record does not decode; run `statequeue fsck`"
                        )
                    yield record
    finally:
        os.close(own)


def scan_item_texts(fd: int, start: int, end: int) -> list[tuple[str, int]] | None:
    """(text, id) of every ``enq`` and ``item`` record in bytes ``start``..``end``
    of ``fd`` (which start and end on record boundaries), decoding only the
    lines that can be one. None if such a line does not decode: the caller
    then reads the file the slow way, which reports where it is damaged."""
    found: list[tuple[str, int]] = []
    covered = start
    for data in line_chunks(fd, start, end):
        covered += len(data)
        for line in data.split(b"\n")[:-1]:
            # A quote inside a JSON string is escaped, so these bytes appear
            # only as a record's own type (or a key of a nested object).
            if b'"t":"enq"' in line or b'"t":"item"' in line:
                record = records.decode(line)
                if record is None:
                    return None
                if record.get("t") in ("enq", "item"):
                    found.append((records.item_text(record), record["id"]))
    return found if covered == end else None


def parse(
    data: bytes,
    *,
    path: str,
    first_line: int,
    last_seq: int | None,
    starts: list[int] | None = None,
) -> tuple[list[records.Record], int, int | None]:
    """Decode the complete, valid records at the start of ``data``.

    Returns (records, bytes consumed, last seq), and appends each record's
    offset in ``data`` to ``starts`` when given. Stops at the first line that
    is incomplete or invalid; raises CorruptJournal when a valid record follows
    it (damage in the middle, not a torn tail).
    """
    out: list[records.Record] = []
    mark = starts.append if starts is not None else None
    pos = 0
    end = data.rfind(b"\n") + 1
    decode = records.decode
    append = out.append
    for line in data[:end].split(b"\n")[:-1]:
        record = decode(line)
        if record is None or (last_seq is not None and record["seq"] != last_seq + 1):
            line_no = first_line + len(out)
            _refuse_if_damage(data[pos:], path=path, line_no=line_no, gap=record is not None)
            break
        append(record)
        if mark is not None:
            mark(pos)
        last_seq = record["seq"]
        pos += len(line) + 1
    return out, pos, last_seq


def looks_like_record(line: bytes) -> bool:
    """Whether a complete line that failed its checks was a record: it has a
    record's opening, its checksum field or its closing (one flipped bit
    breaks at most one of them). The unsynced bytes a power cut garbles
    almost never have any."""
    return line.startswith(b'{"') or line.endswith(b'"}') or b',"crc":"' in line


def _refuse_if_damage(rest: bytes, *, path: str, line_no: int, gap: bool) -> None:
    """``rest`` starts with a line that is not the next record. It is a torn
    tail (a crash cut an append short; never acknowledged) only when no
    complete line in it is, or was, a record, and no valid record follows.
    Else raise CorruptJournal naming the line."""
    lines = rest.split(b"\n")
    if gap:
        raise CorruptJournal(path, line_no, "sequence gap: a record is missing before this one")
    for n, line in enumerate(lines):
        complete = n < len(lines) - 1
        if n > 0 and records.decode(line) is not None:
            reason = "bad checksum or malformed record, followed by valid records"
            raise CorruptJournal(path, line_no, reason)
        if complete and looks_like_record(line):
            raise CorruptJournal(path, line_no + n, "bad checksum or malformed record")


class JournalFile:
    """An open journal (or archive) file and how far this process has read it."""

    def __init__(self, folder: QueueFolder, name: str, *, ops: FileOps = DEFAULT_OPS) -> None:
        self.folder = folder  # the file is opened relative to it, never through a link
        self.name = name
        self.path: Path = folder.path / name
        self.writable = True  # False: opened read-only (the user may not write the queue)
        self.denied = NoAccess.why  # why not writable (a read-only mount says so)
        self.ops = ops
        self.fd = -1
        self.inode = 0
        # An events follower's store keeps the journal it replaced open (one
        # generation): its records after the follower's point may be in the
        # new journal's snapshot only (journal_reads.read_events). Only a
        # follower: any other would keep a compacted journal's disk space.
        self.keep_previous = False
        self.previous: tuple[int, int] | None = None  # (inode, fd)
        self.offset = 0  # bytes read and applied so far
        self.lines = 0  # complete records read so far
        self.last_seq: int | None = None

    def open(self) -> None:
        """Open the existing file at ``path`` and start reading from its beginning."""
        if self.fd >= 0 and self.keep_previous:
            self._drop_previous()
            self.previous, self.fd = (self.inode, self.fd), -1
        self.close(previous=False)
        flags = os.O_RDWR | os.O_APPEND if self.writable else os.O_RDONLY
        try:
            self.fd = self.folder.open_file(self.name, flags)
        except FileNotFoundError:
            # The journal of an open queue goes missing only as the queue is
            # dropped (the folder goes an instant later), or by hand.
            if self.folder.removed(settle=1.0):
                raise self.folder.gone() from None
            raise
        self.inode = os.fstat(self.fd).st_ino
        self.offset = self.lines = 0
        self.last_seq = None

    def close(self, *, previous: bool = True) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if previous:
            self._drop_previous()

    def _drop_previous(self) -> None:
        if self.previous is not None:
            os.close(self.previous[1])
            self.previous = None

    def replaced(self) -> bool:
        """True when the path now names another file (compaction replaced it)."""
        return self.look() is REPLACED

    def look(self) -> int:
        """One stat of the path: REPLACED (it names another file: compaction
        replaced it), GROWN (it holds bytes this process has not read: another
        process appended, or a torn tail) or SAME (nothing new to read, e.g.
        every record since was this process's own: no read needed)."""
        try:
            found = self.folder.stat(self.name)
        except FileNotFoundError:
            return REPLACED
        if found.st_ino != self.inode:
            return REPLACED
        return SAME if found.st_size == self.offset else GROWN

    def replay(
        self, apply: Callable[[records.Record, int], None], *, repair: bool
    ) -> TornTail | None:
        """Pass each record appended since the last call to ``apply``, with its
        offset, in order, reading a bounded chunk at a time; return the torn
        tail if one was cut.

        With ``repair`` (the caller holds the lock exclusively), a torn tail is
        truncated away durably; without it the bytes are left for the writer.
        """
        with gc_paused():
            while True:
                data = os.pread(self.fd, _REPLAY_CHUNK, self.offset)
                if not data:
                    return None
                to_end = len(data) < _REPLAY_CHUNK  # the chunk holds the file's end
                if not to_end and data.rfind(b"\n") < 0:
                    # One record longer than a chunk: that record alone (to
                    # the file's end if it never ends), not all that follows.
                    data = read_line(self.fd, self.offset)
                    to_end = not data.endswith(b"\n")
                starts: list[int] = []
                found, used, last_seq = parse(
                    data,
                    path=str(self.path),
                    first_line=self.lines + 1,
                    last_seq=self.last_seq,
                    starts=starts,
                )
                base = self.offset
                start = 0
                try:
                    for record, start in zip(found, starts, strict=True):
                        apply(record, base + start)
                except records.OutOfReach as exc:
                    # A valid line replay must not apply: damage, as fsck finds it.
                    line = self.lines + starts.index(start) + 1
                    raise CorruptJournal(str(self.path), line, str(exc)) from None
                self.offset += used
                self.lines += len(found)
                self.last_seq = last_seq
                # Bytes left over that a later read cannot complete: a bad
                # record before the last newline, or an unfinished last one
                # (also when it is longer than a chunk: it was read to the end).
                if used < data.rfind(b"\n") + 1 or (used < len(data) and to_end):
                    return self._torn(repair)

    def _torn(self, repair: bool) -> TornTail | None:
        """Everything from ``offset`` on is not a valid record: refuse it as
        corruption if a valid record follows, else cut it as a torn tail."""
        rest = read_from(self.fd, self.offset)
        found, _, _ = parse(
            rest, path=str(self.path), first_line=self.lines + 1, last_seq=self.last_seq
        )
        if found:  # cannot happen: parse would have returned them before
            raise AssertionError("journal changed while its lock was held")
        torn = TornTail(str(self.path), self.offset, len(rest))
        if repair:
            self.cut_torn(torn)
        return torn

    def cut_torn(self, torn: TornTail) -> None:
        """Durably cut the torn tail ``replay(repair=False)`` returned (the
        caller holds the lock exclusively and has decided it is one)."""
        self._cut_to(torn.offset, "repairing")

    def append(self, batch: Iterable[records.Record], *, sync: bool) -> list[int]:
        """Number, encode and write ``batch``; fsync when ``sync``. Returns
        each record's offset in the file.

        The caller must have read every record first (``replay``). On a failed
        write or fsync the file is cut back to its last good record and
        DurabilityError is raised; the fsync is never retried.
        """
        seq = 0 if self.last_seq is None else self.last_seq
        lines = []
        starts = []
        pos = self.offset
        encode = records.encode
        for record in batch:
            seq += 1
            record["seq"] = seq
            line = encode(record)
            lines.append(line)
            starts.append(pos)
            pos += len(line)
        if lines:
            self.append_encoded(b"".join(lines), len(lines), sync=sync)
        return starts

    def append_encoded(self, data: bytes, count: int, *, sync: bool) -> None:
        """Write ``count`` already encoded lines, numbered from ``last_seq + 1``;
        fsync when ``sync``. On a failed write or fsync the file is cut back to
        its last good record and DurabilityError is raised (never retried)."""
        if not self.writable:
            raise NoAccess(f"cannot write {self.path}: {self.denied}")
        try:
            self.ops.write_all(self.fd, data)
        except OSError as exc:
            error = durability_error("appending to", str(self.path), exc)
            # No fsync failed: once the cut holds, the file ends on its last
            # good record, and a later append (space freed) may follow it.
            error.appendable = self._cut_after_failure()
            raise error from None
        if sync:
            try:
                self.ops.fsync(self.fd)
            except OSError as exc:
                self._cut_after_failure()
                raise durability_error("appending to", str(self.path), exc) from None
        self.offset += len(data)
        self.lines += count
        self.last_seq = (self.last_seq or 0) + count

    def sync(self) -> None:
        """fsync records appended without ``sync`` (never retried on failure)."""
        try:
            self.ops.fsync(self.fd)
        except OSError as exc:
            self._cut_after_failure()
            raise durability_error("fsync of", str(self.path), exc) from None

    def _cut_to(self, size: int, action: str) -> None:
        try:
            self.ops.truncate(self.fd, size)
            self.ops.fsync(self.fd)
        except OSError as exc:
            raise durability_error(action, str(self.path), exc) from None

    def _cut_after_failure(self) -> bool:
        """Best effort: drop the unacknowledged bytes so the file ends on a good
        record (True if it does). If even this fails, the next open treats
        them as a torn tail."""
        try:
            self.ops.truncate(self.fd, self.offset)
        except OSError:
            return False
        return True


def create_file(
    folder: QueueFolder, name: str, lines: Iterable[records.Record], *, ops: FileOps
) -> None:
    """Durably write a new file ``name`` in ``folder`` holding ``lines`` (atomic:
    temp + rename).

    Recipe: temp file in the same folder (O_EXCL, 0600), write, fsync, rename
    over ``name``, fsync the folder.
    """
    tmp = f".{name}.{os.getpid()}.tmp"
    payload = b"".join(records.encode(r) for r in lines)
    try:
        fd = folder.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except FileExistsError:
        folder.unlink(tmp)  # left by a crashed run of this same pid; never a live file
        fd = folder.open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            ops.write_all(fd, payload)
            ops.fsync(fd)
        finally:
            os.close(fd)
        ops.replace(folder.entry(tmp), folder.entry(name))
        ops.fsync_dir(folder.itself())
    except OSError as exc:
        with contextlib.suppress(OSError):
            folder.unlink(tmp)
        raise durability_error("writing", folder.shown(name), exc) from None
