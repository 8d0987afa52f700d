"""A stop signal reaches the children even after the run stopped taking items.

With --max-time reached (or --halt-on-failure after a failure) the run takes
no new item but waits for the ones in flight. A SIGTERM then was not
forwarded to them (the forwarding was tied to the run's taking items), so the
run sat until each child ended on its own, and recorded it as finished; now
the signal is forwarded with --grace as at any other time, and the item goes
back (handed back, stopped)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from tests.conftest import STATEQUEUE
from tests.waiting import until


@pytest.mark.parametrize(
    ("flag", "first"),
    [(["--max-time", "0.3"], "--max-time reached"), (["--halt-on-failure", "-j2"], "failed")],
    ids=["max-time", "halt-on-failure"],
)
def test_sigterm_after_the_run_stopped_taking_items_stops_the_children(
    sq_env: dict[str, str], sq_home: Path, tmp_path: Path, flag: list[str], first: str
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["fail", "slow", "later"])
    err_path = tmp_path / "err"
    # "fail" fails at once (--halt-on-failure stops taking); "slow" sleeps far
    # longer than the test waits; "later" must never start.
    script = 'if [ "$1" = fail ]; then exit 1; fi; exec sleep 300'
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [STATEQUEUE, "run", "--grace", "1", *flag, "--", "sh", "-c", script, "_", "{}"],
            env=sq_env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        until(lambda: first in err_path.read_text(), f"the run to say {first!r}")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)  # the child sleeps 300 s: only a forwarded signal ends it sooner
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == ExitCode.INTERRUPTED_TERM, err_path.read_text()
    with Queue(home=sq_home, create=False) as q:
        states = {v.item: v.state.value for v in q.store.items()}
    assert states["slow"] == "pending", (states, err_path.read_text())
    assert states["later"] == "pending"
