"""A queue dropped by another process while a `Queue` (or a CLI watcher) has
it open: its next use raises QueueNotFound (exit 7) saying it was dropped,
never a raw FileNotFoundError (exit 6 in the CLI)."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from statequeue import Queue
from statequeue.core.errors import QueueNotFound
from tests.conftest import STATEQUEUE
from tests.waiting import DEADLINE

USES: dict[str, Callable[[Queue], object]] = {
    "enqueue": lambda q: q.enqueue(["c"]),
    "work": lambda q: next(iter(q.work())),
    "status": lambda q: q.status(),
    "stats": lambda q: q.stats(),
    "history": lambda q: q.history(1),
    "retry": lambda q: q.retry([1]),
    "events": lambda q: next(q.event_batches(follow=False)),
    "export": lambda q: q.export(io.BytesIO()),
    "read_log": lambda q: q.read_log(1, 1),
}


def _drop(name: str, sq_env: dict[str, str]) -> None:
    """`statequeue drop NAME --yes` in another process, as the user would."""
    subprocess.run([STATEQUEUE, "drop", name, "--yes"], env=sq_env, check=True, capture_output=True)


@pytest.mark.parametrize("use", list(USES))
@pytest.mark.parametrize("made_again", [False, True], ids=["gone", "made-again"])
def test_a_queue_dropped_by_another_process_raises_queue_not_found(
    sq_home: Path, sq_env: dict[str, str], use: str, made_again: bool
) -> None:
    queue = Queue("q", home=sq_home)
    queue.enqueue(["a", "b"])
    for item in queue.work():
        item.done()
        break
    _drop("q", sq_env)
    if made_again:  # a new queue of the same name is not the one this Queue had
        Queue("q", home=sq_home).close()
    with pytest.raises(QueueNotFound, match=r"^queue 'q' was dropped: its folder .* was removed"):
        USES[use](queue)
    queue.close()  # closing what was dropped is quiet


@pytest.mark.parametrize(
    "watcher",
    [
        ["status", "--watch", "--interval", "0.1"],
        ["status", "--watch", "--json", "--interval", "0.1"],
        ["events", "--follow"],
        ["logs", "2", "--follow"],  # item 2 is pending: followed until it ends
    ],
    ids=" ".join,
)
def test_a_watcher_says_in_one_line_that_its_queue_was_dropped(
    sq_env: dict[str, str], watcher: list[str]
) -> None:
    subprocess.run([STATEQUEUE, "enqueue", "a", "b"], env=sq_env, check=True)
    subprocess.run([STATEQUEUE, "run", "--limit", "1", "--", "true"], env=sq_env, check=True)
    job = subprocess.Popen(
        [STATEQUEUE, *watcher],
        env=sq_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert job.stdout is not None
        if watcher[0] != "logs":  # it printed: it is watching
            assert job.stdout.readline()
        else:
            time.sleep(0.5)
        _drop("default", sq_env)
        _, err = job.communicate(timeout=DEADLINE)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert err.decode().splitlines() == [
        f"statequeue: queue 'default' was dropped: its folder {sq_env['STATEQUEUE_HOME']}"
        "/default was removed after this process opened it"
    ]
    assert job.returncode == 7  # NOT_FOUND, not 6 (an I/O error)


def test_a_use_between_the_journal_and_the_folder_going_reads_as_dropped(sq_home: Path) -> None:
    queue = Queue("q", home=sq_home)
    queue.enqueue(["a"])
    (sq_home / "q" / "journal.jsonl").unlink()  # as a drop that is still removing the folder
    threading.Timer(0.2, shutil.rmtree, [sq_home / "q"]).start()
    with pytest.raises(QueueNotFound, match="was dropped"):
        queue.status()
    queue.close()


def test_drop_removes_the_journal_last(sq_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = Queue("q", home=sq_home)
    queue.enqueue(["a"])
    for item in queue.work():
        item.done()
    (sq_home / "q" / "logs" / "1.1.log").write_text("out")
    removed: list[str] = []
    unlink = os.unlink

    def recorded(name: str, *, dir_fd: int | None = None) -> None:
        removed.append(os.fsdecode(name))
        unlink(name, dir_fd=dir_fd)

    listdir, scandir = os.listdir, os.scandir
    first = "journal.jsonl".__ne__  # sorts it first: the folder's own order must not matter

    def journal_first(path: Any = None) -> Any:
        return sorted(listdir(path), key=first)

    def scanned_journal_first(path: Any = None) -> Any:
        with scandir(path) as found:
            return _Entries(sorted(found, key=lambda e: first(e.name)))

    monkeypatch.setattr(os, "unlink", recorded)
    monkeypatch.setattr(os, "listdir", journal_first)
    monkeypatch.setattr(os, "scandir", scanned_journal_first)
    queue.drop()
    assert not (sq_home / "q").exists()
    assert "1.1.log" in removed and "lock" in removed
    assert removed[-1] == "journal.jsonl"  # while it is there, an open queue reads as usual


class _Entries(list[Any]):
    """A list of os.DirEntry that is also a context manager, as os.scandir's result is."""

    def __enter__(self) -> _Entries:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
