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

The archive is never cut on the word of a header alone: before step 1, what it
holds up to ``archive_size`` must be exactly the ``archived`` records the
header counts, and every record past it must be an item the journal still
names (one a crashed compaction archived early). Anything else is damage.

The header says how many records follow it (``follow``): ids below ``next_id``
are done unless an ``item`` record says otherwise, so a journal cut after the
header would otherwise turn unfinished items into done ones. It also lists the
ids below ``next_id`` that name no item (``absent``, left by `fsck --repair`).
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
    archive = _open_archive(journal.folder, archive_path.name, state, ops=ops)
    try:
        archived, last_end, texts, tries = _archive_finished(journal, state, archive)
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
            if item.failures:
                rec["failures"] = item.failures  # --retries counts the episode on
            extra = {"runner": item.runner, "reason": item.reason, "retry_at": item.not_before}
            rec.update((k, v) for k, v in extra.items() if v)
            if item.interrupted:
                rec["interrupted"] = True
        if item_id in last_end:
            rec["last"] = last_end[item_id]  # a failed item keeps its result and stderr
        if item_id in tries:
            rec["tries"] = tries[item_id][-_TRIES_KEPT:]  # its attempts so far, for `show`
        lines.append(rec)
    for runner in state.runners.values():
        seq += 1
        lines.append({**runner, "seq": seq})
    lines[0]["follow"] = len(lines) - 1
    absent = state.absent_ids()
    if absent:
        lines[0]["absent"] = absent
    create_file(journal.folder, journal.name, lines, ops=ops)
    return CompactResult(
        bytes_before=bytes_before,
        bytes_after=journal.folder.stat(journal.name).st_size,
        archived=archived,
        archive_bytes=archive_size,
    )


# runner, host and timeout: `stats` groups the attempts by them after compaction.
_RESULT_KEYS = (
    "attempt",
    "dur",
    "exit",
    "sig",
    "result",
    "err",
    "reason",
    "at",
    "timeout",
    "runner",
    "host",
)
_ARCHIVE_BATCH = 20_000


def _archive_finished(
    journal: JournalFile, state: QueueState, archive: JournalFile
) -> tuple[int, dict[int, Record], dict[int, str], dict[int, list[Record]]]:
    """Stream the journal once: append every finished item (with its result and
    its attempts' summaries) to the archive as its final ``end`` is seen, and
    collect the last result, the text and the attempts of each live item.
    Returns (items archived, live item id -> last result, live item id -> text,
    live item id -> attempts).

    Done is terminal, so an ``end`` with state done is an item's last word; a
    text is held only from the item's enqueue to that ``end``.
    """
    texts: dict[int, str] = {}
    tries: dict[int, list[Record]] = {}  # held from enqueue (or carry-over) until archived
    live_texts: dict[int, str] = {}
    last_end: dict[int, Record] = {}
    batch: list[Record] = []
    archived = 0
    codes = state.codes
    done_codes = (0, CODE[ItemState.DONE])
    done = ItemState.DONE.value

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
                if rec.get("tries"):
                    tries[item_id] = rec["tries"]
            elif kind in ("intr", "set") or (
                kind == "end" and (rec["state"] != done or item_id in tries)
            ):
                # An item done at its first attempt needs no summary: its
                # ``arch`` record is that attempt (the usual case costs nothing).
                # A user's retry or cancel (``set``) is kept too: it starts an
                # episode that `show` must still number after compaction.
                tries.setdefault(item_id, []).append(_try(rec))
            if kind == "end":
                fields = {k: rec[k] for k in _RESULT_KEYS if k in rec}
                if is_live(item_id):
                    last_end[item_id] = fields
                elif rec["state"] == done and item_id in texts:
                    batch.append(_arch(item_id, texts.pop(item_id), fields, tries))
            if len(batch) >= _ARCHIVE_BATCH:
                archive.append(batch, sync=False)
                archived += len(batch)
                batch = []
        # Finished items without a done `end` (a salvaged journal): archived bare.
        batch += [_arch(i, text, {}, tries) for i, text in sorted(texts.items())]
        archive.append(batch, sync=False)
    return archived + len(batch), last_end, live_texts, tries


# ``crashes``/``attempts`` tell crash recovery and an uncounted give-back
# from a stop (see ``state.starts_episode``).
_TRY_KEYS = (
    "t",
    "seq",
    "attempt",
    "state",
    "exit",
    "sig",
    "reason",
    "dur",
    "at",
    "crashes",
    "crashed",
    "attempts",
    "timeout",
    "runner",
    "host",
)
_TRIES_KEPT = 50  # per item: the newest attempts' summaries (a result is kept whole anyway)


def _try(rec: Record) -> Record:
    """The summary of one attempt's outcome (an ``end``, or an ``intr`` when
    its runner died) that the item carries through compactions into the
    archive, so `show` still lists every attempt (issue 11, point 21)."""
    return {k: rec[k] for k in _TRY_KEYS if k in rec}


def _arch(item_id: int, text: str, fields: Record, tries: dict[int, list[Record]]) -> Record:
    rec: Record = {"t": "arch", "id": item_id, **item_fields(text), **fields}
    done = tries.pop(item_id, None)
    if done:
        rec["tries"] = done[-_TRIES_KEPT:]
    return rec


def _ignore(record: Record, loc: int) -> None:
    """Replay callback for a file read only to validate it."""


class _ArchiveCheck:
    """Replay callback that checks the archive against the snapshot header:
    ``archived`` records up to ``archive_size``, then only items the journal
    still names (locator >= 0: it holds their record)."""

    def __init__(self, state: QueueState) -> None:
        self.state = state
        self.vouched = 0
        self.strangers = 0

    def __call__(self, record: Record, loc: int) -> None:
        if record.get("t") != "arch":
            return
        if loc < self.state.archive_size:
            self.vouched += 1
            return
        item_id = record.get("id", 0)
        locs = self.state.locs
        if not (isinstance(item_id, int) and 0 < item_id < len(locs) and locs[item_id] >= 0):
            self.strangers += 1


def _open_archive(
    folder: QueueFolder, name: str, state: QueueState, *, ops: FileOps
) -> JournalFile:
    """The archive, open for appending after the ``archive_size`` bytes the
    current snapshot vouches for (a crashed compaction's tail is cut away,
    once it is shown to be one)."""
    size = state.archive_size
    path = folder.path / name
    if not folder.exists(name):
        if size:
            raise DamagedState(f"{path} is missing but the journal refers to it")
        fd = folder.open_file(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.close(fd)
        ops.fsync_dir(folder.itself())
    archive = JournalFile(folder, name, ops=ops)
    archive.open()
    try:
        check = _ArchiveCheck(state)
        archive.replay(check, repair=False)
        if archive.offset < size:
            raise DamagedState(f"{path}: shorter than the journal says ({archive.offset} < {size})")
        if check.vouched != state.archived or check.strangers:
            raise DamagedState(
                f"{path}: holds {check.vouched} record(s) where the journal says "
                f"{state.archived}, and {check.strangers} it does not name; refusing to "
                "compact (run `statequeue fsck`)"
            )
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
