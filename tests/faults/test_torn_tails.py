"""Torn tails: a crash mid-append leaves a partial last record (or junk).

Each case must recover exactly the valid prefix, accept new appends, and
reload identically.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from statequeue.store.journal.store import JOURNAL, JournalStore
from tests.faults.helpers import build_queue, fingerprint, fresh_folder, record_starts

CASES = {"offsets": 0, "junk": 0}


def check_recovers_prefix(folder: Path, prefix: bytes, expected: object) -> None:
    store = JournalStore(folder, create=False)
    try:
        if prefix:
            assert (folder / JOURNAL).read_bytes() == prefix
            assert fingerprint(store) == expected
        else:  # the header itself was torn: nothing was ever acknowledged
            assert store.status().total == 0
        store.enqueue(["after-repair"])
        after = fingerprint(store)
    finally:
        store.close()
    again = JournalStore(folder, create=False)
    try:
        assert fingerprint(again) == after
        assert again.notices() == []
    finally:
        again.close()


def expected_for(root: Path, prefix: bytes) -> object:
    """The state the prefix alone gives (None for an empty prefix: a fresh queue)."""
    if not prefix:
        return None
    root.mkdir()
    folder = fresh_folder(root, "expected", prefix)
    store = JournalStore(folder, create=False)
    try:
        return fingerprint(store)
    finally:
        store.close()


def test_truncation_at_every_offset_of_the_last_three_records(tmp_path: Path) -> None:
    journal = build_queue(tmp_path / "src")
    starts = record_starts(journal)
    assert len(starts) >= 4
    boundaries = [*starts[-3:], len(journal)]
    for first, end in itertools.pairwise(boundaries):
        prefix = journal[:first]
        expected = expected_for(tmp_path / f"exp{first}", prefix)
        for cut in range(first + 1, end):  # first byte of a record .. just before its newline
            folder = fresh_folder(tmp_path, f"cut{cut}", journal[:cut])
            check_recovers_prefix(folder, prefix, expected)
            CASES["offsets"] += 1
    assert CASES["offsets"] > 100


@pytest.mark.parametrize("kind", ["zeros", "random"])
def test_junk_appended_after_the_last_record(tmp_path: Path, kind: str) -> None:
    journal = build_queue(tmp_path / "src")
    expected = expected_for(tmp_path / "exp", journal)
    rng = random.Random(1234)
    lengths = sorted(
        {1, 2, 3, 17, 18, 19, 100, 511, 512, 4095, 4096, *rng.sample(range(1, 4097), 40)}
    )
    for n in lengths:
        junk = bytes(n) if kind == "zeros" else rng.randbytes(n)
        folder = fresh_folder(tmp_path, f"{kind}{n}", journal + junk)
        check_recovers_prefix(folder, journal, expected)
        CASES["junk"] += 1
