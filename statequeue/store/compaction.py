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
from typing import TYPE_CHECKING

from statequeue.errors import DamagedState
from statequeue.fileio import FileOps
from statequeue.gcpause import gc_paused
from statequeue.journal import JournalFile, create_file, iter_records
from statequeue.models import ItemState
from statequeue.records import Record, item_fields, item_text
from statequeue.state import CODE, QueueState
from statequeue.views import CompactResult

if TYPE_CHECKING:
    from statequeue.store.folder import QueueFolder


def compact_journal(
    *, journal: JournalFile, archive_path: Path, state: QueueState, ops: FileOps
) -> CompactResult:
    """Compact ``journal`` (whose records ``state`` reflects); caller holds the lock."""
    bytes_before = journal.offset
    archive = _open_archive(journal.folder, archive_path.name, state.archive_size, ops=ops)
    try:
        archived, last_end, texts = _archive_finished(journal, state, archive)
        archive.sync()  # the archive is durable before the journal stops naming these items
        archive_size = archive.offset
    finally:
        archive.close()
    live = list(state.live_ids())
    watermark = (live[0] - 1) if live else state.next_id - 1
    seq = (journal.last_seq or 0) + 1
    lines: list[Record] = [
        {
            "seq": seq,
            "t": "snap",
            "v": 1,
            "next_id": state.next_id,
            "archived": state.archived + archived,
            "archive_size": archive_size,
            "watermark": watermark,
            "commands": state.commands[-20:],
            "paused": state.paused,
        }
    ]
    for item_id in live:
        seq += 1
        text = texts.pop(item_id, None)
        item = state.items.get(item_id)
        if text is None:  # not in this journal's records: read it back
            text = state.get(item_id).text  # type: ignore[union-attr]
        rec: Record = {"seq": seq, "t": "item", "id": item_id, **item_fields(text)}
        if item is None:  # fresh pending: no details
            rec.update(state=ItemState.PENDING.value, attempts=0, crashes=0)
        else:
            rec.update(state=item.state.value, attempts=item.attempts, crashes=item.crashes)
            extra = {"runner": item.runner, "reason": item.reason, "retry_at": item.not_before}
            rec.update((k, v) for k, v in extra.items() if v)
            if item.interrupted:
                rec["interrupted"] = True
        if item_id in last_end:
            rec["last"] = last_end[item_id]  # a failed item keeps its result and stderr
        lines.append(rec)
    for runner in state.runners.values():
        seq += 1
        lines.append({**runner, "seq": seq})
    create_file(journal.folder, journal.name, lines, ops=ops)
    return CompactResult(
        bytes_before=bytes_before,
        bytes_after=journal.folder.stat(journal.name).st_size,
        archived=archived,
        archive_bytes=archive_size,
    )


_RESULT_KEYS = ("attempt", "dur", "exit", "sig", "result", "err", "reason", "at")
_ARCHIVE_BATCH = 20_000


def _archive_finished(
    journal: JournalFile, state: QueueState, archive: JournalFile
) -> tuple[int, dict[int, Record], dict[int, str]]:
    """Stream the journal once: append every finished item (with its result) to
    the archive as its final ``end`` is seen, and collect the last result and
    the text of each live item. Returns (items archived, live item id -> last
    result, live item id -> text).

    Done is terminal, so an ``end`` with state done is an item's last word; a
    text is held only from the item's enqueue to that ``end``.
    """
    texts: dict[int, str] = {}
    live_texts: dict[int, str] = {}
    last_end: dict[int, Record] = {}
    batch: list[Record] = []
    archived = 0
    codes = state.codes
    done_codes = (0, CODE[ItemState.DONE])

    def is_live(item_id: int) -> bool:
        return 0 < item_id < len(codes) and codes[item_id] not in done_codes

    with gc_paused():
        for rec in iter_records(journal.fd, journal.offset, path=str(journal.path)):
            kind = rec.get("t")
            item_id = rec.get("id", -1)
            if kind in ("enq", "item"):
                if is_live(item_id):
                    live_texts[item_id] = item_text(rec)
                    if "last" in rec:
                        last_end[item_id] = rec["last"]
                else:
                    texts[item_id] = item_text(rec)
            elif kind == "end":
                fields = {k: rec[k] for k in _RESULT_KEYS if k in rec}
                if is_live(item_id):
                    last_end[item_id] = fields
                elif rec["state"] == ItemState.DONE.value and item_id in texts:
                    batch.append(_arch(item_id, texts.pop(item_id), fields))
            if len(batch) >= _ARCHIVE_BATCH:
                archive.append(batch, sync=False)
                archived += len(batch)
                batch = []
        # Finished items without a done `end` (a salvaged journal): archived bare.
        batch += [_arch(i, text, {}) for i, text in sorted(texts.items())]
        archive.append(batch, sync=False)
    return archived + len(batch), last_end, live_texts


def _arch(item_id: int, text: str, fields: Record) -> Record:
    return {"t": "arch", "id": item_id, **item_fields(text), **fields}


def _ignore(record: Record, loc: int) -> None:
    """Replay callback for a file read only to validate it."""


def _open_archive(folder: QueueFolder, name: str, size: int, *, ops: FileOps) -> JournalFile:
    """The archive, open for appending after the ``size`` bytes the current
    snapshot vouches for (a crashed compaction's tail is cut away)."""
    path = folder.path / name
    if not folder.exists(name):
        fd = folder.open_file(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
        ops.fsync_dir(folder.itself())
    archive = JournalFile(folder, name, ops=ops)
    archive.open()
    try:
        archive.replay(_ignore, repair=False)
        if archive.offset < size:
            raise DamagedState(f"{path}: shorter than the journal says ({archive.offset} < {size})")
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
