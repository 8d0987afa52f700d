"""`fsck`: check every record of a queue's files, and salvage what is valid.

It finds what opening refuses (promise 5): a bad record anywhere, even a
complete last line; a missing, empty or cut header; a journal cut after a
compaction (shorter than its header says) or behind its checkpoint.

Repair never deletes: the damaged journal is kept beside the new one (a hard
link named ``journal.jsonl.damaged-TIMESTAMP``) before the salvaged records
replace it through the usual temp-file, fsync, rename, folder-fsync recipe.
When the snapshot header is lost, a new one is rebuilt from everything that
survives (archive, records, checkpoints), so no id is ever handed out twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from statequeue.core import records
from statequeue.core.errors import NoAccess, QueueNotFound
from statequeue.core.exported import out_of_reach
from statequeue.core.fileio import DEFAULT_OPS, FileOps
from statequeue.core.records import Record
from statequeue.store.journal import checkpoint
from statequeue.store.journal.cache_file import Found
from statequeue.store.journal.compaction_files import compaction_lock
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.fsck_losses import (
    Dropped,
    dropped_records,
    highest_enqueued,
    state_unsure,
)
from statequeue.store.journal.integrity import ARCHIVE, JOURNAL, queue_history
from statequeue.store.journal.journal_file import (
    TORN_TAIL_KNOWN,
    JournalFile,
    create_file,
    looks_like_record,
)
from statequeue.store.journal.locks import lock_timeout, wait_for_lock
from statequeue.store.records.state import QueueState, id_runs

TORN_LEFT = "left in place: the next command that opens the queue cuts it"
TORN_READ_ONLY = "left in place: the queue is read-only for you, its next writer cuts it"
TORN_CUT = "cut by the repair"
# A damaged queue is refused by every command (exit 5), which cuts nothing.
TORN_REFUSED = (
    "left in place: every command refuses the damaged queue (exit 5); `fsck --repair` cuts it"
)


@dataclass
class FileCheck:
    """What fsck found in one file."""

    path: str
    valid: int = 0
    bad_lines: list[int] = field(default_factory=list)
    seq_errors: list[int] = field(default_factory=list)
    torn_bytes: int = 0
    problems: list[str] = field(default_factory=list)  # damage not tied to one line
    torn_fate: str = TORN_LEFT  # what became of a torn tail (fsck itself cuts none)
    cut_end: bool = False  # records are missing past its end (cut short, behind its checkpoint)
    exists: bool = True  # False: there is no such file (a queue never compacted has no archive)

    @property
    def damaged(self) -> bool:
        return bool(self.bad_lines or self.seq_errors or self.problems)

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "exists": self.exists,
            "valid_records": self.valid,
            "bad_lines": self.bad_lines,
            "sequence_errors": self.seq_errors,
            "torn_tail_bytes": self.torn_bytes,
            "problems": self.problems,
        }

    def summary(self) -> str:
        """One line for people: the file, its valid records, what is wrong."""
        problems = list(self.problems)
        if self.bad_lines:
            problems.append(f"bad records at lines {_lines(self.bad_lines)}")
        if self.seq_errors:
            problems.append(f"sequence breaks at lines {_lines(self.seq_errors)}")
        if self.torn_bytes:
            problems.append(
                f"torn tail of {self.torn_bytes} bytes ({TORN_TAIL_KNOWN}); {self.torn_fate}"
            )
        return f"{self.path}: {self.valid} valid records; " + ("; ".join(problems) or "ok")


def _runs(runs: list[list[int]]) -> str:
    shown = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in runs[:20])
    return shown + (f" and {len(runs) - 20} more run(s)" if len(runs) > 20 else "")


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:10])
    return shown + (f" and {len(numbers) - 10} more" if len(numbers) > 10 else "")


@dataclass
class FsckReport:
    """The checks of a queue's journal and archive, and what a repair did."""

    journal: FileCheck
    archive: FileCheck
    repaired: bool = False
    kept: list[str] = field(default_factory=list)
    lost_ids: list[list[int]] = field(default_factory=list)  # [first, last] ranges
    # Ids a dropped record named (or may have): their state may have gone back.
    state_unsure_ids: list[list[int]] = field(default_factory=list)  # [first, last] ranges

    @property
    def damaged(self) -> bool:
        return self.journal.damaged or self.archive.damaged

    def to_json(self) -> dict[str, object]:
        return {
            "schema": 1,
            "ok": not self.damaged or self.repaired,
            "damaged": self.damaged,
            "journal": self.journal.to_json(),
            "archive": self.archive.to_json(),
            "repaired": self.repaired,
            "kept_damaged_files": self.kept,
            "lost_ids": self.lost_ids,
            "state_unsure_ids": self.state_unsure_ids,
        }

    @property
    def warnings(self) -> tuple[str, ...]:
        return ()  # a journal's problems are all in its files

    def report_lines(self) -> list[str]:
        """What `fsck` prints: each file's summary, then what a repair did."""
        # A file that is not there and should not be (no archive before the
        # first compaction) is not reported as if it were checked and "ok".
        checks = [c for c in (self.journal, self.archive) if c.exists or c.damaged]
        lines = [check.summary() for check in checks]
        if self.repaired:
            lines += [f"kept the damaged file as {kept}" for kept in self.kept]
            if self.lost_ids:
                lost = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in self.lost_ids)
                lines.append(f"no surviving record names item id(s) {lost}: left out, never reused")
            if self.state_unsure_ids:
                lines.append(
                    f"item id(s) {_runs(self.state_unsure_ids)} were named by dropped records "
                    "(or may have been): their state may have gone back, "
                    "and a done one may run again"
                )
            lines.append("repaired: the valid records now form the queue")
        return lines

    def advice(self) -> str:
        return "run `statequeue fsck --repair` to salvage"


def scan_file(folder: QueueFolder, name: str) -> tuple[FileCheck, list[Record]]:
    """Check every line of ``name``; returns the check and the valid records."""
    check = FileCheck(folder.shown(name))
    try:
        data = folder.read_bytes(name)
    except FileNotFoundError:
        check.exists = False
        return check, []
    lines = data.split(b"\n")
    if lines and lines[-1]:
        check.torn_bytes = len(lines[-1])
    valid: list[Record] = []
    last_seq: int | None = None
    last_valid_line = 0
    held = 1  # ids below it are within replay's reach (as ``QueueState`` grows)
    for number, line in enumerate(lines[:-1], start=1):
        rec = records.decode(line)
        if rec is not None and rec.get("t") in ("enq", "item") and name == JOURNAL:
            if out_of_reach(rec.get("id"), held):
                rec = None  # intact, but replay refuses it: set aside as damage
            else:
                held = max(held, rec["id"] + 1)
        elif rec is not None and rec.get("t") == "snap" and type(rec.get("next_id")) is int:
            held = max(held, rec["next_id"])
        if rec is None:
            check.bad_lines.append(number)
            continue
        if last_seq is not None and rec["seq"] != last_seq + 1:
            check.seq_errors.append(number)
        last_seq = rec["seq"]
        last_valid_line = number
        valid.append(rec)
    check.valid = len(valid)
    # Bad lines with no valid record after them are a torn tail, which an
    # ordinary open cuts away -- unless one of them is (or was) a complete
    # record: a bit flip in the last record is damage, as it is on open.
    # A journal with no valid record has no header: its bytes are damage
    # (every open refuses it, exit 5), not a tail an open would cut.
    if name == JOURNAL and not valid:
        check.torn_bytes = 0
        return check, valid
    trailing = [n for n in check.bad_lines if n > last_valid_line]
    if not any(looks_like_record(lines[n - 1]) for n in trailing):
        for number in trailing:
            check.torn_bytes += len(lines[number - 1]) + 1
            check.bad_lines.remove(number)
    return check, valid


def fsck(folder: Path, *, repair: bool, ops: FileOps = DEFAULT_OPS) -> FsckReport:
    """Check (and with ``repair``, salvage) the queue in ``folder``."""
    try:
        qdir = QueueFolder.open(folder, create=False)
    except QueueNotFound:
        raise QueueNotFound(f"no queue in {folder}") from None
    try:
        if not qdir.exists(JOURNAL) and not queue_history(qdir):
            raise QueueNotFound(f"no queue in {folder}")
        return _check(qdir, repair=repair, ops=ops)
    finally:
        qdir.close()


def _check(qdir: QueueFolder, *, repair: bool, ops: FileOps) -> FsckReport:
    if not repair:
        return _check_locked(qdir, repair=False, ops=ops)
    # A compaction writes the archive and its new journal holding only
    # compact.lock: a repair waits for it (lock order: compact.lock, then lock).
    with compaction_lock(qdir, wait=lock_timeout()):
        return _check_locked(qdir, repair=True, ops=ops)


def _check_locked(qdir: QueueFolder, *, repair: bool, ops: FileOps) -> FsckReport:
    lock_fd, writable = _open_lock(qdir, repair=repair)
    try:
        if lock_fd >= 0:
            wait_for_lock(lock_fd, qdir.path / "lock")
        jcheck, jrecords = scan_file(qdir, JOURNAL)
        acheck, arecords = scan_file(qdir, ARCHIVE)
        jcheck.problems += _journal_problems(qdir, jcheck, jrecords)
        acheck.problems += _archive_problems(qdir, jrecords)
        report = FsckReport(jcheck, acheck)
        if not writable:  # as `status` says of it: nothing here may cut it
            jcheck.torn_fate = acheck.torn_fate = TORN_READ_ONLY
        if jcheck.damaged or acheck.problems:  # every open refuses it: nothing is cut
            jcheck.torn_fate = acheck.torn_fate = TORN_REFUSED
        if repair and report.damaged:
            archive_damaged = acheck.damaged
            _repair(qdir, report, jrecords, arecords, ops)
            jcheck.torn_fate = TORN_CUT  # the journal is rewritten from its valid records
            if archive_damaged:
                acheck.torn_fate = TORN_CUT
        return report
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def _open_lock(qdir: QueueFolder, *, repair: bool) -> tuple[int, bool]:
    """The queue's lock file (-1: none), and whether the queue may be written:
    a check without --repair needs only read access."""
    try:
        return qdir.open_file("lock", os.O_RDWR | os.O_CREAT), True
    except NoAccess:
        if repair:
            raise
    try:
        return qdir.open_file("lock", os.O_RDONLY), False  # flock needs no write access
    except FileNotFoundError:
        return -1, False


def _journal_problems(qdir: QueueFolder, check: FileCheck, valid: list[Record]) -> list[str]:
    """Damage to the journal as a whole, which opening refuses."""
    if not qdir.exists(JOURNAL):
        return [f"missing, but the folder still holds {', '.join(queue_history(qdir)[:3])}"]
    header = _header_of(valid, check)
    if header is None:
        return ["line 1 is not a valid snapshot header (empty, cut or overwritten)"]
    found: list[str] = []
    missing = header["seq"] + header.get("follow", 0) - valid[-1]["seq"]
    if missing > 0:
        found.append(f"ends {missing} record(s) short of what its header says follows it")
    ahead = _checkpoint_ahead(qdir)
    if ahead:
        found.append(ahead)
    check.cut_end = missing > 0 or ahead is not None
    return found


def _header_of(valid: list[Record], check: FileCheck) -> Record | None:
    """The journal's snapshot header, if line 1 holds a valid one."""
    if not valid or 1 in check.bad_lines or valid[0].get("t") != "snap":
        return None
    return valid[0]


def _checkpoint_ahead(qdir: QueueFolder) -> str | None:
    """A message if the state checkpoint saw records of this journal that it no longer has."""
    journal = JournalFile(qdir, JOURNAL)
    journal.writable = False  # only read: a check needs no write access
    journal.open()
    try:
        found = checkpoint.restore(qdir, journal, QueueState())
    finally:
        journal.close()
    if found.found is not Found.AHEAD:
        return None
    return (
        f"{checkpoint.NAME} saw {found.lines} fsynced record(s) ({found.offset} bytes) "
        "that the journal no longer has"
    )


def _archive_problems(qdir: QueueFolder, jrecords: list[Record]) -> list[str]:
    """The archive disagreeing with the journal's header is damage too: shorter
    than it says, another count up to there, or records past it of items the
    journal does not name (compaction would refuse to cut them)."""
    header = jrecords[0] if jrecords and jrecords[0].get("t") == "snap" else None
    if header is None:
        return []
    size = header.get("archive_size", 0)
    if not qdir.exists(ARCHIVE):
        # Every reader refuses the queue then: a repair rebuilds without it.
        if size or header.get("archived", 0):
            return [f"missing, but the journal says it holds {header.get('archived', 0)} record(s)"]
        return []
    ids, _, _ = _archive_extent(qdir, None, set())
    _, vouched_end, vouched = _archive_extent(qdir, size, set())
    if vouched_end != size:
        return [f"shorter than the journal says ({vouched_end} < {size} bytes)"]
    if vouched != header.get("archived", 0):
        return [f"holds {vouched} record(s) where the journal says {header['archived']}"]
    named = {r["id"] for r in jrecords if r.get("t") in ("enq", "item")}
    strangers = [i for i in ids[vouched:] if i not in named]
    if strangers:
        return [f"holds {len(strangers)} record(s) past what the journal vouches for"]
    return []


def _repair(
    qdir: QueueFolder,
    report: FsckReport,
    jrecords: list[Record],
    arecords: list[Record],
    ops: FileOps,
) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    try:
        data = qdir.read_bytes(JOURNAL)
    except FileNotFoundError:
        data = b""
    dropped = dropped_records(data, report.journal.bad_lines, report.journal.cut_end)
    # Read before anything is rebuilt: each salvage discards the checkpoints,
    # and they may be the only witness of ids handed out past the records left.
    remembered = checkpoint.known_ids(qdir)
    if report.archive.damaged:
        kept = _salvage(qdir, ARCHIVE, arecords, stamp, ops)
        if kept:  # "": there was no archive to keep
            report.kept.append(kept)
    header = _header_of(jrecords, report.journal)
    body = [r for r in jrecords if r.get("t") != "snap"]
    trusted = header is not None and not report.archive.damaged
    new_header, report.lost_ids, arch_ids = _rebuilt_header(
        qdir, header, body, dropped, trusted=trusted, remembered=remembered
    )
    reach = max(new_header["next_id"], dropped.top + 1)  # past every id replay will hold
    report.state_unsure_ids = state_unsure(dropped, reach, report.lost_ids, arch_ids)
    kept = _salvage(qdir, JOURNAL, [new_header, *body], stamp, ops)
    if kept:
        report.kept.append(kept)
    report.repaired = True


def _rebuilt_header(
    qdir: QueueFolder,
    old: Record | None,
    body: list[Record],
    dropped: Dropped,
    *,
    trusted: bool,
    remembered: int,
) -> tuple[Record, list[list[int]], list[int]]:
    """The snapshot header of a salvaged journal, made to agree with the
    archive; with ``old`` lost, rebuilt from everything that survives.

    With the header lost, ``next_id`` is past every id the archive, the
    records and the checkpoints know of (``remembered``: read before the
    repair discarded them); with it kept, past the checkpoints'
    (the records' own ids count on replay), and past an id that only a
    dropped record still names. The ids below it that no surviving record
    names are ``absent`` (neither done nor listed, never reused).

    Also returns the ids lost (``absent``, and the ids past it, below the
    records' own, that no surviving record names: replay leaves them out by
    itself) and the archived ids."""
    body_ids = {r["id"] for r in body if r.get("t") in ("enq", "item")}
    limit = old["archive_size"] if old is not None and trusted else None
    arch_ids, size, archived = _archive_extent(qdir, limit, body_ids)
    # The journal's own records raise next_id on replay, so a kept header
    # needs only what the archive and the checkpoints remember beyond them.
    known = max([remembered, *arch_ids])
    if old is None:
        known = max([known, *body_ids])
    # An item whose enqueue record was lost can still be named by its
    # attempts' records, or by its own dropped enqueue record where that
    # still reads: its id stays taken (absent), never handed out again.
    orphans = [r for r in body if r.get("id") not in body_ids]
    known = _highest_named(orphans, max(known + 1, old["next_id"] if old is not None else 1))
    known = highest_enqueued(dropped, known, max(body_ids, default=0))
    next_id = max(known + 1, old["next_id"] if old is not None else 1)
    # The watermark only starts the pending cursor: lower is always safe.
    first_named = min(body_ids, default=next_id) - 1
    watermark = old.get("watermark", 0) if old is not None else first_named
    header: Record = {
        "seq": old["seq"] if old is not None else 1,
        "t": "snap",
        "v": 1,
        "next_id": next_id,
        "archived": archived,
        "archive_size": size,
        "watermark": min(watermark, next_id - 1),
        "commands": old.get("commands", []) if old is not None else [],
        "paused": old.get("paused", False) if old is not None else False,
        "follow": len(body),
    }
    absent = _unnamed(next_id, arch_ids, body_ids)
    if absent:
        header["absent"] = absent
    # Every id below the highest one known was handed out (one by one).
    reach = max(next_id, max(body_ids, default=0) + 1)
    lost = _unnamed(reach, arch_ids, body_ids)
    return header, lost, arch_ids


def _highest_named(body: list[Record], held: int) -> int:
    """The highest item id below ``held`` or named by a record of ``body`` (the
    starts, ends, recoveries... of items with no enqueue left), within reach as
    replay takes ids (an id far past the others costs a byte per id between)."""
    top = held - 1
    for rec in body:
        item_id = rec.get("id")
        if isinstance(item_id, int) and not out_of_reach(item_id, top + 1):
            top = max(top, item_id)
    return top


def _archive_extent(
    qdir: QueueFolder, limit: int | None, stop_ids: set[int]
) -> tuple[list[int], int, int]:
    """(ids, byte size, record count) of the archive's valid records up to
    ``limit`` bytes (all, if None), stopping before the first damaged line or
    the first record of an item in ``stop_ids`` (the journal still names it:
    a crashed compaction archived it early, and the next one will again)."""
    try:
        data = qdir.read_bytes(ARCHIVE)
    except FileNotFoundError:
        return [], 0, 0
    if limit is not None:
        data = data[:limit]
    ids: list[int] = []
    pos = 0
    for line in data.split(b"\n")[:-1]:
        rec = records.decode(line)
        if rec is None or rec.get("id") in stop_ids:
            break
        if rec.get("t") == "arch":
            ids.append(rec["id"])
        pos += len(line) + 1
    return ids, pos, len(ids)


def _unnamed(next_id: int, *named: Iterable[int]) -> list[list[int]]:
    """[first, last] runs of the ids below ``next_id`` that none of ``named``
    holds (one byte per id: a repair of a big queue stays small)."""
    seen = bytearray(max(next_id, 1))
    for ids in named:
        for item_id in ids:
            if 0 < item_id < next_id:
                seen[item_id] = 1
    return id_runs(seen, 0)


def _salvage(qdir: QueueFolder, name: str, valid: list[Record], stamp: str, ops: FileOps) -> str:
    """Keep ``name`` as a damaged copy (if it exists), then replace it with
    ``valid`` renumbered. Returns the kept copy's path ("" if none)."""
    kept = f"{name}.damaged-{stamp}"
    existed = qdir.exists(name)
    if existed:
        qdir.link(name, kept)
        ops.fsync_dir(qdir.itself())
    first = valid[0]["seq"] if valid else 1
    renumbered = [{**r, "seq": first + i} for i, r in enumerate(valid)]
    create_file(qdir, name, renumbered, ops=ops)
    checkpoint.discard(qdir)
    return qdir.shown(kept) if existed else ""
