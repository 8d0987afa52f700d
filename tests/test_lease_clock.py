"""Lease fencing is timed on CLOCK_BOOTTIME where the platform has it (issue 21):
CLOCK_MONOTONIC stops while the machine is suspended, the database's clock
does not. The runner's leases and the keeper's deadlines read one clock, the
module statequeue/core/lease_clock.py, which the keeper imports even as a script."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import statequeue.core.lease_clock
from statequeue.core import lease_clock
from statequeue.run import keeper_process as kp

linux_only = pytest.mark.skipif(
    not hasattr(time, "CLOCK_BOOTTIME"), reason="CLOCK_BOOTTIME is Linux's"
)


@linux_only
def test_the_lease_clock_is_clock_boottime() -> None:
    assert lease_clock.CLOCK == time.CLOCK_BOOTTIME
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    now = lease_clock.now()
    assert before <= now <= time.clock_gettime(time.CLOCK_BOOTTIME)


def test_the_keeper_reads_the_same_clock_module() -> None:
    assert kp.lease_clock is statequeue.core.lease_clock


def test_the_keeper_script_imports_the_lease_clock_from_its_folder() -> None:
    """Run as the runner starts it (``python -I -S``, no package importable),
    the keeper finds lease_clock.py beside itself."""
    program = str(Path(kp.__file__).resolve())
    code = (
        f"import runpy; ns = runpy.run_path({program!r}, run_name='keeper');"
        "print(ns['lease_clock'].__file__, ns['lease_clock'].CLOCK)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert Path(out[0]).resolve() == Path(lease_clock.__file__).resolve()
    assert out[1] == str(lease_clock.CLOCK)


def test_leases_are_fenced_on_the_lease_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("psycopg")
    from statequeue.store.postgres.leases import FENCE_AT, KILL_BY, Leases

    clock = [1000.0]
    monkeypatch.setattr(lease_clock, "now", lambda: clock[0])
    leases = Leases("postgresql://nobody@/none?host=/nonexistent", "q", lease=30.0)
    try:
        leases.hold(7, sent=lease_clock.now())
        assert leases.fence_at() == 1000.0 + FENCE_AT * 30.0
        assert leases.kill_by(7) == 1000.0 + KILL_BY * 30.0
        clock[0] = 1000.0 + FENCE_AT * 30.0 - 0.01
        assert leases.lost() == set()
        clock[0] = 1000.0 + FENCE_AT * 30.0  # e.g. right after a resume from suspend
        assert leases.lost() == {7}
    finally:
        leases.close()


def test_the_keeper_waits_for_deadlines_on_the_lease_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [500.0]
    monkeypatch.setattr(lease_clock, "now", lambda: clock[0])
    keeper = kp.KeeperProcess(None, "q")  # type: ignore[arg-type]  # no request is read
    keeper.deadlines[1] = 500.04
    # ``now`` (the monotonic clock, for the keeper's own scans) plays no part.
    assert keeper.timeout(now=-1e9) == pytest.approx(0.04)
    clock[0] = 501.0
    assert keeper.timeout(now=-1e9) == 0.0
    keeper.deadlines[1] = 900.0  # far off: looked at again soon all the same (suspend)
    assert keeper.timeout(now=-1e9) == kp.DEADLINE_POLL
