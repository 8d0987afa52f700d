"""`fsck` says what became of a torn tail (tester's point 5).

fsck cuts nothing without --repair, and on a read-only queue nothing may
cut it; it said "cut on open" while the file stayed as it was (`status`
rightly said "left in place")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from statequeue.api.queue import Queue
from tests.conftest import STATEQUEUE
from tests.privileges import without_write_access


def _torn_queue(home: Path) -> Path:
    with Queue(home=home) as q:
        q.enqueue(["a", "b"])
    journal = home / "default" / "journal.jsonl"
    with open(journal, "ab") as f:
        f.write(b'{"t":"enq","seq":9')  # a crash mid-append
    return journal


def test_fsck_on_a_read_only_queue_says_the_torn_tail_was_left(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    journal = _torn_queue(sq_home)
    folder = journal.parent
    before = journal.read_bytes()
    paths = [folder, *folder.rglob("*")]
    for path in paths:
        os.chmod(path, 0o500 if path.is_dir() else 0o400)
    try:
        done = subprocess.run(
            [*without_write_access(), STATEQUEUE, "fsck"],
            env=sq_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        for path in paths:
            os.chmod(path, 0o700 if path.is_dir() else 0o600)
    said = done.stdout + done.stderr
    assert "cut on open" not in said, said
    assert "torn tail" in said and "left in place" in said and "read-only" in said, said
    assert journal.read_bytes() == before


def test_fsck_on_a_writable_queue_does_not_claim_a_cut(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    journal = _torn_queue(sq_home)
    before = journal.read_bytes()
    done = subprocess.run(
        [STATEQUEUE, "fsck"], env=sq_env, capture_output=True, text=True, timeout=60, check=False
    )
    said = done.stdout + done.stderr
    assert "cut on open" not in said and "left in place" in said, said
    assert journal.read_bytes() == before  # fsck without --repair changes nothing
