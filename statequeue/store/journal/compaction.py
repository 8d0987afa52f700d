"""Compaction: rewrite the live journal as a snapshot plus its exceptions.

It runs online (``store/online_compaction.py`` drives it): the queue lock is
held only to note a position of the journal and, at the end, to swap files.
Its steps, in this order, so that a crash at any point leaves a readable queue:

1. Under the queue lock: note the journal's position P (inode, offset, last
   seq) and a copy of the state as of P. Records before P never change: the
   journal is append-only until a compaction renames another file over it,
   and only one compaction runs at a time (it holds ``compact.lock``).
2. Without the queue lock: cut the archive back to the size the current
   snapshot vouches for (drops what an earlier, crashed compaction appended),
   append the items finished as of P with their results, fsync it. Write the
   new journal to a temp file (snapshot header, one ``item`` record per item
   unfinished at P, the live runners), fsync it, stage the keys index of it,
   copy the complete records appended since P so far (renumbered; no lock:
   others go on appending), fsync, and stage a state checkpoint after them.
3. Under the queue lock: check the journal and the archive at their paths are
   still the files of step 1 (else give up: a repair replaced one) and that
   the bytes copied ahead are still there (a writer whose fsync failed cuts
   its records: else start again), copy the records appended since,
   fsync, rename it over the journal, fsync the folder, put the staged
   checkpoints in place. Every process that reopens then replays only what
   the swap copied.

A body that gains nothing (``online_compaction._gains_nothing``: nothing
archived, no smaller, fewer records dropped than kept) is never renamed in:
step 2 stops after writing it, and its temp file is removed.

Until step 3's rename, the old journal still names every item, and the
archive's extra tail is ignored (the snapshot's ``archive_size`` bounds it);
records appended meanwhile are in the old journal, and are copied under the
lock, so none can fall between the two files.

The archive is never cut on the word of a header alone: before step 2, what it
holds up to ``archive_size`` must be exactly the ``archived`` records the
header counts, and every record past it must be an item the journal still
names (one a crashed compaction archived early). Anything else is damage.
Step 2 keeps that true at every moment: it appends only items the journal (as
of P, so also now) names.

The header says how many records follow it (``follow``): ids below ``next_id``
are done unless an ``item`` record says otherwise, so a journal cut after the
header would otherwise turn unfinished items into done ones. It also lists the
ids below ``next_id`` that name no item (``absent``, left by `fsck --repair`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from statequeue.core import records
from statequeue.core.errors import CorruptJournal
from statequeue.core.exported import ARCHIVED_KEYS
from statequeue.core.fileio import FileOps
from statequeue.core.gcpause import gc_paused
from statequeue.core.models import ItemState
from statequeue.core.records import Record, item_fields, item_text
from statequeue.store.journal.archive_file import open_archive
from statequeue.store.journal.archive_lines import (
    END_PREFIX,
    ENQ_PREFIX,
    arch_line,
    done_at_once,
    enqueued,
    text_of,
)
from statequeue.store.journal.integrity import ARCHIVE
from statequeue.store.journal.journal_file import JournalFile
from statequeue.store.records.state import CODE, QueueState

if TYPE_CHECKING:
    from statequeue.store.journal.folder import QueueFolder


@dataclass(frozen=True)
class Position:
    """The journal as noted under the queue lock (step 1): the bytes before
    ``offset`` never change while ``inode`` is at the journal's path."""

    fd: int  # a descriptor of its own, so it outlives the store's reopening
    inode: int
    offset: int
    lines: int
    last_seq: int
    path: Path


@dataclass(frozen=True)
class Built:
    """What step 2 made: the archive's new extent and the new journal's body."""

    archived: int
    archive_size: int
    archive_inode: int


def build(
    *, pos: Position, folder: QueueFolder, state: QueueState, new: JournalFile, ops: FileOps
) -> Built:
    """Step 2: archive the items finished as of ``pos`` (whose records
    ``state`` reflects) and write the new journal's body to ``new`` (open on
    the temp file), both fsynced. Caller holds the compaction lock only."""
    archive = open_archive(folder, ARCHIVE, state, ops=ops)
    try:
        archived, last_end, texts, tries, enq_at = _archive_finished(pos, state, archive)
        archive.sync()  # the archive is durable before the journal stops naming these items
        built = Built(archived, archive.offset, archive.inode)
    finally:
        archive.close()
    live = list(state.live_ids())
    header: Record = {
        "t": "snap",
        "v": 1,
        "next_id": state.next_id,
        "archived": state.archived + archived,
        "archive_size": built.archive_size,
        "watermark": (live[0] - 1) if live else state.next_id - 1,
        "commands": state.commands[-20:],
        "paused": state.paused,
        "follow": len(live) + len(state.runners),
        # The journal this one continues: a follower of it (``read_events``)
        # knows which of the records copied after the snapshot it has read.
        "from": {"inode": pos.inode, "seq": pos.last_seq},
    }
    absent = state.absent_ids()
    if absent:
        header["absent"] = absent
    # The finishes and starts of the last minutes, which `status`'s rate and
    # start rate count: the records they came from are archived now (the
    # rate fell by a third after a compaction mid-run, to nothing after one
    # at the end). Within RATES_KEPT seconds of the compaction's position.
    for key, times in (("recent_ends", state.recent_ends), ("recent_starts", state.recent_starts)):
        if times:
            header[key] = [t for t in times if t >= times[-1] - RATES_KEPT]
    new.last_seq = pos.last_seq  # the header continues the old journal's numbering
    new.append([header], sync=False)
    for start in range(0, len(live), _ARCHIVE_BATCH):
        chunk = live[start : start + _ARCHIVE_BATCH]
        carried = [_item_record(i, state, texts, last_end, tries, enq_at) for i in chunk]
        new.append(carried, sync=False)
    new.append([dict(runner) for runner in state.runners.values()], sync=False)
    new.sync()
    return built


def _item_record(
    item_id: int,
    state: QueueState,
    texts: dict[int, str],
    last_end: dict[int, Record],
    tries: dict[int, list[Record]],
    enq_at: dict[int, float],
) -> Record:
    """The ``item`` record that carries live item ``item_id`` over (with its
    enqueue time, ``enq_at``, where the journal recorded one)."""
    text = texts.pop(item_id, None)
    item = state.items.get(item_id)
    if text is None:  # not in this journal's records: read it back
        text = state.get(item_id).text  # type: ignore[union-attr]
    rec: Record = {"t": "item", "id": item_id, **item_fields(text)}
    if item is None:  # fresh pending: no details
        rec.update(state=ItemState.PENDING.value, attempts=0, crashes=0)
    else:
        rec.update(state=item.state.value, attempts=item.attempts, crashes=item.crashes)
        if item.failures:
            rec["failures"] = item.failures  # --retries counts the episode on
        if item.deferrals:
            rec["deferrals"] = item.deferrals  # --max-deferrals counts them on
        extra = {"runner": item.runner, "reason": item.reason, "retry_at": item.not_before}
        rec.update((k, v) for k, v in extra.items() if v)
        if item.interrupted:
            rec["interrupted"] = True
        if item.checking:
            rec["checking"] = True  # its runner's death during the check is no crash
    if item_id in last_end:
        rec["last"] = last_end[item_id]  # a failed item keeps its result and stderr
    if item_id in tries:
        rec["tries"] = tries[item_id][-_TRIES_KEPT:]  # its attempts so far, for `show`
    if item_id in enq_at:
        rec["enq_at"] = enq_at[item_id]
    return rec


_ARCHIVE_BATCH = 20_000


def _archive_finished(
    pos: Position, state: QueueState, archive: JournalFile
) -> tuple[int, dict[int, Record], dict[int, str], dict[int, list[Record]], dict[int, float]]:
    """Stream the journal once: append every finished item (with its result and
    its attempts' summaries) to the archive as its final ``end`` is seen, and
    collect the last result, the text, the attempts and the enqueue time of
    each live item. Returns (items archived, live item id -> last result, live
    item id -> text, live item id -> attempts, live item id -> enqueue time).

    Done is terminal, so an ``end`` with state done is an item's last word; a
    text is held only from the item's enqueue to that ``end``. An item done
    at its first try, in the usual layout, takes the fast path
    (``archive_lines``): its ``arch`` line is spliced from its two lines.
    """
    out = _Archiving(state, archive)
    codes, ncodes, done_code = state.codes, len(state.codes), CODE[ItemState.DONE]
    texts, tries, emit = out.texts, out.tries, out.emit
    lines = _Lines(pos)
    with gc_paused():
        for line in lines:
            if line.startswith(ENQ_PREFIX):
                if _AT in line:  # the first line of an enqueue batch: its time
                    first = records.decode(line)
                    out.batch_at = first.get("at") if first is not None else None
                found = enqueued(line)
                if found is not None and 0 < found[0] < ncodes and codes[found[0]] == done_code:
                    texts[found[0]] = found[1]  # the JSON body: spliced, never decoded
                    continue
            else:
                out.batch_at = None  # a batch is one run of enq lines (start lines are skipped)
            if line.startswith(END_PREFIX):
                found = done_at_once(line)
                if found is not None and found[0] not in tries:
                    body = texts.pop(found[0], None)
                    if type(body) is bytes:
                        emit(arch_line(found[0], body, found[1], out.next_seq()))
                        continue
                    if body is not None:
                        texts[found[0]] = body
            out.general(lines.decoded(line))
        return out.finish()


class _Archiving:
    """What ``_archive_finished`` holds while it streams: the texts of
    finished items not archived yet (a JSON body from the fast path, or a
    text), the attempts kept per item, and the archive lines to write."""

    def __init__(self, state: QueueState, archive: JournalFile) -> None:
        self.state = state
        self.archive = archive
        self.texts: dict[int, str | bytes] = {}
        self.tries: dict[int, list[Record]] = {}  # held from enqueue (or carry-over) until archived
        self.live_texts: dict[int, str] = {}
        self.last_end: dict[int, Record] = {}
        self.finished: dict[int, Record] = {}
        self.enq_at: dict[int, float] = {}  # live item id -> its enqueue batch's time
        self.batch_at: object = None  # the time of the enqueue batch being read
        self.lines: list[bytes] = []
        self.archived = 0
        self.seq = archive.last_seq or 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def emit(self, line: bytes) -> None:
        self.lines.append(line)
        if len(self.lines) >= _ARCHIVE_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.lines:
            self.archive.append_encoded(b"".join(self.lines), len(self.lines), sync=False)
            self.archived += len(self.lines)
            self.lines = []

    def arch(self, item_id: int, text: str | bytes, fields: Record) -> None:
        rec = _arch(item_id, text_of(text) if type(text) is bytes else text, fields, self.tries)  # type: ignore[arg-type]
        rec["seq"] = self.next_seq()
        self.emit(records.encode(rec))

    def is_live(self, item_id: int) -> bool:
        codes = self.state.codes
        return 0 < item_id < len(codes) and codes[item_id] not in _DONE_CODES

    def general(self, rec: Record) -> None:
        """One record the fast path left, decoded."""
        kind = rec.get("t")
        item_id = rec.get("id", -1)
        if kind in ("enq", "item"):
            if self.is_live(item_id):
                self.live_texts[item_id] = item_text(rec)
                at = rec.get("enq_at", self.batch_at if kind == "enq" else None)
                if isinstance(at, int | float):
                    self.enq_at[item_id] = float(at)
                if "last" in rec:
                    self.last_end[item_id] = rec["last"]
            else:
                self.texts[item_id] = item_text(rec)
                if "last" in rec:  # an imported finished item: its result
                    self.finished[item_id] = rec["last"]
            if rec.get("tries"):
                self.tries[item_id] = rec["tries"]
        elif kind in ("intr", "set", "defer") or (
            kind == "end" and (rec["state"] != _DONE or item_id in self.tries)
        ):
            # An item done at its first attempt needs no summary: its
            # ``arch`` record is that attempt (the usual case costs nothing).
            # A user's retry or cancel (``set``) is kept too: it starts an
            # episode that `show` must still number after compaction.
            self.tries.setdefault(item_id, []).append(_try(rec))
        if kind == "end":
            fields = {k: rec[k] for k in ARCHIVED_KEYS if k in rec}
            if self.is_live(item_id):
                self.last_end[item_id] = fields
            elif rec["state"] == _DONE and item_id in self.texts:
                self.arch(item_id, self.texts.pop(item_id), fields)

    def finish(
        self,
    ) -> tuple[int, dict[int, Record], dict[int, str], dict[int, list[Record]], dict[int, float]]:
        # Finished items without a done `end` (a salvaged journal): archived bare.
        # Imported ones carry their result in ``last``.
        for item_id, text in sorted(self.texts.items()):
            self.arch(item_id, text, self.finished.get(item_id, {}))
        self.texts.clear()
        self.flush()
        return self.archived, self.last_end, self.live_texts, self.tries, self.enq_at


_AT = b',"at":'
_DONE = ItemState.DONE.value
_DONE_CODES = (0, CODE[ItemState.DONE])
_CHUNK = 4 << 20
# A ``start`` says nothing compaction keeps (the state copy has who runs
# what), and is a third of a busy journal: not decoded. Only a line that
# begins so is one (its first key is the record's own type).
_START = b'{"t":"start",'


class _Lines:
    """The lines before ``pos`` but ``start`` ones, a chunk at a time; and
    where a line is, for the message if it proves damaged."""

    def __init__(self, pos: Position) -> None:
        self.pos = pos
        self.first_line = 1  # of the chunk being read
        self.chunk: list[bytes] = []

    def __iter__(self) -> Iterator[bytes]:
        pos, offset = self.pos, 0
        while offset < pos.offset:
            data = os.pread(pos.fd, min(_CHUNK, pos.offset - offset), offset)
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one record longer than a chunk
                data = os.pread(pos.fd, pos.offset - offset, offset)
                cut = data.rfind(b"\n") + 1
                if cut == 0:
                    raise CorruptJournal(str(pos.path), self.first_line, "no record ends here")
            offset += cut
            self.first_line += len(self.chunk)
            self.chunk = data[:cut].split(b"\n")[:-1]
            for line in self.chunk:
                if not line.startswith(_START):
                    yield line

    def decoded(self, line: bytes) -> Record:
        """A line the fast path left, decoded (a replay validated them
        already; damage since is still refused)."""
        rec = records.decode(line)
        if rec is None:
            where = self.first_line + self.chunk.index(line)
            raise CorruptJournal(str(self.pos.path), where, "bad checksum or malformed record")
        return rec


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
    "logcut",
    "runner",
    "host",
    "started",  # an interrupted attempt's start (`report`'s timeline)
    "delay",  # a deferral's (``defer``): `show` lists it after compaction too
    "deferrals",
    # A failed attempt with a retry to come: `show` says "failed, retry due
    # at ..." of it; without it, after a compaction, "pending".
    "retry_at",
)
RATES_KEPT = 600.0
"""Seconds of finish and start times a snapshot keeps for the rates (the
window `status` counts is a minute; `run`'s progress line reads more)."""
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


def continues_from(header: Record, inode: object) -> bool:
    """Whether ``header`` is the snapshot of a compaction of the journal
    ``inode`` (not of another, nor a journal `fsck --repair` rewrote)."""
    source = header.get("from")
    return (
        header.get("t") == "snap"
        and isinstance(source, dict)
        and source.get("inode") == inode
        and header.get("seq") == source.get("seq", -1) + 1
    )


def unseen_after_compaction(
    found: list[Record], inode: object, seen: object, *, read_to_end: bool = False
) -> list[Record]:
    """A compacted journal's records for a follower of the journal it replaced
    (``inode``, read up to seq ``seen``): its snapshot, then the records copied
    after it that the follower has not read there (copied in order, renumbered
    from the snapshot's end: old seq = new seq - follow - 1).

    ``read_to_end``: the follower read the replaced journal to its end, so
    every record the snapshot stands for: the snapshot's header alone, as a
    mark, without its item states (as of the compaction's start, older than
    what the follower has read). Where the journal it followed is not the
    one replaced (two compactions since its last read), it gets this one
    whole: the states are all it can know of what it missed."""
    header = found[0]
    if not continues_from(header, inode) or not isinstance(seen, int):
        return found
    follow = header.get("follow", 0)
    body_end = header["seq"] + follow
    if read_to_end:
        return [header, *(r for r in found if r["seq"] > body_end and r["seq"] - follow - 1 > seen)]
    return [r for r in found if r["seq"] <= body_end or r["seq"] - follow - 1 > seen]
