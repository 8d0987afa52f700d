"""An outside tester's finding: STATEQUEUE_AUTO_COMPACT=-5 and
STATEQUEUE_CHECKPOINT_EVERY=-5 exited 0 (taken as 0, "off") while "abc"
and "1.5" were refused. Every numeric STATEQUEUE_* variable refuses a value
out of its range with one line naming it and exit 2, before a queue folder is
made or a journal changed (promise 6). Real CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import STATEQUEUE

Env = dict[str, str]
USAGE = 2

RECORD_COUNTS = ("STATEQUEUE_AUTO_COMPACT", "STATEQUEUE_CHECKPOINT_EVERY")
ALL = (*RECORD_COUNTS, "STATEQUEUE_LOCK_TIMEOUT", "STATEQUEUE_FOLLOW_POLL")


def sq(env: Env, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], stdin=subprocess.DEVNULL, env=env, capture_output=True,
        timeout=60, check=False,
    )  # fmt: skip


def _refused(done: subprocess.CompletedProcess[bytes], name: str) -> None:
    err = done.stderr.decode()
    assert done.returncode == USAGE, err
    assert err.startswith(f"statequeue: {name} must be ") and err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["-5", "-1", "-0.5", "abc", "1.5"])
@pytest.mark.parametrize("name", RECORD_COUNTS)
def test_a_negative_record_count_is_refused_before_anything_is_made(
    sq_env: Env, sq_home: Path, name: str, value: str
) -> None:
    assert sq(sq_env, "enqueue", "-q", "kept", "a").returncode == 0
    journal = (sq_home / "kept" / "journal.jsonl").read_bytes()
    bad = {**sq_env, name: value}
    _refused(sq(bad, "enqueue", "-q", "kept", "b"), name)
    _refused(sq(bad, "enqueue", "-q", "fresh", "b"), name)
    _refused(sq(bad, "run", "-q", "kept", "--", "true"), name)
    assert (sq_home / "kept" / "journal.jsonl").read_bytes() == journal
    assert not (sq_home / "fresh").exists()


@pytest.mark.parametrize("name", ALL)
def test_every_numeric_variable_refuses_minus_five_and_makes_no_queue(
    sq_env: Env, sq_home: Path, name: str
) -> None:
    bad = {**sq_env, name: "-5"}
    _refused(sq(bad, "run", "--follow", "-q", "fresh", "--", "true"), name)
    assert not (sq_home / "fresh").exists()


@pytest.mark.parametrize("value", ["0", "off", "5", " 7 "])
@pytest.mark.parametrize("name", RECORD_COUNTS)
def test_zero_off_and_counts_are_still_taken(sq_env: Env, name: str, value: str) -> None:
    done = sq({**sq_env, name: value}, "enqueue", "-q", "fine", "a")
    assert done.returncode == 0, done.stderr
