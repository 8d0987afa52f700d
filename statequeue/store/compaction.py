"""Compaction: rewrite the live journal as a snapshot plus its exceptions.

Steps, in this order, so that a crash at any point leaves a readable queue:

1. Cut the archive back to the size the current snapshot vouches for (drops
   what an earlier, crashed compaction appended), append the finished items
   with their results, fsync it.
2. Write the new journal to a temp file (snapshot header, then one ``item``
   record per unfinished item, then the live runners), fsync, rename over the
   journal, fsync the folder.

Before step 2 completes, the old journal still names every item, and the
archive's extra tail is ignored (the snapshot's ``archive_size`` bounds it).
"""

from __future__ import annotations

import os
from pathlib import Path

from statequeue.errors import DamagedState
from statequeue.fileio import FileOps
from statequeue.journal import JournalFile, create_file, read_from
from statequeue.location import FILE_MODE
from statequeue.records import Record, decode, item_fields, item_text
from statequeue.state import QueueState
from statequeue.views import CompactResult


def compact_journal(
    *, journal: JournalFile, archive_path: Path, state: QueueState, ops: FileOps
) -> CompactResult:
    """Compact ``journal`` (whose records ``state`` reflects); caller holds the lock."""
    bytes_before = journal.offset
    texts, last_end = _scan(journal)
    finished = _finished_items(texts, last_end, state)
    archive_size = _append_archive(archive_path, state.archive_size, finished, ops=ops)
    live = sorted(state.items.values(), key=lambda i: i.id)
    watermark = (live[0].id - 1) if live else state.next_id - 1
    seq = (journal.last_seq or 0) + 1
    lines: list[Record] = [
        {
            "seq": seq,
            "t": "snap",
            "v": 1,
            "next_id": state.next_id,
            "archived": state.archived + len(finished),
            "archive_size": archive_size,
            "watermark": watermark,
            "commands": state.commands[-20:],
            "paused": state.paused,
        }
    ]
    for item in live:
        seq += 1
        rec: Record = {"seq": seq, "t": "item", "id": item.id, **item_fields(item.text)}
        rec.update(state=item.state.value, attempts=item.attempts, crashes=item.crashes)
        extra = {"runner": item.runner, "reason": item.reason, "retry_at": item.not_before}
        rec.update((k, v) for k, v in extra.items() if v)
        if item.interrupted:
            rec["interrupted"] = True
        if item.id in last_end:
            rec["last"] = last_end[item.id]  # a failed item keeps its result and stderr
        lines.append(rec)
    for runner in state.runners.values():
        seq += 1
        lines.append({**runner, "seq": seq})
    create_file(journal.path, lines, ops=ops)
    return CompactResult(
        bytes_before=bytes_before,
        bytes_after=journal.path.stat().st_size,
        archived=len(finished),
        archive_bytes=archive_size,
    )


_RESULT_KEYS = ("attempt", "dur", "exit", "sig", "result", "err", "reason", "at")


def _scan(journal: JournalFile) -> tuple[dict[int, str], dict[int, Record]]:
    """Item texts, and the result fields of each item's last attempt."""
    texts: dict[int, str] = {}
    last_end: dict[int, Record] = {}
    data = read_from(journal.fd, 0)[: journal.offset]
    for line in data.splitlines():
        rec = decode(line)
        if rec is None:  # cannot happen: these bytes were validated on read
            raise ValueError("journal changed under the lock")
        kind = rec.get("t")
        if kind in ("enq", "item"):
            texts[rec["id"]] = item_text(rec)
            if "last" in rec:
                last_end[rec["id"]] = rec["last"]
        elif kind == "end":
            last_end[rec["id"]] = {k: rec[k] for k in _RESULT_KEYS if k in rec}
    return texts, last_end


def _finished_items(
    texts: dict[int, str], last_end: dict[int, Record], state: QueueState
) -> list[Record]:
    """Archive records for items that are done in the live journal, in id order."""
    out = []
    for item_id, text in texts.items():
        if item_id in state.items:
            continue  # not finished: it stays in the journal
        out.append({"t": "arch", "id": item_id, **item_fields(text), **last_end.get(item_id, {})})
    out.sort(key=lambda r: r["id"])
    return out


def _append_archive(path: Path, size: int, finished: list[Record], *, ops: FileOps) -> int:
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
        os.close(fd)
        ops.fsync_dir(str(path.parent))
    archive = JournalFile(path, ops=ops)
    archive.open()
    try:
        archive.read_new(repair=False)
        if archive.offset < size:
            raise DamagedState(f"{path}: shorter than the journal says ({archive.offset} < {size})")
        if os.fstat(archive.fd).st_size != size:
            # A compaction crashed after appending here (its journal never took
            # effect, so those items are archived again below), or a torn tail.
            ops.truncate(archive.fd, size)
            ops.fsync(archive.fd)
            archive.open()
            archive.read_new(repair=False)
        archive.append(finished, sync=True)
        return archive.offset
    finally:
        archive.close()
