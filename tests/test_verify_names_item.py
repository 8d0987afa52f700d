"""A `--verify` script that does not name the item.

An outside tester wrote `--verify /path/check.sh`, a script testing
`out/$1`. The check runs as `sh -c SCRIPT sh ITEM`, so the script itself got
no argument: `out/` (the folder) existed, every check passed, and items were
recorded done that had never run (254 of 1,000 in a kill loop). A script of
one plain word now gets the item as its last word, as `run` gives it to a
command; any other script that names no item runs as written, with a warning.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.run.verify import verify_script
from tests.conftest import STATEQUEUE

Env = dict[str, str]


def sq(env: Env, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def states(env: Env) -> dict[str, str]:
    done = sq(env, "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return {row["item"]: row["state"] for row in rows}


def test_a_one_word_check_script_gets_the_item(sq_env: Env, sq_home: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    check = tmp_path / "check.sh"
    check.write_text(f'#!/bin/sh\ntest -f "{out}/$1" || test -d "{out}/$1"\n')
    check.chmod(0o755)
    (out / "b").write_text("done before\n")  # b's work exists; a's does not
    with Queue("default", home=sq_home) as q:
        q.enqueue(["a", "b"])
    done = sq(
        sq_env, "run", "--verify-first", "--verify", str(check), "--", "sh", "-c",
        'echo ran > "$0/$1"', str(out), "{}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (out / "a").read_text() == "ran\n", "a was recorded done without running"
    assert (out / "b").read_text() == "done before\n", "b was run though its check passed"
    assert states(sq_env) == {"a": "done", "b": "done"}
    assert "[ok] #1 a" in done.stderr and "[verified] #2 b" in done.stderr
    assert "names no item" not in done.stderr


def test_a_check_that_names_no_item_is_warned_about(sq_env: Env, sq_home: Path) -> None:
    with Queue("default", home=sq_home) as q:
        q.enqueue(["a"])
    done = sq(sq_env, "run", "--verify-first", "--verify", "test -d /", "--", "true")
    assert done.returncode == 0, done.stderr
    assert "--verify names no item ({} or $1)" in done.stderr
    assert states(sq_env) == {"a": "done"}


@pytest.mark.parametrize(
    ("written", "run"),
    [
        ("./check.sh", '__statequeue_1=$1; ./check.sh "$__statequeue_1"'),
        ("  /usr/bin/check-it  ", '__statequeue_1=$1; /usr/bin/check-it "$__statequeue_1"'),
        ("test -s out/{}.json", '__statequeue_1=$1; test -s out/"$__statequeue_1".json'),
        ('test -s "out/$1"', 'test -s "out/$1"'),  # names the item itself
        ("check.sh; exit 1", "check.sh; exit 1"),  # shell: run as written (warned)
    ],
)
def test_what_sh_runs_for_a_check(written: str, run: str) -> None:
    assert verify_script(written) == run
