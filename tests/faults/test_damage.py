"""Promise 5: never an empty queue in place of a damaged one (issue 10, points 1-4).

A damaged, emptied, cut or missing journal is refused with exit 5 and every
file left byte for byte as it was; a journal cut after a compaction, or behind
what a checkpoint saw, is damage and not a torn tail; a complete last line
with a bad checksum is damage; and `fsck --repair` of a damaged header never
hands out an id twice.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded
from statequeue.core.errors import CorruptJournal, DamagedState
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal import checkpoint
from statequeue.store.journal.fsck import fsck
from statequeue.store.journal.store import ARCHIVE, JOURNAL, JournalStore
from tests.conftest import STATEQUEUE
from tests.faults.helpers import record_starts

DAMAGED = 5


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process (the same error mapping as the installed one)."""
    capsys.readouterr()
    code = run_guarded(_invoke, list(args))
    out, err = capsys.readouterr()
    return code, out, err


def build(folder: Path, *, done: int, pending: int = 0, compact: bool = True) -> None:
    """A queue of ``done`` finished items then ``pending`` unstarted ones."""
    store = JournalStore(folder, create=True)
    store.enqueue([f"item-{i}" for i in range(1, done + pending + 1)])
    runner = new_runner()
    for _ in range(done):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True, result={"n": claim.item_id}))
    if compact:
        store.compact()
    store.close()


def files_of(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (relative path -> sha256 of its bytes)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def compacted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A queue of 100 done items, compacted: the journal is one header line."""
    folder = tmp_path_factory.mktemp("src") / "default"
    build(folder, done=100)
    assert len((folder / JOURNAL).read_bytes().splitlines()) == 1
    return folder


def _flip(journal: Path) -> None:
    data = bytearray(journal.read_bytes())
    data[len(data) // 2] ^= 0x04
    journal.write_bytes(bytes(data))


def _empty(journal: Path) -> None:
    journal.write_bytes(b"")


def _cut_into_header(journal: Path) -> None:
    journal.write_bytes(journal.read_bytes()[:40])


def _delete(journal: Path) -> None:
    journal.unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "bit-flip": _flip,
    "truncated-to-0": _empty,
    "truncated-into-header": _cut_into_header,
    "deleted": _delete,
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_journal_is_refused_and_nothing_is_written(
    compacted: Path, sq_home: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    folder = sq_home / "default"
    shutil.copytree(compacted, folder)
    DAMAGE[kind](folder / JOURNAL)
    before = files_of(folder)
    archive_size = (folder / ARCHIVE).stat().st_size
    items = [f"item-{i}" for i in range(1, 101)]
    for args in (
        ["status"],
        ["status"],  # a second command still refuses
        ["queues"],
        ["list"],
        ["enqueue", *items],  # the cron re-enqueue
        ["compact"],
        ["run", "--", "true"],
    ):
        code, _, err = cli(capsys, *args)
        assert code == DAMAGED, (args, err)
        assert err.startswith("statequeue: ") and err.count("\n") == 1, err
        assert files_of(folder) == before, f"{args} changed a file"
    assert (folder / ARCHIVE).stat().st_size == archive_size
    code, out, _ = cli(capsys, "fsck")
    assert code == DAMAGED
    assert files_of(folder) == before
    code, out, _ = cli(capsys, "fsck", "--json")
    assert code == DAMAGED and orjson.loads(out)["damaged"] is True


def test_the_installed_cli_refuses_a_flipped_header(
    compacted: Path, sq_home: Path, sq_env: dict[str, str]
) -> None:
    folder = sq_home / "default"
    shutil.copytree(compacted, folder)
    _flip(folder / JOURNAL)
    before = files_of(folder)
    for args in (["status"], ["status", "--json"], ["enqueue", "item-1"]):
        done = subprocess.run(
            [STATEQUEUE, *args], env=sq_env, capture_output=True, timeout=60, check=False
        )
        assert done.returncode == DAMAGED, done.stderr
        assert str(folder / JOURNAL) in done.stderr.decode()
    assert files_of(folder) == before


@pytest.mark.parametrize("made", ["no folder", "empty folder", "empty subfolders"])
def test_a_genuinely_new_queue_is_still_created(
    sq_home: Path, capsys: pytest.CaptureFixture[str], made: str
) -> None:
    folder = sq_home / "default"
    if made != "no folder":
        folder.mkdir(parents=True, mode=0o700)
    if made == "empty subfolders":  # a creation that died before its journal
        for sub in ("claims", "runners", "logs"):
            (folder / sub).mkdir(mode=0o700)
        (folder / "lock").touch(mode=0o600)
    code, _, err = cli(capsys, "enqueue", "a", "b")
    assert code == 0, err
    assert cli(capsys, "status", "--json")[0] == 0


@pytest.mark.parametrize(
    "leftover", ["logs/1.1.log", "claims/3.lock", "claims.lock", "state.ckpt", "keys.ckpt"]
)
def test_a_folder_with_history_but_no_journal_is_not_new(
    sq_home: Path, capsys: pytest.CaptureFixture[str], leftover: str
) -> None:
    folder = sq_home / "default"
    for sub in ("claims", "runners", "logs"):
        (folder / sub).mkdir(parents=True, mode=0o700)
    (folder / leftover).write_bytes(b"x")
    before = files_of(folder)
    code, _, err = cli(capsys, "enqueue", "a")
    assert code == DAMAGED, err
    assert files_of(folder) == before


def test_compact_never_cuts_the_archive_on_a_header_that_does_not_vouch_for_it(
    compacted: Path, tmp_path: Path
) -> None:
    # A valid but fresh journal (restored from an old backup, or written by
    # an older statequeue) beside a full archive: its header says the archive
    # is empty, and compaction used to cut it to that size.
    folder = tmp_path / "q"
    shutil.copytree(compacted, folder)
    JournalStore(tmp_path / "fresh", create=True).close()
    shutil.copy(tmp_path / "fresh" / JOURNAL, folder / JOURNAL)
    archive = (folder / ARCHIVE).read_bytes()
    store = JournalStore(folder, create=False)
    try:
        with pytest.raises(DamagedState, match="archive"):
            store.compact()
    finally:
        store.close()
    assert (folder / ARCHIVE).read_bytes() == archive
    assert fsck(folder, repair=False).archive.damaged
    assert fsck(folder, repair=True).repaired
    assert _ids_agree(folder) == list(range(1, 101))


# -- point 2: a journal cut after a compaction, or behind its checkpoint -------


@pytest.mark.parametrize("keep", ["header only", "header and some items", "torn item"])
def test_a_journal_cut_after_compaction_is_damage(tmp_path: Path, keep: str) -> None:
    folder = tmp_path / "q"
    build(folder, done=4, pending=6)
    journal = (folder / JOURNAL).read_bytes()
    starts = record_starts(journal)
    assert len(starts) == 7  # the header and six pending items
    cut = {"header only": starts[1], "header and some items": starts[4]}.get(keep, starts[4] + 9)
    (folder / JOURNAL).write_bytes(journal[:cut])
    before = files_of(folder)
    with pytest.raises(DamagedState) as info:
        JournalStore(folder, create=False)
    assert str(folder / JOURNAL) in str(info.value)
    assert "no acknowledged record was lost" not in str(info.value)
    assert files_of(folder) == before
    assert fsck(folder, repair=False).damaged
    assert files_of(folder) == before
    # The repair names the items it could not save instead of calling them done.
    kept = 0 if keep == "header only" else 3
    assert fsck(folder, repair=True).lost_ids == [[5 + kept, 10]]
    assert _ids_agree(folder) == list(range(1, 5 + kept))


def test_a_journal_shorter_than_its_checkpoint_is_damage(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True)
    store.settings.checkpoint_every = store.settings.checkpoint_on_close = 1
    store.enqueue([f"item-{i}" for i in range(1, 21)])
    runner = new_runner()
    for _ in range(5):
        claim = store.claim(runner)
        assert claim is not None
        store.finish(claim, Outcome(ok=True))
    store.close()
    assert (folder / checkpoint.NAME).exists()
    journal = (folder / JOURNAL).read_bytes()
    starts = record_starts(journal)
    # Cut the fsynced records the checkpoint saw, leaving a torn piece behind
    # (what a true torn tail looks like).
    (folder / JOURNAL).write_bytes(journal[: starts[-4] + 5])
    before = files_of(folder)
    with pytest.raises(DamagedState) as info:
        JournalStore(folder, create=False)
    assert checkpoint.NAME in str(info.value)
    assert files_of(folder) == before  # the checkpoint is evidence: kept
    assert fsck(folder, repair=False).damaged


# -- point 3: a complete last line with a bad checksum -------------------------


def test_a_complete_last_record_with_a_flipped_bit_is_damage(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    build(folder, done=3, pending=2, compact=False)
    journal = bytearray((folder / JOURNAL).read_bytes())
    lines = len(record_starts(bytes(journal)))
    journal[-20] ^= 0x01  # inside the last record, which keeps its newline
    (folder / JOURNAL).write_bytes(bytes(journal))
    with pytest.raises(CorruptJournal) as info:
        JournalStore(folder, create=False)
    assert info.value.line == lines
    assert str(folder / JOURNAL) in str(info.value)
    assert (folder / JOURNAL).read_bytes() == bytes(journal)
    report = fsck(folder, repair=False)
    assert report.journal.bad_lines == [lines] and report.journal.torn_bytes == 0


def test_a_last_record_out_of_sequence_is_damage(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    build(folder, done=1, pending=2, compact=False)
    journal = (folder / JOURNAL).read_bytes()
    starts = record_starts(journal)
    # Drop the second-to-last record: the last one is intact but out of sequence.
    (folder / JOURNAL).write_bytes(journal[: starts[-2]] + journal[starts[-1] :])
    with pytest.raises(CorruptJournal) as info:
        JournalStore(folder, create=False)
    assert info.value.line == len(starts) - 1


def test_a_true_prefix_is_still_repaired_as_a_torn_tail(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    build(folder, done=3, pending=2, compact=False)
    journal = (folder / JOURNAL).read_bytes()
    starts = record_starts(journal)
    (folder / JOURNAL).write_bytes(journal[: starts[-1] + 10])
    store = JournalStore(folder, create=False)
    try:
        assert (folder / JOURNAL).read_bytes() == journal[: starts[-1]]
        assert "torn tail" in store.notices()[0]
    finally:
        store.close()


# -- point 4: fsck --repair of a damaged header -------------------------------


def _ids_agree(folder: Path) -> list[int]:
    store = JournalStore(folder, create=False)
    try:
        ids = [v.item_id for v in store.items()]
        assert len(ids) == len(set(ids)), "an id is listed twice"
        assert store.status().total == len(ids)
        return ids
    finally:
        store.close()


@pytest.mark.parametrize("pending", [0, 3])
def test_repair_of_a_damaged_header_rebuilds_next_id(tmp_path: Path, pending: int) -> None:
    folder = tmp_path / "q"
    build(folder, done=10)
    if pending:
        store = JournalStore(folder, create=False)
        store.enqueue([f"late-{i}" for i in range(pending)])
        store.close()
    _flip_first_line(folder / JOURNAL)
    report = fsck(folder, repair=True)
    assert report.repaired
    assert _ids_agree(folder) == list(range(1, 11 + pending))
    store = JournalStore(folder, create=False)
    try:
        store.enqueue(["brand-new", "item-1"])  # item-1 is archived: a duplicate
        new = [v for v in store.items() if v.item == "brand-new"]
        assert [v.item_id for v in new] == [11 + pending]
    finally:
        store.close()
    assert _ids_agree(folder) == list(range(1, 12 + pending))


def _flip_first_line(journal: Path) -> None:
    data = bytearray(journal.read_bytes())
    data[data.index(b"\n") // 2] ^= 0x04
    journal.write_bytes(bytes(data))


def test_repair_never_reuses_ids_only_a_checkpoint_remembers(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    store = JournalStore(folder, create=True)
    store.settings.checkpoint_every = store.settings.checkpoint_on_close = 1
    store.enqueue([f"item-{i}" for i in range(1, 6)])
    store.close()
    journal = (folder / JOURNAL).read_bytes()
    _flip_first_line(folder / JOURNAL)
    (folder / JOURNAL).write_bytes((folder / JOURNAL).read_bytes()[: record_starts(journal)[3]])
    fsck(folder, repair=True)
    ids = _ids_agree(folder)  # ids 1-2 survive; 3-5 are known only to the checkpoint
    assert ids == [1, 2]
    store = JournalStore(folder, create=False)
    try:
        store.enqueue(["new"])
        assert [v.item_id for v in store.items()][-1] == 6
    finally:
        store.close()


def test_repair_rebuilds_a_missing_journal_from_the_archive(
    compacted: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "q"
    shutil.copytree(compacted, folder)
    (folder / JOURNAL).unlink()
    assert fsck(folder, repair=False).damaged
    assert fsck(folder, repair=True).repaired
    assert _ids_agree(folder) == list(range(1, 101))


def test_a_queue_too_damaged_to_open_can_still_be_dropped(
    compacted: Path, sq_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = sq_home / "default"
    shutil.copytree(compacted, folder)
    _flip(folder / JOURNAL)
    code, out, err = cli(capsys, "drop", "default", "--yes")
    assert code == 0, err
    assert "dropped" in out
    assert not folder.exists()


def test_drop_of_a_damaged_queue_still_waits_for_its_runner(
    compacted: Path, sq_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import fcntl
    import os

    folder = sq_home / "default"
    shutil.copytree(compacted, folder)
    _flip(folder / JOURNAL)
    (folder / "runners").mkdir(exist_ok=True)
    fd = os.open(folder / "runners" / "r1.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, _, err = cli(capsys, "drop", "default", "--yes")
    finally:
        os.close(fd)
    assert code == 4, err  # RUNNER_ACTIVE, as run --single exits
    assert "active runner" in err
    assert folder.exists()
