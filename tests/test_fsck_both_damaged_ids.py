"""`fsck --repair` of a queue whose journal and archive are both damaged never
hands out an id that was already used (promise 2 and 5).

Before, the repair rebuilt the archive first, and that deleted ``state.ckpt``
(and ``keys.ckpt``); the journal's header was rebuilt after, without the
highest id the checkpoint knew. Ids enqueued after the last records left (a
journal cut behind its checkpoint, or with its header lost) were then neither
reported lost nor kept out: the next `enqueue` took them again (17 and 18 for
ids 17-20 that the checkpoint saw, where a repair of the journal alone
reported 17-20 lost and handed out 21). Now the checkpoints are read before
anything is rebuilt."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue.store.journal import checkpoint
from statequeue.store.journal.folder import QueueFolder
from tests.conftest import STATEQUEUE


def _ok(env: dict[str, str], *args: str, stdin: str = "") -> str:
    done = subprocess.run(
        [STATEQUEUE, *args], env=env, input=stdin, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done.stdout


def _ids(path: Path) -> set[int]:
    """The ids the valid-looking records of a JSONL file name."""
    found: set[int] = set()
    for line in path.read_bytes().split(b"\n"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("id"), int):
            found.add(rec["id"])
    return found


def _checkpoint_knows(queue: Path) -> int:
    folder = QueueFolder.open(queue, create=False)
    try:
        return checkpoint.known_ids(folder)
    finally:
        folder.close()


def _queue_with_ids_only_the_checkpoint_knows(env: dict[str, str], queue: Path) -> int:
    """Ids 1-10 done and archived, 11-16 enqueued (two done) after the
    compaction, 17-20 enqueued last and cut from the journal: only state.ckpt
    still knows them. Returns the highest id the checkpoint knows."""
    _ok(env, "enqueue", stdin="".join(f"a{i}\n" for i in range(1, 11)))
    _ok(env, "run", "--", "sh", "-c", 'echo "{\\"r\\": 1}"')
    assert "archived 10" in _ok(env, "compact")
    _ok(env, "enqueue", stdin="".join(f"b{i}\n" for i in range(1, 7)))
    _ok(env, "run", "--limit", "2", "--", "true")
    _ok(env, "enqueue", stdin="".join(f"c{i}\n" for i in range(1, 5)))
    _ok(env, "status")
    known = _checkpoint_knows(queue)
    assert known == 20
    journal = queue / "journal.jsonl"
    lines = journal.read_bytes().split(b"\n")
    assert all(b'"t":"enq"' in line for line in lines[-5:-1])
    journal.write_bytes(b"\n".join([*lines[:-5], b""]))  # the c enqueues cut off
    return known


def _damage_archive(queue: Path) -> None:
    archive = queue / "archive.jsonl"
    lines = archive.read_bytes().split(b"\n")
    assert b'"id":4,' in lines[3]
    lines[3] = lines[3].replace(b'"id":4,', b'"id":9,', 1)  # a bad checksum
    archive.write_bytes(b"\n".join(lines))


@pytest.mark.parametrize("header", ["kept", "overwritten"])
def test_a_repair_of_journal_and_archive_never_hands_out_an_id_again(
    sq_env: dict[str, str], sq_home: Path, header: str
) -> None:
    env = {**sq_env, "STATEQUEUE_CHECKPOINT_EVERY": "1"}  # a checkpoint after each command
    queue = sq_home / "default"
    known = _queue_with_ids_only_the_checkpoint_knows(env, queue)
    _damage_archive(queue)
    journal = queue / "journal.jsonl"
    if header == "overwritten":
        lines = journal.read_bytes().split(b"\n")
        lines[0] = b"x" * len(lines[0])
        journal.write_bytes(b"\n".join(lines))
    report = json.loads(_ok(env, "fsck", "--repair", "--json"))
    assert report["repaired"]
    assert report["archive"]["bad_lines"] == [4]
    lost = {i for a, b in report["lost_ids"] for i in range(a, b + 1)}
    used = _ids(queue / "archive.jsonl") | _ids(journal) | lost | set(range(1, known + 1))
    rebuilt = json.loads(journal.read_bytes().split(b"\n")[0])
    _ok(env, "enqueue", stdin="new1\nnew2\n")
    listed = [json.loads(line) for line in _ok(env, "list", "--json").splitlines()]
    new_ids = [v["id"] for v in listed if v["item"].startswith("new")]
    assert not set(new_ids) & used, (new_ids, rebuilt["next_id"], report["lost_ids"])
    assert new_ids == [known + 1, known + 2]
    assert rebuilt["t"] == "snap" and rebuilt["next_id"] > known
    assert {4, 17, 18, 19, 20} <= lost  # reported, never silently dropped
    assert json.loads(_ok(env, "fsck", "--json"))["damaged"] is False
