"""Promise 4 against escaping descendants, and the runner's own resource limits.

The keeper (statequeue/run/keeper_process.py) is the parent and subreaper of every
child: a descendant that detaches (new session, closed fds, double fork) is
still its child once its parent dies, and the item's claim is held until no
process of the item is left. Every escaping worker here records its
detached sleeper's pid in $SQT_DIR/escaped (and in pids/, for teardown); a
later attempt records "overlap" in $SQT_DIR/events if one still runs.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from statequeue import Queue
from statequeue.core.errors import ResourcesExhausted
from statequeue.core.models import ItemState
from statequeue.run.keeper_process import LOST, KeeperProcess, Leader
from statequeue.run.options import RunOptions
from statequeue.run.runner import Runner
from tests.acceptance.test_runner import (
    Procs,
    alive,
    enqueue,
    finish,
    journal,
    kill9,
    lines,
    pids_in,
    sq,
    status,
    wait_for,
)
from tests.conftest import STATEQUEUE

PY = sys.executable

# Attempt 2 and later: is a sleeper of attempt 1 still running beside us?
SH_OVERLAP = """
echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/starts"
for p in $(cat "$SQT_DIR/escaped" 2>/dev/null); do
  s=$(sed 's/.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f1)
  if [ -n "$s" ] && [ "$s" != Z ] && [ "$s" != X ]; then echo overlap >> "$SQT_DIR/events"; fi
done
"""

# A sleeper that leaves the session and closes every inherited fd.
SH_DETACHED_SLEEPER = (
    f"setsid {PY} -c 'import os, sys; os.closerange(3, 65536); "
    'os.execvp("sleep", ["sleep", sys.argv[1]])\' "$SLEEP" &\n'
    'echo $! >> "$SQT_DIR/escaped"; echo $! >> "$SQT_DIR/pids/escaped"\n'
)

# (a) The classic `exec 9>lockfile; flock 9` idiom, then a detached sleeper.
FLOCK9_WORKER = (
    SH_OVERLAP
    + """
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  exec 9>"$SQT_DIR/lockfile"; flock 9
  SLEEP=30
"""
    + SH_DETACHED_SLEEPER
    + """
  echo $$ >> "$SQT_DIR/pids/leader"
  exec sleep 30
fi
"""
)

PY_OVERLAP = """
import os, subprocess, sys, time
d = os.environ["SQT_DIR"]
with open(f"{d}/starts", "a") as f:
    f.write(os.environ["STATEQUEUE_ATTEMPT"] + "\\n")
try:
    escaped = open(f"{d}/escaped").read().split()
except FileNotFoundError:
    escaped = []
for p in escaped:
    try:
        state = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        continue
    if state not in ("Z", "X"):
        with open(f"{d}/events", "a") as f:
            f.write("overlap\\n")

def record(pid):
    for name in ("escaped", "pids/escaped"):
        with open(f"{d}/{name}", "a") as f:
            f.write(f"{pid}\\n")
"""

# (b) subprocess.Popen(start_new_session=True): a new session, and close_fds.
POPEN_WORKER = (
    PY_OVERLAP
    + """
if os.environ["STATEQUEUE_ATTEMPT"] == "1":
    record(subprocess.Popen(["sleep", "30"], start_new_session=True).pid)
    record(os.getpid())
    time.sleep(30)
"""
)

# (c) Double fork + setsid: the sleeper's parent exits at once.
DOUBLE_FORK_WORKER = (
    PY_OVERLAP
    + """
if os.environ["STATEQUEUE_ATTEMPT"] == "1":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            record(os.getpid())
            os.closerange(3, 65536)
            os.execvp("sleep", ["sleep", "30"])
        os._exit(0)
    os.wait()
    while not os.path.exists(f"{d}/escaped"):
        time.sleep(0.01)
    record(os.getpid())
    time.sleep(30)
"""
)


def escaped_alive(work: Path) -> bool:
    return any(alive(p) for p in pids_in(work / "escaped"))


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["sh", "-c", FLOCK9_WORKER], id="exec9-flock-setsid-closed-fds"),
        pytest.param([PY, "-c", POPEN_WORKER], id="popen-start-new-session"),
        pytest.param([PY, "-c", DOUBLE_FORK_WORKER], id="double-fork-setsid"),
    ],
)
def test_after_kill9_no_escaped_descendant_runs_beside_the_next_attempt(
    env: dict[str, str], work: Path, procs: Procs, argv: list[str]
) -> None:
    enqueue(env, "a")
    first = procs.start("run", "--", *argv)
    wait_for(lambda: escaped_alive(work), "the detached sleeper to start")
    kill9(first)
    # A runner started at once must not start the item while the sleeper lives.
    second = procs.start("run", "--follow", "--", *argv)
    wait_for(lambda: len(lines(work / "starts")) == 2, "the item to run again", timeout=15)
    wait_for(lambda: status(env)["counts"]["done"] == 1, "the item to be done")
    assert "overlap" not in lines(work / "events"), "attempt 2 ran beside attempt 1's sleeper"
    assert not escaped_alive(work), "a detached descendant outlived its killed runner"
    second.send_signal(signal.SIGTERM)
    code, _, err = finish(second)
    assert code == 0, err  # --follow stopped by TERM with nothing in flight: a clean stop


RETRY_WORKER = (
    SH_OVERLAP
    + """
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  SLEEP=1
"""
    + SH_DETACHED_SLEEPER
    + """
  exit 1
fi
"""
)


def test_retry_never_runs_beside_a_detached_descendant_of_the_failed_attempt(
    env: dict[str, str], work: Path
) -> None:
    enqueue(env, "a")
    first = sq(env, "run", "--retries", "1", "--retry-delay", "0", "--", "sh", "-c", RETRY_WORKER)
    assert first.returncode in (0, 3), first.stderr
    # The run may end with the retry still pending (its claim held until the
    # sleeper exits); later runs take it, never while the sleeper lives.
    wait_for(
        lambda: (
            sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", RETRY_WORKER).returncode == 0
            or status(env)["counts"]["done"] == 1
        ),
        "the retry to run",
        timeout=15,
    )
    assert lines(work / "starts") == ["1", "2"]
    assert "overlap" not in lines(work / "events"), "the retry ran beside the sleeper"


HANG_WORKER = """
echo "$STATEQUEUE_ATTEMPT" >> "$SQT_DIR/starts"
if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
  echo $$ >> "$SQT_DIR/pids/leader"
  exec sleep 30
fi
"""


def test_deleting_the_claim_files_does_not_free_a_running_item(
    env: dict[str, str], work: Path, procs: Procs, sq_home: Path
) -> None:
    enqueue(env, "a")
    procs.start("run", "--", "sh", "-c", HANG_WORKER)
    wait_for(lambda: pids_in(work / "pids" / "leader"), "the item to start")
    for path in (sq_home / "default" / "claims").iterdir():  # rm claims/*.lock
        path.unlink()
    second = sq(env, "run", "--exit-empty", "3", "--", "sh", "-c", HANG_WORKER)
    assert second.returncode == 3, second.stderr
    assert lines(work / "starts") == ["1"], "a second copy started beside the first"
    assert status(env)["counts"]["running"] == 1


def test_claim_fd_is_placed_high_in_the_child(env: dict[str, str], sq_home: Path) -> None:
    enqueue(env, "a")
    out = sq(
        env, "run", "--", "sh", "-c", 'ls -l /proc/$$/fd | grep -c "claims.lock"; ls /proc/$$/fd'
    )
    assert out.returncode == 0, out.stderr
    log = (sq_home / "default" / "logs" / "1.1.log").read_text().split()
    assert log[0] == "1", log
    assert max(int(fd) for fd in log[1:]) >= 30, log  # not 9 or 16: kept by `exec 9>file`


def _fd_limit(n: int) -> Callable[[], None]:
    """A preexec hook setting RLIMIT_NOFILE (the test process starts no threads)."""
    return functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (n, n))


def test_running_out_of_fds_is_the_runners_problem_not_the_items(
    env: dict[str, str], sq_home: Path
) -> None:
    enqueue(env, *(f"i{n}" for n in range(1, 41)))
    out = subprocess.run(
        [STATEQUEUE, "run", "--json", "-j16", "--", "sh", "-c", "sleep 0.05"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_fd_limit(32),
        check=False,
    )
    ends = [r for r in journal(sq_home) if r.get("t") == "end"]
    assert not [r for r in ends if not r["ok"]], "an item was failed for the runner's EMFILE"
    # Uncounted: an attempt that could not start gives its number out again.
    assert {r["attempt"] for r in ends} <= {1}, "an attempt that never began was counted"
    if out.returncode == 10:  # stopped: then nothing may be lost or counted
        assert status(env)["counts"]["pending"] == 40, out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["failed"] == 0
    assert status(env)["counts"]["done"] == 40
    assert "Too many open files" in out.stderr  # it said why it ran fewer at once


def test_with_no_fd_to_spare_the_run_stops_with_a_clear_error(env: dict[str, str]) -> None:
    enqueue(env, "a")
    # The lowest fd limit the CLI gets through start-up with (10 today): one
    # child is one too many. Lower limits fail at start-up (not the subject).
    for limit in range(10, 40):
        out = subprocess.run(
            [STATEQUEUE, "run", "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=_fd_limit(limit),
            check=False,
        )
        if out.returncode in (0, 10):
            break
    assert out.returncode == 10, out.stderr
    assert out.stderr.startswith("statequeue: ") and out.stderr.count("\n") == 1, out.stderr
    assert "Too many open files" in out.stderr
    counts = status(env)["counts"]
    assert counts["pending"] == 1 and counts["failed"] == 0  # given back, not failed


# -- how the keeper attributes a reparented orphan (unit level) ---------------------


@pytest.fixture
def keeper() -> Iterator[KeeperProcess]:
    mine, theirs = socket.socketpair()
    try:
        yield KeeperProcess(mine, "q")
    finally:
        mine.close()
        theirs.close()


def test_an_orphan_of_no_known_item_holds_every_item_held(
    keeper: KeeperProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper.held = {1: [], 2: []}
    found = {100: 1, 101: -1, 102: 7}  # 7: not an item the keeper holds
    monkeypatch.setattr(keeper, "item_of", found.__getitem__)
    owners = keeper.attribute([100, 101, 102])
    assert owners == {100: {1}, 101: {1, 2}, 102: {1, 2}}


def test_only_items_no_process_is_left_of_are_released(
    keeper: KeeperProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    keeper.held = {1: [], 2: [], 3: []}
    keeper.finished = {1, 2}  # item 3's leader still runs
    keeper.leaders = {50: Leader(token=9, item=3, pid=50)}
    monkeypatch.setattr(keeper, "has_children", lambda: True)
    monkeypatch.setattr(keeper, "children_timed", lambda now: [50, 100])
    monkeypatch.setattr(keeper, "item_of", {100: 2}.__getitem__)
    keeper.settle(now=0.0)
    assert set(keeper.held) == {2, 3} and keeper.finished == {2}


def test_an_orphan_is_attributed_by_the_queue_and_id_in_its_environment(
    keeper: KeeperProcess,
) -> None:
    env = {**os.environ, "STATEQUEUE_QUEUE": "q", "STATEQUEUE_ID": "5"}
    procs = [
        subprocess.Popen(["sleep", "30"], env=env),
        subprocess.Popen(["sleep", "30"], env={**env, "STATEQUEUE_QUEUE": "other"}),
    ]
    try:
        # Right after an exec the kernel may not have set up the new
        # environment yet (an empty read; seen under load): wait until both
        # can be read. The keeper's own attribution treats an unknown orphan
        # as any held item's: held too long at worst, never too short.
        wait_for(lambda: all(Path(f"/proc/{p.pid}/environ").read_bytes() for p in procs), "envs")
        assert [keeper.item_of(p.pid) for p in procs] == [5, -1]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_command_that_cannot_start_fails_its_items_and_the_run_goes_on(
    env: dict[str, str],
) -> None:
    # The program is the item, so it cannot be checked before the run: each
    # item fails on its own (a missing fixed program is refused up front).
    enqueue(env, "/nonexistent/a", "/nonexistent/b")
    out = sq(env, "run", "--", "{}")
    assert out.returncode == 1, out.stderr
    assert "keeper" not in out.stderr, out.stderr
    st = status(env)
    assert st["counts"]["failed"] == 2
    assert all("cannot start command" in f["reason"] for f in st["recent_failures"]), st


def test_fds_lost_in_transit_fail_their_own_request_only(keeper: KeeperProcess) -> None:
    # Three requests' fds queued: the second lost some (MSG_CTRUNC: the
    # keeper was out of fds); the first and third keep theirs.
    keeper.inbox.fds = [10, 11, 20, LOST, 30, 31]
    assert keeper.inbox.take_fds(2) == [10, 11]
    assert keeper.inbox.take_fds(3) == [20, LOST]
    assert keeper.inbox.take_fds(2) == [30, 31]
    assert keeper.inbox.fds == []


class _KeeperOutOfProcesses:
    """A keeper whose every spawn fails with EAGAIN, reported later, as the
    real keeper reports a failed posix_spawn."""

    in_process = False
    lost = False  # alive all along: the run gives its claims back

    def __init__(self, queue: str, **options: object) -> None:
        self._r, self._w = os.pipe()
        self.failed: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self._tokens = 0

    def fileno(self) -> int:
        return self._r

    def spawn(self, **request: object) -> int:
        self._tokens += 1
        self.failed[self._tokens] = errno.EAGAIN
        os.write(self._w, b"!")
        return self._tokens

    def receive(self) -> None:
        os.read(self._r, 4096)

    def tend(self) -> None:
        pass

    def close(self) -> None:
        os.close(self._r)
        os.close(self._w)


def test_spawns_failing_together_give_back_every_claim(
    sq_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # -j4 and every spawn refused at once: the run stops (exit 10), and no
    # item may stay claimed (it would count as a runner crash next time).
    monkeypatch.setattr("statequeue.run.runner.Keeper", _KeeperOutOfProcesses)
    with Queue("q", home=sq_home) as q:
        q.enqueue(["a", "b", "c", "d"])
        runner = Runner(q, RunOptions(command=("true",), jobs=4))
        with pytest.raises(ResourcesExhausted):
            runner.run()
        st = q.status()
    assert st.counts[ItemState.PENDING] == 4, st.counts
    assert st.counts[ItemState.RUNNING] == 0
    assert not st.interrupted
