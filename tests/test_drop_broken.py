"""`drop` of a queue folder broken in other ways than a damaged journal (its
`lock` a folder, its `logs` or `runners` a file): `queues` lists it as
damaged, and drop deletes it as it deletes a queue with a damaged journal
(--yes, no runner active). A folder that holds no queue is still refused, and
so is a linked queue folder."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded


def lock_a_folder(queue: Path) -> None:
    (queue / "lock").unlink()
    (queue / "lock").mkdir()


def logs_a_file(queue: Path) -> None:
    for entry in (queue / "logs").iterdir():
        entry.unlink()
    (queue / "logs").rmdir()
    (queue / "logs").write_text("")


def runners_a_file(queue: Path) -> None:
    (queue / "runners").rmdir()
    (queue / "runners").write_text("")


@pytest.mark.parametrize("breakage", [lock_a_folder, logs_a_file, runners_a_file])
def test_drop_deletes_a_broken_queue(
    sq_home: Path, capsys: pytest.CaptureFixture[str], breakage: Callable[[Path], None]
) -> None:
    Queue("q", home=sq_home).enqueue(["a"])
    Queue("other", home=sq_home).enqueue(["b"])
    breakage(sq_home / "q")
    assert run_guarded(_invoke, ["queues"]) == 5  # listed as damaged
    capsys.readouterr()
    assert run_guarded(_invoke, ["drop", "q"]) == 2  # still asks for --yes (stdin: no tty)
    assert "pass --yes" in capsys.readouterr().err
    assert (sq_home / "q").is_dir()
    assert run_guarded(_invoke, ["drop", "q", "--yes"]) == 0
    assert capsys.readouterr().out == "dropped queue 'q'\n"
    assert sorted(p.name for p in sq_home.iterdir()) == ["other"]


def test_drop_refuses_a_broken_queue_with_an_active_runner(
    sq_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Queue("q", home=sq_home).enqueue(["a"])
    lock_a_folder(sq_home / "q")
    fd = os.open(sq_home / "q" / "runners" / "r1.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # as a live runner holds its lock
        assert run_guarded(_invoke, ["drop", "q", "--yes"]) == 4  # RUNNER_ACTIVE
        assert "active runner" in capsys.readouterr().err
        assert (sq_home / "q" / "journal.jsonl").exists()
    finally:
        os.close(fd)


def test_drop_still_refuses_a_folder_that_holds_no_queue(
    sq_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Queue("q", home=sq_home).enqueue(["a"])
    (sq_home / "stuff").mkdir(mode=0o700)
    (sq_home / "stuff" / "lock").mkdir()  # looks broken, but no journal: not a queue
    (sq_home / "stuff" / "keep.txt").write_text("mine")
    assert run_guarded(_invoke, ["drop", "stuff", "--yes"]) == 7
    assert (sq_home / "stuff" / "keep.txt").read_text() == "mine"


def test_drop_never_follows_a_linked_broken_queue(
    sq_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Queue("q", home=sq_home).enqueue(["a"])
    outside = tmp_path / "outside"
    (sq_home / "q").rename(outside)
    (sq_home / "q").symlink_to(outside)
    lock_a_folder(outside)
    assert run_guarded(_invoke, ["drop", "q", "--yes"]) == 9
    assert (outside / "journal.jsonl").exists()


@pytest.mark.parametrize("stray", ["claims.lock", "state.ckpt", "stats.ckpt", "archive.jsonl"])
def test_drop_never_deletes_a_users_file_beside_a_stray_queue_file(
    sq_home: Path, capsys: pytest.CaptureFixture[str], stray: str
) -> None:
    """A folder in the home holding a user's file and one file with a queue's
    name (no journal): it opened as a damaged queue, and drop deleted the
    folder with the user's file in it."""
    folder = sq_home / "nq"
    folder.mkdir(mode=0o700, parents=True)
    (folder / "mydata.txt").write_text("precious")
    (folder / stray).write_text("junk")
    assert run_guarded(_invoke, ["drop", "nq", "--yes"]) == 2
    assert "mydata.txt, which statequeue did not make" in capsys.readouterr().err
    assert (folder / "mydata.txt").read_text() == "precious"


def test_drop_keeps_a_healthy_queue_that_holds_a_users_file(
    sq_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    Queue("q", home=sq_home).enqueue(["a"])
    (sq_home / "q" / "notes.txt").write_text("mine")
    assert run_guarded(_invoke, ["drop", "q", "--yes"]) == 2
    assert (sq_home / "q" / "notes.txt").read_text() == "mine"
    (sq_home / "q" / "notes.txt").unlink()
    assert run_guarded(_invoke, ["drop", "q", "--yes"]) == 0
    assert not (sq_home / "q").exists()


def test_queue_drop_in_the_library_keeps_a_users_file(sq_home: Path) -> None:
    from statequeue.core.errors import UsageError

    q = Queue("q", home=sq_home)
    q.enqueue(["a"])
    (sq_home / "q" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"notes\.txt, which statequeue did not make"):
        q.drop()
    assert (sq_home / "q" / "notes.txt").read_text() == "mine"
    q.close()
