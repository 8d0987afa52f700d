"""The sentinel of one pool worker: when the worker dies (killed with the
program, or on its own), it kills every process ``fn`` left running, holding
the item's claim until they are gone, as the keeper does for ``run``.

Each worker forks its sentinel as it starts (while it has one thread) and
marks its environment with ``STATEQUEUE_POOL_WORKER``, which every program
``fn`` starts inherits, and keeps through ``setsid``, closed fds and double
forks. Around each call of ``fn`` the worker hands the sentinel the item's
claim fds (SCM_RIGHTS) and takes them back after. The sentinel learns of the
worker's death from its parent-death signal and from the end of its socket;
unless the worker said goodbye (a normal exit), it then SIGKILLs every
process carrying the mark, again until none is left, and only then exits,
closing the claim fds it held. Processes that drop the mark (a program
started with an environment of its own) are not found.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import signal
import socket
import time
from collections.abc import Callable, Sequence

MARK_ENV = "STATEQUEUE_POOL_WORKER"
_HOLD, _DROP, _BYE = b"h", b"d", b"b"
_MAX_FDS = 8
_ROUND_PAUSE = 0.01
"""Between two kill rounds: a killed process may take a moment to exit."""


class Sentinel:
    """The worker's end of the socket to its sentinel. A dead sentinel is not
    the item's problem: messages it cannot get are dropped."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def hold(self, fds: Sequence[int]) -> None:
        with contextlib.suppress(OSError):
            socket.send_fds(self._sock, [_HOLD], list(fds))

    def drop(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(_DROP)

    def bye(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.send(_BYE)


def start(arm: Callable[[int], bool]) -> Sentinel:
    """Fork this worker's sentinel; ``arm(signum)`` asks for ``signum`` when
    the caller's parent dies. Call it while the process has one thread."""
    worker = os.getpid()
    mark = f"{worker}-{secrets.token_hex(8)}"
    os.environ[MARK_ENV] = mark
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the sentinel: never returns
        code = 0
        try:
            mine.close()
            _serve(theirs, worker, mark, arm)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    return Sentinel(mine)


def _serve(sock: socket.socket, worker: int, mark: str, arm: Callable[[int], bool]) -> None:
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # a Ctrl-C is for the program, not for us
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGUSR1, lambda signum, frame: None)
    _close_all_but(sock.fileno(), wake_r, wake_w)  # the worker's pipes are none of ours
    held: list[int] = []
    # Checked after arming: a worker that died before is no longer our parent.
    alive = arm(signal.SIGUSR1) and os.getppid() == worker
    poller = select.poll()  # not select: fds past FD_SETSIZE are possible
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while alive:
        ready = [fd for fd, _ in poller.poll()]
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 64)
            if os.getppid() != worker:
                break  # messages left unread keep their fds in flight: held too
        if sock.fileno() in ready:
            message, fds, _, _ = socket.recv_fds(sock, 16, _MAX_FDS)
            if not message:
                break  # end of file: the worker is gone
            if message == _BYE:
                return  # a normal end: what fn left behind may go on
            for fd in held:
                os.close(fd)
            held = fds if message == _HOLD else []
    kill_marked(mark)  # the claim fds in ``held`` close as we exit, after this


def kill_marked(mark: str) -> None:
    """SIGKILL every process whose environment carries ``mark``, until none is left."""
    needle = f"{MARK_ENV}={mark}".encode()
    me = os.getpid()
    while found := [pid for pid in _pids() if pid != me and needle in _environ(pid)]:
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(_ROUND_PAUSE)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _environ(pid: int) -> list[bytes]:
    """The environment ``pid`` started with (empty for a zombie or another user's)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _close_all_but(*keep: int) -> None:
    low = 3
    for fd in sorted(keep):
        if fd >= low:
            os.closerange(low, fd)
            low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))
