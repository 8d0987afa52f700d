"""A PostgreSQL run whose keeper process is killed with -9 (promise 4).

In the PostgreSQL store's process shape the keeper (run/keeper_process.py)
is the parent of every item's process. Killed, it left them to init, still
running, while the runner stopped and gave their items back at once: the next
run started attempt 2 beside attempt 1. Now the runner, a subreaper, adopts
and kills them (their groups and every detached descendant) before any claim
goes back; where it cannot, the item stays claimed (run/orphans.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any, cast

import pytest

from statequeue.core.models import Claim
from tests.conftest import STATEQUEUE
from tests.pg import sql as _sql
from tests.waiting import gone as _gone
from tests.waiting import until as _until

psycopg = pytest.importorskip("psycopg")

DEADLINE = 60.0  # generous: the machine is shared

# The item's process writes its pid, starts a descendant in a new session
# (no group kill reaches it) that writes its own, and sleeps.
ITEM = textwrap.dedent(
    """\
    setsid sh -c 'echo $$ > "$DESC_PID.tmp"; mv "$DESC_PID.tmp" "$DESC_PID"; exec sleep 60' &
    echo $$ > "$ITEM_PID.tmp"; mv "$ITEM_PID.tmp" "$ITEM_PID"
    sleep 60
    """
)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            found += [int(x) for x in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def _keeper_of(runner: int) -> int | None:
    for pid in _children(runner):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if b"keeper_process.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    return None


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def test_a_killed_keepers_item_never_runs_beside_its_next_attempt(
    tmp_path: Path, sq_env: dict[str, str], pg_url: str
) -> None:
    """kill -9 of the keeper while the item runs: when the runner has stopped,
    nothing of the attempt is left (its process, and a descendant in a new
    session), so the next run's attempt 2 never overlaps it; that run does
    the item, once."""
    item_pid, desc_pid = tmp_path / "item.pid", tmp_path / "desc.pid"
    env = dict(sq_env, STATEQUEUE_STORE=pg_url, ITEM_PID=str(item_pid), DESC_PID=str(desc_pid))
    subprocess.run([STATEQUEUE, "enqueue", "a"], env=env, check=True, timeout=DEADLINE)
    first = subprocess.Popen(
        [STATEQUEUE, "run", "--no-live", "--", "sh", "-c", ITEM],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    pids: list[int] = []
    try:
        _until(lambda: item_pid.exists() and desc_pid.exists(), "the item to start")
        pids = [int(item_pid.read_text()), int(desc_pid.read_text())]
        keeper = _until(lambda: _keeper_of(first.pid), "the run's keeper")
        os.kill(cast(int, keeper), signal.SIGKILL)
        _, err = first.communicate(timeout=DEADLINE)
        assert first.returncode == 1, err
        assert b"keeper process ended unexpectedly" in err
        # At once: the runner has ended, and anything of the attempt that
        # still lived would run beside the next run's attempt.
        alive = [pid for pid in pids if not _gone(pid)]
        assert not alive, f"processes of attempt 1 outlived the run: {alive}"
        assert _sql(pg_url, "SELECT state FROM statequeue.live WHERE id = 1") == [("pending",)]
        second = subprocess.run(
            [STATEQUEUE, "run", "--no-live", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert second.returncode == 0, second.stderr
        assert _sql(pg_url, "SELECT attempt FROM statequeue.results") == [(2,)]
    finally:
        if first.poll() is None:
            _kill(first.pid)
            first.wait(DEADLINE)
        for pid in pids:
            _kill(pid)


class _Job:
    def __init__(self, claim: Claim) -> None:
        self.claim = claim

    def signal_group(self, signum: int) -> None:
        pass

    def reap(self) -> int:
        return -1

    def cut(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Store:
    has_leases = True

    def __init__(self) -> None:
        self.released: list[Any] = []

    def release(self, claim: Claim, reason: str, **kw: Any) -> None:
        self.released.append(claim)


class _Recorder:
    def give_back_prefetched(self) -> None:
        pass


class _LostKeeper:
    in_process = False
    lost = True


@pytest.mark.parametrize("lost", [True, False])
def test_a_lost_keepers_items_stay_claimed_where_its_orphans_cannot_be_ended(
    monkeypatch: pytest.MonkeyPatch, lost: bool
) -> None:
    """No subreaper (a library's runner): a lost keeper's children went to
    init, beyond our reach, so its items are not given back (recovery takes
    them once their claim locks are free); with the keeper alive, an error
    gives them back as ever."""
    from statequeue.run import orphans  # here: the test above runs on older code too
    from statequeue.run.stopping import give_back_all

    monkeypatch.setattr(orphans, "_subreaper", False)
    store, keeper = _Store(), _LostKeeper()
    keeper.lost = lost
    claim = cast(Claim, object())
    jobs: dict[int, Any] = {1: _Job(claim)}
    give_back_all(jobs, cast(Any, store), cast(Any, _Recorder()), cast(Any, keeper))
    assert store.released == ([] if lost else [claim])
