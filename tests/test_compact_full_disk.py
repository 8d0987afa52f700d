"""`compact --keep-logs` on a full disk: the logs go first.

An outside tester filled a 2 MiB tmpfs with a run's logs (1.7M of it), then
asked `compact --keep-logs 0s` to free it. Compaction appended to the archive
first, failed ("disk full", exit 6) and never reached the logs: the disk stayed
full until `rm` by hand. Removing needs no space, so compaction now removes
the logs it is asked to first, and they stay removed even when the rewrite
then fails; a rewrite that still finds no room says what frees space.

The full disk is a fault layer over the store's file operations (FileOps):
every write fails with ENOSPC while the logs folder holds more than ``room``
files, as on the tester's tmpfs, where each small log took a page.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.errors import DurabilityError
from statequeue.core.fileio import FileOps, durability_error
from statequeue.store.journal.store import JournalStore
from tests.conftest import STATEQUEUE


class LogsFillTheDisk(FileOps):
    """Writes fail with ENOSPC while ``logs`` holds more than ``room`` files
    (None: always)."""

    def __init__(self, logs: Path, room: int | None) -> None:
        self.logs = logs
        self.room = room
        self.refused = 0

    def write_all(self, fd: int, data: bytes) -> None:
        if self.room is None or len(os.listdir(self.logs)) > self.room:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().write_all(fd, data)


def _ran(env: dict[str, str], store_url: str = "") -> Path:
    """Items a, b (done) and c (failed), each with its log; the queue's folder."""
    store = ["--store", store_url] if store_url else []
    subprocess.run([STATEQUEUE, *store, "enqueue", "a", "b", "c"], env=env, check=True)
    job = 'echo "out $1"; [ "$1" != c ]'
    subprocess.run(
        [STATEQUEUE, *store, "run", "--", "sh", "-c", job, "sh", "{}"],
        env=env,
        capture_output=True,
        check=False,
        timeout=120,
    )
    folder = Path(env["STATEQUEUE_HOME"]) / "default"
    if store_url:  # its logs are in the database
        return folder
    assert sorted(os.listdir(folder / "logs")) == ["1.1.log", "2.1.log", "3.1.log"]
    return folder


def _open(folder: Path, ops: FileOps) -> Queue:
    return Queue(store=JournalStore(folder, create=False, ops=ops, auto_compact=0))


def test_compact_frees_a_full_disk_by_removing_the_logs_first(sq_env: dict[str, str]) -> None:
    folder = _ran(sq_env)
    full = LogsFillTheDisk(folder / "logs", room=1)  # the failed item's log fits
    with _open(folder, full) as q:
        result = q.compact(keep_logs=0)
        assert (result.archived, result.logs_removed.files) == (2, 2)
        assert {v.item: v.state.value for v in q.items()} == {
            "a": "done",
            "b": "done",
            "c": "failed",
        }
    assert full.refused == 0  # nothing was written while the disk was full
    assert os.listdir(folder / "logs") == ["3.1.log"]  # a failed item's log stays


def test_logs_are_removed_even_when_the_rewrite_still_finds_no_room(
    sq_env: dict[str, str],
) -> None:
    folder = _ran(sq_env)
    full = LogsFillTheDisk(folder / "logs", room=None)
    with _open(folder, full) as q, pytest.raises(DurabilityError) as caught:
        q.compact(keep_logs=0)
    assert full.refused >= 1
    assert os.listdir(folder / "logs") == ["3.1.log"]
    said = caught.value.message
    assert "disk full" in said
    assert "removed 2 logs of finished items, not enough: free space on the disk, then run" in said
    # Nothing was lost: the next compaction, with room, archives both.
    with _open(folder, FileOps()) as q:
        assert q.compact(keep_logs=0).archived == 2
        assert [v.state.value for v in q.items()] == ["done", "done", "failed"]


def test_every_store_removes_the_logs_before_it_compacts(
    sq_env: dict[str, str], sq_home: Path, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On both stores the finished items' logs go before the rewrite: a
    compaction that fails (here at once, as on a full disk) has removed them
    all the same, and only theirs."""
    _ran(sq_env, store_url)
    with Queue(home=sq_home, store=store_url or None, create=False) as q:
        full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def no_room() -> None:
            raise durability_error("appending to", "the archive", full)

        monkeypatch.setattr(q.store, "compact", no_room)
        with pytest.raises(DurabilityError):
            q.compact(keep_logs=0)
        monkeypatch.undo()
        assert [q.read_log(i, 1) for i in (1, 2, 3)] == [None, None, b"out c\n"]
        assert q.compact(keep_logs=0).archived == 2


# The CLI on the same full disk, through its real entry, in a process of its own.
_FULL_CLI = """
import errno, os, sys
from statequeue.core import fileio
def full(fd, data):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
fileio.DEFAULT_OPS.write_all = full
from statequeue.cli.main import main
main(sys.argv[1:])
"""


def test_the_cli_says_what_frees_space(sq_env: dict[str, str]) -> None:
    folder = _ran(sq_env)
    out = subprocess.run(
        [sys.executable, "-c", _FULL_CLI, "compact", "--keep-logs", "7d"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 6, out
    assert out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert line.startswith("statequeue: ") and "disk full" in line, line
    assert "compact --keep-logs 0s` frees space" in line, line
    assert len(os.listdir(folder / "logs")) == 3  # none was older than 7 days


def test_any_command_that_meets_a_full_disk_says_what_frees_space(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run whose result cannot be written (the tester's run exited 6 on the
    full tmpfs) says how to free space, as compaction does; compaction's own
    advice is not doubled."""
    from statequeue.cli.errors import exit_code_of
    from statequeue.core.errors import DiskFull

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    run = durability_error("appending to", "/q/journal.jsonl", full)
    assert isinstance(run, DiskFull)
    assert exit_code_of(run) == 6
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and "disk full" in line, line
    assert "compact --keep-logs 0s` removes the logs of finished items" in line
    own = DiskFull("compacting failed: disk full (free space on the disk, then ...)")
    assert exit_code_of(own) == 6
    assert "--keep-logs 0s" not in capsys.readouterr().err


def test_a_full_disk_hint_names_compact_only_where_there_are_logs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A new queue's first enqueue on a full disk was told that `compact
    --keep-logs 0s` removes the logs of finished items: it has none, and
    compaction frees nothing there. It is told to free space; a queue with
    logs is still told what removes them."""
    from statequeue.cli.errors import exit_code_of

    folder = tmp_path / "default"
    (folder / "logs").mkdir(parents=True)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    first = durability_error("writing", str(folder / "journal.jsonl"), full)
    assert exit_code_of(first) == 6
    line = capsys.readouterr().err
    assert line.count("\n") == 1 and line.rstrip().endswith("(free space)"), line
    assert "compact" not in line, line
    (folder / "logs" / "1.1.log").write_bytes(b"output\n")
    assert exit_code_of(durability_error("writing", str(folder / "journal.jsonl"), full)) == 6
    assert "compact --keep-logs 0s` removes the logs" in capsys.readouterr().err
