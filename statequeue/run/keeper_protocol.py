"""The protocol between the runner and its keeper (keeper_process.py): its
constants, and the keeper's end of the socket (``Inbox``), where requests
come with the fds that ride on them.

Standard library only: under ``python -I -S`` it is imported from its own folder.
"""

from __future__ import annotations

import marshal
import signal
import socket
import struct

TYPE_CHECKING = False  # not typing's: the keeper starts under -I -S (see keeper_os.suppress)
if TYPE_CHECKING:
    from typing import Any

SOCKET_FD = 3  # where the keeper finds its end of the socket
STATUS_FD = 4  # guard mode: where the runner's wait status goes (to the waiter, guard.py)
GUARD = "--guard"  # argv: QUEUE --guard RUNNER_PID WAITER_PID
RUNNER_TOKEN = 0  # guard mode: the token of the runner itself (the runner's own count from 1)
WAITER_GONE = signal.SIGUSR1  # guard mode: our parent (the waiter) died (PR_SET_PDEATHSIG)

# runner -> keeper: a header, then a marshal payload; fds ride on the header.
HEADER = struct.Struct("<II")  # payload length, number of fds sent
SPAWN, SIGNAL, GOODBYE, DEADLINE, ENVIRON, WORKER, ASSIGN = 1, 2, 3, 4, 5, 6, 7
LIVENESS, HOLD = 8, 9  # guard mode: the runner's liveness lock; a claim to keep at its end
CUT = 10  # an attempt stopped or timed out: kill what is left of its item
NOTE = 11  # where to note the leftovers held for after the run (core/leftover_note.py)
# keeper -> runner: fixed-size replies.
REPLY = struct.Struct("<Bqq")  # kind, token, value
FAILED, EXITED, LINGERING, STARTED = 2, 3, 4, 5
REPLY_FD, NO_ITEM = 3, -1  # a persistent worker's reply pipe; its item between two

CPU_REPORT_ENV = "STATEQUEUE_BENCH_KEEPER_CPU"
CPU_APPEND_ENV = "STATEQUEUE_BENCH_CPU"  # each process of a run appends "ROLE SECONDS"
MAX_FDS = 8
LOST = -1  # in the queue of received fds: some of the batch before it were lost


class Inbox:
    """What came on the keeper's socket and is not handled yet: the bytes of
    requests, and the fds that rode on them (LOST where some were lost)."""

    __slots__ = ("data", "fds")

    def __init__(self) -> None:
        self.data = bytearray()
        self.fds: list[int] = []

    def read(self, sock: socket.socket) -> bool:
        """One read of ``sock``, bytes and fds; False at its end (or on an error)."""
        try:
            data, ancdata, flags, _ = sock.recvmsg(
                65536, socket.CMSG_SPACE(MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
            )
        except OSError:
            data, ancdata, flags = b"", [], 0
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(raw) - len(raw) % 4
                self.fds += struct.unpack(f"{usable // 4}i", raw[:usable])
        if flags & socket.MSG_CTRUNC:
            # Out of fds: some of this batch were lost, so its request fails.
            # (A read returns the fds of one sendmsg at most: one request's.)
            self.fds.append(LOST)
        self.data += data
        return bool(data)

    def next(self) -> tuple[tuple[Any, ...], list[int]] | None:
        """The next request whole, with its fds; None until all of it came."""
        if len(self.data) < HEADER.size:
            return None
        size, nfds = HEADER.unpack_from(self.data)
        if len(self.data) < HEADER.size + size:
            return None
        request = marshal.loads(bytes(self.data[HEADER.size : HEADER.size + size]))
        del self.data[: HEADER.size + size]
        return request, self.take_fds(nfds)

    def take_fds(self, count: int) -> list[int]:
        """The next request's ``count`` fds, in the order they came; ending
        with LOST if some of them were lost."""
        batch = self.fds[:count]
        if LOST in batch:
            batch = batch[: batch.index(LOST) + 1]
        del self.fds[: len(batch)]
        if len(batch) < count and batch[-1:] != [LOST]:
            batch.append(LOST)  # cannot happen: a request's fds come with its first byte
        return batch
