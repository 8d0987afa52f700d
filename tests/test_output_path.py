"""`export -o` and `report -o` write through what is not a regular file.

Both replace the target with a new file renamed over it (whole or not at
all). A device, a FIFO or a socket must not be replaced: as root, `export -o
/dev/null` used to leave a regular file where /dev/null was, for every
program on the machine. A FIFO here stands for them all (a test must not touch
the real /dev/null); a symbolic link is followed and stays a link.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path

import orjson
import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]


def _sq(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, "-q", "q", *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def queue_env(sq_env: Env) -> Env:
    assert _sq(sq_env, "enqueue", "a", "b").returncode == 0
    assert _sq(sq_env, "run", "--quiet", "--", "true").returncode == 0
    return sq_env


def _read_all(fifo: Path, into: list[bytes]) -> threading.Thread:
    def read() -> None:
        with open(fifo, "rb") as f:
            into.append(f.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("command", ["export", "report"])
def test_a_fifo_is_written_through_and_stays_a_fifo(
    queue_env: Env, tmp_path: Path, command: str
) -> None:
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = _read_all(fifo, got)
    done = _sq(queue_env, command, "-o", str(fifo))
    reader.join(timeout=60)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a file"
    assert got and got[0], "the reader got nothing"
    if command == "export":
        lines = [orjson.loads(line) for line in got[0].splitlines()]
        assert len(lines) == 3  # the header and two items
    else:
        assert got[0].lstrip().startswith(b"<!")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.parametrize("command", ["export", "report"])
def test_a_link_stays_a_link_and_what_it_names_gets_the_file(
    queue_env: Env, tmp_path: Path, command: str
) -> None:
    real = tmp_path / "real" / "out.txt"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    done = _sq(queue_env, command, "-o", str(link))
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() != "old" and real.stat().st_size > 0
