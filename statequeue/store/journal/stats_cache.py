"""A cache of `statequeue stats`' summary at a journal position, so that
`stats` on a big queue decodes only the records written after it.

``stats.ckpt`` is never the truth: the journal and the archive are. Like
``state.ckpt`` it names the files it summarises (inode, the checksum of the
first record, the last bytes before the position) and is used only when all
of them still match, its own checksum holds and its format is this one;
anything else means that part is computed again from the files. Losing it
costs only time, so it is written temp + rename without fsync.

It holds two summaries (``StatsBuilder`` state, which merges):

- ``archive``: of the archive's first ``size`` bytes. The archive is
  append-only up to the size the snapshot vouches for, so a summary of a
  prefix is extended by scanning what was appended since (a compaction that
  did not leave a ``total``).
- ``total``: of the archive up to its size plus the journal up to a position,
  with what the journal scan carries across lines (starts awaiting their end,
  runner hosts). `stats` folds the journal records after that position.

A compaction stages a ``total`` for the journal it is about to put in place
(``stage``, one call, in step 2), renamed with the journal in step 3: the
attempts of the archive plus the new journal's body are those of the archive
plus the old journal up to the compaction's position, so the summary carries
over without decoding the archived items again.

Layout: ``MAGIC``, 8-byte header length, header JSON, the retried-item bitmaps
(zlib), CRC32 of everything before it.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import zlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from statequeue.core.errors import StateQueueError
from statequeue.stats.rates import RecentRate, Throughput
from statequeue.stats.sketch import QuantileSketch
from statequeue.store.journal.attempt_scan import scan_range_batches
from statequeue.store.journal.cache_file import write_cache
from statequeue.store.journal.compaction_files import NEW_STATS
from statequeue.store.journal.integrity import ARCHIVE, STATS_CACHE
from statequeue.store.journal.journal_file import read_line

if TYPE_CHECKING:
    from statequeue.stats.figures import StatsBuilder
    from statequeue.store.journal.compaction import Position
    from statequeue.store.journal.folder import QueueFolder
    from statequeue.store.journal.journal_file import JournalFile

NAME = STATS_CACHE
MAGIC = b"SQSTATS2\n"  # 2: --verify's attempts left out of durations
STAGED = NEW_STATS
"""A compaction's staged cache (``online_compaction.MARK`` names its temp files so)."""
_TAIL = 32  # bytes just before a position that must still be there


@dataclass
class Summary:
    """A summary and what it covers; ``journal`` None for an archive-only one."""

    builder: StatsBuilder
    archive: dict[str, Any] | None
    journal: dict[str, Any] | None = None
    started: dict[int, bytes] = field(default_factory=dict)
    hosts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class File:
    """One file to summarise, noted under the queue lock: its own descriptor,
    and the bytes of it that count (``end``)."""

    fd: int
    inode: int
    end: int
    path: str


# -- positions -----------------------------------------------------------------------


def position(f: File) -> dict[str, Any] | None:
    """What identifies ``f`` up to ``f.end`` (None for an empty or unreadable file)."""
    if f.end <= 0:
        return None
    try:
        head = _head(f.fd)
        tail = os.pread(f.fd, _TAIL, max(0, f.end - _TAIL))
    except OSError:
        return None
    if head is None or not tail:
        return None
    return {"inode": f.inode, "offset": f.end, "head": head, "tail": tail.hex()}


def covers(f: File, where: dict[str, Any] | None) -> int | None:
    """The offset ``where`` names if it is a prefix of ``f`` (same inode and
    first record, the same bytes before it, not past ``f.end``); 0 for an
    empty prefix (None ``where``); None if it is not ``f``'s."""
    if where is None:
        return 0
    try:
        offset = int(where["offset"])
        if where["inode"] != f.inode or not 0 < offset <= f.end or _head(f.fd) != where["head"]:
            return None
        tail = os.pread(f.fd, _TAIL, max(0, offset - _TAIL))
    except (KeyError, TypeError, ValueError, OSError):
        return None
    return offset if tail.hex() == where["tail"] else None


def _head(fd: int) -> str | None:
    """The checksum field of the file's first record."""
    line = read_line(fd, 0)
    if len(line) < 11 or not line.endswith(b"\n"):
        return None
    return line[-11:-3].decode("ascii", "replace")


# -- reading and extending -------------------------------------------------------------


def summarise(folder: QueueFolder, archive: File | None, journal: File, *, save: bool) -> Summary:
    """The summary of every attempt in ``archive`` then ``journal`` (each up
    to its ``end``): from the cache where it still matches, plus a scan of
    what came after it; saved back (when ``save``) if anything was scanned."""
    from statequeue.stats.figures import StatsBuilder  # lazy: start-up time

    cached = load(folder)
    total = cached.get("total")
    if total is not None and archive_matches(archive, total.archive):
        start = covers(journal, total.journal)
        if start is not None:
            if fold(total, journal, start) and save:
                write(folder, NAME, cached.get("archive"), total)
            return total
    part = _archive_part(cached.get("archive"), archive)
    total = Summary(StatsBuilder(now=0.0), part.archive)
    total.builder.merge(part.builder)  # archive first, as one pass reads them
    fold(total, journal, 0)
    if save:
        write(folder, NAME, part, total)
    return total


def _archive_part(cached: Summary | None, archive: File | None) -> Summary:
    """The archive's summary: the cached one extended by what was appended
    since, if it is a prefix of the archive; else the whole archive's."""
    from statequeue.stats.figures import StatsBuilder  # lazy: start-up time

    start = None if cached is None or archive is None else covers(archive, cached.archive)
    part = cached if cached is not None and start is not None else None
    if part is None:
        part, start = Summary(StatsBuilder(now=0.0), None), 0
    if archive is not None:
        fold(part, archive, start or 0, carry=False)
        part.archive = position(archive)
    return part


def archive_matches(archive: File | None, where: dict[str, Any] | None) -> bool:
    """Whether ``where`` names exactly ``archive`` as it is now (or both are empty)."""
    if archive is None or archive.end == 0:
        return where is None
    return where is not None and covers(archive, where) == archive.end


def fold(part: Summary, f: File, start: int, *, carry: bool = True) -> bool:
    """Fold ``f``'s attempts from ``start`` to its end into ``part`` and move
    its position there; False if there was nothing to read."""
    if start >= f.end:
        return False
    started, hosts = (part.started, part.hosts) if carry else ({}, {})
    batches = scan_range_batches(f.fd, start, f.end, path=f.path, started=started, hosts=hosts)
    part.builder.add_all(batches)
    if carry:
        part.journal = position(f)
    return True


# -- the compaction hook ---------------------------------------------------------------


def stage(
    folder: QueueFolder, *, old: Position, new: JournalFile, archived: tuple[int, int]
) -> None:
    """Stage (as ``STAGED``) the summary of the queue a compaction is putting
    in place: its archive up to ``archived[1]`` bytes plus ``new`` (the new
    journal's body, written and synced), which hold the attempts that the
    archive up to ``archived[0]`` and the old journal up to ``old`` hold.
    Extends the current cache by the old journal's records since it (the
    whole queue, if there is none). Step 2 of a compaction, holding only
    ``compact.lock``, right after the body is written: ``new`` must end
    where the body ends (nothing copied from the old journal after ``old``
    yet; the records after ``old`` are folded by the next `stats` from the
    new journal). It is a cache: any failure only leaves it unstaged."""
    with contextlib.suppress(OSError, StateQueueError):
        _stage(folder, old, new, archived)


STAGE_BUDGET = 64 * 1024 * 1024
"""Bytes of records a compaction folds for the summary it stages, at most
(about 0.7 s of decoding here). Auto-compaction (every 100,000 dead records,
~13 MB) stays well inside it, so a run's first compaction builds the cache and
each later one only extends it; a big queue never summarised is compacted at
full speed instead, and its first `stats` builds the cache."""


def _stage(folder: QueueFolder, old: Position, new: JournalFile, archived: tuple[int, int]) -> None:
    before, after = archived
    fd = folder.open_file(ARCHIVE, os.O_RDONLY)
    try:
        inode, path = os.fstat(fd).st_ino, str(folder.path / ARCHIVE)
        archive = File(fd, inode, before, path) if before else None
        journal = File(old.fd, old.inode, old.offset, str(old.path))
        if _uncovered(folder, archive, journal) > STAGE_BUDGET:
            return
        total = summarise(folder, archive, journal, save=False)
        total.journal = position(File(new.fd, new.inode, new.offset, str(new.path)))
        total.archive = position(File(fd, inode, after, path))
        # The archive's own summary stays true of its prefix: kept, for a
        # later compaction that stages nothing (then it is extended).
        part = load(folder).get("archive")
        if part is not None and covers(File(fd, inode, after, path), part.archive) is None:
            part = None
        if total.journal is not None:
            write(folder, STAGED, part, total, staged=True)
    finally:
        os.close(fd)


def refresh(folder: QueueFolder, archive: File | None, journal: File) -> None:
    """Bring the saved summary up to ``journal.end`` after a state checkpoint
    (``stats_refresh``): always when a cached summary covers a prefix of the
    files (only what came after it is read), else only within
    ``STAGE_BUDGET``. A big queue that has no summary yet (one written by an
    older statequeue, a copied folder) is left to its first `stats`, as the
    compaction hook leaves it, instead of costing a run or a `status` the
    scan of the whole queue."""
    if _uncovered(folder, archive, journal, covered_prefix=True) <= STAGE_BUDGET:
        summarise(folder, archive, journal, save=True)


def _uncovered(
    folder: QueueFolder, archive: File | None, journal: File, *, covered_prefix: bool = False
) -> int:
    """Bytes of ``archive`` and ``journal`` that no cached summary covers."""
    cached = load(folder)
    total = cached.get("total")
    if total is not None and archive_matches(archive, total.archive):
        start = covers(journal, total.journal)
        if start is not None:  # with ``covered_prefix``: any extension is due
            return 0 if covered_prefix else journal.end - start
    part = cached.get("archive")
    start = None if part is None or archive is None else covers(archive, part.archive)
    return (archive.end - (start or 0) if archive is not None else 0) + journal.end


# -- a summary as JSON -------------------------------------------------------------


def export(b: StatsBuilder) -> tuple[dict[str, Any], bytes]:
    """A summary as JSON-ready values and its retried-item bitmap; ``restore``
    reads them back."""
    sk, tp, rr = b.sketch, b.throughput, b.recent
    meta = {
        "attempts": b.attempts,
        "failed": b.failed,
        "sketch": [sk.alpha, sk.count, sk.total, _finite(sk.min), _finite(sk.max)],
        "buckets": list(sk.buckets.items()),
        "slowest": b.slowest,
        "throughput": [tp.width, tp.limit, tp.lo, tp.hi, list(tp.counts.items())],
        "recent": [rr.window, rr.first, _finite(rr.newest), list(rr.seconds.items())],
        "recent_began": sorted(rr.began.items()),
        "reasons": [[r, *group] for r, group in b.reasons.items()],
        "runners": [[r, *group] for r, group in b.runners.items()],
    }
    return meta, bytes(b.retried)


def restore(meta: dict[str, Any], retried: bytes) -> StatsBuilder:
    """A builder holding what ``export`` gave (ValueError, KeyError or
    TypeError if ``meta`` is not such)."""
    from statequeue.stats.figures import StatsBuilder  # lazy: start-up time

    b = StatsBuilder(now=0.0)
    b.attempts, b.failed = int(meta["attempts"]), int(meta["failed"])
    alpha, count, total, low, high = meta["sketch"]
    b.sketch = QuantileSketch(float(alpha))
    b.sketch.count, b.sketch.total = int(count), float(total)
    b.sketch.min = math.inf if low is None else float(low)
    b.sketch.max = -math.inf if high is None else float(high)
    b.sketch.buckets = {int(k): int(n) for k, n in meta["buckets"]}
    b.slowest = [(float(d), int(i), int(a)) for d, i, a in meta["slowest"]]
    heapq.heapify(b.slowest)
    width, limit, lo, hi, counts = meta["throughput"]
    b.throughput = Throughput(float(width), int(limit))
    b.throughput.lo, b.throughput.hi = lo, hi
    b.throughput.counts = {int(k): int(n) for k, n in counts}
    window, first, newest, seconds = meta["recent"]
    b.recent = RecentRate(float(window))
    b.recent.first = first
    b.recent.newest = -math.inf if newest is None else newest
    b.recent.seconds = {int(k): int(n) for k, n in seconds}
    # KeyError for a cache written before rates began at the starts: the
    # summary is computed again from the files, as for any other format.
    b.recent.began = {int(k): float(t) for k, t in meta["recent_began"]}
    b.reasons = {str(r): [int(n), int(i), int(a)] for r, n, i, a in meta["reasons"]}
    b.runners = {str(r): [int(n), int(f), str(h)] for r, n, f, h in meta["runners"]}
    b.retried = bytearray(retried)
    return b


def _finite(value: float) -> float | None:
    """``value``, or None for the infinities an empty part starts from (not JSON)."""
    return value if math.isfinite(value) else None


# -- the file ------------------------------------------------------------------------


def load(folder: QueueFolder) -> dict[str, Summary]:
    """The cached summaries ("archive", "total") that parse; {} for none."""

    try:
        data = folder.read_bytes(NAME)
    except (OSError, StateQueueError):
        return {}
    if len(data) < len(MAGIC) + 12 or not data.startswith(MAGIC):
        return {}
    body = data[:-4]
    if zlib.crc32(body) != int.from_bytes(data[-4:], "little"):
        return {}
    start = len(MAGIC) + 8
    size = int.from_bytes(data[len(MAGIC) : start], "little")
    found: dict[str, Summary] = {}
    try:
        header = orjson.loads(body[start : start + size])
        blobs = body[start + size :]
        for key in ("archive", "total"):
            entry = header.get(key)
            if entry is None:
                continue
            retried = zlib.decompress(blobs[: entry["blob"]])
            blobs = blobs[entry["blob"] :]
            found[key] = Summary(
                restore(entry["summary"], retried),
                entry.get("archive"),
                entry.get("journal"),
                {int(k): bytes.fromhex(v) for k, v in entry.get("started", {}).items()},
                dict(entry.get("hosts", {})),
            )
    except (KeyError, TypeError, ValueError, AttributeError, zlib.error, orjson.JSONDecodeError):
        return {}
    return found


def write(
    folder: QueueFolder,
    name: str,
    archive: Summary | None,
    total: Summary | None,
    *,
    staged: bool = False,
) -> bool:
    """Save the summaries as ``name`` (temp + rename; or, ``staged``, straight
    to ``name``, a temp file the compaction renames). False if it could not."""
    header: dict[str, Any] = {"v": 1}
    blobs: list[bytes] = []
    for key, part in (("archive", archive), ("total", total)):
        if part is None:
            continue
        meta, retried = export(part.builder)
        blob = zlib.compress(retried, 1)
        blobs.append(blob)
        header[key] = {
            "summary": meta,
            "blob": len(blob),
            "archive": part.archive,
            "journal": part.journal,
            "started": {str(k): v.hex() for k, v in part.started.items()},
            "hosts": part.hosts,
        }
    encoded = orjson.dumps(header)
    body = b"".join((MAGIC, len(encoded).to_bytes(8, "little"), encoded, *blobs))
    return _replace(folder, name, body + zlib.crc32(body).to_bytes(4, "little"), staged=staged)


def _replace(folder: QueueFolder, name: str, payload: bytes, *, staged: bool) -> bool:
    return write_cache(folder, name, (payload,), staged=name if staged else None)
