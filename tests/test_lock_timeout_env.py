"""STATEQUEUE_LOCK_TIMEOUT must say how long to wait: "nan" and "-1" were
taken as 0 (give up at once, exit 8, under any contention); now they are
refused as "soon" is: exit 2, one line, nothing changed. "inf" waits."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE

Env = dict[str, str]


def _sq(env: Env, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [STATEQUEUE, *args], env=env, capture_output=True, timeout=60, check=False
    )


@pytest.mark.parametrize("value", ["nan", "NaN", "-1", "-inf", "soon"])
def test_a_lock_timeout_that_is_no_wait_is_refused(sq_env: Env, sq_home: Path, value: str) -> None:
    assert _sq(sq_env, "enqueue", "a").returncode == 0
    journal = sq_home / "default" / "journal.jsonl"
    before = journal.read_bytes()
    out = _sq(dict(sq_env, STATEQUEUE_LOCK_TIMEOUT=value), "enqueue", "b")
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr
    assert f"STATEQUEUE_LOCK_TIMEOUT must be a number of seconds >= 0, not '{value}'".encode() in (
        out.stderr
    )
    assert journal.read_bytes() == before


@pytest.mark.parametrize("value", ["0", "0.5", "inf", "60"])
def test_a_lock_timeout_of_zero_or_more_is_taken(sq_env: Env, value: str) -> None:
    out = _sq(dict(sq_env, STATEQUEUE_LOCK_TIMEOUT=value), "enqueue", "a")
    assert out.returncode == 0, out.stderr
