"""One upper bound for every duration option, ten years (outside tester:
`run --timeout 99999999999d` was taken while `--grace 2d` was refused, the
grace capped at a day because a persistent worker's end was waited for with
one poll() of it, which 1e300 seconds overflowed). Past the bound: one line,
exit 2, nothing run; the poll() of a longer wait is taken a day at a time."""

from __future__ import annotations

import os
import subprocess

import pytest

from statequeue.core.durations import parse_duration
from statequeue.core.errors import InvalidDuration, UsageError
from statequeue.run.keeper import readable
from statequeue.run.options import RunOptions
from tests.conftest import STATEQUEUE
from tests.test_huge_option_values import _refused_run

Env = dict[str, str]
SAYS = b"must be at most 3650d (ten years)"
MAX_DURATION = 3650 * 86400.0


@pytest.mark.parametrize(
    "option", ["--timeout", "--grace", "--retry-delay", "--max-time", "--lease", "--give-up-after"]
)
@pytest.mark.parametrize("value", ["99999999999d", "3651d", "1e300"])
def test_every_run_duration_past_ten_years_is_refused(sq_env: Env, option: str, value: str) -> None:
    err = _refused_run(sq_env, option, value)
    assert err == f"statequeue: invalid duration {value!r}: ".encode() + SAYS + b"\n"


def test_the_bound_is_the_same_for_other_commands(sq_env: Env) -> None:
    assert subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False).returncode == 0
    args = ["compact", "--keep-logs", "3651d"]
    out = subprocess.run([STATEQUEUE, *args], env=sq_env, capture_output=True, check=False)
    assert out.returncode == 2 and SAYS in out.stderr and out.stderr.count(b"\n") == 1, args
    # A look-back window is no wait: one longer than the history is all of it
    # (tests/test_stats_edges.py::test_a_since_before_1970_is_every_attempt).
    for args in (["stats", "--since", "3651d"], ["report", "--since", "1e300", "-o", "-"]):
        out = subprocess.run([STATEQUEUE, *args], env=sq_env, capture_output=True, check=False)
        assert out.returncode == 0, (args, out.stderr)


def test_ten_years_is_taken() -> None:
    assert parse_duration("3650d") == MAX_DURATION == parse_duration(f"{MAX_DURATION:.0f}")
    with pytest.raises(InvalidDuration, match="at most 3650d"):
        parse_duration("3650d1s")
    assert RunOptions(command=("true",), grace=MAX_DURATION).grace == MAX_DURATION
    with pytest.raises(UsageError, match=r"--grace must be .* up to 3650d"):
        RunOptions(command=("true",), grace=MAX_DURATION * 2)


def test_a_grace_of_days_and_a_timeout_of_weeks_run(sq_env: Env) -> None:
    for item in ("a", "b"):
        assert (
            subprocess.run([STATEQUEUE, "enqueue", item], env=sq_env, check=False).returncode == 0
        )
    for options in (["--grace", "2d"], ["--timeout", "30d", "--grace", "3650d"]):
        out = subprocess.run(
            [STATEQUEUE, "run", "--limit", "1", *options, "--", "true"],
            env=sq_env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr


def test_a_wait_longer_than_poll_takes_is_not_an_overflow() -> None:
    """Half of a 3650d grace is waited for a persistent worker's end: poll()
    raised OverflowError past 2**31 - 1 milliseconds (24.8 days)."""
    r, w = os.pipe()
    try:
        os.write(w, b"x")
        assert readable(r, MAX_DURATION / 2)
    finally:
        os.close(r)
        os.close(w)
