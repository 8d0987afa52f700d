"""`export -o` / `report -o` into another user's FIFO or file in /tmp (tester's point 3).

A shell's `> /tmp/his-fifo` is refused by the kernel (fs.protected_fifos=2,
protected_regular=2: an O_CREAT open of another user's FIFO or file in a
sticky, world- or group-writable folder); statequeue wrote through a FIFO
without O_CREAT, and replaced a file by a rename, bypassing it. The same
rule now refuses both (exit 9, one line); one's own FIFO or file there, and
`-o /dev/stdout`, still work.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]
NOBODY = 65534
COMMANDS = [["export", "-o"], ["report", "-o"]]


def _sq(env: Env, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, timeout=30, check=False
    )


@pytest.fixture
def shared(tmp_path: Path, sq_env: Env) -> Path:
    """A /tmp-like folder: mode 1777, owned by root (tests run as root, or the user)."""
    assert _sq(sq_env, "enqueue", "a", "b").returncode == 0
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    return folder


@pytest.fixture
def fifo_reader(shared: Path) -> Iterator[tuple[Path, int]]:
    """A FIFO in the shared folder with a reader open (a writer never waits)."""
    fifo = shared / "fifo"
    os.mkfifo(fifo, 0o666)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    yield fifo, reader
    os.close(reader)


def _read_all(fd: int) -> bytes:
    try:
        return os.read(fd, 1 << 20)
    except BlockingIOError:
        return b""


def _refused(done: subprocess.CompletedProcess[bytes], *words: str) -> None:
    err = done.stderr.decode()
    assert done.returncode == 9, (done.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("command", COMMANDS, ids=["export", "report"])
def test_another_users_fifo_in_a_sticky_folder_is_refused(
    sq_env: Env, fifo_reader: tuple[Path, int], command: list[str]
) -> None:
    fifo, reader = fifo_reader
    os.chown(fifo, NOBODY, -1)
    _refused(_sq(sq_env, *command, str(fifo)), str(fifo), f"uid {NOBODY}")
    assert _read_all(reader) == b""  # he read nothing


@pytest.mark.parametrize("command", COMMANDS, ids=["export", "report"])
def test_another_users_file_in_a_sticky_folder_is_refused(
    sq_env: Env, shared: Path, command: list[str]
) -> None:
    his = shared / "his"
    his.write_bytes(b"his\n")
    os.chown(his, NOBODY, -1)
    _refused(_sq(sq_env, *command, str(his)), str(his), f"uid {NOBODY}")
    assert his.read_bytes() == b"his\n" and os.stat(his).st_uid == NOBODY


@pytest.mark.parametrize("command", COMMANDS, ids=["export", "report"])
def test_ones_own_fifo_and_file_there_and_stdout_still_work(
    sq_env: Env, fifo_reader: tuple[Path, int], shared: Path, command: list[str]
) -> None:
    fifo, reader = fifo_reader
    done = _sq(sq_env, *command, str(fifo))
    assert done.returncode == 0, done.stderr
    assert _read_all(reader)
    mine = shared / "mine"
    mine.write_bytes(b"old\n")
    done = _sq(sq_env, *command, str(mine))
    assert done.returncode == 0, done.stderr
    assert mine.read_bytes() != b"old\n"
    done = _sq(sq_env, *command, "/dev/stdout")
    assert done.returncode == 0 and done.stdout, done.stderr


def test_a_file_of_the_sticky_folders_owner_passes(
    sq_env: Env, tmp_path: Path, shared: Path
) -> None:
    # The kernel lets one write the folder owner's file: so does statequeue.
    os.chown(shared, NOBODY, -1)
    his = shared / "owners"
    his.write_bytes(b"")
    os.chown(his, NOBODY, -1)
    done = _sq(sq_env, "export", "-o", str(his))
    assert done.returncode == 0, done.stderr
