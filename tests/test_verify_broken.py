"""`run --verify-first --verify SCRIPT` with a broken check: exit 2 and the
queue as it was. The check used to be found broken only on the first item,
which it had claimed: that item's attempt count went up by one, and so the
next run (script fixed) no longer verified it first but ran it. Now a missing
or non-executable first command is refused before anything is claimed, and a
check found broken on an item gives it back uncounted."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from tests.conftest import STATEQUEUE

Env = dict[str, str]
USAGE = 2


def sq(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def attempts(env: Env) -> dict[str, tuple[str, int]]:
    done = sq(env, "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return {row["item"]: (row["state"], row["attempts"]) for row in rows}


@pytest.fixture
def three(sq_home: Path) -> None:
    with Queue("default", home=sq_home) as q:
        q.enqueue(["a", "b", "c"])


@pytest.mark.parametrize(
    ("check", "said"),
    [
        ("no-such-checker {}", "--verify command not found in PATH: no-such-checker"),
        ("./no-such-checker {}", "--verify command not found: ./no-such-checker"),
        ("NOT_EXEC {}", "--verify command is not executable: NOT_EXEC"),
    ],
)
def test_a_missing_verify_command_is_refused_before_anything_is_claimed(
    sq_env: Env, sq_home: Path, tmp_path: Path, three: None, check: str, said: str
) -> None:
    not_exec = tmp_path / "checker"
    not_exec.write_text("#!/bin/sh\nexit 0\n")
    check, said = (text.replace("NOT_EXEC", str(not_exec)) for text in (check, said))
    journal = (sq_home / "default" / "journal.jsonl").read_bytes()
    done = sq(sq_env, "run", "--verify-first", "--verify", check, "--", "true")
    assert done.returncode == USAGE
    assert done.stderr == f"statequeue: {said}; nothing was run\n"
    assert attempts(sq_env) == {"a": ("pending", 0), "b": ("pending", 0), "c": ("pending", 0)}
    assert (sq_home / "default" / "journal.jsonl").read_bytes() == journal  # nothing claimed


def test_a_check_found_broken_on_an_item_counts_no_attempt(
    sq_env: Env, sq_home: Path, tmp_path: Path, three: None
) -> None:
    # The first word runs; the command it then reaches is missing (exit 127).
    broken = "test -n {} && no-such-checker {}"
    done = sq(sq_env, "run", "--verify-first", "--verify", broken, "--", "true")
    assert done.returncode == USAGE
    assert "--verify script failed with exit 127 (not found)" in done.stderr
    assert attempts(sq_env) == {"a": ("pending", 0), "b": ("pending", 0), "c": ("pending", 0)}
    # Fixed, the check still comes first for every item: none is run.
    ran = tmp_path / "ran"
    done = sq(sq_env, "run", "--verify-first", "--verify", "test -n {}", "--", "touch", str(ran))
    assert done.returncode == 0, done.stderr
    assert not ran.exists(), "an item ran without its --verify-first check"
    assert {state for state, _ in attempts(sq_env).values()} == {"done"}


def test_a_script_broken_on_one_item_lets_the_items_in_flight_finish(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path
) -> None:
    """--verify-first -j3, the script exiting 126 on item 4 only: the run
    killed the other slots' children at once (no --grace), recorded them
    pending to run again though one had written its output, and said
    "nothing run" after item 1 had run. Now no new item starts, those in
    flight finish and are recorded, and the run then stops (exit 2)."""
    from statequeue import ItemState

    check = tmp_path / "check.sh"
    check.write_text('#!/bin/sh\ncase "$1" in 4) exit 126;; *) exit 1;; esac\n')
    check.chmod(0o755)
    ran = tmp_path / "ran"
    with Queue(home=sq_home) as q:
        q.enqueue([str(i) for i in range(1, 9)])
    script = f'if [ "$1" = 1 ]; then sleep 0.3; else sleep 1.5; fi; echo "$1" >> {ran}'
    done = subprocess.run(
        [STATEQUEUE, "run", "-j3", "--verify", f"{check} {{}}", "--verify-first", "--",
         "sh", "-c", script, "_", "{}"],
        env=sq_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "no item was started after it" in done.stderr
    with Queue(home=sq_home, create=False) as q:
        views = {v.item: v for v in q.items()}
    finished = sorted(ran.read_text().split())
    assert finished == ["1", "2", "3"], (finished, done.stderr)
    assert [views[x].state for x in "123"] == [ItemState.DONE] * 3, views
    assert views["4"].state is ItemState.PENDING and views["4"].attempts == 0
    assert all(views[x].state is ItemState.PENDING for x in "5678")
