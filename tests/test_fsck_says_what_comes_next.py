"""An outside tester's finding: on a journal holding only ``garbage\\n``,
`fsck` said "torn tail of 8 bytes ... left in place: the next command that
opens the queue cuts it" and "archive.jsonl: 0 valid records; ok" though no
archive existed, while `status` then refused the queue with exit 5. A file
with no valid header is damage, not a torn tail; a torn tail in a damaged
journal is not cut by the next command (it refuses the queue) but by
`fsck --repair`; and an archive that does not exist is not reported. Real CLI."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from statequeue.api.queue import Queue
from tests.conftest import STATEQUEUE

Env = dict[str, str]
DAMAGED = 5


def sq(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_journal_of_garbage_is_damage_that_needs_a_repair(sq_env: Env, sq_home: Path) -> None:
    folder = sq_home / "default"
    folder.mkdir(parents=True)
    os.chmod(sq_home, 0o700)
    os.chmod(folder, 0o700)
    (folder / "journal.jsonl").write_bytes(b"garbage\n")

    checked = sq(sq_env, "fsck")
    said = checked.stdout + checked.stderr
    assert checked.returncode == DAMAGED, said
    assert "torn tail" not in said and "the next command that opens the queue cuts it" not in said
    assert "not a valid snapshot header" in said and "fsck --repair" in said, said
    assert "archive.jsonl" not in said, said
    report = json.loads(sq(sq_env, "fsck", "--json").stdout)
    assert report["journal"]["torn_tail_bytes"] == 0 and report["damaged"] is True
    assert report["archive"]["exists"] is False and report["journal"]["exists"] is True

    # What fsck said is what the next command does: refuse, change nothing.
    status = sq(sq_env, "status")
    assert status.returncode == DAMAGED, status.stderr
    assert (folder / "journal.jsonl").read_bytes() == b"garbage\n"
    assert sq(sq_env, "fsck", "--repair").returncode == 0
    assert sq(sq_env, "status").returncode == 0


def test_a_torn_tail_behind_damage_is_left_for_the_repair(sq_env: Env, sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
    journal = sq_home / "default" / "journal.jsonl"
    lines = journal.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"a"', b'"x"')  # a bad checksum mid-file
    journal.write_bytes(b"\n".join(lines) + b'{"t":"enq","seq":9')  # and a torn tail
    checked = sq(sq_env, "fsck")
    assert checked.returncode == DAMAGED
    assert "torn tail" in checked.stdout, checked.stdout
    assert "the next command that opens the queue cuts it" not in checked.stdout
    assert "`fsck --repair` cuts it" in checked.stdout, checked.stdout
    assert sq(sq_env, "status").returncode == DAMAGED


def test_only_an_archive_that_exists_is_reported(sq_env: Env, sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    fresh = sq(sq_env, "fsck")
    assert fresh.returncode == 0 and "archive.jsonl" not in fresh.stdout, fresh.stdout
    assert sq(sq_env, "run", "--", "true").returncode == 0
    assert sq(sq_env, "compact").returncode == 0
    compacted = sq(sq_env, "fsck")
    assert compacted.returncode == 0
    assert "archive.jsonl: 1 valid records; ok" in compacted.stdout, compacted.stdout
