"""The queue folder's ``reserve``: made by a run, known to every command.

A run keeps 64 KiB in reserve in its queue folder (space_reserve.py), freed
to give its items back when the disk fills (tests/faults/
test_full_disk_give_back.py). Everything else that looks at a queue folder
takes the file as the queue's own: `fsck` calls it no damage, `drop`
removes it, `queues` lists the queue as before, and it is opened as every
file there is (a link planted in its place is refused, never followed). It
is best effort: a run that cannot make it goes on without it. Only the
journal store keeps one.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

import pytest

from statequeue.core.errors import DiskFull
from statequeue.store.journal.folder import QueueFolder
from statequeue.store.journal.space_reserve import NAME, SIZE, keep
from statequeue.store.memory import MemoryStore
from tests.conftest import STATEQUEUE


def sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_a_run_keeps_a_reserve_that_every_command_takes_as_the_queues(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    assert sq(sq_env, "enqueue", "a").returncode == 0
    reserve = sq_home / "default" / NAME
    assert not reserve.exists()  # only a run makes it
    assert sq(sq_env, "run", "--no-live", "--", "true").returncode == 0
    st = reserve.stat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_size == SIZE and st.st_blocks * 512 >= SIZE  # allocated, not sparse
    checked = sq(sq_env, "fsck")
    assert checked.returncode == 0 and str(reserve) not in checked.stdout + checked.stderr
    listed = sq(sq_env, "queues")
    assert listed.returncode == 0 and listed.stdout.startswith("default\t"), listed
    assert sq(sq_env, "export").returncode == 0
    dropped = sq(sq_env, "drop", "default", "--yes")
    assert dropped.returncode == 0, dropped.stderr
    assert not (sq_home / "default").exists()


def test_a_link_in_place_of_the_reserve_is_refused(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    assert sq(sq_env, "enqueue", "a").returncode == 0
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not ours to fill")
    (sq_home / "default" / NAME).symlink_to(target)
    done = sq(sq_env, "run", "--no-live", "--", "true")
    assert done.returncode == 9, done.stderr  # ExitCode.UNSAFE_FOLDER, as for every file there
    assert "symbolic link" in done.stderr
    assert target.read_bytes() == b"not ours to fill"


def test_a_reserve_that_cannot_be_made_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "posix_fallocate", no_room)
    folder = QueueFolder.open(tmp_path / "q", create=True)
    try:
        assert keep(folder) is False
        assert not folder.exists(NAME)  # a part of one would take room the run needs
    finally:
        folder.close()


def test_a_store_without_files_keeps_no_reserve() -> None:
    store = MemoryStore()
    store.keep_space_reserve()
    with store.space_reserve_freed(DiskFull("appending failed: disk full")) as freed:
        assert freed is False
