"""The journal store's finished attempts, read straight from its files.

`stats` on a million-item queue must not decode three million records nor
hold them: the live journal is read a chunk at a time and only the lines
that can be an attempt (``end``, ``intr``, ``item``, ``arch``, and ``run`` for
hosts) are decoded;
a ``start`` line is kept undecoded until its attempt ends, and decoded only
if that ``end`` does not name its runner (records of an older statequeue).
The archive is streamed the same way, up to the size the snapshot vouches for.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from itertools import repeat
from operator import itemgetter
from typing import Any

import orjson

from statequeue.core.errors import DamagedState
from statequeue.core.records import Record, decode
from statequeue.stats.attempts import (
    Attempt,
    AttemptBatch,
    batch_of,
    batches_of,
    from_archived,
    from_crash,
    from_end,
    from_tries,
    joined_host,
    run_durations,
    start_time,
)

_CHUNK = 1 << 20  # a chunk's decoded records (dicts) take several times its size
_START = b'{"t":"start","id":'
_WANTED = (b'"t":"end"', b'"t":"intr"', b'"t":"item"', b'"t":"arch"', b'"t":"run"')


def scan_attempts(fd: int, end: int, *, path: str) -> Iterator[Attempt]:
    """The finished attempts recorded in the first ``end`` bytes of ``fd``
    (a journal or an archive), read from a duplicate of ``fd`` taken now, so
    the caller may iterate after releasing the lock."""
    return _owned(os.dup(fd), end, path)  # duplicated now, not on first use


def _owned(own: int, end: int, path: str) -> Iterator[Attempt]:
    try:
        yield from _scan(own, end, path)
    finally:
        os.close(own)


def _scan(fd: int, end: int, path: str) -> Iterator[Attempt]:
    started: dict[int, bytes] = {}  # id -> its attempt's start line, undecoded
    hosts: dict[str, str] = {}  # runner -> host, from ``run`` records
    for data in _chunks(fd, end, path):
        lines = data.split(b"\n")
        lines.pop()
        yield from _scan_lines(lines, started, hosts, path)


def _attempts(
    rec: Record, started: dict[int, bytes], hosts: dict[str, str], path: str
) -> Iterator[Attempt]:
    kind = rec.get("t")
    if kind == "end":
        a = from_end(rec, rec["id"])
        start = started.pop(a.item_id, None)
        yield a if a.runner else _joined(a, _runner(start, path), hosts)
    elif kind == "intr":
        start = started.pop(rec["id"], None)
        if "crashes" in rec:  # few: its start line is decoded for its time
            begun = None if start is None else _decode(start, path)
            a = from_crash(rec, rec["id"], start_time(begun, rec))
            yield a if a.runner else _joined(a, _runner(start, path), hosts)
    elif kind == "arch":
        yield from from_archived(rec)
    elif kind == "item" and rec.get("tries"):
        yield from from_tries(rec["tries"], rec["id"])


def _joined(a: Attempt, runner: str, hosts: dict[str, str]) -> Attempt:
    """``a`` (whose record names no runner: an older statequeue's) with the
    runner of its ``start`` record and that runner's host (``joined_host``)."""
    return a._replace(runner=runner, host=joined_host(a.host, runner, hosts))


def _runner(start: bytes | None, path: str) -> str:
    if start is None:
        return ""
    runner = _decode(start, path).get("runner", "")
    return runner if isinstance(runner, str) else ""


def _decode(line: bytes, path: str) -> Record:
    rec = decode(line)
    if rec is None:
        raise DamagedState(f"{path}: a record does not decode; run `statequeue fsck`")
    return rec


def _chunks(fd: int, end: int, path: str, start: int = 0) -> Iterator[bytes]:
    """Bytes ``start``..``end`` of ``fd`` (``start`` at a line's start) in
    chunks of whole lines."""
    offset = start
    while offset < end:
        data = os.pread(fd, min(_CHUNK, end - offset), offset)
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # one record longer than a chunk
            data = os.pread(fd, end - offset, offset)
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                raise DamagedState(f"{path}: ends inside a record; run `statequeue fsck`")
        yield data[:cut]
        offset += cut


# -- in batches: the path `stats` takes ---------------------------------------------

# Records as the encoder writes them start with their type (an ``item`` record
# or a snapshot header may start with its seq): these prefixes, after the
# newline before every line of a chunk, find and count lines by type in C.
_ENQ, _END, _ARCH = b'{"t":"enq"', b'{"t":"end"', b'{"t":"arch"'
_BULK = (_ENQ, _START[:-6], _END, _ARCH)
_END_LINES = re.compile(rb"\n(" + re.escape(_END) + rb"[^\n]*)")
_ARCH_LINES = re.compile(rb"\n(" + re.escape(_ARCH) + rb"[^\n]*)")
_EN_OR_START = (b'\n{"t":"en', b"\n" + _START[:-6])  # enq and end; start
# In a chunk that holds none (nearly all), durations are taken in C as written.
_VERIFIED = b'"reason":"verified'


def scan_attempt_batches(fd: int, end: int, *, path: str) -> Iterator[AttemptBatch]:
    """What ``scan_attempts`` yields, a chunk of the file per batch.

    The ``end`` and plain ``arch`` lines of a chunk, nearly all of it, are
    decoded by one orjson call and turned into columns in C; the checksums
    were verified when the store was opened (and the archive when written),
    and a line that does not parse is reported as damage. A chunk whose
    ``end`` records do not name their runner (an older statequeue wrote them)
    is read record by record, joining each attempt's ``start``."""
    return _owned_batches(os.dup(fd), end, path)


def _owned_batches(own: int, end: int, path: str) -> Iterator[AttemptBatch]:
    try:
        yield from scan_range_batches(own, 0, end, path=path, started={}, hosts={})
    finally:
        os.close(own)


def scan_range_batches(
    fd: int,
    start: int,
    end: int,
    *,
    path: str,
    started: dict[int, bytes],
    hosts: dict[str, str],
) -> Iterator[AttemptBatch]:
    """The batches of bytes ``start``..``end`` of ``fd`` (``start`` at a
    line's start), read through ``fd`` itself. ``started`` and ``hosts`` carry
    what the lines before ``start`` left (the starts still waiting for their
    end, runner -> host) and are updated in place, so a later scan from
    ``end`` continues this one."""
    for data in _chunks(fd, end, path, start):
        yield from _chunk_batches(data, started, hosts, path)


def _chunk_batches(
    data: bytes, started: dict[int, bytes], hosts: dict[str, str], path: str
) -> Iterator[AttemptBatch]:
    framed = b"\n" + data  # a newline before every line, so a search finds line starts
    ends = _bulk_decode(_END_LINES.findall(framed), path)
    runners = list(map(dict.get, ends, repeat("runner")))
    if None in runners:  # written before ends named their runner: the exact, slow way
        lines = data.split(b"\n")
        lines.pop()
        yield from batches_of(_scan_lines(lines, started, hosts, path))
        return
    verified = _VERIFIED in data
    if ends:
        yield _batch_of_ends(ends, runners, verified=verified)
    archived_lines = _ARCH_LINES.findall(framed) if _ARCH in data else []
    if archived_lines:
        archived = _bulk_decode(archived_lines, path)
        plain = [r for r in archived if not r.get("tries") and "attempt" in r]
        if plain:
            yield _batch_of_archived(plain, verified=verified)
        carried = [a for r in archived if r.get("tries") for a in from_archived(r)]
        if carried:
            yield batch_of(carried)
    bulk = sum(map(framed.count, _EN_OR_START)) + len(archived_lines)
    if bulk == data.count(b"\n"):
        return  # the usual chunk: nothing but enq, start, end and arch records
    # Any other record (intr, item, run, a snapshot header) is read in order.
    others = [line for line in data.split(b"\n")[:-1] if not line.startswith(_BULK)]
    found = _scan_lines(others, started, hosts, path)
    if found:
        yield batch_of(found)


def _batch_of_ends(ends: list[Record], runners: list[Any], *, verified: bool) -> AttemptBatch:
    ids, attempts, states, oks, durations, ats = (
        list(map(itemgetter(key), ends)) for key in ("id", "attempt", "state", "ok", "dur", "at")
    )
    if verified:  # some were settled by --verify: no run time
        durations = run_durations(ends)
    return AttemptBatch(
        ids,
        attempts,
        states,
        oks,
        durations,
        ats,
        runners,
        list(map(dict.get, ends, repeat("host"))),
        [from_end(r, r["id"]) for r in ends if not r["ok"]],
    )


def _batch_of_archived(archived: list[Record], *, verified: bool) -> AttemptBatch:
    n = len(archived)
    get = dict.get
    return AttemptBatch(
        list(map(itemgetter("id"), archived)),
        list(map(itemgetter("attempt"), archived)),
        ["done"] * n,
        [True] * n,
        run_durations(archived) if verified else list(map(get, archived, repeat("dur"))),
        list(map(get, archived, repeat("at"))),
        [r or "" for r in map(get, archived, repeat("runner"))],
        list(map(get, archived, repeat("host"))),
        [],
    )


def _bulk_decode(lines: list[bytes], path: str) -> list[Record]:
    if not lines:
        return []
    try:
        found = orjson.loads(b"[%s]" % b",".join(lines))
    except orjson.JSONDecodeError:
        for line in lines:
            _decode(line, path)  # names the damage (DamagedState)
        raise DamagedState(f"{path}: a record does not parse; run `statequeue fsck`") from None
    return found  # type: ignore[no-any-return]


def _scan_lines(
    lines: list[bytes], started: dict[int, bytes], hosts: dict[str, str], path: str
) -> list[Attempt]:
    """Record by record, in order: what ``_scan`` does for one chunk."""
    found: list[Attempt] = []
    end_m, intr_m, item_m, arch_m, run_m = _WANTED
    for line in lines:
        if line.startswith(_START):
            comma = line.find(b",", len(_START))
            started[int(line[len(_START) : comma])] = line
        elif end_m in line or intr_m in line or arch_m in line or item_m in line:
            found.extend(_attempts(_decode(line, path), started, hosts, path))
        elif run_m in line:
            rec = _decode(line, path)
            if rec.get("t") == "run":
                hosts[rec["runner"]] = rec.get("host", "")
    return found
