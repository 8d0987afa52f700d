"""The keeper's state and rules: its children, the claims it holds for them,
and the runner's requests (the protocol, its constants and the reading of
requests off the socket, is keeper_protocol.py).

The keeper process (keeper_process.py, its loop) runs it; so does the runner's
own keeper in the guarded shape (local_keeper.py), in-process. Standard
library only: under ``python -I -S`` it is imported from its own folder.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import time

TYPE_CHECKING = False  # not typing's: the keeper starts under -I -S (see keeper_os.suppress)
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING or __package__:
    from statequeue.core import lease_clock
    from statequeue.core.leftover_note import LeftoverNote
    from statequeue.run import keeper_children, keeper_os
    from statequeue.run import keeper_protocol as wire
    from statequeue.run.keeper_os import children, claim_target, suppress
else:  # a script under -I -S: keeper_process.py put our folders on sys.path
    import keeper_children
    import keeper_os
    import keeper_protocol as wire
    import lease_clock
    from keeper_os import children, claim_target, suppress
    from leftover_note import LeftoverNote

FENCE_POLL = 0.05  # seconds between looks for adopted descendants of a fenced item
# Longest wait while a deadline is pending: poll's timeout runs on the
# monotonic clock, which stops during a suspend; after a resume, a deadline
# past on the lease clock is seen within this long.
DEADLINE_POLL = 0.1
SCAN_COST_SHARE = 20  # a /proc scan at most every 20x its own duration
FORCE_SCAN_AT = 32  # finished items awaiting release that force a scan (fds)
MAX_IDLE_GAP = 1.0  # seconds between scans while only a detached leftover lives
UNOPENED = -1  # KeeperProcess.children_fd before a look (keeper_children.py)


class Leader:
    """A child the keeper started for the runner: one attempt of one item."""

    __slots__ = ("exec_fd", "item", "pid", "stopping", "token")

    def __init__(self, token: int, item: int, pid: int, exec_fd: int = -1) -> None:
        self.token = token
        self.item = item
        self.pid = pid
        self.stopping = False
        self.exec_fd = exec_fd  # a worker's: where a failed exec's errno comes (keeper_os)


class KeeperProcess:
    """The keeper's state: its children, and the claims it holds for them."""

    def __init__(self, sock: socket.socket | None, queue: str) -> None:
        self.sock = sock
        self.queue = queue
        self.leaders: dict[int, Leader] = {}  # pid -> leader
        self.by_token: dict[int, Leader] = {}
        self.held: dict[int, list[int]] = {}  # item id -> claim fds held for it
        self.finished: set[int] = set()  # held items whose leader is reaped
        self.owners: dict[int, frozenset[int]] = {}  # orphan pid -> items it may be of
        self.inbox = wire.Inbox()  # requests (and their fds) not handled yet
        self.ending = False  # the runner died: kill everything left
        self.goodbye = False  # the run ended: wait for what is left
        self.cost_until = 0.0  # no /proc scan before (a share of the last one's cost)
        self.idle_until = 0.0  # nor before (while only a detached leftover lives)
        self.idle_gap = 0.0
        self.claim_targets = [claim_target(i) for i in range(wire.MAX_FDS)]
        # token -> lease-clock time to kill its item: the end of its lease as
        # the runner last confirmed it, enforced here even if the runner is
        # frozen (SIGSTOP, a paused VM) and cannot fence its children itself.
        self.deadlines: dict[int, float] = {}
        self.deadline_items: dict[int, int] = {}  # token -> its item (the leader may be reaped)
        self.fencing: set[int] = set()  # held items whose deadline came: kill all of them
        # Held items whose attempt was stopped (a signal, --timeout): kill
        # what is left of them, but only processes surely theirs -- an
        # orphan that may be another item's is not killed for this one.
        self.cut: set[int] = set()
        self.programs: dict[str, str] = {}  # name -> its path on PATH, found once
        self.environ: dict[str, str] = dict(os.environ)  # until the runner sends its own
        self.liveness: list[int] = []  # guard mode: the runner's liveness lock, held to the end
        self.status_fd = -1  # guard mode: where the runner's exit code goes (the waiter)
        self.runner = 0  # guard mode: the runner's pid (never killed for its own end)
        self.childless = False  # the last ``reap`` found no child at all
        self.children_fd = UNOPENED  # our /proc children file (own_children)
        self.runner_code: int | None = None  # guard mode: the runner's exit code, once reaped
        self.note: LeftoverNote | None = None  # what the claims held after the run wait for

    # -- requests -------------------------------------------------------------

    def receive(self) -> None:
        assert self.sock is not None  # a keeper process always has its socket
        if not self.inbox.read(self.sock):
            self.ending = True
            return
        while not self.goodbye and (request := self.inbox.next()) is not None:
            self.handle(*request)

    def handle(self, request: tuple[Any, ...], fds: list[int]) -> None:
        if request[0] == wire.SIGNAL:
            return self.signal(request[1], request[2])
        if request[0] == wire.ENVIRON:
            self.environ = request[1]
            return
        if request[0] == wire.DEADLINE:
            token = request[1]
            leader = self.by_token.get(token)
            if leader is not None:
                self.deadline_items[token] = leader.item
            if request[2] == float("inf"):  # recorded for good: nothing to fence
                self.deadline_items.pop(token, None)
                self.deadlines.pop(token, None)
            elif token in self.deadline_items:  # else long settled: no deadline to keep
                self.deadlines[token] = request[2]
            return
        if request[0] == wire.ASSIGN:
            return self.assign(request[1], request[2], fds)
        if request[0] == wire.LIVENESS:  # held until every process of the run is gone
            self.liveness += [fd for fd in fds if fd >= 0]
            self.queue = request[2]  # the name adopted orphans carry (STATEQUEUE_QUEUE)
            return
        if request[0] == wire.CUT:
            return self.cut_item(request[2])
        if request[0] == wire.NOTE:  # its folder (lost: no note), and its name there
            if fds and fds[0] >= 0:
                self.note = LeftoverNote(fds[0], request[2])
            return
        if request[0] == wire.HOLD:  # the run ended while a leftover of this item may live
            item = request[2]
            self.hold(item, [fd for fd in fds if fd >= 0])
            self.finished.add(item)
            # An orphan adopted before this message was read (the runner reaped
            # first) was attributed without this item: it may be its own.
            self.owners = {pid: of | {item} for pid, of in self.owners.items()}
            return
        if request[0] == wire.GOODBYE:
            self.goodbye = True
            if self.has_children():
                self.reply(wire.LINGERING, 0, 0)  # so the runner does not wait for us
            return
        token = request[1]
        try:
            if wire.LOST in fds:
                raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
            self.spawn(request, fds)
        except OSError as exc:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
            self.reply(wire.FAILED, token, exc.errno or errno.EIO)
        # A started child is not reported: the runner does not wait for it (a
        # reply per spawn cost a wakeup of the runner per item).

    def spawn(self, request: tuple[Any, ...], fds: list[int]) -> None:
        """Start a requested child; our copies of its streams are closed (the
        child has its own), its claim fds are held."""
        nstreams = 2 + request[5] + (request[0] == wire.WORKER)
        self.launch(request, fds[:nstreams], fds[nstreams:])
        for fd in fds[:nstreams]:
            os.close(fd)

    def launch(self, request: tuple[Any, ...], streams: list[int], claims: list[int]) -> int:
        """posix_spawn the child of ``request`` with ``streams`` (stdout,
        stderr, then stdin and a worker's reply pipe if any) and ``claims`` at
        high fds; the caller keeps ``streams``, ``claims`` are held here from
        now on. OSError if it cannot start (the caller closes the fds)."""
        kind, token, item, argv, item_env, has_stdin = request
        env = self.environ | item_env
        actions: list[tuple[Any, ...]] = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]
        if has_stdin:
            actions[0] = (os.POSIX_SPAWN_DUP2, streams[2], 0)
        actions += [(os.POSIX_SPAWN_DUP2, streams[0], 1), (os.POSIX_SPAWN_DUP2, streams[1], 2)]
        if kind == wire.WORKER:  # a worker's reply pipe: at REPLY_FD
            actions.append((os.POSIX_SPAWN_DUP2, streams[-1], wire.REPLY_FD))
        actions += [
            (os.POSIX_SPAWN_DUP2, fd, target)
            for fd, target in zip(claims, self.claim_targets, strict=False)
        ]
        exec_fd = -1
        if kind == wire.WORKER:
            pid, exec_fd = keeper_os.spawn_bound(self.programs, argv, env, actions)
        else:
            pid = self.start(argv, env, actions)
        leader = Leader(token, item, pid, exec_fd)
        self.leaders[pid] = self.by_token[token] = leader
        self.hold(item, claims)
        if kind == wire.WORKER:  # the runner watches its memory and shows its pid
            self.reply(wire.STARTED, token, pid)
        return pid

    def assign(self, token: int, item: int, claims: list[int]) -> None:
        """``token``'s worker (and what it starts) is now ``item``'s: its claim
        is held here; the item it leaves is released as a finished one is."""
        leader = self.by_token.get(token)
        if leader is None or wire.LOST in claims:  # it ended (the runner settles the item)
            for fd in claims:
                if fd >= 0:
                    os.close(fd)
            return
        old, leader.item = leader.item, item
        # Its lease deadline was the old item's: the runner sends the new one.
        self.deadlines.pop(token, None)
        self.deadline_items.pop(token, None)
        self.hold(item, claims)
        if old != wire.NO_ITEM and old != item and old in self.held:
            self.finished.add(old)
            self.idle_gap, self.idle_until = 0.0, 0.0

    def hold(self, item: int, claims: list[int]) -> None:
        """Keep ``item``'s claim fds while a process of it lives."""
        if item != wire.NO_ITEM:
            self.held.setdefault(item, []).extend(claims)
            self.finished.discard(item)

    def start(self, argv: list[str], env: dict[str, str], actions: list[Any]) -> int:
        """posix_spawn ``argv`` (keeper_os.py: its program found on PATH once
        per run; a persistent worker, which dies with the keeper, is ``spawn_bound``'s)."""
        return keeper_os.spawn_found(self.programs, argv, env, actions)

    def signal(self, token: int, signum: int) -> None:
        leader = self.by_token.get(token)
        if leader is None:  # already reaped: its group id may be reused, so no signal
            return
        leader.stopping = True
        # Unreaped, the leader keeps its pid, so its group id names its group.
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(leader.pid, signum)

    def cut_item(self, item: int) -> None:
        """``item``'s attempt was stopped (by a signal, or its --timeout) and
        its leader has ended: kill its detached leftovers (a new session
        escapes the group), as more are reparented, until none is left; the
        claim is held meanwhile, and released as a finished item's is."""
        if item in self.held:
            self.cut.add(item)
            self.idle_gap, self.idle_until = 0.0, 0.0
            self.kill_fenced()

    def reply(self, kind: int, token: int, value: int) -> None:
        assert self.sock is not None  # a keeper process always has its socket
        with suppress(OSError):  # the runner is gone: nobody to tell
            self.sock.sendall(wire.REPLY.pack(kind, token, value))

    # -- children ---------------------------------------------------------------

    def reap(self) -> list[tuple[int, int]]:
        """Collect every exited child; a stopped item's group is killed before
        its leader is reaped (while the group id still names it). Returns the
        leaders' (token, exit code), for ``report`` once claims are settled."""
        exits: list[tuple[int, int]] = []
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                self.childless = True  # as of now: saves the runner's keeper a look
                return exits
            self.childless = False
            if info is None:
                return exits
            pid = info.si_pid
            leader = self.leaders.pop(pid, None)
            if leader is not None and (leader.stopping or self.ending):
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            if leader is None:
                self.reaped_other(pid, status)
            self.owners.pop(pid, None)
            self.idle_gap, self.idle_until = 0.0, 0.0  # something ended: look again
            if leader is not None:
                # Its deadline stays until the item is released: a detached
                # leftover of it may still need fencing.
                del self.by_token[leader.token]
                if leader.item != wire.NO_ITEM:
                    self.finished.add(leader.item)
                failed = keeper_os.exec_error(leader.exec_fd) if leader.exec_fd >= 0 else 0
                if failed:  # a worker whose program could not start: a failed spawn
                    self.reply(wire.FAILED, leader.token, failed)
                else:
                    exits.append((leader.token, os.waitstatus_to_exitcode(status)))

    def tell_runner_code(self, how: str = "") -> None:
        """Guard mode: give the waiter the runner's exit code (once)."""
        if self.status_fd >= 0 and self.runner_code is not None:
            tell_waiter(self.status_fd, f"exit {self.runner_code}{how}\n")
            os.close(self.status_fd)
            self.status_fd = -1

    def reaped_other(self, pid: int, status: int) -> None:
        """A child that was no leader was reaped: an adopted orphan (or, in
        the runner's own keeper, a child some other code started)."""

    def report(self, exits: list[tuple[int, int]]) -> None:
        """Tell the runner of ``exits`` in one message (one wakeup of the
        runner for every child that ended since the last look)."""
        if self.status_fd >= 0:  # guard mode: the runner itself ended
            for token, code in exits:
                if token == wire.RUNNER_TOKEN:
                    self.runner_code = code
                    # Reaped: its pid may be reused, so no more signals to it.
                    tell_waiter(self.status_fd, "gone\n")
            exits = [(t, c) for t, c in exits if t != wire.RUNNER_TOKEN]
            if self.runner_code is not None and self.goodbye and self.has_children():
                # Detached leftovers of settled items may run on: the waiter
                # (the shell) must not wait for them, nor for us.
                self.tell_runner_code(" detached")
        if exits and self.sock is not None:
            with suppress(OSError):  # the runner is gone: nobody to tell
                self.sock.sendall(
                    b"".join(wire.REPLY.pack(wire.EXITED, t, code) for t, code in exits)
                )

    def settle(self, now: float) -> None:
        """Release the claims of finished items no process is left of."""
        if not self.finished:
            return
        if now < max(self.cost_until, self.idle_until) and len(self.finished) < FORCE_SCAN_AT:
            if not self.has_children():
                self.release(set(self.finished))
            return
        # One look at our children tells both whether any is left and which:
        # a persistent worker's last item comes here once per item.
        found = self.children_timed(now)
        if not found:
            self.release(set(self.finished))
            return
        leaders = self.leaders
        alive = {leader.item for leader in leaders.values()}
        if wire.RUNNER_TOKEN in self.by_token:
            # Guard mode, the runner not reaped yet: the leftovers of the items
            # it handed over (HOLD) may still be its children, not ours.
            alive |= self.finished
        if all(pid in leaders for pid in found):  # the usual: no orphan, nothing to attribute
            self.owners = {}
        else:
            for owners in self.attribute(found).values():
                alive |= owners
        free = self.finished - alive
        self.release(free)
        # Nothing came free: a detached leftover lives on. Look less and less
        # often (up to once a second) until another child exits.
        self.idle_gap = 0.0 if free else min(MAX_IDLE_GAP, max(0.01, 2 * self.idle_gap))
        self.idle_until = now + self.idle_gap

    def settle_if_childless(self) -> None:
        if self.finished and not self.has_children():
            self.release(set(self.finished))

    def has_children(self) -> bool:
        try:
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return True

    def release(self, items: set[int]) -> None:
        for item in items:
            for fd in self.held.pop(item, ()):
                os.close(fd)
            self.finished.discard(item)
            self.fencing.discard(item)
            self.cut.discard(item)
        if not self.held and self.children_fd >= 0:
            # Nothing to look for until an item is held again: the file is
            # not kept open past the claims it serves (a library process).
            os.close(self.children_fd)
            self.children_fd = UNOPENED
        if self.deadline_items and items:
            for token in [t for t, item in self.deadline_items.items() if item in items]:
                del self.deadline_items[token]
                self.deadlines.pop(token, None)

    def attribute(self, children: list[int]) -> dict[int, frozenset[int]]:
        """Which items each child that is not a leader may belong to."""
        owners = {}
        everyone = frozenset(self.held)
        for pid in children:
            if pid in self.leaders:
                continue
            known = self.owners.get(pid)
            if known is None:
                item = self.item_of(pid)
                known = frozenset((item,)) if item in self.held else everyone
            owners[pid] = known
        self.owners = owners
        return owners

    def item_of(self, pid: int) -> int:
        """The STATEQUEUE_ID in ``pid``'s environment, or -1."""
        return keeper_children.item_of(pid, self.queue)

    def children_timed(self, now: float) -> list[int]:
        began = time.monotonic()
        found = self.own_children()
        self.cost_until = now + SCAN_COST_SHARE * (time.monotonic() - began)
        return found

    def own_children(self) -> list[int]:
        """Our children (zombies included): one pread of our /proc children
        file, held open from the first look (keeper_children.py)."""
        if self.children_fd == UNOPENED:
            # Opened by the process that made this object: it is never forked.
            self.children_fd = keeper_children.open_children()
        return keeper_children.read_children(self.children_fd)

    def kill_all(self) -> None:
        """The runner is gone: kill what is left of every item."""
        for leader in self.leaders.values():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(leader.pid, signal.SIGKILL)
        if not self.has_children():
            return
        for pid in children():
            if pid == self.runner:  # ending (its socket closed): its own exit code counts
                continue
            # An unreaped child keeps its pid, and so does the group it leads
            # (an item's, adopted after the runner's death): neither signal
            # can hit another process.
            with suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)

    def enforce(self, now: float) -> None:
        """Fence the items whose deadline (lease clock) has come: their
        leader's group now, their adopted descendants in ``kill_fenced``."""
        for token in [t for t, at in self.deadlines.items() if at <= now]:
            del self.deadlines[token]
            self.fencing.add(self.deadline_items[token])
            self.signal(token, signal.SIGKILL)
        self.kill_fenced()

    def kill_fenced(self) -> None:
        """SIGKILL every child of the keeper that may be of a fenced item (or
        is surely of a cut one), and the process group it leads: as after a
        kill -9 of the runner, but for these items only. The dead ones' own
        children are reparented to the keeper in turn, and killed on a later
        look (see ``timeout``)."""
        if not (self.fencing or self.cut) or not self.has_children():
            return
        for pid, owners in self.attribute(children()).items():
            if not (owners & self.fencing or (owners and owners <= self.cut)):
                continue
            # An unreaped child keeps its pid, and so does the group it leads:
            # neither signal can hit another process.
            with suppress(ProcessLookupError, PermissionError):
                if os.getpgid(pid) == pid:
                    os.killpg(pid, signal.SIGKILL)
                os.kill(pid, signal.SIGKILL)

    def timeout(self, now: float) -> float | None:
        if self.ending or self.fencing or self.cut:
            return FENCE_POLL  # children may appear without a SIGCHLD (reparented)
        wait = None
        if self.finished:
            wait = max(0.001, max(self.cost_until, self.idle_until) - now)
        if self.deadlines:
            first = max(0.0, min(min(self.deadlines.values()) - lease_clock.now(), DEADLINE_POLL))
            wait = first if wait is None else min(wait, first)
        return wait


def tell_waiter(fd: int, line: str) -> None:
    """A line for the waiter (guard.py): the runner's pid, then its exit code."""
    with suppress(OSError):  # the waiter is gone: nobody to tell
        os.write(fd, line.encode("ascii"))
