"""The dedupe keys index (issue 14): a small enqueue into a big queue probes
``keys.ckpt`` (binary search, confirmed by the item's bytes) instead of
loading every key, and dedupe stays exact when the index is stale, damaged,
or holds two items with the same digest."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal import cache_file, checkpoint, dedupe_keys, key_index
from statequeue.store.journal.key_index import KEYS_NAME
from statequeue.store.journal.store import JournalStore

ITEMS = [f"item-{i}" for i in range(1, 3001)]  # three chunks of ids
# Two items with the same crc32 (the index's digest).
TWINS = ("c699378", "c18020006")


@pytest.fixture(autouse=True)
def small_cache_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dedupe_keys, "KEYS_CACHE_AFTER", 100)


def indexed_queue(folder: Path, items: list[str] = ITEMS) -> None:
    """A queue whose filling enqueue left a keys index behind, made whole
    (with its sorted table) by the first small enqueue after it."""
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(items)
    store.close()
    assert not _header(folder)["table"]
    store = JournalStore(folder, create=False, auto_compact=0)
    assert store.enqueue(items[:1]).added == 0
    store.close()
    assert _header(folder)["table"]


def _header(folder: Path) -> dict[str, object]:
    header, _ = key_index._read_head((folder / KEYS_NAME).read_bytes())
    return header


def probing(folder: Path) -> JournalStore:
    return JournalStore(folder, create=False, auto_compact=0)


def test_a_small_enqueue_probes_the_index(tmp_path: Path) -> None:
    """The keys of the 3000 items are not loaded: the index answers, and
    both known and new items are told apart."""
    folder = tmp_path / "q"
    indexed_queue(folder)
    store = probing(folder)
    try:
        result = store.enqueue(["item-1", "item-2999", "brand-new", "item-3000"])
        assert (result.added, result.skipped) == (1, 3)
        assert store.dedupe.index is not None and store.dedupe.from_cache
        assert "item-1" not in (store.state.keys or {})  # probed, never loaded
        assert store.find_ids(["item-1500", "brand-new", "nope"]) == {
            "item-1500": 1500,
            "brand-new": 3001,
        }
    finally:
        store.close()


def test_items_after_the_index_come_from_the_journal_tail(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    indexed_queue(folder)
    other = probing(folder)
    other.enqueue(["late"])  # after the index's position
    other.close()
    store = probing(folder)
    try:
        assert store.enqueue(["late", "later"]).added == 1
        assert store.enqueue(["later"]).added == 0
    finally:
        store.close()


def test_items_with_the_same_digest_are_told_apart(tmp_path: Path) -> None:
    assert zlib.crc32(TWINS[0].encode()) == zlib.crc32(TWINS[1].encode())
    folder = tmp_path / "q"
    indexed_queue(folder, [*ITEMS[:200], TWINS[1]])
    store = probing(folder)
    try:
        assert store.enqueue([TWINS[0]]).added == 1  # the digest matches; the bytes do not
        assert store.dedupe.index is not None
        assert store.find_ids([TWINS[1]]) == {TWINS[1]: 201}
    finally:
        store.close()
    store = probing(folder)
    try:
        assert store.enqueue(list(TWINS)).added == 0
    finally:
        store.close()


def test_item_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    odd = os.fsdecode(b"caf\xe9.txt")
    folder = tmp_path / "q"
    indexed_queue(folder, ITEMS[:200])
    store = probing(folder)
    store.enqueue([odd])
    store.close()
    (folder / KEYS_NAME).unlink()
    store = probing(folder)
    store.enqueue(ITEMS)  # a bulk enqueue builds the keys the slow way: indexed again
    store.close()
    store = probing(folder)
    try:
        assert store.enqueue([odd, os.fsdecode(b"caf\xe8.txt")]).added == 1
        assert store.dedupe.index is not None
    finally:
        store.close()


def _sections(folder: Path) -> dict[str, int]:
    """An offset inside each section of the index file."""
    data = (folder / KEYS_NAME).read_bytes()
    header, start = key_index._read_head(data)
    count, entries, blob = header["count"], header["entries"], header["blob"]
    at_blob = start + (count + 1) * 8
    at_table = at_blob + blob + (-blob % 8)
    return {
        "header": len(key_index.MAGIC) + 12,
        "offsets": start + 8 * 1500,
        "blob": at_blob + blob // 2,
        "table": at_table + 8 * (entries // 2) + 5,  # a digest byte
        "table-id": at_table + 8 * (entries // 3),  # an id byte
        "crcs": at_table + entries * 8 + 2,
    }


@pytest.mark.parametrize("section", ["header", "offsets", "blob", "table", "table-id", "crcs"])
def test_a_damaged_index_never_breaks_dedupe(tmp_path: Path, section: str) -> None:
    """A flipped byte anywhere: every known item is still found (the slow
    way), a new one added once, and a sound index written again."""
    folder = tmp_path / "q"
    indexed_queue(folder)
    where = _sections(folder)[section]
    with (folder / KEYS_NAME).open("r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0x41]))
    store = probing(folder)
    try:
        for start in range(0, len(ITEMS), 250):
            assert store.enqueue(ITEMS[start : start + 250]).added == 0
        assert store.enqueue(["new", "item-1"]).added == 1
    finally:
        store.close()
    store = probing(folder)
    try:
        assert store.enqueue([*ITEMS[::7], "new"]).added == 0
        assert store.dedupe.index is not None  # rebuilt, and sound
    finally:
        store.close()


def test_an_index_of_another_journal_is_not_used(tmp_path: Path) -> None:
    """An index copied from another queue (same ids, other items) names
    another journal: ignored, and dedupe is by this queue's own items."""
    indexed_queue(tmp_path / "a", [f"other-{i}" for i in range(1, 3001)])
    folder = tmp_path / "b"
    indexed_queue(folder)
    os.replace(tmp_path / "a" / KEYS_NAME, folder / KEYS_NAME)
    store = probing(folder)
    try:
        assert store.enqueue(["item-7", "other-7"]).added == 1
    finally:
        store.close()


def test_compaction_leaves_an_index_of_the_new_journal(tmp_path: Path) -> None:
    """After the swap, the first open restores the staged state checkpoint
    and the first small enqueue probes the staged index: the archived items
    are found there, without reading the archive."""
    folder = tmp_path / "q"
    indexed_queue(folder)
    store = JournalStore(folder, create=False, auto_compact=0)
    runner = new_runner()
    for _ in range(2000):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True), sync=False)
    store.compact()
    store.close()
    store = probing(folder)
    try:
        assert store.replay.restored_from_checkpoint
        assert store.enqueue(["item-5", "item-2500", "fresh"]).added == 1
        assert store.dedupe.index is not None and store.dedupe.archived == {}
    finally:
        store.close()


def test_a_long_tail_is_merged_into_a_fresh_index(tmp_path: Path) -> None:
    """Once the records after the index hold many items, the next enqueue
    writes an index covering them (merged into the old one's sorted table),
    and every item, old and new, is still found by its exact bytes."""
    folder = tmp_path / "q"
    indexed_queue(folder, [*ITEMS[:500], TWINS[0]])
    late = [f"late-{i}" for i in range(150)] + [TWINS[1]]
    store = probing(folder)
    assert store.enqueue(late).added == len(late)
    store.close()
    store = probing(folder)
    assert store.enqueue(["one-more"]).added == 1  # the tail was long: indexed again
    store.close()
    store = probing(folder)
    try:
        assert store.enqueue([*ITEMS[:500], TWINS[0], *late, "one-more", "last"]).added == 1
        assert store.dedupe.index is not None
        assert store.dedupe.index.index is not None and store.dedupe.index.index.count == 653
        assert store.find_ids(list(TWINS)) == {TWINS[0]: 501, TWINS[1]: 652}
    finally:
        store.close()


def test_find_ids_of_a_few_items_probes_the_index(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    indexed_queue(folder)
    store = probing(folder)
    try:
        assert store.find_ids(["item-42", "absent"]) == {"item-42": 42}
        assert store.dedupe.index is not None
    finally:
        store.close()


def test_ids_an_older_keys_file_knew_are_never_handed_out_again(tmp_path: Path) -> None:
    """A keys file in the format before the index (SQKEYS1) still counts for
    the highest id a repair must not reuse."""
    folder = tmp_path / "q"
    indexed_queue(folder, ITEMS[:200])
    store = probing(folder)
    try:
        header = {"journal": {}, "count": 77}
        assert cache_file.write_framed(store.dir, KEYS_NAME, b"SQKEYS1\n", header, (b"a\0b",))
        assert checkpoint.known_ids(store.dir) == 77
        assert store.enqueue(["item-1", "new"]).added == 1  # and it is not used for dedupe
    finally:
        store.close()


def test_the_filling_enqueue_leaves_the_sort_to_the_first_small_one(tmp_path: Path) -> None:
    """Filling a new queue writes the index without its sorted table (most of
    that enqueue's cost); a re-enqueue of everything loads its texts and
    leaves it so; the first small enqueue sorts the index's items into its
    table, writes it whole and probes it (no dict of every key)."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(ITEMS)
    store.close()
    header = _header(folder)
    assert header["table"] is False and header["entries"] == 0
    store = probing(folder)
    try:
        assert store.enqueue(ITEMS).added == 0  # a cron job's re-enqueue: no sort
        assert store.dedupe.from_cache
    finally:
        store.close()
    assert _header(folder)["table"] is False
    store = probing(folder)
    try:
        assert store.enqueue(["item-7", "new-1", "item-3000"]).added == 1
        assert store.dedupe.index is not None  # probed
        assert "item-1" not in (store.state.keys or {})  # never loaded
    finally:
        store.close()
    assert _header(folder)["table"] is True
    store = probing(folder)
    try:
        assert store.enqueue(["item-8", "new-1", "new-2"]).added == 1
        assert store.dedupe.index is not None  # probed
        assert store.find_ids(["new-2", "item-2999"]) == {"new-2": 3002, "item-2999": 2999}
    finally:
        store.close()


def test_an_index_that_cannot_be_written_whole_is_loaded_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the small enqueue cannot write the index with its table (say a
    read-only folder), it loads the keys, dedupes exactly, and the index is
    written whole at its end, as after any costly build of the keys."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(ITEMS)
    store.close()
    with monkeypatch.context() as m:
        m.setattr(key_index, "with_table", lambda folder, index: False)
        store = probing(folder)
        try:
            assert store.enqueue(["item-7", "new-1", "item-3000"]).added == 1
            assert store.dedupe.index is None and store.dedupe.from_cache  # loaded
        finally:
            store.close()
    assert _header(folder)["table"] is True
    store = probing(folder)
    try:
        assert store.enqueue(["item-8", "new-1", "new-2"]).added == 1
        assert store.dedupe.index is not None
    finally:
        store.close()


def test_an_index_without_a_table_is_never_probed(tmp_path: Path) -> None:
    """Its empty table would answer "not queued" for every item: a probe
    raises IndexDamaged instead (and dedupe falls back to the slow way)."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(ITEMS)
    try:
        index = key_index.open_index(store.dir, store.journal)
        assert index is not None and not index.has_table
        try:
            assert index.texts()[41] == "item-42"
            with pytest.raises(key_index.IndexDamaged):
                index.get("item-42")
        finally:
            index.close()
    finally:
        store.close()


def test_compaction_keeps_an_index_without_a_table_without_sorting(tmp_path: Path) -> None:
    """Compaction extends the filling enqueue's index as it is (no table, no
    sort); dedupe after the swap is exact, and the first small enqueue
    writes the index whole."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(ITEMS)
    store.close()
    store = probing(folder)
    runner = new_runner()
    for _ in range(2000):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True), sync=False)
    store.compact()
    store.close()
    assert _header(folder)["table"] is False
    store = probing(folder)
    try:
        assert store.enqueue(["item-5", "item-2500", "fresh"]).added == 1
    finally:
        store.close()
    assert _header(folder)["table"] is True
    store = probing(folder)
    try:
        assert store.enqueue(["item-6", "item-2501", "fresh", "fresher"]).added == 1
        assert store.dedupe.index is not None
    finally:
        store.close()


def test_an_index_in_the_format_before_tableless_ones_is_probed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index written before the tableless kind (SQKEYS2) always has its table."""
    folder = tmp_path / "q"
    with monkeypatch.context() as m:
        m.setattr(key_index, "MAGIC", b"SQKEYS2\n")
        indexed_queue(folder)
    assert (folder / KEYS_NAME).read_bytes().startswith(b"SQKEYS2\n")
    store = probing(folder)
    try:
        assert store.enqueue(["item-1", "item-2999", "brand-new"]).added == 1
        assert store.dedupe.index is not None
    finally:
        store.close()


@pytest.mark.parametrize(
    "extra",
    [[], ["caf\u00e9", "\u540d\u524d", "\U0001f642", "\u00e9" * 9]],
)
def test_an_index_without_a_table_holds_each_items_exact_bytes(
    tmp_path: Path, extra: list[str]
) -> None:
    """Its offsets come from the texts' lengths when every character is one
    byte, else from the encoded bytes: each id's bytes are its item's either way."""
    items = [*ITEMS[:150], *extra, "z"]
    store = JournalStore(tmp_path / "q", create=True, auto_compact=0)
    store.enqueue(items)
    try:
        index = key_index.open_index(store.dir, store.journal)
        assert index is not None and not index.has_table
        try:
            assert index.texts() == items
            for item_id, text in enumerate(items, 1):
                assert index.item_bytes(item_id) == text.encode("utf-8", "surrogateescape")
        finally:
            index.close()
    finally:
        store.close()


@pytest.mark.parametrize("section", ["offsets", "blob"])
def test_a_damaged_index_without_a_table_is_never_sorted_into_one(
    tmp_path: Path, section: str
) -> None:
    """A flipped byte in the filling enqueue's index: the small enqueue that
    would sort it into a table finds the damage, and dedupe is exact (the slow way)."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(ITEMS)
    store.close()
    where = _sections(folder)[section]
    with (folder / KEYS_NAME).open("r+b") as f:
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0x41]))
    store = probing(folder)
    try:
        assert store.enqueue(["item-1", "item-1501", "item-1500", "item-3000", "new"]).added == 1
        assert store.find_ids(["item-1501", "new"]) == {"item-1501": 1501, "new": 3001}
    finally:
        store.close()


def test_a_read_only_store_never_sorts_an_index_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that may not write the queue's files (``read_only``) looks a
    few items up in an index without a table by loading the keys: it never
    pays for a sort whose result it could not keep."""
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True, auto_compact=0)
    store.enqueue(ITEMS)
    store.close()

    def never(folder: object, index: object) -> bool:
        raise AssertionError("sorted into a table")

    monkeypatch.setattr(key_index, "with_table", never)
    store = probing(folder)
    store.read_only = True
    try:
        assert store.find_ids(["item-42", "absent"]) == {"item-42": 42}
    finally:
        store.close()
    assert _header(folder)["table"] is False
