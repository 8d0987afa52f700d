"""The keeper: one small process per run that is the parent of every child.

The runner asks it (over a unix socket, sending the child's pipes and claim
fds with SCM_RIGHTS) to start each item's command. The keeper is a child
subreaper (PR_SET_CHILD_SUBREAPER), so a descendant that detaches -- new
session, closed fds, double fork -- is reparented to it when its parent dies,
never to init. It holds a copy of every item's claim fd and closes it only
once no process of that item is left, so neither a retry nor the next run
starts a second copy while one lives (promise 4).

When the runner dies (the socket reaches end of file without a goodbye: kill
-9, a crash), its items are in flight and will be recovered, so the keeper
SIGKILLs every process left of them -- the items' process groups, then every
child that appears, which it may kill by pid because an unreaped child keeps
its pid -- until it has no child at all, then releases the claims and exits.
When the run ends normally (goodbye), every item is settled: a detached
process an item left behind may go on, and the keeper stays until the last
one has exited, holding its item's claim so no retry overlaps it -- except
for an item the runner CUT (its attempt was stopped by a signal or timed
out): what is left of it is killed, as of a fenced item below, but only the
processes surely of it.

Self-fencing (stores with leases): the runner sends each token's DEADLINE,
the end of its lease as last renewed, on the lease clock (lease_clock.py,
CLOCK_BOOTTIME where there is one: the very module the runner reads).
When it comes, the keeper kills the item as it would after a kill -9 of the
runner, even if the runner is frozen: the leader's process group, then every
adopted descendant attributed to the item (a new session escapes the group),
again and again as more are reparented, until none is left. The deadline
outlives the leader: a detached leftover of an item whose runner froze before
it could record the result dies at the lease's end too; once the runner has
recorded the item done or failed, it cancels the deadline (an infinite one)
and a leftover may go on. An orphan attributed to every held item (no
STATEQUEUE_ID) is killed with any of them.

Attribution of a reparented orphan: the STATEQUEUE_ID in its environment
(which survives setsid and closed fds), else every item the keeper holds at
that moment (an orphan's dead parent belonged to a held item). Finding the
keeper's children needs a /proc scan when the kernel lacks the cheap
``/proc/self/task/N/children`` list; that scan is rate-limited, and skipped
whenever ``waitid`` says the keeper has no child at all.

A persistent worker (run/persistent.py) starts with no item (WORKER: its reply
pipe too, its pid reported); ASSIGN makes it the process of each item in turn.

The children's environment comes once per run (ENVIRON); each SPAWN names
only the variables of its item, so a request stays small whatever the size of
the user's environment.

``STATEQUEUE_BENCH_KEEPER_CPU``, if set, names a file where the keeper writes
its own user+sys CPU seconds as it exits (scripts/bench.py reports the
runner's and the keeper's CPU per item side by side: the keeper is
statequeue's own process, and its work must not go unreported).

This file runs as a script under ``python -I -S``: standard library only,
and the package's stdlib-only modules it imports from its own folder.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time

TYPE_CHECKING = False  # not typing's: we start under -I -S (see keeper_os.suppress)

if TYPE_CHECKING or __package__:
    from statequeue.core import lease_clock
    from statequeue.run.keeper_os import append_cpu, become_subreaper, report_cpu, suppress
    from statequeue.run.keeper_protocol import (
        ASSIGN,
        CPU_APPEND_ENV,
        CPU_REPORT_ENV,
        CUT,
        DEADLINE,
        ENVIRON,
        EXITED,
        FAILED,
        GOODBYE,
        GUARD,
        HEADER,
        HOLD,
        LINGERING,
        LIVENESS,
        LOST,
        MAX_FDS,
        NO_ITEM,
        NOTE,
        REPLY,
        REPLY_FD,
        RUNNER_TOKEN,
        SIGNAL,
        SOCKET_FD,
        SPAWN,
        STARTED,
        STATUS_FD,
        WAITER_GONE,
        WORKER,
    )
    from statequeue.run.keeper_state import (
        DEADLINE_POLL,
        FENCE_POLL,
        KeeperProcess,
        Leader,
        tell_waiter,
    )
else:  # a script under -I -S: the package is not importable, its folders are
    # (appended: a standard module is never shadowed by one of ours)
    _HERE = os.path.dirname(os.path.abspath(__file__))
    sys.path += [_HERE, os.path.join(os.path.dirname(_HERE), "core")]
    import lease_clock
    from keeper_os import append_cpu, become_subreaper, report_cpu, suppress
    from keeper_protocol import (
        ASSIGN,
        CPU_APPEND_ENV,
        CPU_REPORT_ENV,
        CUT,
        DEADLINE,
        ENVIRON,
        EXITED,
        FAILED,
        GOODBYE,
        GUARD,
        HEADER,
        HOLD,
        LINGERING,
        LIVENESS,
        LOST,
        MAX_FDS,
        NO_ITEM,
        NOTE,
        REPLY,
        REPLY_FD,
        RUNNER_TOKEN,
        SIGNAL,
        SOCKET_FD,
        SPAWN,
        STARTED,
        STATUS_FD,
        WAITER_GONE,
        WORKER,
    )
    from keeper_state import (
        DEADLINE_POLL,
        FENCE_POLL,
        KeeperProcess,
        Leader,
        tell_waiter,
    )

__all__ = [
    "ASSIGN",
    "CPU_APPEND_ENV",
    "CPU_REPORT_ENV",
    "CUT",
    "DEADLINE",
    "DEADLINE_POLL",
    "ENVIRON",
    "EXITED",
    "FAILED",
    "FENCE_POLL",
    "GOODBYE",
    "GUARD",
    "HEADER",
    "HOLD",
    "LINGERING",
    "LIVENESS",
    "LOST",
    "MAX_FDS",
    "NOTE",
    "NO_ITEM",
    "REPLY",
    "REPLY_FD",
    "RUNNER_TOKEN",
    "SIGNAL",
    "SOCKET_FD",
    "SPAWN",
    "STARTED",
    "STATUS_FD",
    "WAITER_GONE",
    "WORKER",
    "KeeperProcess",
    "Leader",
    "lease_clock",
    "main",
    "tell_waiter",
]


def main() -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    os.set_inheritable(SOCKET_FD, False)
    sock = socket.socket(fileno=SOCKET_FD)
    become_subreaper()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    keeper = KeeperProcess(sock, sys.argv[1] if len(sys.argv) > 1 else "")
    if len(sys.argv) > 4 and sys.argv[2] == GUARD:
        guard(keeper, int(sys.argv[3]), int(sys.argv[4]))
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while True:
        now = time.monotonic()
        wait = keeper.timeout(now)
        for fd, _ in poller.poll(None if wait is None else wait * 1000):
            if fd == wake_r:
                with suppress(BlockingIOError):
                    os.read(wake_r, 4096)
            else:
                keeper.receive()
                if keeper.ending or keeper.goodbye:
                    poller.unregister(sock.fileno())
                    sock.close()
        keeper.enforce(lease_clock.now())
        exits = keeper.reap()
        if keeper.ending:
            keeper.kill_all()
        else:
            # Claims first when that is cheap (no child left: the common -j1
            # case), as the runner may retry the item as soon as it hears;
            # a /proc scan, though, must not delay the news.
            keeper.settle_if_childless()
        keeper.report(exits)
        if not keeper.ending:
            keeper.settle(time.monotonic())
        if keeper.note is not None and keeper.goodbye:  # what a later run waits for
            keeper.note.write(keeper.held, keeper.owners)
        if (keeper.ending or keeper.goodbye) and not keeper.has_children():
            break
    keeper.release(set(keeper.held))
    if keeper.note is not None:
        keeper.note.close()
    for fd in keeper.liveness:
        os.close(fd)
    report_cpu(os.environ.get(CPU_REPORT_ENV, ""))
    append_cpu(os.environ.get(CPU_APPEND_ENV, ""), "keeper")
    # Last: the waiter then reaps us (the whole run's CPU is in its rusage),
    # and the shell's prompt comes back with nothing of the run left.
    keeper.tell_runner_code()


def guard(keeper: KeeperProcess, runner: int, waiter: int) -> None:
    """Guard mode (guard.py): the runner is our child, started before our
    exec; its exit code goes to the waiter, and the waiter's death (our
    parent's: the parent-death signal) is the runner's, as a kill -9 of the
    run's visible pid was before."""
    keeper.status_fd = STATUS_FD
    keeper.runner = runner
    os.set_inheritable(STATUS_FD, False)
    keeper.leaders[runner] = keeper.by_token[RUNNER_TOKEN] = Leader(RUNNER_TOKEN, NO_ITEM, runner)

    def waiter_gone(signum: int, frame: object) -> None:
        if runner in keeper.leaders:  # not reaped yet: its pid is still its own
            with suppress(ProcessLookupError):
                os.kill(runner, signal.SIGKILL)

    # Ignored until now (set before our exec): a death before this handler
    # would have killed us; the check below catches one that came meanwhile.
    signal.signal(WAITER_GONE, waiter_gone)
    if os.getppid() != waiter:
        waiter_gone(WAITER_GONE, None)


if __name__ == "__main__":
    main()
    # Without the interpreter's teardown: it is all that is left (everything is
    # released and said), and the waiter, so the shell's prompt, waits for it.
    os._exit(0)
