"""`fsck`: check every record of a queue's files, and salvage what is valid.

Repair never deletes: the damaged journal is kept beside the new one (a hard
link named ``journal.jsonl.damaged-TIMESTAMP``) before the salvaged records
replace it through the usual temp-file, fsync, rename, folder-fsync recipe.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from statequeue import records
from statequeue.errors import NoAccess, QueueNotFound
from statequeue.fileio import DEFAULT_OPS, FileOps
from statequeue.journal import create_file
from statequeue.records import Record
from statequeue.store import checkpoint
from statequeue.store.folder import QueueFolder
from statequeue.store.journal_store import wait_for_lock


@dataclass
class FileCheck:
    """What fsck found in one file."""

    path: str
    valid: int = 0
    bad_lines: list[int] = field(default_factory=list)
    seq_errors: list[int] = field(default_factory=list)
    torn_bytes: int = 0

    @property
    def damaged(self) -> bool:
        return bool(self.bad_lines or self.seq_errors)

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "valid_records": self.valid,
            "bad_lines": self.bad_lines,
            "sequence_errors": self.seq_errors,
            "torn_tail_bytes": self.torn_bytes,
        }


@dataclass
class FsckReport:
    """The checks of a queue's journal and archive, and what a repair did."""

    journal: FileCheck
    archive: FileCheck
    repaired: bool = False
    kept: list[str] = field(default_factory=list)

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
        }


def scan_file(folder: QueueFolder, name: str) -> tuple[FileCheck, list[Record]]:
    """Check every line of ``name``; returns the check and the valid records."""
    check = FileCheck(folder.shown(name))
    try:
        data = folder.read_bytes(name)
    except FileNotFoundError:
        return check, []
    lines = data.split(b"\n")
    if lines and lines[-1]:
        check.torn_bytes = len(lines[-1])
    valid: list[Record] = []
    last_seq: int | None = None
    last_valid_line = 0
    for number, line in enumerate(lines[:-1], start=1):
        rec = records.decode(line)
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
    # ordinary open cuts away: not damage.
    for number in [n for n in check.bad_lines if n > last_valid_line]:
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
        if not qdir.exists("journal.jsonl"):
            raise QueueNotFound(f"no queue in {folder}")
        return _check(qdir, repair=repair, ops=ops)
    finally:
        qdir.close()


def _check(qdir: QueueFolder, *, repair: bool, ops: FileOps) -> FsckReport:
    lock_fd = _open_lock(qdir, repair=repair)
    try:
        if lock_fd >= 0:
            wait_for_lock(lock_fd, qdir.path / "lock")
        jcheck, jrecords = scan_file(qdir, "journal.jsonl")
        acheck, arecords = scan_file(qdir, "archive.jsonl")
        report = FsckReport(jcheck, acheck)
        if repair and report.damaged:
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            if acheck.damaged:
                report.kept.append(_salvage(qdir, "archive.jsonl", arecords, stamp, ops))
            header = _header_for(jrecords, qdir, rebuilt=acheck.damaged)
            body = [r for r in jrecords if r.get("t") != "snap"]
            report.kept.append(_salvage(qdir, "journal.jsonl", [header, *body], stamp, ops))
            report.repaired = True
        return report
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def _open_lock(qdir: QueueFolder, *, repair: bool) -> int:
    """The queue's lock file; a check without --repair needs only read access."""
    try:
        return qdir.open_file("lock", os.O_RDWR | os.O_CREAT)
    except NoAccess:
        if repair:
            raise
    try:
        return qdir.open_file("lock", os.O_RDONLY)  # flock needs no write access
    except FileNotFoundError:
        return -1


def _header_for(jrecords: list[Record], qdir: QueueFolder, *, rebuilt: bool) -> Record:
    """The snapshot header of a salvaged journal, made to agree with the archive."""
    old = jrecords[0] if jrecords and jrecords[0].get("t") == "snap" else {}
    if old and not rebuilt:
        archived, size = old["archived"], old["archive_size"]
    else:
        _, records_ = scan_file(qdir, "archive.jsonl")
        archived = sum(1 for r in records_ if r.get("t") == "arch")
        size = qdir.stat("archive.jsonl").st_size if qdir.exists("archive.jsonl") else 0
    return {
        "seq": old.get("seq", 1),
        "t": "snap",
        "v": 1,
        "next_id": old.get("next_id", 1),
        "archived": archived,
        "archive_size": size,
        "watermark": old.get("watermark", 0),
        "commands": old.get("commands", []),
        "paused": old.get("paused", False),
    }


def _salvage(qdir: QueueFolder, name: str, valid: list[Record], stamp: str, ops: FileOps) -> str:
    """Keep ``name`` as a damaged copy, then replace it with ``valid`` renumbered."""
    kept = f"{name}.damaged-{stamp}"
    qdir.link(name, kept)
    ops.fsync_dir(qdir.itself())
    first = valid[0]["seq"] if valid else 1
    renumbered = [{**r, "seq": first + i} for i, r in enumerate(valid)]
    create_file(qdir, name, renumbered, ops=ops)
    checkpoint.discard(qdir)
    return qdir.shown(kept)
