"""A run stopped by a full disk gives its items back, and says so (no crash).

Before the space reserve, `run` stopped on a full disk (exit 6) could not
write the records that give its items in flight back: the next run
recovered them as "interrupted: its runner died", counting a crash, and
after three such stops (--max-crashes) an innocent item was held as poison.

The full disk here is a fault layer over the store's writes, in a real
`statequeue run` in a process of its own: once item a has seen item b
running, every journal write fails with ENOSPC until the run removes the
queue's ``reserve`` (if it had one), as on a disk whose only free space is
the reserve. A
failed write is cut back to the last good record, so the run may still give
the items back once it has removed the reserve; a failed fsync must write
nothing more (DESIGN.md), and leaves its items to recovery as before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from statequeue.store.journal.store import JournalStore
from tests.conftest import STATEQUEUE

# The real CLI entry, its writes failing (or its fsyncs, FAIL=fsync) with
# ENOSPC once the file FULL exists, until the queue's reserve is removed. Every
# journal write attempted after the first failure is noted in WROTE.
_FULL_DISK_RUN = """
import errno, os, sys
from statequeue.core import fileio
folder = os.path.join(os.environ["STATEQUEUE_HOME"], "default")
full, wrote, fail = os.environ["FULL"], os.environ["WROTE"], os.environ["FAIL"]
reserve = os.path.join(folder, "reserve")
failed, reserved = [], []
def disk_full():
    # Full from the moment FULL exists; if a reserve was there then, its
    # removal frees room again (none was made before there were reserves).
    if not os.path.exists(full):
        return False
    if not failed and not reserved:
        reserved.append(os.path.exists(reserve))
    return not (reserved[0] and not os.path.exists(reserve))
def refuse():
    failed.append(1)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
plain_write, plain_fsync = fileio.DEFAULT_OPS.write_all, fileio.DEFAULT_OPS.fsync
def write_all(fd, data):
    if failed:
        with open(wrote, "ab") as f:
            f.write(data)
    if fail == "write" and disk_full():
        refuse()
    plain_write(fd, data)
def fsync(fd):
    if fail == "fsync" and disk_full():
        refuse()
    plain_fsync(fd)
fileio.DEFAULT_OPS.write_all, fileio.DEFAULT_OPS.fsync = write_all, fsync
from statequeue.cli.main import main
main(sys.argv[1:])
"""

# Item b is in flight until the run kills it; item a waits for it to run,
# then fills the disk and ends: its end record is the write that fails.
_JOB = """
if [ "$1" = b ]; then touch "$2/b-running"; exec sleep 60; fi
while [ ! -e "$2/b-running" ]; do sleep 0.01; done
touch "$2/full"
"""


def _run_on_full_disk(
    env: dict[str, str], tmp: Path, fail: str
) -> subprocess.CompletedProcess[str]:
    for name in ("full", "b-running", "wrote"):
        (tmp / name).unlink(missing_ok=True)
    env = {**env, "FULL": str(tmp / "full"), "WROTE": str(tmp / "wrote"), "FAIL": fail}
    argv = ["run", "-j2", "--no-live", "--", "sh", "-c", _JOB, "sh", "{}", str(tmp)]
    return subprocess.run(
        [sys.executable, "-c", _FULL_DISK_RUN, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _show(env: dict[str, str], item: int) -> dict[str, object]:
    out = subprocess.run(
        [STATEQUEUE, "show", str(item), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    shown: dict[str, object] = json.loads(out.stdout)
    return shown


def _reasons(shown: dict[str, object]) -> list[str]:
    events = shown["events"]
    assert isinstance(events, list)
    return [e["reason"] for e in events if e.get("t") == "intr"]


def _crashes(folder: Path) -> dict[int, int]:
    store = JournalStore(folder, create=False)
    try:
        live = (store.state.get(i) for i in store.state.live_ids())
        return {item.id: item.crashes for item in live if item is not None}
    finally:
        store.close()


def test_a_full_disk_gives_the_items_back_counting_no_crash(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    subprocess.run([STATEQUEUE, "enqueue", "a", "b"], env=sq_env, check=True, timeout=60)
    folder = sq_home / "default"
    for stop in (1, 2, 3):  # --max-crashes is 3: a third crash would hold b as poison
        done = _run_on_full_disk(sq_env, tmp_path, "write")
        assert done.returncode == 6, done.stderr
        assert "disk full" in done.stderr.splitlines()[-1]
        assert not (folder / "reserve").exists()  # spent on the records below
        for item in (1, 2):
            shown = _show(sq_env, item)
            assert shown["state"] == "pending" and shown["interrupted"] is False, shown
            reasons = _reasons(shown)
            assert len(reasons) == stop, reasons
            assert all("disk full" in r and "died" not in r for r in reasons), reasons
        assert _crashes(folder) == {1: 0, 2: 0}
    # Item b was in flight; item a had ended, but its result was never written.
    assert _reasons(_show(sq_env, 2))[-1] == "interrupted: runner stopped: disk full"
    assert "its result was not recorded" in _reasons(_show(sq_env, 1))[-1]
    # With room again, the next run makes its reserve and finishes both.
    again = subprocess.run(
        [STATEQUEUE, "run", "--no-live", "--", "true"],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    assert "recovered" not in again.stderr
    assert [_show(sq_env, i)["state"] for i in (1, 2)] == ["done", "done"]
    assert (folder / "reserve").stat().st_size == 64 * 1024


def test_a_failed_fsync_writes_nothing_more(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """ENOSPC from fsync is a failed fsync all the same: nothing more is
    written, the reserve stays, and the items are left to recovery."""
    subprocess.run([STATEQUEUE, "enqueue", "a", "b"], env=sq_env, check=True, timeout=60)
    folder = sq_home / "default"
    done = _run_on_full_disk(sq_env, tmp_path, "fsync")
    assert done.returncode == 6, done.stderr
    assert "disk full" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "wrote").exists()  # not one write after the failed fsync
    assert (folder / "reserve").exists()
    shown = _show(sq_env, 2)
    assert shown["state"] == "running" and shown["interrupted"] is True, shown
    assert _reasons(shown) == []
