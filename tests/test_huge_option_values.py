"""Option values past what a run could use, found by a hostile tester:
`--retries 10**22` made the 1025th retry's backoff raise OverflowError
(2.0 ** 1024) in the runner, a traceback mid-run; `--burst 10**22 --rate 1/s`
a traceback when the queue's bucket was saved (past 64 bits)."""

from __future__ import annotations

import subprocess

import pytest

from statequeue.api.work import backoff
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE

Env = dict[str, str]


@pytest.mark.parametrize("retry", [1025, 5000, 10**22])
def test_the_backoff_of_a_late_retry_is_the_longest_delay(retry: int) -> None:
    assert 150.0 <= backoff(retry, 1.0, 300.0) <= 300.0  # max_delay, with jitter
    assert backoff(retry, 0.0, 300.0) == 0.0


def test_the_backoff_still_doubles_from_the_first_delay() -> None:
    assert 0.5 <= backoff(1, 1.0, 300.0) <= 1.0
    assert 4.0 <= backoff(4, 1.0, 300.0) <= 8.0


@pytest.mark.parametrize("burst", ["99999999999999999999999", "1000000001"])
def test_a_burst_past_the_bound_is_refused(sq_env: Env, burst: str) -> None:
    assert subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False).returncode == 0
    out = subprocess.run(
        [STATEQUEUE, "run", "--burst", burst, "--rate", "1/s", "--", "true"],
        env=sq_env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr
    assert b"--burst must be from 1 to 1000000000" in out.stderr
    listed = subprocess.run([STATEQUEUE, "list"], env=sq_env, capture_output=True, check=False)
    assert listed.stdout.split(b"\t")[1] == b"pending"  # nothing ran


def test_the_largest_burst_runs(sq_env: Env) -> None:
    assert subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False).returncode == 0
    out = subprocess.run(
        [STATEQUEUE, "run", "--burst", "1000000000", "--rate", "1/s", "--", "true"],
        env=sq_env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
