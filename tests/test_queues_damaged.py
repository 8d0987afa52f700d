"""`queues` with one damaged queue among healthy ones (issue 21, point 10).

It used to print nothing about the healthy queues and exit 5, in text and in
--json. Every readable queue is listed, the damaged one on its own line with
the reason, and the exit code is 5 (ExitCode.DAMAGED), with one line on stderr.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue.api.maintenance import list_queues
from statequeue.core.errors import DamagedState
from tests.conftest import STATEQUEUE

Env = dict[str, str]
DAMAGED = 5  # ExitCode.DAMAGED


def sq(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def three(sq_env: Env, sq_home: Path) -> bytes:
    """Queues a and c (healthy) and bad (a record in the middle of its journal
    altered: refused on open); the bad journal's bytes."""
    for name, items in (("a", ["x"]), ("bad", ["1", "2", "3"]), ("c", ["y", "z"])):
        assert sq(sq_env, "enqueue", "-q", name, *items).returncode == 0
    journal = sq_home / "bad" / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"item":"1"', b'"item":"9"')  # its checksum no longer holds
    journal.write_bytes(b"".join(lines))
    return journal.read_bytes()


def test_queues_lists_the_healthy_ones_and_marks_the_damaged_one(
    sq_env: Env, sq_home: Path, three: bytes
) -> None:
    done = sq(sq_env, "queues")
    assert done.returncode == DAMAGED, done.stderr
    rows = [line.split("\t") for line in done.stdout.splitlines()]
    assert [row[0] for row in rows] == ["a", "bad", "c"]
    assert rows[0][1:] == ["1 item", "pending 1"]
    assert rows[2][1:] == ["2 items", "pending 2"]
    assert rows[1][1] == "damaged" and "journal.jsonl: line 2" in rows[1][2]
    assert done.stderr.splitlines() == [
        "statequeue: queue 'bad' is damaged; run `statequeue -q bad fsck`"
    ]
    assert (sq_home / "bad" / "journal.jsonl").read_bytes() == three  # nothing changed


def test_queues_json_lists_all_three(sq_env: Env, sq_home: Path, three: bytes) -> None:
    done = sq(sq_env, "queues", "--json")
    assert done.returncode == DAMAGED, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
    listed = json.loads(done.stdout)
    assert listed["home"] == str(sq_home)
    by_name = {q["queue"]: q for q in listed["queues"]}
    assert list(by_name) == ["a", "bad", "c"]
    assert by_name["a"]["counts"]["pending"] == 1 and by_name["c"]["total"] == 2
    assert "journal.jsonl: line 2" in by_name["bad"]["damaged"]
    assert "counts" not in by_name["bad"]
    assert (sq_home / "bad" / "journal.jsonl").read_bytes() == three


def test_list_queues_passes_a_damaged_queue_to_on_damaged(sq_home: Path, three: bytes) -> None:
    with pytest.raises(DamagedState):
        list_queues(sq_home)  # without on_damaged, as before
    seen: list[str] = []
    found = list_queues(sq_home, on_damaged=lambda name, exc: seen.append(name))
    assert [s.queue for s in found] == ["a", "c"] and seen == ["bad"]


@pytest.mark.parametrize(
    ("broken", "reason"),
    [("lock", "(remove it)"), ("logs", "bad/logs exists and is not a folder")],
)
def test_a_queue_folder_broken_in_other_ways_does_not_hide_the_others(
    sq_env: Env, sq_home: Path, broken: str, reason: str
) -> None:
    # An attacker's find: its `lock` a folder, or its `logs` a file, made
    # `queues` fail for the whole home (exit 6 or 2, the healthy ones unlisted).
    for name in ("a", "bad"):
        assert sq(sq_env, "enqueue", "-q", name, "x").returncode == 0
    path = sq_home / "bad" / broken
    if path.is_dir():
        path.rmdir()
        path.write_text("x\n")
    else:
        path.unlink()
        path.mkdir()
    listed = sq(sq_env, "queues", "--json")
    assert listed.returncode == DAMAGED, listed.stderr
    rows = {q["queue"]: q for q in json.loads(listed.stdout)["queues"]}
    assert rows["a"]["counts"]["pending"] == 1
    assert rows["bad"]["damaged"].endswith(reason), rows["bad"]


def test_a_queue_whose_journal_is_missing_is_listed_as_damaged(
    sq_env: dict[str, str], sq_home: Path
) -> None:
    """Its journal deleted, the folder still holds its claims lock and logs:
    `status -q d` refused it (exit 5) but `queues` left it out and said 0."""
    from statequeue import Queue

    with Queue("d", home=sq_home) as q:
        q.enqueue(["a"])
    with Queue("ok", home=sq_home) as q:
        q.enqueue(["b"])
    ran = subprocess.run(
        [STATEQUEUE, "-q", "d", "run", "--", "echo", "hi"], env=sq_env, capture_output=True
    )
    assert ran.returncode == 0
    (sq_home / "d" / "journal.jsonl").unlink()
    listed = subprocess.run([STATEQUEUE, "queues"], env=sq_env, capture_output=True, text=True)
    assert listed.returncode == 5, listed.stdout + listed.stderr
    lines = listed.stdout.splitlines()
    damaged = [line for line in lines if line.startswith("d\tdamaged")]
    assert damaged, lines
    assert "`statequeue -q d fsck --repair`" in damaged[0]  # a hint that names its queue
    assert any(line.startswith("ok\t") for line in lines), lines
