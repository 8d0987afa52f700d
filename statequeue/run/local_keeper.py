"""The runner's own keeper, in the guarded shape (guard.py): the runner starts
each child itself.

The same rules as the keeper process (keeper_process.py, whose state and
logic this reuses), kept in the runner: each child is posix_spawned in its own
session with its claim fds at high numbers; the runner is a subreaper, so the
orphans of its children are reparented to it; an item's claim is held (a copy
of its fds) until no process of the item is left. A child's exit wakes the
runner's one loop through SIGCHLD: one wakeup per item, where the keeper
process cost three (the request, the exit, the report).

If the runner dies, the guard (its parent and the keeper of the run) adopts
everything this held and kills it, holding the runner's liveness lock until
none is left. At a normal end, ``close`` hands the claims of items whose
detached leftovers still run to the guard, which holds each until they end.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

from statequeue.core import child_exits, lease_clock
from statequeue.core.errors import KeeperLost
from statequeue.run import keeper_process as kp
from statequeue.run.guard import GuardLink
from statequeue.run.keeper import Keeper, readable

_WAIT_STEP = 0.05  # seconds between looks while waiting for one child's exit
CUT_WAIT = 5.0  # seconds the end of a run waits for a stopped item's leftovers to die


class _State(kp.KeeperProcess):
    """The keeper's bookkeeping, answering the runner in-process."""

    def __init__(self, queue: str, owner: LocalKeeper) -> None:
        super().__init__(None, queue)
        self.owner = owner

    def reply(self, kind: int, token: int, value: int) -> None:
        if kind == kp.FAILED:
            self.owner.failed[token] = value
        elif kind == kp.STARTED:
            self.owner.pids[token] = value

    def report(self, exits: list[tuple[int, int]]) -> None:
        self.owner.exits.update(exits)

    def attribute(self, children: list[int]) -> dict[int, frozenset[int]]:
        # A child this process started for itself (a compaction) is no item's.
        return super().attribute([pid for pid in children if not child_exits.expected(pid)])

    def reaped_other(self, pid: int, status: int) -> None:
        # Not an item's leader: an adopted orphan, or a child some other code
        # of this process started (a compaction child): its owner may ask.
        child_exits.record(pid, os.waitstatus_to_exitcode(status))


class LocalKeeper(Keeper):
    """``Keeper``'s interface, with the children started by this process."""

    in_process = True

    def __init__(self, queue: str, *, environ: Mapping[str, str], guard: GuardLink) -> None:
        # Not Keeper.__init__: no process to start.
        self._guard = guard
        self._state = _State(queue, self)
        self._state.environ = dict(environ)
        self.failed: dict[int, int] = {}
        self.exits: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self._tokens = kp.RUNNER_TOKEN
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._previous = signal.signal(signal.SIGCHLD, lambda signum, frame: self._poke())
        self.pid = os.getpid()

    def fileno(self) -> int:
        return self._wake_r

    def _poke(self) -> None:
        try:  # noqa: SIM105  # not contextlib.suppress: this runs at every child's exit
            os.write(self._wake_w, b"c")
        except OSError:  # full: a wakeup is pending anyway
            pass

    def spawn(
        self,
        *,
        item_id: int,
        argv: list[str],
        env: dict[str, str],
        streams: Sequence[int],
        claim_fds: Sequence[int],
    ) -> int:
        request = (kp.SPAWN, self._next(), item_id, argv, env, int(len(streams) > 2))
        return self._launch(request, streams, claim_fds)

    def spawn_worker(self, *, argv: list[str], env: dict[str, str], streams: Sequence[int]) -> int:
        return self._launch((kp.WORKER, self._next(), kp.NO_ITEM, argv, env, 1), streams, ())

    def _next(self) -> int:
        self._tokens += 1
        return self._tokens

    def _launch(
        self, request: tuple[Any, ...], streams: Sequence[int], claim_fds: Sequence[int]
    ) -> int:
        """Start the child of ``request``; a failure is reported as the keeper
        process reports it (``failed``, and a wakeup of the loop)."""
        token: int = request[1]
        if GuardLink.lost:
            raise KeeperLost()
        try:
            claims = [os.dup(fd) for fd in claim_fds]  # ours, while a process of the item lives
        except OSError as exc:
            self.failed[token] = exc.errno or errno.EMFILE
            self._poke()
            return token
        try:
            self._state.launch(request, list(streams), claims)
        except OSError as exc:
            for fd in claims:
                os.close(fd)
            self.failed[token] = exc.errno or errno.EIO
            self._poke()
        return token

    def assign(self, token: int, item_id: int, claim_fds: Sequence[int]) -> None:
        self._state.assign(token, item_id, [os.dup(fd) for fd in claim_fds])

    def signal(self, token: int, signum: int) -> None:
        self._state.signal(token, signum)

    def cut(self, item_id: int) -> None:
        self._state.cut_item(item_id)

    def deadline(self, token: int, at: float) -> None:
        # Stores with leases run in the older shape (their keeper process
        # fences a frozen runner); a deadline here is enforced by ``tend``.
        self._state.handle((kp.DEADLINE, token, float(at)), [])

    def receive(self) -> None:
        """Take in what happened: children's exits (SIGCHLD woke the loop),
        and the claims that came free. KeeperLost if the guard died."""
        try:  # noqa: SIM105  # not contextlib.suppress: this runs at every child's exit
            os.read(self._wake_r, 4096)
        except BlockingIOError:
            pass
        if GuardLink.lost:
            raise KeeperLost()
        state = self._state
        exits = state.reap()
        if state.childless:  # nothing of any item is left: every finished one is free
            if state.finished:
                state.release(set(state.finished))
        else:
            state.settle_if_childless()
        self.exits.update(exits)
        state.settle(time.monotonic())

    def tend(self) -> None:
        """Between wakeups: enforce deadlines, look again for leftovers."""
        state = self._state
        if state.deadlines:
            state.enforce(lease_clock.now())
        elif state.cut:
            state.kill_fenced()
        if state.finished:
            state.settle(time.monotonic())

    def _kill_everything(self) -> None:
        """As the keeper does after the runner's death: kill every process
        left of every item -- leaders' groups, then each child (orphans it
        adopted included) as it appears -- until none is left, holding the
        claims meanwhile."""
        state = self._state
        while True:
            state.kill_all()
            state.reap()
            if not state.has_children():
                return
            with contextlib.suppress(OSError):
                readable(self._wake_r, kp.FENCE_POLL)
                os.read(self._wake_r, 4096)

    def _end_cut(self) -> None:
        """Before the run ends: kill what is left of the items whose attempt
        was stopped, as it is reparented here, until none is left (SIGKILL:
        a moment; at most CUT_WAIT, then the guard holds their claims)."""
        state = self._state
        end = time.monotonic() + CUT_WAIT
        while state.cut and time.monotonic() < end:
            state.kill_fenced()
            with contextlib.suppress(TimeoutError):
                self.receive_within(kp.FENCE_POLL)
            state.cost_until = state.idle_until = 0.0  # look now, not at the scan's pace
            state.settle(time.monotonic())

    def receive_within(self, timeout: float) -> None:
        if not readable(self._wake_r, timeout):
            raise TimeoutError()
        self.receive()

    def wait_exit(self, token: int) -> int:
        while token not in self.exits and token not in self.failed:
            with contextlib.suppress(TimeoutError):
                self.receive_within(_WAIT_STEP)
            if token not in self.exits and token not in self.failed:
                self.receive()  # a SIGCHLD may have come before the pipe was read
        if self.failed.pop(token, None) is not None:
            return -1
        return self.exits.pop(token)

    def close(self) -> None:
        """End the run: the claims of items a detached leftover may still run
        for go to the guard, which holds each until no process of it is left.
        Without a guard (it died), nobody would: everything is killed first."""
        state = self._state
        if GuardLink.lost:
            self._kill_everything()
        else:
            with contextlib.suppress(KeeperLost):
                self.receive()
                self._end_cut()
            state.settle_if_childless()
            self._guard.close({item: fds for item, fds in state.held.items()})
        state.release(set(state.held))
        signal.signal(signal.SIGCHLD, self._previous)
        os.close(self._wake_r)
        os.close(self._wake_w)
