"""Files planted in a queue folder while it was open to others (tester's point 1).

The folders are checked (sshd's StrictModes), and the user fixes one that
was writable; but another user may have put files in it meanwhile: his own
journal, lock, log, or a FIFO. Every file statequeue opens in a queue folder
must be a regular file the user owns, or it is refused (one line, exit 9);
no open waits on a FIFO; `queues` skips such a queue with a warning.

Tests run as root: another user's file is one chowned to uid 65534.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import UnsafeFolder
from tests.conftest import STATEQUEUE

Env = dict[str, str]
NOBODY = 65534
UNSAFE = 9  # ExitCode.UNSAFE_FOLDER


def sq(env: Env, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    # A short lock timeout: a hang on another user's lock shows as exit 8, not a wait.
    env = {**env, "STATEQUEUE_LOCK_TIMEOUT": "2"}
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def refused(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == UNSAFE, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def queue(sq_home: Path) -> Path:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    return sq_home / "default"


def plant(path: Path, data: bytes = b"") -> None:
    """Another user's file at ``path``, mode 0666, in place of ours."""
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    os.chmod(path, 0o666)
    os.chown(path, NOBODY, -1)


def plant_fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path, 0o600)


# -- the one helper --------------------------------------------------------------------


def test_open_own_refuses_another_users_file_and_a_fifo_without_waiting(tmp_path: Path) -> None:
    from statequeue.core.fileio import open_own  # here: the old code has none (the check)

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        plant(tmp_path / "foreign", b"his")
        with pytest.raises(UnsafeFolder, match=f"owned by uid {NOBODY}"):
            open_own("foreign", os.O_RDONLY, fd)
        plant_fifo(tmp_path / "fifo")
        for flags in (os.O_RDONLY, os.O_RDWR, os.O_WRONLY):
            with pytest.raises(UnsafeFolder, match="not a regular file"):
                open_own("fifo", flags, fd)
        mine = open_own("mine", os.O_RDWR | os.O_CREAT, fd)
        os.close(mine)
    finally:
        os.close(fd)


# -- through the command ---------------------------------------------------------------


def test_another_users_journal_is_refused(queue: Path, sq_env: Env) -> None:
    data = (queue / "journal.jsonl").read_bytes()
    plant(queue / "journal.jsonl", data)
    for args in (["status"], ["enqueue", "b"], ["run", "--", "true"]):
        refused(sq(sq_env, *args), "journal.jsonl", f"uid {NOBODY}")
    assert (queue / "journal.jsonl").read_bytes() == data


def test_a_fifo_at_the_journal_is_refused_not_an_illegal_seek(queue: Path, sq_env: Env) -> None:
    plant_fifo(queue / "journal.jsonl")
    refused(sq(sq_env, "status"), "journal.jsonl", "FIFO")


@pytest.mark.parametrize("name", ["lock", "claims.lock"])
def test_another_users_held_lock_is_refused_at_once(queue: Path, sq_env: Env, name: str) -> None:
    sq(sq_env, "run", "--", "true")  # makes claims.lock
    with Queue(home=queue.parent) as q:
        q.enqueue(["b"])
    plant(queue / name)
    fd = os.open(queue / name, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, bytes(32))  # an OFD lock over it all, as he held
        refused(sq(sq_env, "run", "--", "true"), name, f"uid {NOBODY}")
    finally:
        os.close(fd)


def test_a_fifo_at_the_checkpoint_hangs_nothing(queue: Path, sq_env: Env, sq_home: Path) -> None:
    with Queue("other", home=sq_home) as q:
        q.enqueue(["x"])
    plant_fifo(queue / "state.ckpt")
    for args in (["status"], ["queues"], ["run", "--", "true"]):
        done = sq(sq_env, *args, timeout=20)  # the timeout is the hang this guards against
        assert done.returncode in (0, UNSAFE), (args, done.stderr)


def test_queues_skips_a_queue_with_another_users_journal(
    queue: Path, sq_env: Env, sq_home: Path
) -> None:
    with Queue("other", home=sq_home) as q:
        q.enqueue(["x"])
    plant(queue / "journal.jsonl", (queue / "journal.jsonl").read_bytes())
    done = sq(sq_env, "queues")
    assert done.returncode == 0, done.stderr  # as for an unsafe folder: skipped, warned
    assert "other" in done.stdout and "default" not in done.stdout
    assert "warning: skipped" in done.stderr and "journal.jsonl" in done.stderr


def test_another_users_log_is_replaced_by_the_runs_own(queue: Path, sq_env: Env) -> None:
    logs = queue / "logs"
    plant(logs / "1.1.log", b"planted\n")
    os.link(logs / "1.1.log", queue.parent.parent / "tailed")  # the inode he tails
    done = sq(sq_env, "run", "--", "sh", "-c", "echo alice-secret")
    assert done.returncode == 0, done.stderr
    assert (queue.parent.parent / "tailed").read_bytes() == b"planted\n"
    assert os.stat(logs / "1.1.log").st_uid == os.geteuid()
    shown = sq(sq_env, "logs", "1")
    assert shown.returncode == 0 and "alice-secret" in shown.stdout, shown.stderr
    plant(logs / "1.1.log", b"his words\n")  # planted after the run: refused, not shown
    refused(sq(sq_env, "logs", "1"), "1.1.log", f"uid {NOBODY}")


def test_a_linked_log_is_replaced_and_the_output_kept(queue: Path, sq_env: Env) -> None:
    elsewhere = queue.parent.parent / "elsewhere"
    elsewhere.write_bytes(b"untouched\n")
    (queue / "logs" / "1.1.log").symlink_to(elsewhere)
    done = sq(sq_env, "run", "--", "sh", "-c", "echo kept-output")
    assert done.returncode == 0, done.stderr
    assert elsewhere.read_bytes() == b"untouched\n"
    assert not (queue / "logs" / "1.1.log").is_symlink()
    shown = sq(sq_env, "logs", "1")
    assert shown.returncode == 0 and "kept-output" in shown.stdout, shown.stderr


def test_create_own_replaces_what_is_planted_at_its_name(tmp_path: Path) -> None:
    from statequeue.core.fileio import create_own  # here: the old code has none

    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        plant(tmp_path / "1.1.log", b"his")
        os.link(tmp_path / "1.1.log", tmp_path / "his-copy")  # what he would tail
        plant_fifo(tmp_path / "2.1.log")
        (tmp_path / "3.1.log").symlink_to(tmp_path / "his-copy")
        for name in ("1.1.log", "2.1.log", "3.1.log"):
            out = create_own(name, fd)
            os.write(out, b"mine")
            os.close(out)
            st = os.stat(tmp_path / name, follow_symlinks=False)
            assert st.st_uid == os.geteuid() and (tmp_path / name).read_bytes() == b"mine"
        assert (tmp_path / "his-copy").read_bytes() == b"his"
    finally:
        os.close(fd)
