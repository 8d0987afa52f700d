"""Option values past what a run could use, found by a hostile tester:
`--retries 10**22` made the 1025th retry's backoff raise OverflowError
(2.0 ** 1024) in the runner, a traceback mid-run; `--burst 10**22 --rate 1/s`
a traceback when the queue's bucket was saved (past 64 bits). In the
library, ``rate=1e-300`` and ``rate=10**400`` raised OverflowError, and
``compact(keep_logs=-1)`` removed every log where `--keep-logs -1d` is refused."""

from __future__ import annotations

import math
import subprocess
from typing import Any

import pytest

import statequeue
from statequeue import Queue
from statequeue.api.work import backoff
from statequeue.core.errors import UsageError
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
    err = _refused_run(sq_env, "--burst", burst, "--rate", "1/s")
    assert b"--burst must be from 1 to 1000000000" in err


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


@pytest.mark.parametrize(
    ("rate", "says"),
    [
        (1e-300, "the rate must be at least 1e-09/s"),  # was OverflowError (time_t) waiting
        (10**400, "rate is too large"),  # was OverflowError converting to float
    ],
)
def test_the_librarys_rate_out_of_range_is_a_usage_error(rate: float, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        statequeue.map(len, ["a", "b"], queue="odd-rate", rate=rate)


def test_a_slow_rate_within_range_is_taken() -> None:
    assert statequeue.map(len, ["abc"], queue="slow-rate", rate=1e-9) == [3]  # the first starts now


@pytest.mark.parametrize("keep", [-1, -0.5, math.nan, True, "7d"])
def test_compact_refuses_a_keep_logs_that_is_no_age(keep: Any) -> None:
    with Queue("keep") as q:
        q.enqueue(["a"])
        for item in q.work():
            item.done(1)
        with pytest.raises(UsageError, match="keep_logs must be a number of seconds >= 0"):
            q.compact(keep_logs=keep)
        assert q.compact(keep_logs=0).archived == 1


def _refused_run(sq_env: Env, *options: str) -> bytes:
    """`run OPTIONS -- true` on a queue of one item: refused in one line with
    exit 2 and nothing run; its stderr."""
    assert subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False).returncode == 0
    out = subprocess.run(
        [STATEQUEUE, "run", *options, "--", "true"],
        env=sq_env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr
    listed = subprocess.run([STATEQUEUE, "list"], env=sq_env, capture_output=True, check=False)
    assert listed.stdout.split(b"\t")[1] == b"pending"  # nothing ran
    return out.stderr
