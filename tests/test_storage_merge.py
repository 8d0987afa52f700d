"""Where the damage checks (issue 10, points 1-4) meet the queue folder handle
and read-only queues (issue 10, points 5 and 11): the checks run on a
read-only queue too, a torn tail there is reported but not cut, and the
checks themselves never look through a link planted in the queue folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.store.journal.store import ARCHIVE, JOURNAL, JournalStore
from tests.privileges import without_write_access
from tests.test_folder_security import (
    SECRET,
    UNSAFE,
    Env,
    one_line_error,
    sq,
)

DAMAGED = 5


@pytest.fixture
def compacted(sq_home: Path) -> Path:
    """The queue `default`: two items done and compacted into the archive, one pending."""
    store = JournalStore(sq_home / "default", create=True)
    try:
        store.enqueue(["a", "b", "c"])
        runner = new_runner()
        for _ in range(2):
            claim = store.claim(runner)
            assert claim is not None
            store.finish(claim, Outcome(ok=True))
        store.compact()
    finally:
        store.close()
    return sq_home / "default"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "victim").write_bytes(SECRET)
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _read_only(folder: Path) -> Iterator[Path]:
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o500 if path.is_dir() else 0o400)
    yield folder
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, 0o700 if path.is_dir() else 0o600)


def _empty(folder: Path) -> None:
    (folder / JOURNAL).write_bytes(b"")


def _delete(folder: Path) -> None:
    (folder / JOURNAL).unlink()


@pytest.mark.parametrize("damage", [_empty, _delete], ids=["emptied", "deleted"])
def test_a_damaged_read_only_queue_is_refused_with_exit_5(
    compacted: Path, sq_env: Env, damage: Callable[[Path], None]
) -> None:
    damage(compacted)
    for folder in _read_only(compacted):
        before = _snapshot(folder)
        for args in (["status"], ["list"]):
            one_line_error(sq(sq_env, *args, wrap=without_write_access()), DAMAGED)
        done = sq(sq_env, "fsck", wrap=without_write_access())  # a check needs no write access
        assert done.returncode == DAMAGED and "damage found" in done.stderr, done.stderr
        assert _snapshot(folder) == before


def test_a_torn_tail_on_a_read_only_queue_is_left_and_not_called_repaired(
    compacted: Path, sq_env: Env
) -> None:
    with (compacted / JOURNAL).open("ab") as f:
        f.write(b'{"seq":9,"t":"enq"')  # a crash cut this append short
    for folder in _read_only(compacted):
        before = _snapshot(folder)
        done = sq(sq_env, "status", wrap=without_write_access())
        assert done.returncode == 0, done.stderr
        assert "torn tail" in done.stderr and "left in place" in done.stderr, done.stderr
        assert "repaired" not in done.stderr
        assert _snapshot(folder) == before
    done = sq(sq_env, "status")  # its next writer cuts it, and says so
    assert done.returncode == 0 and "repaired a torn tail" in done.stderr, done.stderr
    assert (compacted / JOURNAL).read_bytes().endswith(b"\n")


def test_fsck_does_not_read_an_archive_planted_as_a_link(
    compacted: Path, sq_env: Env, outside: Path
) -> None:
    (outside / "victim").write_bytes((compacted / ARCHIVE).read_bytes())
    (compacted / ARCHIVE).unlink()
    (compacted / ARCHIVE).symlink_to(outside / "victim")
    victim = (outside / "victim").read_bytes()
    for args in (["fsck"], ["fsck", "--repair"]):
        one_line_error(sq(sq_env, *args), UNSAFE, "symbolic link")
    assert (outside / "victim").read_bytes() == victim
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_the_is_it_new_check_does_not_list_a_linked_subfolder(
    sq_home: Path, sq_env: Env, outside: Path
) -> None:
    # A folder without a journal is new only if it holds nothing of a queue;
    # that is looked up relative to the folder: a planted `logs` link is
    # refused as one, never listed (it would name the victim as "history").
    folder = sq_home / "default"
    folder.mkdir(parents=True, mode=0o700)
    (folder / "logs").symlink_to(outside)
    for args in (["status"], ["enqueue", "a"], ["fsck"]):
        done = sq(sq_env, *args)
        one_line_error(done, UNSAFE, "symbolic link")
        assert "victim" not in done.stderr
    assert not (folder / JOURNAL).exists()
    assert sorted(p.name for p in outside.iterdir()) == ["victim"]


def test_queues_skips_a_plain_file_in_the_home_and_lists_a_damaged_queue(
    compacted: Path, sq_env: Env
) -> None:
    (compacted.parent / "notes.txt").write_text("not a queue\n")
    assert sq(sq_env, "queues").returncode == 0
    _delete(compacted)  # the archive remains: a damaged queue, never left out
    one_line_error(sq(sq_env, "queues"), DAMAGED)
