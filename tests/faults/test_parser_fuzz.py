"""Arbitrary bytes fed to the journal reader: only statequeue's own errors come
out, and a record whose checksum does not match is never accepted."""

from __future__ import annotations

import zlib
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from statequeue.core import records
from statequeue.core.errors import StateQueueError
from statequeue.store.journal.journal_file import parse
from statequeue.store.journal.store import JournalStore

GOOD = [
    records.encode(
        {
            "seq": 1,
            "t": "snap",
            "v": 1,
            "next_id": 1,
            "archived": 0,
            "archive_size": 0,
            "watermark": 0,
        }
    ),
    records.encode({"seq": 2, "t": "enq", "id": 1, "item": "a"}),
    records.encode({"seq": 3, "t": "enq", "id": 2, "item": "b"}),
]


def crc_matches(line: bytes) -> bool:
    """The checksum rule, restated independently of the reader."""
    if len(line) < 19 or not line.endswith(b'"}') or line[-18:-10] != b',"crc":"':
        return False
    digits = line[-10:-2]
    if any(c not in b"0123456789abcdef" for c in digits):
        return False
    return zlib.crc32(line[:-18] + b"}") == int(digits, 16)


@given(st.binary(max_size=400))
def test_decode_never_accepts_a_bad_checksum(data: bytes) -> None:
    rec = records.decode(data)
    if rec is not None:
        assert crc_matches(data)
        assert isinstance(rec["seq"], int)


@given(st.lists(st.sampled_from(GOOD) | st.binary(max_size=80), max_size=8))
def test_parse_only_raises_own_errors(chunks: list[bytes]) -> None:
    data = b"".join(chunks)
    try:
        found, used, _ = parse(data, path="fuzz", first_line=1, last_seq=None)
    except StateQueueError:
        return
    assert used <= len(data)
    for rec in found:
        assert isinstance(rec, dict) and isinstance(rec["seq"], int)
    # Every accepted record is a line whose checksum matches.
    for line in data[:used].split(b"\n")[:-1]:
        assert crc_matches(line)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=300), st.integers(min_value=0, max_value=2))
def test_store_open_on_fuzzed_journal(tmp_path: Path, junk: bytes, cut: int) -> None:
    folder = tmp_path / f"q{abs(hash((junk, cut)))}"
    folder.mkdir(mode=0o700)
    (folder / "journal.jsonl").write_bytes(b"".join(GOOD[: cut + 1]) + junk)
    try:
        store = JournalStore(folder, create=False)
    except StateQueueError:
        return
    try:
        assert store.status().total <= 2
    finally:
        store.close()
