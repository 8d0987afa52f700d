"""The run's process shape: a waiter, the keeper as guard, and the runner below it.

``statequeue run`` forks once, early, into three processes:

    waiter (the pid the shell knows)
      keeper, in guard mode (keeper_process.py; own session; a subreaper)
        runner (this code goes on here; a subreaper too)
          each item's child, started by the runner itself (local_keeper.py)

so an item's path has one wakeup, the runner's at the child's exit, while the
keeper stays what enforces promise 4 after a kill -9: it is the runner's
parent and an ancestor of every child, so whatever the runner leaves behind
-- its children, and the orphans it had adopted -- is reparented to the
keeper when the runner dies. The keeper holds a copy of the runner's liveness
lock (sent once, ``send_liveness``), so the items of a dead runner stay
claimed until the keeper has killed every descendant left; then it lets go,
and the next runner recovers them.

The waiter forwards the signals it gets (Ctrl-C, SIGTERM by pid or to its
group, SIGHUP) to the runner, once each, suspends the runner with itself on
Ctrl-Z, and exits with the runner's exit code (dying by the same signal if the
runner died by one). Its death, even by SIGKILL, kills the runner (the
keeper's parent-death signal), as a kill -9 of the run's pid did before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from statequeue.run import keeper_process as kp
from statequeue.run.keeper import readable, send_request
from statequeue.run.keeper_os import append_cpu

_PROGRAM = str(Path(kp.__file__).resolve())
_HIGH = 10  # above the keeper's fds (kp.SOCKET_FD, kp.STATUS_FD)
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
GUARD_LOST = signal.SIGUSR2  # the runner's parent-death signal: the keeper died
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGWINCH,  # the terminal's size, for the live view
)
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the runner stops on these (runner.py)
NO_GUARD_ENV = "STATEQUEUE_NO_GUARD"  # "1": the older shape (the keeper spawns each child)


def available() -> bool:
    """Whether this system can run the guarded shape (Linux: prctl)."""
    if os.environ.get(NO_GUARD_ENV, "") == "1" or not sys.platform.startswith("linux"):
        return False
    try:
        return hasattr(ctypes.CDLL(None), "prctl")
    except OSError:
        return False


class GuardLink:
    """The runner's side of the keeper in guard mode: a socket for the few
    messages of a run (never one per item), and whether the keeper died."""

    lost = False  # set by the parent-death signal: the keeper is gone

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.wake: Callable[[], None] = _nothing  # set by the runner's keeper: wakes its loop

    def send(self, request: tuple[Any, ...], fds: Sequence[int] = ()) -> bool:
        """Send ``request`` with ``fds``; False if the keeper is gone."""
        try:
            send_request(self.sock, request, fds)
        except OSError:
            return False
        return True

    def send_liveness(self, queue: str, fds: Sequence[int]) -> None:
        """Tell the keeper the queue's name (it attributes adopted orphans by
        it) and have it hold the runner's liveness lock (``fds``) until every
        process of the run is gone."""
        self.send((kp.LIVENESS, 0, queue), fds)

    def send_note(self, where: tuple[int, str] | None) -> None:
        """Where the keeper notes the processes it waits for, holding their
        items' claims, after the run (``Store.leftover_note``; None: nowhere)."""
        if where is not None:
            self.send((kp.NOTE, 0, where[1]), [where[0]])

    def close(self, held: dict[int, list[int]]) -> None:
        """End the run: the claims of items a leftover may still run for go to
        the keeper, which holds each until no process of its item is left."""
        for item, fds in held.items():
            self.send((kp.HOLD, 0, item), fds)
        self.send((kp.GOODBYE, 0, 0))
        self.sock.close()


def launch() -> GuardLink:
    """Fork into the waiter, the keeper and the runner (see the module's
    docstring); returns in the runner only. Call it with no thread running
    and nothing buffered for stdout or stderr. Every fd is made here, before
    the first fork: running short of them (OSError, EMFILE) happens in this
    process, which reports it as any command does."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: started with that fd closed
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    status_r, status_w = _high(*os.pipe2(os.O_CLOEXEC))
    mine, theirs = _high(*socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM))
    waiter = os.getpid()
    keeper = os.fork()
    if keeper != 0:
        for fd in (status_w, mine, theirs):
            os.close(fd)
        _wait_for_runner(status_r, keeper)  # never returns
    try:
        os.close(status_r)
        runner = _become_keeper(status_w, mine, theirs)
    except BaseException:  # tell the waiter (it exits 1), and never return as a runner
        os._exit(70)
    if runner == 0:
        return _become_runner(mine)
    try:
        _exec_keeper(runner, waiter)
    finally:
        os._exit(70)  # the exec failed: the runner sees its parent die, and stops


def _become_keeper(status_w: int, mine: int, theirs: int) -> int:
    """The keeper-to-be: its own session (terminal signals reach the waiter
    alone, which forwards them once), a subreaper, told of the waiter's death
    (ignored until the keeper's handler is set: it checks then); then the
    fork of the runner (0 in the runner, which keeps ``mine`` only)."""
    os.setsid()
    signal.signal(kp.WAITER_GONE, signal.SIG_IGN)
    _prctl(_PR_SET_PDEATHSIG, kp.WAITER_GONE)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    runner = os.fork()
    if runner == 0:
        signal.signal(kp.WAITER_GONE, signal.SIG_DFL)  # our children must not inherit SIG_IGN
        os.close(theirs)
        os.close(status_w)
        return 0
    os.close(mine)
    with contextlib.suppress(OSError):
        os.write(status_w, f"pid {runner}\n".encode("ascii"))
    # Both are above the targets (``_high``): neither overwrites the other.
    os.dup2(theirs, kp.SOCKET_FD)
    os.dup2(status_w, kp.STATUS_FD)
    return runner


def _exec_keeper(runner: int, waiter: int) -> None:
    program = [sys.executable, "-I", "-S", _PROGRAM, "", kp.GUARD, str(runner), str(waiter)]
    # Only its socket and the status pipe: a keeper that stays for a detached
    # leftover must not hold the caller's pipes open (`statequeue run 2>&1 |
    # cat`, an fd a harness waits on), its stdio included.
    os.closerange(kp.STATUS_FD + 1, _fd_limit())
    null = os.open(os.devnull, os.O_RDWR)  # may be 0-2 itself, if one was closed
    for fd in (0, 1, 2):
        if fd == null:
            os.set_inheritable(fd, True)
        else:
            os.dup2(null, fd)
    os.execv(sys.executable, program)


def _high(*fds: int | socket.socket) -> list[int]:
    """``fds`` moved above the keeper's fixed ones (close-on-exec)."""
    moved = []
    try:
        for fd in fds:
            number = fd.fileno() if isinstance(fd, socket.socket) else fd
            try:
                moved.append(fcntl.fcntl(number, fcntl.F_DUPFD_CLOEXEC, _HIGH))
            except OSError as exc:  # EINVAL: the fd limit is below _HIGH
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE)) from exc
    except BaseException:
        for number in moved:
            os.close(number)
        raise
    finally:
        for fd in fds:
            if isinstance(fd, socket.socket):
                fd.close()
            else:
                os.close(fd)
    return moved


def _nothing() -> None:
    pass


def _become_runner(fd: int) -> GuardLink:
    link = GuardLink(socket.socket(fileno=fd))

    def keeper_gone(signum: int, frame: object) -> None:
        GuardLink.lost = True
        link.wake()

    signal.signal(GUARD_LOST, keeper_gone)
    parent = os.getppid()
    _prctl(_PR_SET_PDEATHSIG, GUARD_LOST)
    # Orphans of our own children come to us, so an item's claim is held
    # until no process of it is left (local_keeper.py).
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.getppid() != parent:
        keeper_gone(GUARD_LOST, None)
    return link


def _wait_for_runner(status: int, keeper: int) -> None:
    """The waiter: forward signals to the runner, exit as it did. The keeper
    says the runner's exit code as it exits itself (then it is reaped here),
    or at once if a detached leftover keeps it ("detached": not waited for)."""
    runner = 0
    pending: list[int] = []
    forwarded: set[int] = set()

    def forward(signum: int, frame: object) -> None:
        forwarded.add(signum)
        if runner > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner, signum)
        elif runner == 0:
            pending.append(signum)

    def suspend(signum: int, frame: object) -> None:
        if runner > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner, signal.SIGSTOP)
        os.kill(os.getpid(), signal.SIGSTOP)

    def resume(signum: int, frame: object) -> None:
        if runner > 0:
            with contextlib.suppress(ProcessLookupError):
                os.kill(runner, signal.SIGCONT)

    for sig in FORWARDED:
        if signal.getsignal(sig) is not signal.SIG_IGN:  # `nohup`, `&`: stays ignored
            signal.signal(sig, forward)
    signal.signal(signal.SIGTSTP, suspend)
    signal.signal(signal.SIGCONT, resume)
    os.closerange(3, status)
    os.closerange(status + 1, _fd_limit())
    code: int | None = None
    buffer = b""
    while code is None:
        try:
            data = os.read(status, 256)
        except OSError:
            data = b""
        if not data:
            break
        buffer += data
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, _, value = line.partition(b" ")
            if word == b"pid":
                runner = int(value)
                for signum in pending:
                    forward(signum, None)
            elif word == b"gone":  # reaped by the keeper: its pid is no longer its own
                runner = -1
            elif word == b"exit":
                code = int(value.split()[0])
                if not value.endswith(b"detached"):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(keeper, 0)
    _report_cpu("waiter")
    if code is None:  # the keeper died before the runner: it stops (KeeperLost)
        if runner > 0:
            _wait_gone(runner)
        elif runner == 0:  # not even its pid came: it is in the keeper's group
            with contextlib.suppress(OSError):
                os.killpg(keeper, signal.SIGTERM)
        os._exit(1)
    if code < 0 and -code in forwarded and -code in STOPS:
        # The stop the user asked for, come before the runner had set its
        # handlers (it does so before it takes any item): not a crash. The
        # exit code of a stop by that signal once the run has begun.
        _say_stopped_early(-code)
        os._exit(128 - code)
    if code < 0:  # died by a signal: so do we, as a shell reports it
        _say_runner_killed(runner, -code)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP keep theirs
            signal.signal(-code, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
            os.kill(os.getpid(), -code)
        os._exit(128 - code)
    os._exit(code)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _say_stopped_early(signum: int) -> None:
    line = (
        f"statequeue: stopped by {_signal_name(signum)} before the run began; no item was taken\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, line.encode())


def _say_runner_killed(runner: int, signum: int) -> None:
    """One line for a runner killed by a signal (kill -9 of its own pid, the
    OOM killer): the waiter dies by the same signal, which a shell reports
    only as a code; the line says what became of the run."""
    name = _signal_name(signum)
    who = f" (pid {runner})" if runner > 0 else ""
    line = (
        f"statequeue: the run's runner{who} was killed by {name}; its keeper stopped "
        "what it had started, and the next run recovers the items it held\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, line.encode())


def _wait_gone(pid: int) -> None:
    """Wait for ``pid`` (not our child) to end: the runner stopping after
    its keeper died, so the shell gets its prompt back when the run is over."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already (or no pidfd here: then we do not wait)
        return
    try:
        while not readable(fd, None):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def report_runner_cpu() -> None:
    """Append the runner's own CPU seconds to $STATEQUEUE_BENCH_CPU (if set)."""
    _report_cpu("runner")


def _report_cpu(role: str) -> None:
    append_cpu(os.environ.get(kp.CPU_APPEND_ENV, ""), role)


def _fd_limit() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 1 << 16)
    except (OSError, ValueError):
        return 1024


def _prctl(option: int, value: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    result: int = libc.prctl(option, value, 0, 0, 0)
    if result != 0:
        raise OSError(ctypes.get_errno(), "prctl failed")
    return result
