"""Permission cases exit 9 or 2, never 6 "a write or fsync failed" (tester's point 4).

A home that is another user's 0700 folder, or one below a folder closed to
the user, said "statequeue: error: DIR: Permission denied" with exit 6, and
`drop` on a read-only mount "claims.lock: Read-only file system" with exit
6. Exit 6 is for a failing disk; these are exit-codes.md's 9 (another
user's folder) and 2 (a folder you may not read or write), naming the folder.

Root ignores file modes: the home cases run the command under setpriv
without the capabilities that bypass them; the read-only mount is an
injected EROFS.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from statequeue.api.maintenance import drop_queue
from statequeue.api.queue import Queue
from statequeue.core.errors import StateQueueError
from tests.conftest import STATEQUEUE
from tests.privileges import without_write_access

NOBODY = 65534


def _sq(env: dict[str, str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*without_write_access(), STATEQUEUE, *args],
        env={**env, "STATEQUEUE_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int, *words: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def closed(tmp_path: Path) -> Path:
    """Another user's 0700 folder in a shared one."""
    folder = tmp_path / "shared" / "a1"
    folder.mkdir(parents=True)
    os.chown(folder, NOBODY, -1)
    os.chmod(folder, 0o700)
    return folder


@pytest.mark.parametrize("args", [["status"], ["enqueue", "z"], ["queues"]])
def test_another_users_closed_home_is_refused_as_not_yours(
    closed: Path, sq_env: dict[str, str], args: list[str]
) -> None:
    _one_line(_sq(sq_env, closed, *args), 9, str(closed), f"uid {NOBODY}")


@pytest.mark.parametrize("args", [["status"], ["enqueue", "z"], ["queues"]])
def test_a_home_below_a_closed_folder_is_one_you_may_not_read(
    closed: Path, sq_env: dict[str, str], args: list[str]
) -> None:
    home = closed / "x"
    _one_line(_sq(sq_env, home, *args), 2, str(home), "Permission denied")


def test_drop_on_a_read_only_mount_is_not_a_failing_disk(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    real_unlink = os.unlink

    def read_only(path: str, *, dir_fd: int | None = None) -> None:
        if dir_fd is None:
            real_unlink(path)
            return
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(os, "unlink", read_only)
    with pytest.raises(StateQueueError) as caught:
        drop_queue("default", home=sq_home)
    assert caught.value.exit_code == 2
    assert str(sq_home / "default") in caught.value.message
    assert "Read-only file system" in caught.value.message
    monkeypatch.undo()
    assert (sq_home / "default" / "journal.jsonl").exists()
