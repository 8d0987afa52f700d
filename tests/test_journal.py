"""The journal format and the local store's handling of damage."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from statequeue.core import records
from statequeue.core.errors import CorruptJournal
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.store.journal.store import JOURNAL, JournalStore


def make_queue(folder: Path, n: int = 5) -> JournalStore:
    store = JournalStore(folder, create=True)
    store.enqueue([f"item-{i}" for i in range(n)])
    runner = new_runner()
    for _ in range(2):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result={"n": claim.item_id}))
    return store


def snapshot(store: JournalStore) -> tuple[dict[str, int], list[str]]:
    status = store.status()
    st = store.state
    pending = sorted(st.get(i).text for i in st.live_ids())  # type: ignore[union-attr]
    return status.counts, pending


def line_starts(data: bytes) -> list[int]:
    starts = [0]
    starts += [i + 1 for i, b in enumerate(data) if b == ord("\n")]
    return starts[:-1]


def test_record_round_trip_and_jq_readable() -> None:
    rec = {"seq": 3, "t": "enq", "id": 1, "item": 'a "quoted" \n line'}
    line = records.encode(dict(rec))
    assert line.endswith(b"\n")
    assert records.decode(line[:-1]) == rec
    plain = orjson.loads(line)  # still plain JSON, as jq reads it
    assert plain["item"] == rec["item"] and len(plain["crc"]) == 8


def test_decode_rejects_any_single_byte_change() -> None:
    line = records.encode({"seq": 1, "t": "enq", "id": 1, "item": "abc"})[:-1]
    for pos in range(len(line)):
        damaged = bytearray(line)
        damaged[pos] ^= 0x01
        assert records.decode(bytes(damaged)) is None, pos


def test_non_utf8_item_round_trips(tmp_path: Path) -> None:
    odd = os.fsdecode(b"caf\xe9-\xff.pdf")
    store = JournalStore(tmp_path / "q", create=True)
    store.enqueue([odd, "plain"])
    store.close()
    again = JournalStore(tmp_path / "q", create=False)
    claim = again.claim(new_runner())
    assert claim is not None and os.fsencode(claim.item) == b"caf\xe9-\xff.pdf"
    assert again.enqueue([odd]).added == 0


def test_journal_round_trip_reopens_identically(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q")
    before = snapshot(store)
    store.close()
    again = JournalStore(tmp_path / "q", create=False)
    assert snapshot(again) == before
    assert again.notices() == []


def test_truncation_at_every_offset_of_last_record_recovers_prefix(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q")
    store.close()
    path = tmp_path / "q" / JOURNAL
    data = path.read_bytes()
    last = line_starts(data)[-1]
    expected = None
    for cut in range(last, len(data)):
        folder = tmp_path / f"cut{cut}"
        folder.mkdir(mode=0o700)
        (folder / JOURNAL).write_bytes(data[:cut])
        store = JournalStore(folder, create=False)
        if cut > last:
            assert any("torn tail" in n for n in store.notices()), cut
        assert (folder / JOURNAL).read_bytes() == data[:last], cut
        got = snapshot(store)
        expected = expected or got
        assert got == expected, cut
        # New appends work and the result reloads identically.
        store.enqueue([f"new-{cut}"])
        after = snapshot(store)
        store.close()
        reopened = JournalStore(folder, create=False)
        try:  # closed: left open, its files held ~1,000 fds in the test process
            assert snapshot(reopened) == after
        finally:
            reopened.close()


def test_flipped_byte_mid_file_is_refused_and_file_untouched(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q")
    store.close()
    path = tmp_path / "q" / JOURNAL
    data = path.read_bytes()
    starts = line_starts(data)
    target_line = 3  # 1-based: a middle record
    pos = starts[target_line - 1] + 5
    damaged = bytearray(data)
    damaged[pos] ^= 0x20
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptJournal) as info:
        JournalStore(tmp_path / "q", create=False)
    assert info.value.line == target_line
    assert str(path) in str(info.value) and f"line {target_line}" in str(info.value)
    assert path.read_bytes() == bytes(damaged)


def test_missing_middle_record_is_a_sequence_gap(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q")
    store.close()
    path = tmp_path / "q" / JOURNAL
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2] + lines[3:]))
    with pytest.raises(CorruptJournal, match="sequence gap"):
        JournalStore(tmp_path / "q", create=False)


def test_compaction_keeps_dedupe_results_and_shrinks(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q", n=50)
    runner = new_runner()
    while (claim := store.claim(runner)) is not None:
        store.finish(claim, Outcome(ok=True, result={"n": claim.item_id}))
    result = store.compact()
    assert result.bytes_after < result.bytes_before and result.archived == 50
    store.close()
    again = JournalStore(tmp_path / "q", create=False)
    assert again.status().counts["done"] == 50
    assert again.enqueue([f"item-{i}" for i in range(50)]).added == 0
    archive = [
        orjson.loads(x) for x in (tmp_path / "q" / "archive.jsonl").read_bytes().splitlines()
    ]
    assert sorted(r["result"]["n"] for r in archive) == list(range(1, 51))


def test_crashed_compaction_leaves_archive_tail_ignored(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q", n=4)
    store.compact()
    size = (tmp_path / "q" / "archive.jsonl").stat().st_size
    with open(tmp_path / "q" / "archive.jsonl", "ab") as f:
        f.write(b'{"half a record')  # as if a compaction died mid-append
    store.close()
    again = JournalStore(tmp_path / "q", create=False)
    claim = again.claim(new_runner())
    assert claim is not None
    again.finish(claim, Outcome(ok=True))
    again.compact()
    assert again.enqueue([f"item-{i}" for i in range(4)]).added == 0
    assert (tmp_path / "q" / "archive.jsonl").stat().st_size > size


def test_permissions(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q")
    folder = tmp_path / "q"
    assert folder.stat().st_mode & 0o777 == 0o700
    for name in ("journal.jsonl", "lock"):
        assert (folder / name).stat().st_mode & 0o777 == 0o600
    store.compact()
    assert (folder / "journal.jsonl").stat().st_mode & 0o777 == 0o600
    assert (folder / "archive.jsonl").stat().st_mode & 0o777 == 0o600


def test_process_notices_compaction_by_another(tmp_path: Path) -> None:
    a = make_queue(tmp_path / "q", n=6)
    b = JournalStore(tmp_path / "q", create=False)
    claim = a.claim(new_runner())
    assert claim is not None
    b.compact()
    a.finish(claim, Outcome(ok=True))
    assert b.status().counts["done"] == 3
    assert a.enqueue(["item-0", "fresh"]).added == 1


def test_dead_runners_are_pruned_and_not_carried_by_compaction(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    for _ in range(3):
        dying = JournalStore(folder, create=True)
        dying.register_runner(new_runner())
        dying.close()  # the process dies without unregistering
    store = JournalStore(folder, create=False)
    assert len(store.state.runners) == 3
    assert store.active_runners() == []
    store.compact()
    assert store.state.runners == {}
    assert list((folder / "runners").iterdir()) == []
    assert b'"t":"run"' not in (folder / JOURNAL).read_bytes()


def test_temp_files_left_by_a_dead_rewrite_are_removed(tmp_path: Path) -> None:
    store = make_queue(tmp_path / "q")
    store.close()
    litter = tmp_path / "q" / ".journal.jsonl.99999.tmp"
    litter.write_bytes(b"half a snapshot")
    JournalStore(tmp_path / "q", create=False).close()
    assert not litter.exists()


def test_listing_stays_in_id_order_when_items_finish_out_of_order(tmp_path: Path) -> None:
    store = JournalStore(tmp_path / "q", create=True)
    store.enqueue(["a", "b", "c", "d"])
    runner = new_runner()
    first, second, third = (store.claim(runner) for _ in range(3))
    assert first and second and third
    store.finish(third, Outcome(ok=True))
    store.finish(first, Outcome(ok=False))  # failed: stays live through compaction
    store.finish(second, Outcome(ok=True))
    store.compact()
    store.retry([1])
    again = store.claim(runner)
    assert again is not None and again.item_id == 1
    store.finish(again, Outcome(ok=True))
    assert [v.item_id for v in store.items()] == [1, 2, 3, 4]
    assert [v.item_id for v in store.items(ItemState.DONE)] == [1, 2, 3]


@pytest.mark.parametrize(
    "texts",
    [
        ["a", "b"],
        ['quote " inside', 'x","y', "back\\slash\\", "\\", '","', "tab\tnew\u2028line"],
        ["ünïcødé 名前", "emoji 🙂", "ctrl \x01\x1f"],
        ["50% off", "%d %s %08x %%", "}", "}\n", '{"a":1}\n}', "%"],
        [],
    ],
)
def test_batch_enqueue_lines_are_byte_identical_to_encode(texts: list[str]) -> None:
    encoded = records.encode_enqueued(41, 7, texts)
    assert encoded is not None
    data, sizes = encoded
    expected = [
        records.encode({"t": "enq", "id": 41 + i, "item": t, "seq": 7 + i})
        for i, t in enumerate(texts)
    ]
    assert data == b"".join(expected)
    assert sizes == [len(line) for line in expected]
    lines = data.split(b"\n")[:-1]
    assert [records.decode(line) for line in lines] == [
        {"t": "enq", "id": 41 + i, "item": t, "seq": 7 + i} for i, t in enumerate(texts)
    ]


def test_batch_enqueue_gives_its_first_line_the_batch_time() -> None:
    texts = ["a%", "}", "c"]
    encoded = records.encode_enqueued(5, 9, texts, 1764640000.12345)
    assert encoded is not None
    data, sizes = encoded
    expected = [
        records.encode({"t": "enq", "id": 5, "item": "a%", "seq": 9, "at": 1764640000.123}),
        records.encode({"t": "enq", "id": 6, "item": "}", "seq": 10}),
        records.encode({"t": "enq", "id": 7, "item": "c", "seq": 11}),
    ]
    assert data == b"".join(expected)
    assert sizes == [len(line) for line in expected]


def test_batch_enqueue_defers_non_utf8_to_the_general_encoder() -> None:
    assert records.encode_enqueued(1, 1, ["ok", "bad \udcff byte"]) is None
