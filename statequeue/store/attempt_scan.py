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
from collections.abc import Iterator

from statequeue.attempts import Attempt, from_archived, from_crash, from_end, from_tries
from statequeue.errors import DamagedState
from statequeue.records import Record, decode

_CHUNK = 4 << 20
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
    end_m, intr_m, item_m, arch_m, run_m = _WANTED
    for data in _chunks(fd, end, path):
        for line in data.split(b"\n")[:-1]:
            if line.startswith(_START):
                comma = line.find(b",", len(_START))
                started[int(line[len(_START) : comma])] = line
            elif end_m in line or intr_m in line or arch_m in line or item_m in line:
                # The marker may sit in a nested object (an item's ``tries``):
                # the decoded record's own type decides.
                for a in _attempts(_decode(line, path), started, path):
                    yield a if a.host or not a.runner else a._replace(host=hosts.get(a.runner, ""))
            elif run_m in line:
                rec = _decode(line, path)
                if rec.get("t") == "run":
                    hosts[rec["runner"]] = rec.get("host", "")


def _attempts(rec: Record, started: dict[int, bytes], path: str) -> Iterator[Attempt]:
    kind = rec.get("t")
    if kind == "end":
        a = from_end(rec, rec["id"])
        start = started.pop(a.item_id, None)
        yield a if a.runner else a._replace(runner=_runner(start, path))
    elif kind == "intr":
        start = started.pop(rec["id"], None)
        if "crashes" in rec:
            a = from_crash(rec, rec["id"])
            yield a if a.runner else a._replace(runner=_runner(start, path))
    elif kind == "arch":
        yield from from_archived(rec)
    elif kind == "item" and rec.get("tries"):
        yield from from_tries(rec["tries"], rec["id"])


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


def _chunks(fd: int, end: int, path: str) -> Iterator[bytes]:
    """Bytes 0..``end`` of ``fd`` in chunks of whole lines."""
    offset = 0
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
