"""Damage in the middle of the journal: always detected and refused, and
`fsck --repair` keeps every undamaged record."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import orjson
import pytest

from statequeue.core.errors import CorruptJournal
from statequeue.store.journal.fsck import fsck
from statequeue.store.journal.store import JOURNAL, JournalStore
from tests.faults.helpers import build_queue, fresh_folder, record_starts

FLIPS_PER_RECORD = 12


def flip_positions(journal: bytes, rng: random.Random) -> list[tuple[int, int]]:
    """(line number, byte offset) pairs inside middle records (not the last one)."""
    starts = record_starts(journal)
    out = []
    for number, (start, end) in enumerate(itertools.pairwise(starts), start=1):
        if number == 1:
            continue  # the header is covered separately below
        span = range(start, end - 1)  # not the newline itself
        out += [(number, pos) for pos in rng.sample(span, min(FLIPS_PER_RECORD, len(span)))]
    return out


def test_every_flip_is_refused_naming_file_and_line(tmp_path: Path) -> None:
    journal = build_queue(tmp_path / "src", items=10, finished=6)
    rng = random.Random(7)
    cases = flip_positions(journal, rng)
    assert len(cases) > 150
    for i, (line, pos) in enumerate(cases):
        damaged = bytearray(journal)
        damaged[pos] ^= 1 << rng.randrange(8)
        folder = fresh_folder(tmp_path, f"flip{i}", bytes(damaged))
        with pytest.raises(CorruptJournal) as info:
            JournalStore(folder, create=False)
        assert info.value.line == line
        assert str(folder / JOURNAL) in str(info.value)
        assert (folder / JOURNAL).read_bytes() == bytes(damaged), "refusal must not write"


def test_flip_in_header_is_refused(tmp_path: Path) -> None:
    journal = build_queue(tmp_path / "src")
    for pos in range(0, record_starts(journal)[1] - 1, 7):
        damaged = bytearray(journal)
        damaged[pos] ^= 0x10
        folder = fresh_folder(tmp_path, f"h{pos}", bytes(damaged))
        with pytest.raises(CorruptJournal):
            JournalStore(folder, create=False)


def test_repair_keeps_every_undamaged_record(tmp_path: Path) -> None:
    journal = build_queue(tmp_path / "src", items=10, finished=6)
    lines = journal.splitlines()
    rng = random.Random(11)
    for case in range(25):
        hit = sorted(rng.sample(range(1, len(lines) - 1), rng.randint(1, 3)))
        damaged_lines = list(lines)
        for n in hit:
            b = bytearray(damaged_lines[n])
            b[rng.randrange(len(b))] ^= 0x01
            damaged_lines[n] = bytes(b)
        folder = fresh_folder(tmp_path, f"r{case}", b"\n".join(damaged_lines) + b"\n")
        report = fsck(folder, repair=True)
        assert report.repaired and report.journal.bad_lines == [n + 1 for n in hit]
        kept = [orjson.loads(x) for x in (folder / JOURNAL).read_bytes().splitlines()]
        want = [orjson.loads(x) for i, x in enumerate(lines) if i not in hit]

        def body(r: dict[str, object]) -> dict[str, object]:
            return {k: v for k, v in r.items() if k not in ("seq", "crc")}

        assert [body(r) for r in kept[1:]] == [body(r) for r in want[1:]]
        store = JournalStore(folder, create=False)  # usable again
        store.status()
        store.enqueue(["after"])
        store.close()
        assert Path(report.kept[0]).read_bytes() == b"\n".join(damaged_lines) + b"\n"
