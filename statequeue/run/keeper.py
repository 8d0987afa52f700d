"""The runner's side of the keeper (keeper_process.py), the parent of every child.

The runner never forks: it asks the keeper to start each child, passing the
child's stdin, stdout and stderr and the item's claim fds with SCM_RIGHTS,
and goes on without waiting. A failed spawn (its errno) and every exit come
back as messages on the same socket, which the runner's selector watches.
Signals to a child's process group go through the keeper too: it alone knows
whether the group's leader is still unreaped, i.e. whether the group id still
names that group.

The keeper holds every item's claim until no process of the item is left. If
the runner dies (kill -9), it kills whatever is left of the items; after a
normal end (``close``) it lets detached leftovers finish, holding their claims.
"""

from __future__ import annotations

import array
import contextlib
import marshal
import os
import select
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from statequeue.core.errors import KeeperLost
from statequeue.run import keeper_process as kp

_PROGRAM = str(Path(kp.__file__).resolve())
_LONGEST_POLL = 86400.0  # seconds: one poll() of ``readable``


def readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` is readable (or at its end) within ``timeout`` seconds
    (None: wait for it), or within a day when ``timeout`` is longer (its
    callers wait again until their end). poll, not select: select refuses an
    fd past 1023, which a library process with many files open holds."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if timeout is None:
        return bool(poller.poll(None))
    # poll() takes a C int of milliseconds, 24.8 days at most: a persistent
    # worker's end is waited for with half of --grace, which may be longer.
    return bool(poller.poll(min(max(0.0, timeout), _LONGEST_POLL) * 1000))


class Keeper:
    """A running keeper process and the socket to it."""

    in_process = False
    """Whether the children are this process's own (LocalKeeper, the guarded shape)."""

    lost = False
    """Whether the keeper process ended unexpectedly (KeeperLost): orphans.py."""

    def __init__(self, queue: str, *, environ: Mapping[str, str] | None = None) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", _PROGRAM, queue],
                dict(os.environ),
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    # Not our stderr: a keeper that stays for a detached
                    # leftover would hold `statequeue run 2>&1 | cat` open.
                    (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), kp.SOCKET_FD),
                ],
                setsid=True,  # terminal signals must not reach it
            )
        except BaseException:
            mine.close()
            raise
        finally:
            theirs.close()
        self._sock = mine
        self._inbox = bytearray()
        self.failed: dict[int, int] = {}  # token -> errno of its failed spawn
        self.exits: dict[int, int] = {}  # token -> exit code (or -signal)
        self.pids: dict[int, int] = {}  # token -> pid, of persistent workers (STARTED)
        self._lingering = False
        self._tokens = 0
        if environ is not None:
            # Once per run: each spawn then sends only its item's variables.
            self._send((kp.ENVIRON, dict(environ)), [])

    def fileno(self) -> int:
        return self._sock.fileno()

    def spawn(
        self,
        *,
        item_id: int,
        argv: list[str],
        env: dict[str, str],
        streams: Sequence[int],
        claim_fds: Sequence[int],
    ) -> int:
        """Have ``argv`` started in a new session with ``streams`` (stdout,
        stderr and optionally stdin) and the claim fds, its environment the
        run's (``environ``) plus ``env``; returns its token. If the spawn
        fails, ``failed`` gets its errno; KeeperLost if it is gone."""
        self._tokens += 1
        token = self._tokens
        has_stdin = len(streams) > 2
        request = (kp.SPAWN, token, item_id, argv, env, int(has_stdin))
        self._send(request, [*streams, *claim_fds])
        return token

    def spawn_worker(self, *, argv: list[str], env: dict[str, str], streams: Sequence[int]) -> int:
        """Have a persistent worker started: as ``spawn``, with ``streams``
        its stdout, stderr, stdin and reply pipe (at REPLY_FD in the worker)
        and no item yet; its pid comes back in ``pids``."""
        self._tokens += 1
        token = self._tokens
        self._send((kp.WORKER, token, kp.NO_ITEM, argv, env, 1), streams)
        return token

    def assign(self, token: int, item_id: int, claim_fds: Sequence[int]) -> None:
        """Make ``token``'s worker the process of ``item_id`` (NO_ITEM: of
        none), the keeper holding ``claim_fds`` while any process of it lives."""
        self._send((kp.ASSIGN, token, item_id), claim_fds)

    def signal(self, token: int, signum: int) -> None:
        """Signal the process group of ``token``'s child, if it is not reaped yet."""
        self._send((kp.SIGNAL, token, int(signum)), [])

    def cut(self, item_id: int) -> None:
        """``item_id``'s attempt was stopped or timed out, and its child has
        ended: have every process left of it killed (its claim held until
        none is left)."""
        self._send((kp.CUT, 0, item_id), [])

    def deadline(self, token: int, at: float) -> None:
        """Have the keeper SIGKILL ``token``'s process group at the monotonic
        time ``at`` (a lease's end), unless a later deadline replaces it."""
        self._send((kp.DEADLINE, token, float(at)), [])

    def receive(self) -> None:
        """Read what the keeper sent (blocks until something arrives)."""
        try:
            data = self._sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self.lost = True
            raise KeeperLost()
        self._inbox += data
        size = kp.REPLY.size
        end = len(self._inbox) - len(self._inbox) % size
        for kind, token, value in kp.REPLY.iter_unpack(self._inbox[:end]):
            if kind == kp.EXITED:
                self.exits[token] = value
            elif kind == kp.FAILED:
                self.failed[token] = value
            elif kind == kp.STARTED:
                self.pids[token] = value
            else:
                self._lingering = True
        del self._inbox[:end]

    def tend(self) -> None:
        """Between wakeups of the runner: nothing here (the keeper process
        keeps its own time); the runner's own keeper looks again."""

    def receive_within(self, timeout: float) -> None:
        """``receive``, waiting at most ``timeout`` seconds (TimeoutError)."""
        ready = readable(self._sock.fileno(), timeout)
        if not ready:
            raise TimeoutError()
        self.receive()

    def wait_exit(self, token: int) -> int:
        """The exit code of ``token``'s child, waiting for it to end (-1 if it
        never started)."""
        while token not in self.exits and token not in self.failed:
            self.receive()
        if self.failed.pop(token, None) is not None:
            return -1
        return self.exits.pop(token)

    def _send(self, request: tuple[Any, ...], fds: Sequence[int]) -> None:
        try:
            send_request(self._sock, request, fds)
        except BrokenPipeError:
            self.lost = True
            raise KeeperLost() from None

    def close(self) -> None:
        """End the run. The keeper exits at once if no process of an item is
        left (then it is waited for); else it stays, holding those items'
        claims, until the last one has exited (then it is not waited for: in a
        long-lived library process it stays a zombie until that one exits)."""
        with contextlib.suppress(OSError, KeeperLost):
            self._send((kp.GOODBYE, 0, 0), [])
            while not self._lingering:
                self.receive()
            self._sock.close()
            return
        self._sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def send_request(sock: socket.socket, request: tuple[Any, ...], fds: Sequence[int]) -> None:
    """One request to a keeper process: a header, a marshal payload, and
    ``fds`` riding on it with SCM_RIGHTS (keeper_process.py reads it)."""
    payload = marshal.dumps(request)
    head = kp.HEADER.pack(len(payload), len(fds))
    rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    sent = sock.sendmsg([head, payload], rights if fds else [])
    whole = head + payload
    if sent < len(whole):
        sock.sendall(whole[sent:])
