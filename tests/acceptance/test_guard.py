"""The guarded shape of `statequeue run` (statequeue/run/guard.py) and its kill points.

    waiter (the pid the shell knows)
      keeper in guard mode (keeper_process.py)
        runner (starts each child itself: run/local_keeper.py)
          the item's child

Each test kills one of these (or freezes the keeper) and checks promise 4:
never a second copy of an item while a process of its first one lives, and
nothing of a run left behind once its keeper is done.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.test_keeper import (
    HANG_WORKER,
    SH_DETACHED_SLEEPER,
    SH_OVERLAP,
    escaped_alive,
)
from tests.acceptance.test_runner import (
    Procs,
    alive,
    enqueue,
    finish,
    lines,
    pids_in,
    sq,
    status,
    wait_for,
)
from tests.conftest import STATEQUEUE

PY = sys.executable

# Attempt 1 leaves a detached sleeper (new session, every inherited fd closed,
# so no claim fd) and hangs, having closed its own claim fd too: after the
# runner's death no process holds the item's claim lock. Later attempts end
# at once.
LEFTOVER_WORKER = (
    SH_OVERLAP
    + """
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  SLEEP=30
"""
    + SH_DETACHED_SLEEPER
    + f"""
  echo $$ >> "$SQT_DIR/pids/leader"
  exec {PY} -c 'import os; os.closerange(3, 65536); os.execvp("sleep", ["sleep", "30"])'
fi
"""
)

# TERM once: the item writes "term" and ends 0.3 s later (a second TERM,
# or a KILL, would end it before it writes "clean").
TRAP_WORKER = """
echo $$ >> "$SQT_DIR/pids/leader"
trap 'echo term >> "$SQT_DIR/events"; sleep 0.3; echo clean >> "$SQT_DIR/events"; exit 0' TERM
echo ready >> "$SQT_DIR/events"
while :; do sleep 0.05; done
"""


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def shape(waiter: int) -> tuple[int, int]:
    """The keeper and the runner under ``waiter`` (waits for them to appear)."""
    found: list[int] = []

    def look() -> bool:
        keepers = [p for p in children(waiter) if b"keeper_process" in cmdline(p)]
        runners = [p for k in keepers for p in children(k) if alive(p)]
        found[:] = keepers[:1] + runners[:1]
        return len(found) == 2

    wait_for(look, "the keeper and the runner")
    return found[0], found[1]


def test_the_run_is_a_waiter_above_the_keeper_above_the_runner_above_the_child(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    waiter = procs.start("run", "--", "sh", "-c", LEFTOVER_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "leader"), "the item to start")
    keeper, runner = shape(waiter.pid)
    assert b"--guard" in cmdline(keeper)
    leader = pids_in(work / "pids" / "leader")[0]
    assert leader in children(runner), "the runner starts the child itself"
    assert os.getsid(keeper) == keeper, "terminal signals reach the waiter only"
    assert os.getsid(runner) == keeper
    waiter.kill()
    finish(waiter)


def test_a_killed_runner_keeps_its_items_until_its_keeper_has_killed_what_it_left(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    # The keeper holds the runner's liveness lock: while it has not killed
    # the leftover (here: it is frozen), the item stays claimed, although no
    # process holds its claim fd (the sleeper closed it).
    enqueue(env, "a")
    waiter = procs.start("run", "--", "sh", "-c", LEFTOVER_WORKER)
    wait_for(lambda: escaped_alive(work) and pids_in(work / "pids" / "leader"), "the item to start")
    keeper, runner = shape(waiter.pid)
    os.kill(keeper, signal.SIGSTOP)
    try:
        os.kill(runner, signal.SIGKILL)
        wait_for(lambda: not alive(runner), "the runner to die")
        second = sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", LEFTOVER_WORKER)
        assert second.returncode == 3, second.stderr
        assert lines(work / "starts") == ["1"], "a second copy started beside the leftover"
        assert escaped_alive(work)
        assert status(env)["interrupted"] == []  # nor does `status` say it will run again
    finally:
        os.kill(keeper, signal.SIGCONT)
    # Thawed, the keeper kills the leftover, then lets go: the item runs again.
    wait_for(lambda: not escaped_alive(work), "the keeper to kill the leftover")
    code, _, _ = finish(waiter)
    assert code == -signal.SIGKILL  # as the runner died
    assert status(env)["interrupted"] == [1]  # the keeper has let go
    wait_for(
        lambda: (
            sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", LEFTOVER_WORKER).returncode == 0
        ),
        "the item to run again",
    )
    assert lines(work / "starts") == ["1", "2"]
    assert "overlap" not in lines(work / "events")


def test_a_killed_waiter_takes_the_runner_and_its_items_with_it(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    enqueue(env, "a")
    waiter = procs.start("run", "--", "sh", "-c", LEFTOVER_WORKER)
    wait_for(lambda: escaped_alive(work) and pids_in(work / "pids" / "leader"), "the item to start")
    keeper, runner = shape(waiter.pid)
    leader = pids_in(work / "pids" / "leader")[0]
    waiter.kill()  # kill -9 of the pid the shell knows, as before this shape
    finish(waiter)
    wait_for(lambda: not alive(runner), "the runner to die with the waiter")
    wait_for(lambda: not alive(leader), "the item's child to die")
    wait_for(lambda: not escaped_alive(work), "the detached leftover to die")
    wait_for(lambda: not alive(keeper), "the keeper to end")
    assert status(env)["interrupted"] == [1]
    again = sq(env, "run", "--", "sh", "-c", LEFTOVER_WORKER)
    assert again.returncode == 0, again.stderr
    assert lines(work / "starts") == ["1", "2"]


def test_a_killed_keeper_stops_the_runner(env: dict[str, str], work: Path, procs: Procs) -> None:
    # Without its keeper the runner could not keep promise 4 after its own
    # death: it stops, killing its children and giving their items back.
    enqueue(env, "a", "b")
    waiter = procs.start("run", "--", "sh", "-c", LEFTOVER_WORKER)
    wait_for(lambda: escaped_alive(work) and pids_in(work / "pids" / "leader"), "the item to start")
    keeper, runner = shape(waiter.pid)
    leader = pids_in(work / "pids" / "leader")[0]
    os.kill(keeper, signal.SIGKILL)
    code, _, err = finish(waiter)
    assert code != 0
    wait_for(lambda: not alive(runner), "the runner to stop")
    wait_for(lambda: not alive(leader), "the item's child to be killed")
    assert "keeper" in err, err
    # Nothing the runner left may run on unwatched: it killed all of it.
    wait_for(lambda: not escaped_alive(work), "the detached leftover to be killed")
    counts = status(env)["counts"]
    assert counts["running"] == 0 and counts["pending"] == 2, counts
    assert lines(work / "starts") == ["1"], "the runner went on without its keeper"


def _trap_run(env: dict[str, str], work: Path, procs: Procs, worker: str) -> subprocess.Popen[str]:
    """A run of one item whose command traps a signal, in its own process
    group (so killpg reaches no one else), once the item has started."""
    enqueue(env, "a")
    waiter = subprocess.Popen(
        [STATEQUEUE, "run", "--grace", "5", "--", "sh", "-c", worker],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    procs.runners.append(waiter)
    wait_for(lambda: "ready" in lines(work / "events"), "the item to start")
    return waiter


@pytest.mark.parametrize("to_group", [False, True], ids=["by-pid", "to-its-group"])
def test_a_signal_to_the_waiter_or_its_group_reaches_the_runner_once(
    env: dict[str, str], work: Path, procs: Procs, to_group: bool
) -> None:
    # SIGTERM by pid, and to the whole process group (as `timeout` sends it):
    # the runner sends one TERM to the item, which has its grace; a second
    # TERM (the runner's "stop now") would have killed it at once.
    waiter = _trap_run(env, work, procs, TRAP_WORKER)
    if to_group:
        os.killpg(waiter.pid, signal.SIGTERM)
    else:
        waiter.send_signal(signal.SIGTERM)
    code, _, err = finish(waiter)
    assert lines(work / "events") == ["ready", "term", "clean"], err
    assert code == 143, err  # the runner's own exit code for a stop by SIGTERM


HUP_WORKER = TRAP_WORKER.replace("term >>", "hup >>").replace("' TERM", "' HUP")


def test_sighup_stops_the_run_with_grace_and_exits_129(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    # A closed terminal or ssh session: the children run in sessions of their
    # own, so they hear of it only through the runner, which stops as for
    # TERM (the item gets HUP and its grace) instead of dying by the signal
    # and leaving its keeper to SIGKILL the item.
    waiter = _trap_run(env, work, procs, HUP_WORKER)
    waiter.send_signal(signal.SIGHUP)
    code, _, err = finish(waiter)
    assert lines(work / "events") == ["ready", "hup", "clean"], err
    assert code == 129, err  # ExitCode.INTERRUPTED_HUP
    counts = status(env)["counts"]
    assert counts["done"] == 1 and counts["running"] == 0, counts  # its trap exited 0


# Holds its claim fd (inherited, at a high number) and sleeps: no detaching.
PLAIN_WORKER = HANG_WORKER


def test_with_keeper_and_runner_killed_the_child_keeps_its_claim(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    # No process of the run is left to kill the child: it keeps the claim it
    # inherited, so the next run waits for it instead of starting a copy.
    enqueue(env, "a")
    waiter = procs.start("run", "--", "sh", "-c", PLAIN_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "leader"), "the item to start")
    keeper, runner = shape(waiter.pid)
    leader = pids_in(work / "pids" / "leader")[0]
    # Both stopped first: a runner that outlives its keeper even briefly kills
    # what it started (run/guard.py, GUARD_LOST), which is not this case.
    for pid in (keeper, runner):
        os.kill(pid, signal.SIGSTOP)
    os.kill(keeper, signal.SIGKILL)
    os.kill(runner, signal.SIGKILL)
    finish(waiter)
    assert alive(leader)
    second = sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", PLAIN_WORKER)
    assert second.returncode == 3, second.stderr
    assert lines(work / "starts") == ["1"], "a second copy started beside the first"
    os.kill(leader, signal.SIGKILL)
    wait_for(lambda: not alive(leader), "the child to die")
    wait_for(
        lambda: sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", PLAIN_WORKER).returncode == 0,
        "the item to run again",
    )
    assert lines(work / "starts") == ["1", "2"]


# Ends at once, leaving a detached sleeper (new session, fds closed).
DETACH_AND_END = (
    """
SLEEP=30
"""
    + SH_DETACHED_SLEEPER
)


def test_the_run_returns_while_a_detached_leftover_runs_on(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    # The keeper stays for the leftover (holding its item's claim); the pid
    # the shell waits for exits with the runner's code, without waiting for it.
    enqueue(env, "a")
    waiter = procs.start("run", "--", "sh", "-c", DETACH_AND_END)
    code, _, err = finish(waiter, timeout=20)
    assert code == 0, err
    assert escaped_alive(work), "the leftover was killed at a normal end"
    for pid in pids_in(work / "escaped"):
        os.kill(pid, signal.SIGKILL)


def test_an_idle_runner_stops_when_its_keeper_dies(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    # Idle (its one item done, --follow): it still notices, and stops.
    enqueue(env, "a")
    waiter = procs.start("run", "--follow", "--", "true")
    wait_for(lambda: status(env)["counts"]["done"] == 1, "the item to be done")
    keeper, runner = shape(waiter.pid)
    os.kill(keeper, signal.SIGKILL)
    code, _, err = finish(waiter)
    assert code == 1, err
    assert "keeper" in err, err
    wait_for(lambda: not alive(runner), "the runner to stop")


def test_the_keeper_holds_none_of_the_callers_fds(
    env: dict[str, str], work: Path, procs: Procs
) -> None:
    # A keeper staying for a detached leftover must not hold a caller's pipe.
    enqueue(env, "a")
    read_end, write_end = os.pipe()
    try:
        waiter = subprocess.Popen(
            [STATEQUEUE, "run", "--", "sh", "-c", PLAIN_WORKER],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(write_end,),
        )
        procs.runners.append(waiter)
        wait_for(lambda: pids_in(work / "pids" / "leader"), "the item to start")
        keeper, _ = shape(waiter.pid)
        held = {int(fd) for fd in os.listdir(f"/proc/{keeper}/fd")}
        assert write_end not in held, held
        assert {0, 1, 2, 3, 4} <= held
        waiter.kill()
        finish(waiter)
    finally:
        os.close(read_end)
        os.close(write_end)
