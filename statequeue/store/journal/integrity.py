"""What makes a queue folder damaged rather than new or torn (promise 5).

Opening refuses, and changes nothing, when a journal is missing while the
folder shows a queue lived there, when it does not start with its snapshot
header, when it ends before the records that header says follow it (a cut
after a compaction), or when it no longer has records its own checkpoint saw
(those were fsynced, so acknowledged). A genuinely new queue is a folder that
is missing or holds nothing of one. `fsck` reports the same conditions.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from statequeue.core.errors import DamagedState, NoAccess, UsageError
from statequeue.core.records import decode
from statequeue.store.journal import checkpoint, key_index
from statequeue.store.journal.cache_file import Found
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.journal_file import JournalFile, read_line
from statequeue.store.records.state import QueueState

JOURNAL = "journal.jsonl"
ARCHIVE = "archive.jsonl"
STATS_CACHE = "stats.ckpt"  # stats_cache.NAME: that module loads only when `stats` runs
ARCHIVE_INDEX = "archive.ckpt"  # archive_index.NAME: that module loads only when `result` runs


def archive_missing(path: object) -> DamagedState:
    """The error every reader raises when the archive the journal vouches for is gone."""
    return DamagedState(
        f"{path} is missing but the journal refers to it "
        "(run `statequeue fsck --repair` to salvage the rest)"
    )


# What a queue folder holds only once its journal has existed. Empty
# subfolders and the lock file are not in it: a creation that died before
# its journal was renamed into place leaves them, and nothing acknowledged.
_HISTORY = (
    ARCHIVE,
    checkpoint.NAME,
    key_index.KEYS_NAME,
    STATS_CACHE,
    ARCHIVE_INDEX,
    "claims.lock",
)
_HISTORY_DIRS = ("logs", "claims", "runners")
# Every name statequeue makes at a queue folder's top level ("rate": run
# --rate's bucket; "compact.lock": online compaction's; "reserve": a run's
# space reserve, space_reserve.NAME), besides its hidden temporary files (a
# leading dot) and the copies fsck --repair keeps. The reserve says nothing
# of a queue's history: a run makes it, and removes it on a full disk.
QUEUE_ENTRIES = frozenset(
    {*_HISTORY, *_HISTORY_DIRS, JOURNAL, "lock", "compact.lock", "rate", "reserve"}
)


def foreign_entries(path: Path) -> list[str]:
    """The entries at the top of queue folder ``path`` that statequeue did not
    make (a user's file put there): `drop` refuses to delete them with it."""
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    return [
        n
        for n in names
        if n not in QUEUE_ENTRIES and not n.startswith(".") and ".damaged-" not in n
    ]


_REPAIR = "(run `statequeue fsck --repair` to salvage the valid records)"


def queue_history(folder: QueueFolder) -> list[str]:
    """The files in ``folder`` that show a queue lived there (empty for a
    folder that is empty, or left by a creation that died early). Looked up
    relative to the open folder, never through a link (a linked subfolder
    raises UnsafeFolder, as opening the queue would)."""
    found = [name for name in _HISTORY if folder.exists(name)]
    found += sorted(n for n in folder.names() if n.startswith(f"{JOURNAL}.damaged-"))
    for sub in _HISTORY_DIRS:
        found += [f"{sub}/{entry}" for entry in sorted(folder.names(sub))[:1]]
    return found


def holds_queue(path: Path) -> bool:
    """Whether the folder ``path`` holds a queue: its journal, or what only a
    queue leaves (an archive, checkpoints, logs, claims) without one (a
    damaged queue, which opening refuses). Looked up
    relative to the folder opened and checked as any queue folder is (a link
    or another user's folder raises UnsafeFolder); False for a plain file.
    A link or another user's folder that holds neither a journal nor an
    archive is no queue either: `queues --home /etc` is no reason to advise
    `rm /etc/localtime` or `chown` of /etc/postgresql. That look is a stat
    through it, never an open; one that cannot look lets the open say why."""
    if _foreign_without_queue(path):
        return False
    try:
        folder = QueueFolder.open(path, create=False)
    except NoAccess:
        raise
    except UsageError:  # a file beside the queues, not a folder
        return False
    try:
        # A journal, or what only a queue leaves (its journal then lost: a
        # damaged queue, which `queues` lists and opening refuses).
        return folder.exists(JOURNAL) or bool(queue_history(folder))
    finally:
        folder.close()


def _foreign_without_queue(path: Path) -> bool:
    """Whether ``path`` is a link or another user's entry that holds no queue's files."""
    try:
        if not path.is_symlink() and path.lstat().st_uid == os.geteuid():
            return False
        return not any((path / name).exists() for name in (JOURNAL, ARCHIVE))
    except OSError:  # cannot look (permission denied): the open says why
        return False


def refuse_if_not_new(folder: QueueFolder) -> None:
    """Raise DamagedState if ``folder`` has no journal but a queue lived there."""
    history = queue_history(folder)
    if history:
        raise DamagedState(
            f"{folder.shown(JOURNAL)} is missing but the folder still holds "
            f"{', '.join(history[:3])}; "
            "refusing to start an empty queue in its place "
            "(run `statequeue fsck --repair` to rebuild it)"
        )


def refuse_if_incomplete(
    journal: JournalFile, state: QueueState, found: checkpoint.Restore
) -> None:
    """Raise DamagedState unless ``journal`` (just replayed into ``state``,
    nothing cut yet) starts with its snapshot header and holds every record
    that header and the checkpoint vouch for: a cut there is damage, not a
    torn tail."""
    path = journal.path
    first = decode(read_line(journal.fd, 0).removesuffix(b"\n")) if journal.lines else None
    if first is None or first.get("t") != "snap":
        raise DamagedState(
            f"{path}: line 1 is not a valid snapshot header (the file is empty, cut or "
            "overwritten); refusing to open (run `statequeue fsck --repair` to rebuild it)"
        )
    missing = state.snap_end - (journal.last_seq or 0)
    if missing > 0:
        raise DamagedState(
            f"{path}: ends {missing} record(s) short of what its snapshot header says "
            f"follows it (cut after a compaction); refusing to open {_REPAIR}"
        )
    if found.found is Found.AHEAD:
        raise DamagedState(
            f"{path}: {path.parent / checkpoint.NAME} saw {found.lines} fsynced record(s) "
            f"({found.offset} bytes) but the journal has {journal.lines} that follow on: "
            f"acknowledged records were lost; refusing to open {_REPAIR}"
        )


def refuse_if_archive_short(folder: QueueFolder, state: QueueState) -> None:
    """Raise DamagedState when the archive the journal's header vouches for is
    missing or shorter than the header says: the results of compacted items
    are gone, and a writer that went on would hide it (promise 5). One lstat,
    only for a queue that was ever compacted."""
    if not state.archive_size:
        return
    try:
        found = folder.stat(ARCHIVE)
    except FileNotFoundError:
        raise archive_missing(folder.shown(ARCHIVE)) from None
    if not stat.S_ISREG(found.st_mode):  # a folder or a link put in its place
        raise DamagedState(
            f"{folder.shown(ARCHIVE)} is not a regular file (a folder or a link in its place); "
            "refusing to open (move it aside, then run `statequeue fsck --repair`)"
        )
    size = found.st_size
    if size < state.archive_size:
        raise DamagedState(
            f"{folder.shown(ARCHIVE)}: shorter than the journal says ({size} < "
            f"{state.archive_size} bytes): archived results were lost; refusing to open "
            "(run `statequeue fsck --repair` to salvage the rest)"
        )
