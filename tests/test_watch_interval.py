"""`status --watch --interval nan` (or inf, 1e999) passed click's min=0.1
and then died in time.sleep with a traceback; now one line, exit 2."""

from __future__ import annotations

import subprocess

import pytest

from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE

Env = dict[str, str]


@pytest.mark.parametrize("value", ["nan", "inf", "1e999"])
@pytest.mark.parametrize("watch", [["--watch"], []])
def test_an_interval_that_is_not_finite_is_refused(
    sq_env: Env, value: str, watch: list[str]
) -> None:
    assert subprocess.run([STATEQUEUE, "enqueue", "a"], env=sq_env, check=False).returncode == 0
    out = subprocess.run(
        [STATEQUEUE, "status", *watch, "--interval", value],
        env=sq_env,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert out.returncode == ExitCode.USAGE, out.stderr
    assert out.stderr.count(b"\n") == 1 and b"Traceback" not in out.stderr
    assert b"--interval must be a finite number of seconds" in out.stderr
