"""Input that never ends a line (/dev/zero) for `enqueue --file`, `enqueue`
on stdin and `import`: refused with one line and exit 2 once a line is past
its limit, nothing enqueued or created, memory bounded. They used to read
until MemoryError. Each runs the real CLI with its address space capped, so
reading on would fail rather than take the machine's memory."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue import Queue
from tests.conftest import STATEQUEUE

Env = dict[str, str]
USAGE = 2
MEMORY_CAP = 2 << 30  # bytes of address space: well above a run's need, far below the input


def _capped() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def sq(env: Env, *args: str, stdin: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args],
        env=env,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_capped,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == USAGE, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_enqueue_file_dev_zero_is_refused_like_a_long_line(sq_env: Env, sq_home: Path) -> None:
    line = one_line(sq(sq_env, "enqueue", "-q", "z", "--file", "/dev/zero"))
    assert line.startswith("statequeue: /dev/zero: line 1: item of at least ")
    assert line.endswith("bytes exceeds the 65536-byte limit")
    assert not (sq_home / "z").exists()


def test_enqueue_stdin_dev_zero_into_an_existing_queue_adds_nothing(
    sq_env: Env, sq_home: Path
) -> None:
    Queue("z", home=sq_home).enqueue(["kept"])
    with open("/dev/zero", "rb") as zero:
        line = one_line(sq(sq_env, "enqueue", "-q", "z", stdin=zero.fileno()))
    assert line.startswith("statequeue: line 1: item of at least ")
    with Queue("z", home=sq_home, create=False) as q:
        assert [v.item for v in q.items()] == ["kept"]


def test_endless_line_after_good_ones_is_named_by_its_line(
    sq_env: Env, sq_home: Path, tmp_path: Path
) -> None:
    start = tmp_path / "start"
    start.write_bytes(b"a\n\n\nb\n")
    feed = subprocess.Popen(["cat", str(start), "/dev/zero"], stdout=subprocess.PIPE)
    try:
        assert feed.stdout is not None
        line = one_line(sq(sq_env, "enqueue", "-q", "z", stdin=feed.stdout.fileno()))
    finally:
        feed.kill()
        feed.wait()
    assert line.startswith("statequeue: line 5: item of at least ")
    assert not (sq_home / "z").exists()


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_import_dev_zero_is_refused(sq_env: Env, sq_home: Path, how: str) -> None:
    if how == "file":
        done = sq(sq_env, "import", "-q", "z", "/dev/zero")
    else:
        with open("/dev/zero", "rb") as zero:
            done = sq(sq_env, "import", "-q", "z", stdin=zero.fileno())
    assert one_line(done) == (
        "statequeue: line 1: longer than 65536 bytes: not a statequeue export"
    )
    assert not (sq_home / "z").exists()


def test_import_endless_item_line_is_refused(sq_env: Env, sq_home: Path, tmp_path: Path) -> None:
    header = tmp_path / "header"
    header.write_bytes(b'{"statequeue_export":1,"queue":"x","items":1}\n')
    feed = subprocess.Popen(["cat", str(header), "/dev/zero"], stdout=subprocess.PIPE)
    try:
        assert feed.stdout is not None
        done = sq(sq_env, "import", "-q", "z", stdin=feed.stdout.fileno())
    finally:
        feed.kill()
        feed.wait()
    assert one_line(done) == ("statequeue: line 2: longer than 268435456 bytes: not an export line")
    assert not (sq_home / "z").exists()


LIBRARY_IMPORT = """
from statequeue import Queue
from statequeue.core.errors import InvalidExport

with Queue("z") as q, open("/dev/zero", "rb") as zero:
    try:
        q.import_(zero)
    except InvalidExport as exc:
        print(exc)
    print(len(list(q.items())))
"""


def test_library_import_of_an_open_file_is_bounded_too(sq_env: Env) -> None:
    done = subprocess.run(
        [sys.executable, "-c", LIBRARY_IMPORT],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=_capped,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "line 1: longer than 65536 bytes: not a statequeue export\n0\n"


def test_running_out_of_memory_is_one_line_and_exit_10(sq_env: Env) -> None:
    """A valid input too big for the memory a limit leaves (an endless
    stream of short lines): MemoryError ended `enqueue` with a traceback,
    exit 1 (the code of a failed item). Now one line, exit 10 (resources)."""
    cap = 400 << 20

    def capped() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    feed = subprocess.Popen(["seq", "1", "100000000"], stdout=subprocess.PIPE)
    try:
        done = subprocess.run(
            [STATEQUEUE, "-q", "big", "enqueue"],
            env=sq_env,
            stdin=feed.stdout,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=capped,
        )
    finally:
        feed.kill()
        feed.wait()
    assert done.returncode == 10, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("statequeue: out of memory") and done.stderr.count("\n") == 1
