"""The library reads a queue on a home it may not write, as the CLI does.

`statequeue status` read such a queue; `Queue(name)` (whose default is to
create the queue if missing) refused even `status()` with NoAccess on its
lock file. Found by an outside tester on a read-only bind mount. It now
opens an existing queue read-only there; a write is refused (NoAccess),
and a new queue still cannot be made.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.core.errors import NoAccess


@contextmanager
def _read_only(folder: Path, view: Path) -> Iterator[Path]:
    """``folder`` seen through ``view``, read-only: a read-only bind mount as
    root (who writes through any mode), else the folder's modes."""
    if os.geteuid() != 0:
        for path in (folder, *folder.rglob("*")):
            if path.is_dir():
                path.chmod(0o500)
        try:
            yield folder
        finally:
            for path in (folder, *folder.rglob("*")):
                if path.is_dir():
                    path.chmod(0o700)
        return
    view.mkdir()
    subprocess.run(["mount", "--bind", str(folder), str(view)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], check=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def test_an_existing_queue_on_a_read_only_home_is_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with Queue("q", home=home) as q:
        q.enqueue(["a", "b"])
    with _read_only(home, tmp_path / "view") as seen:
        q = Queue("q", home=seen)
        try:
            assert q.status().counts["pending"] == 2
            assert [v.item for v in q.items()] == ["a", "b"]
            with pytest.raises(NoAccess):
                q.enqueue(["c"])
        finally:
            q.close()
        with pytest.raises(NoAccess):
            Queue("new", home=seen)


def test_enqueue_on_a_read_only_mount_says_so(tmp_path: Path, sq_env: dict[str, str]) -> None:
    """The refusal named "Permission denied" (hard-coded) on a read-only
    mount, where the system says "Read-only file system"."""
    from tests.conftest import STATEQUEUE

    if os.geteuid() != 0:
        pytest.skip("a read-only mount needs root (CI runs as root)")
    home = tmp_path / "home"
    with Queue("q", home=home) as q:
        q.enqueue(["a"])
    with _read_only(home, tmp_path / "view") as seen:
        env = {**sq_env, "STATEQUEUE_HOME": str(seen)}
        done = subprocess.run(
            [STATEQUEUE, "-q", "q", "enqueue", "b"], env=env, capture_output=True, text=True
        )
        assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
        assert "Read-only file system" in done.stderr, done.stderr
        assert "Permission denied" not in done.stderr, done.stderr
