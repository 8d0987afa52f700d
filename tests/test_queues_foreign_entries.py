"""`queues --home DIR` over a folder that is not only statequeue's.

An outside tester ran `statequeue queues --home /etc`: it warned about every
link there with the advice `rm /etc/localtime` (and `chown` of another user's
folder). A link or another user's folder that holds no queue's files (no
journal, no archive) is now passed over in silence; one that does is still
refused with its warning, as before."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from statequeue import Queue
from tests.conftest import STATEQUEUE

NOBODY = 65534


def test_links_and_foreign_folders_without_a_queue_are_passed_over(
    sq_env: dict[str, str], tmp_path: Path
) -> None:
    home = tmp_path / "etc"
    home.mkdir(mode=0o700)
    with Queue("mine", home=home) as q:
        q.enqueue(["a"])
    (tmp_path / "zoneinfo").write_text("x")
    (home / "localtime").symlink_to(tmp_path / "zoneinfo")  # a link to a file
    other = tmp_path / "elsewhere"
    other.mkdir()
    (home / "ssl").symlink_to(other)  # a link to a folder with no queue
    foreign = home / "postgresql"
    foreign.mkdir()
    os.chown(foreign, NOBODY, NOBODY)  # another user's folder with no queue
    real = tmp_path / "real-queue-home"
    with Queue("linked", home=real) as q:
        q.enqueue(["b"])
    (home / "linked").symlink_to(real / "linked")  # a link to a real queue: still refused

    done = subprocess.run(
        [STATEQUEUE, "queues", "--home", str(home)],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "mine" in done.stdout
    warnings = done.stderr.splitlines()
    assert len(warnings) == 1 and "linked is a symbolic link" in warnings[0], done.stderr
    assert "localtime" not in done.stderr and "postgresql" not in done.stderr
    assert "ssl" not in done.stderr
