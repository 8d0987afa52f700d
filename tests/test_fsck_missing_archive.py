"""`fsck` and a deleted archive: the journal's header says the archive holds
the results of compacted items, and every command refuses the queue (exit 5,
"archive.jsonl is missing but the journal refers to it"), the writers too:
`run`, `cancel`, `pause` and `status` used to go on (exit 0) and write the
journal over the loss.
fsck used to call the queue ok, and `fsck --repair` left it refused, so
nothing the tool offers could bring the queue back. Now fsck names the damage
(exit 5) and a repair salvages: the surviving items go on, the lost ids are
reported and never handed out again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE


def _sq(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=120)


def _compacted_queue(home: Path) -> Path:
    """Items 1-3 done and archived, item 4 pending; the archive then deleted."""
    with Queue(home=home) as q:
        q.enqueue(["a", "b", "c"])
        for item in q.work():
            with item:
                item.done()
        q.compact()
        q.enqueue(["d"])
        folder = q.path
    assert folder is not None
    (folder / "archive.jsonl").unlink()
    return folder


def test_fsck_finds_a_deleted_archive_and_repair_brings_the_queue_back(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    folder = _compacted_queue(sq_home)
    refused = _sq(sq_env, "list")
    assert refused.returncode == ExitCode.DAMAGED, refused.stderr
    hint = "(run `statequeue -q default fsck --repair` to salvage the rest)"
    assert refused.stderr.rstrip().endswith(hint)
    check = _sq(sq_env, "fsck")
    assert check.returncode == ExitCode.DAMAGED, check.stdout + check.stderr
    assert "archive.jsonl: 0 valid records; missing, but the journal says it holds 3" in (
        check.stdout
    )
    repair = _sq(sq_env, "fsck", "--repair")
    assert repair.returncode == 0, repair.stdout + repair.stderr
    assert "no surviving record names item id(s) 1-3: left out, never reused" in repair.stdout
    assert "kept the damaged file as \n" not in repair.stdout + "\n"  # no archive to keep
    assert _sq(sq_env, "fsck").returncode == 0
    added = _sq(sq_env, "enqueue", "e")
    assert added.returncode == 0, added.stderr
    with Queue(home=sq_home, create=False) as q:
        assert [(v.item_id, v.item, v.state.value) for v in q.store.items()] == [
            (4, "d", "pending"),
            (5, "e", "pending"),
        ]
    assert (folder / "archive.jsonl").exists()


@pytest.mark.parametrize("how", ["deleted", "emptied", "a folder"])
def test_every_command_refuses_a_queue_whose_archive_is_gone(
    sq_env: dict[str, str], sq_home: Path, how: str
) -> None:
    folder = _compacted_queue(sq_home)
    if how == "emptied":
        (folder / "archive.jsonl").write_bytes(b"")
    elif how == "a folder":
        (folder / "archive.jsonl").mkdir()
    journal = (folder / "journal.jsonl").read_bytes()
    commands = [
        ["status"],
        ["run", "--", "true"],
        ["cancel", "4"],
        ["retry", "4"],
        ["pause"],
        ["resume"],
        ["enqueue", "e"],
        ["compact"],
    ]
    for args in commands:
        refused = _sq(sq_env, *args)
        assert refused.returncode == ExitCode.DAMAGED, (args, refused.stdout, refused.stderr)
        assert "fsck --repair" in refused.stderr, (args, refused.stderr)
    assert (folder / "journal.jsonl").read_bytes() == journal  # nothing written over the loss
    listed = _sq(sq_env, "queues")
    assert listed.returncode == ExitCode.DAMAGED
    assert "default\tdamaged" in listed.stdout
    if how == "a folder":  # the hint says: move it aside first
        assert "move it aside" in refused.stderr
        (folder / "archive.jsonl").rmdir()
    assert _sq(sq_env, "fsck", "--repair").returncode == 0
    assert _sq(sq_env, "run", "--", "true").returncode == 0
