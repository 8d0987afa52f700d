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


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EOPNOTSUPP])
def test_a_reserve_that_cannot_be_made_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    def refused(fd: int, offset: int, length: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", refused)
    folder = QueueFolder.open(tmp_path / "q", create=True)
    try:
        if code == errno.EOPNOTSUPP:  # best effort: the run goes on without one
            assert keep(folder) is False
        else:  # no room: the run must not start (it could not give its items back)
            with pytest.raises(DiskFull, match="no room on the disk"):
                keep(folder)
        assert not folder.exists(NAME)  # a part of one would take room the run needs
    finally:
        folder.close()


# The real CLI, with no room on the disk for the reserve (and none for much else).
_NO_ROOM_RUN = """
import errno, os, sys
def no_room(fd, offset, length):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
os.posix_fallocate = no_room
from statequeue.cli.main import main
main(sys.argv[1:])
"""


def test_a_run_with_no_room_for_its_reserve_claims_nothing(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    """A disk that fills while the run has no reserve left its items in flight
    to be recovered as crashes: an outside tester's item was held as poison
    after three such runs. Such a run now refuses to start: one line, exit 6."""
    import sys

    assert sq(sq_env, "enqueue", "a", "b").returncode == 0
    done = subprocess.run(
        [sys.executable, "-c", _NO_ROOM_RUN, "run", "--no-live", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 6, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "space reserve" in lines[0], done.stderr
    status = sq(sq_env, "status", "--json")
    assert '"pending": 2' in status.stdout.replace('"pending":2', '"pending": 2'), status.stdout


def test_a_library_loop_with_no_room_for_its_reserve_claims_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statequeue import Queue

    def no_room(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with Queue("q", home=tmp_path / "home") as q:
        q.enqueue(["a"])
        monkeypatch.setattr(os, "posix_fallocate", no_room)
        with pytest.raises(DiskFull, match="space reserve"):
            for item in q.work():
                item.done()
        assert q.status().counts["pending"] == 1 and not q.status().runners


def test_a_store_without_files_keeps_no_reserve() -> None:
    store = MemoryStore()
    store.keep_space_reserve()
    with store.space_reserve_freed(DiskFull("appending failed: disk full")) as freed:
        assert freed is False
