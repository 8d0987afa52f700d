"""`statequeue run` and SIGHUP: the terminal it was started from closed (an ssh
session dropped, a window shut). It is a stop like Ctrl-C or SIGTERM: the run
hands its unfinished items back, charges them no crash, and exits 129, as a
shell reports a command the hangup ended. Before, the runner died of the
signal's default action, so its items looked crashed (one crash each, towards
--max-crashes) and `status` showed them running with no runner."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.exitcodes import ExitCode
from statequeue.run.guard import NO_GUARD_ENV
from tests.acceptance.test_runner import Procs, finish, pids_in, wait_for

RECORD_PID = 'echo $$ >> "$SQT_DIR/pids/$STATEQUEUE_ID.$STATEQUEUE_ATTEMPT"\n'
RECORD_PID_THEN_HANG = RECORD_PID + "exec sleep 30\n"


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "no-guard"])
def test_sighup_stops_the_run_and_hands_the_items_back_uncharged(
    env: dict[str, str], work: Path, procs: Procs, guarded: bool
) -> None:
    env[NO_GUARD_ENV] = "0" if guarded else "1"  # the waiter forwards it, or the runner gets it
    home = env["STATEQUEUE_HOME"]
    with Queue("default", home=home) as q:
        q.enqueue(["a", "b", "c"])
    runner = procs.start("run", "-j2", "--grace", "5s", "--", "sh", "-c", RECORD_PID_THEN_HANG)
    wait_for(lambda: pids_in(work / "pids" / "1.1") and pids_in(work / "pids" / "2.1"), "2 starts")
    runner.send_signal(signal.SIGHUP)
    code, _, err = finish(runner)
    assert code == ExitCode.INTERRUPTED_HUP == 129, err
    assert "Traceback" not in err, err
    assert err.splitlines()[-1] == (
        "statequeue: stopped by SIGHUP: items: 0 ok, 0 failed, 2 handed back (stopped), "
        "1 left pending (not started); 2 attempts started"
    ), err
    with Queue("default", home=home, create=False) as q:
        status = q.status()
        assert status.counts["pending"] == 3 and status.interrupted == (), status
        assert [e.crashes for e in q.store.export_items()] == [0, 0, 0]
