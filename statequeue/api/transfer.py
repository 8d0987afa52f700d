"""Moving a queue between stores: `statequeue export` and `statequeue import`.

The format is NDJSON: a header line, then one line per item in id order::

    {"statequeue_export": 1, "queue": "crawl", "items": 2, "paused": false, "exported_at": ...}
    {"id": 1, "item": "a.pdf", "state": "done", "attempts": 1, ..., "history": [{"t": "end", ...}]}

An item that is not valid UTF-8 has ``item_b64`` (its exact bytes) beside
``item``, as every JSON view gives it. The header's ``items`` count lets
import tell a truncated file from a whole one.

Import reads and checks the whole file before it changes anything.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import orjson

from statequeue.core.errors import ImportRefused, InvalidExport, UsageError
from statequeue.core.exported import FORMAT_VERSION, ExportedItem, check_id_gaps, parse_item
from statequeue.core.fileio import DEFAULT_OPS
from statequeue.core.output_path import (
    check_writable_place,
    creation_refused,
    open_in_place,
    output_failed,
    output_target,
)

if TYPE_CHECKING:
    from statequeue.api.queue import Queue

HEADER_KEY = "statequeue_export"
# The longest lines an import reads, so an input that never ends a line
# (/dev/zero) is refused, not held until memory runs out. A header is a few
# short fields; an item line holds its history, every attempt's result
# included (a command's is at most 1 MiB), so its bound is far above any
# export statequeue writes in practice.
MAX_HEADER_LINE = 1 << 16
MAX_EXPORT_LINE = 1 << 28


@dataclass(frozen=True)
class ExportHeader:
    """The first line of an export."""

    queue: str
    items: int
    paused: bool = False


class CheckedExport(NamedTuple):
    """A whole export, read and checked (``read_export``): ready to import."""

    header: ExportHeader
    entries: list[ExportedItem]


@dataclass(frozen=True)
class ImportResult:
    """What an import did: items added, items already in the target (skipped)."""

    added: int
    skipped: int
    paused: bool


def export_lines(queue: Queue) -> Iterator[bytes]:
    """The export of ``queue``, line by line (each ends with a newline)."""
    store = queue.store
    paused = store.is_paused()
    # The count goes in the header, first: the items are gathered before it.
    items = list(store.export_items())
    header = {
        HEADER_KEY: FORMAT_VERSION,
        "queue": queue.name,
        "items": len(items),
        "paused": paused,
        "exported_at": round(time.time(), 3),
    }
    yield orjson.dumps(header) + b"\n"
    for entry in items:
        yield orjson.dumps(entry.to_json()) + b"\n"


def export_queue(queue: Queue, out: IO[bytes]) -> int:
    """Write ``queue``'s export to ``out``; returns the number of items."""
    count = -1
    for line in export_lines(queue):
        out.write(line)
        count += 1
    return count


def export_to_file(queue: Queue, path: Path) -> int:
    """Write ``queue``'s export to ``path`` whole or not at all: a temp file
    in the same folder, fsynced, renamed over ``path``, the folder fsynced.
    A device, FIFO or socket there is written through (core/output_path.py)."""
    path, in_place = output_target(path)
    if in_place:
        try:
            with open(open_in_place(path), "wb") as out:
                return export_queue(queue, out)
        except OSError as exc:
            raise output_failed("writing", path, exc) from None
    check_writable_place(path)  # a folder, a missing folder: bad input, not a failing disk
    folder = path.parent
    tmp = folder / f".{path.name}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        # A bad place (gone, /proc, read-only) is not a failing disk.
        raise (creation_refused(path, exc) or output_failed("creating", tmp, exc)) from None
    try:
        with open(fd, "wb") as out:
            count = export_queue(queue, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        DEFAULT_OPS.fsync_dir(str(folder))
    except OSError as exc:
        raise output_failed("writing", path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return count


def export_file_lines(stream: IO[bytes] | io.IOBase) -> Iterator[bytes]:
    """The lines of an export read from ``stream``, each at most
    MAX_HEADER_LINE (the first) or MAX_EXPORT_LINE bytes (InvalidExport
    after reading that much of a longer one, with nothing more held)."""
    limit, number = MAX_HEADER_LINE, 1
    while line := stream.readline(limit + 1):
        if len(line) > limit:
            raise InvalidExport(
                f"line {number}: longer than {limit} bytes: "
                + ("not a statequeue export" if number == 1 else "not an export line")
            )
        yield line
        limit, number = MAX_EXPORT_LINE, number + 1


def read_export(lines: Iterable[bytes]) -> CheckedExport:
    """Parse and check a whole export (its lines; an open file is read by
    ``export_file_lines``); InvalidExport naming the first problem."""
    if isinstance(lines, io.IOBase):
        lines = export_file_lines(lines)
    header: ExportHeader | None = None
    entries: list[ExportedItem] = []
    ids: dict[int, int] = {}  # id -> line
    texts: dict[str, tuple[int, int]] = {}  # item text -> (line, id)
    number = 0
    for number, raw in enumerate(lines, start=1):
        if not isinstance(raw, bytes | bytearray):  # open(path) without "rb" gives str lines
            raise UsageError(
                f"line {number} is {type(raw).__name__}, not bytes: "
                "open the export in binary mode, open(path, 'rb')"
            )
        if not raw.endswith(b"\n"):
            raise InvalidExport(f"line {number}: cut short (no newline): the file is truncated")
        obj = _json(raw, number)
        if header is None:
            header = _header(obj)
            continue
        entry = parse_item(obj, number)
        if entry.item_id in ids:
            raise InvalidExport(
                f"line {number}: item id {entry.item_id} appears twice "
                f"(also on line {ids[entry.item_id]})"
            )
        # An item is its text (enqueue and import skip a text already held):
        # two ids for one text are a malformed export, not two items, and the
        # second must not vanish as "skipped".
        first, first_id = texts.setdefault(entry.item, (number, entry.item_id))
        if first != number:
            raise InvalidExport(
                f"line {number}: the item of id {entry.item_id} is also on line {first} "
                f"(id {first_id}): an export holds each item once"
            )
        ids[entry.item_id] = number
        entries.append(entry)
    if header is None:
        raise InvalidExport("empty input: not a statequeue export")
    if len(entries) != header.items:
        raise InvalidExport(
            f"the header promises {header.items} item(s) but {len(entries)} follow: "
            "the file is truncated or was edited"
        )
    check_id_gaps(ids)
    return CheckedExport(header, entries)


def _json(raw: bytes, number: int) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        what = "not a statequeue export" if number == 1 else "not valid JSON"
        raise InvalidExport(f"line {number}: {what}") from None


def _header(obj: Any) -> ExportHeader:
    if not isinstance(obj, dict) or HEADER_KEY not in obj:
        raise InvalidExport(f"line 1: not a statequeue export (no {HEADER_KEY!r} header)")
    version = obj[HEADER_KEY]
    if version != FORMAT_VERSION:
        raise InvalidExport(
            f"line 1: export format version {version!r}; this statequeue reads version "
            f"{FORMAT_VERSION}"
        )
    items, queue = obj.get("items"), obj.get("queue")
    if type(items) is not int or items < 0 or not isinstance(queue, str):
        raise InvalidExport("line 1: the header needs a queue name and an item count")
    paused = obj.get("paused", False)
    if not isinstance(paused, bool):  # "yes" imported as not paused
        raise InvalidExport("line 1: the header's 'paused' must be a JSON boolean, true or false")
    return ExportHeader(queue=queue, items=items, paused=paused)


def import_queue(queue: Queue, lines: Iterable[bytes], *, merge: bool = False) -> ImportResult:
    """Read an export into ``queue``: ``read_export``, then ``import_entries``
    (the whole input is checked first: bad input changes nothing)."""
    header, entries = read_export(lines)
    return import_entries(queue, header, entries, merge=merge)


def import_entries(
    queue: Queue, header: ExportHeader, entries: list[ExportedItem], *, merge: bool = False
) -> ImportResult:
    """Import checked entries into ``queue``. A queue holding an item the
    export does not is refused (ImportRefused) unless ``merge``; one holding
    only items of the export (an import that was interrupted) is completed. A
    paused export pauses the queue first, so no runner starts on half an import."""
    store = queue.store
    if not merge:
        wanted = {e.item for e in entries}
        strangers = sum(1 for view in store.items() if view.item not in wanted)
        if strangers:
            raise ImportRefused(
                f"queue {queue.name!r} already holds {strangers} item(s) that the export "
                "does not; use --merge to add only the items it lacks"
            )
    if header.paused:
        store.set_paused(True)
    result = store.import_items(entries)
    return ImportResult(added=result.added, skipped=result.skipped, paused=header.paused)
