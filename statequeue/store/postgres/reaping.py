"""Recovery in the PostgreSQL store: expired leases, and the same-host shortcut.

An item is interrupted when its lease has expired on the database clock,
whoever held it and whatever became of its runner's row. One reaper at a
time looks (``REAP_TURN``), and every item is re-checked on its locked row.

On one host, waiting for a dead runner's leases is needless: an item whose
runner has this host name and boot id, whose pid is gone, and whose claim
lock file is free is recovered at once. The claim lock (``ClaimLocks``) is a
flock on a file per token in this host's scratch folder, passed to the child:
the keeper holds its copy until no process of the item is left, so a free
lock means nothing of the attempt still runs. Each runner also holds a
file of its own (``runner-ID.lock``) from its registration on, before any
claim of it commits: a claim with no file of its own (its runner died
between the commit and the making of the file, or it is an in-process
runner's, below) goes by it.

An expired lease is no proof either, where the claim lock file is here: a
lock still held on this host means a process of the attempt lives (a frozen
runner's keeper not yet done fencing, a child it could not kill), so the
item waits; a reaper on another host cannot see the lock, and there the
keeper's fencing deadline is what protects it (promise 4).

A runner that runs its items in its own process and hands no claim's lock
to another (``RunnerInfo.in_process``: the library's ``work()`` loops) makes
no file per claim: its own file, locked as long as it lives, stands for each
of its claims (``ClaimLocks.take``). A reaper on this host then finds no
token file and asks the runner's file, as for a claim whose file was never
made, and the runner's own store knows its claims (``_covered``). Per item
that saves a create, a lock, a close and an unlink (or a rename) in a folder
every loop of the host writes to: at 16 loops, measured, each such metadata
change also made the database's WAL flushes on the same disk slower (the
file system's journal commits them together).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import time
from collections.abc import Collection
from typing import TYPE_CHECKING

from statequeue.core.errors import UnsafeFolder
from statequeue.core.fileio import open_own
from statequeue.core.models import OnInterrupted
from statequeue.store import transitions
from statequeue.store.postgres import check_marks, lock_holders, queries, sql, writes
from statequeue.store.postgres.connection import Connection
from statequeue.store.postgres.schema import LOCK_CLASS

if TYPE_CHECKING:
    from statequeue.core.views import RecoveryReport
    from statequeue.store.journal.folder import QueueFolder

Rule = tuple[OnInterrupted, int, Collection[int] | None]
"""How to settle an interrupted item: the policy, --max-crashes, and the
items to look at (None: all; a user's cancel or retry names its own)."""

SUBFOLDER = "claims"
REAP_EVERY = 1.0
"""Seconds between two reaps of one queue, by any runner."""
REAP_LOCK = LOCK_CLASS + 1
"""First key of the advisory lock a reaper's turn holds (the second: the queue name's hash)."""


class ClaimLocks:
    """Per-token lock files in the ``claims`` subfolder of ``folder`` (None:
    no shortcut on this host), opened relative to it, never through a link:
    the subfolder is checked as a queue's is (folder.py), so no other user
    can plant a file there, or hold a lock on one, to hang this runner."""

    def __init__(self, folder: QueueFolder | None) -> None:
        self._folder = folder
        self._fds: dict[int, int] = {}
        # runner id -> the fd of its own lock file, held while it is registered.
        self._runners: dict[str, int] = {}
        # Tokens held by an in-process runner of this store: no file of their
        # own, its runner's file stands for each (``take``).
        self._covered: set[int] = set()

    def _claims(self) -> int:
        assert self._folder is not None
        return self._folder.subfolder(SUBFOLDER, create=True)

    def hold_runner(self, runner_id: str) -> None:
        """Lock ``runner_id``'s own file, before any claim of it commits.

        A claim whose token file was never made (the runner died between the
        commit and ``take``, or its runner runs its items in process: ``take``)
        is then still known here: its runner's file, free once the runner is
        gone, stands for it (``_held``). Without it such a claim waited for
        its lease. Not fsynced: after a crash of the host the boot id differs,
        and no shortcut is taken."""
        if self._folder is None or runner_id in self._runners or not _runner_named(runner_id):
            return
        fd = self._folder.open_file(_runner_file(runner_id), os.O_RDWR | os.O_CREAT, sub=SUBFOLDER)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh id's file: nobody has it
        except OSError:
            os.close(fd)  # someone does: no shortcut for this runner's claims
            return
        self._runners[runner_id] = fd

    def let_runner_go(self, runner_id: str) -> None:
        """Unlock and remove ``runner_id``'s file (unregistered: it claims no more)."""
        fd = self._runners.pop(runner_id, None)
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(_runner_file(runner_id), dir_fd=self._claims())
        os.close(fd)

    def forget_runner(self, runner_id: str) -> None:
        """Remove the file of ``runner_id``, a dead runner of this host, if nothing holds it."""
        if self._folder is None or not _runner_named(runner_id):
            return
        if self._held_file(_runner_file(runner_id)) is False:
            with contextlib.suppress(OSError):
                os.unlink(_runner_file(runner_id), dir_fd=self._claims())

    def take(self, token: int, runner_id: str | None = None) -> tuple[int, ...]:
        """Lock ``token``'s file; the fds a child must inherit (none without a folder).

        ``runner_id``: the claim's runner runs it in its own process and hands
        its lock to no other (``RunnerInfo.in_process``). Where this store
        holds that runner's file, no file is made: the runner's file, locked
        until the runner's process is gone (and any fork of it that kept the
        descriptor), stands for the claim, for every reaper on this host."""
        if self._folder is None:
            return ()
        if runner_id is not None and runner_id in self._runners:
            self._covered.add(token)
            return ()
        fd = self._folder.open_file(f"{token}.lock", os.O_RDWR | os.O_CREAT, sub=SUBFOLDER)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a fresh token's file: nobody else has it
        self._fds[token] = fd
        return (fd,)

    def let_go(self, token: int | None, *, remove: bool) -> None:
        """Close this process's copy; ``remove`` the file once the attempt is settled."""
        if token in self._covered:
            self._covered.discard(token)  # no file: its runner's stands for it
            return
        fd = self._fds.pop(token or 0, None)
        if fd is not None:
            os.close(fd)
        if remove and self._folder is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{token}.lock", dir_fd=self._claims())

    def is_free(self, token: int, runner_id: str | None = None) -> bool:
        """True when the file exists and no process holds it (a missing file
        proves nothing); without a token file, ``runner_id``'s file decides."""
        return self._held(token, runner_id) is False

    def is_held(self, token: int, runner_id: str | None = None) -> bool:
        """True when ``token``'s file is here and some process holds its lock
        (without a token file: ``runner_id``'s file, held by its live runner)."""
        return self._held(token, runner_id) is True

    def _held(self, token: int, runner_id: str | None) -> bool | None:
        """Whether a process holds ``token``'s lock; None when there is no file
        (the claim was not taken on this host). A claim with no file of its own
        (committed, its file not yet made, or never made: ``take``) is its runner's: that
        runner's file decides, when it has one here. A lock that cannot be
        tested counts as held: never reap what might still run. A file at
        the name that is not our own (a link, a FIFO, another user's file,
        planted while the folder was open to others) is no claim of ours: it
        counts as not held, whoever locks it, so that nobody can keep an item
        from recovery by holding a lock on such a file."""
        if self._folder is None:
            return None
        if token in self._covered:
            return True  # this store's in-process runner holds it (``take``)
        held = self._held_file(f"{token}.lock")
        if held is None and runner_id is not None and _runner_named(runner_id):
            if runner_id in self._runners:
                # This store's own runner, alive: every claim it holds has its
                # file, or is covered, by now (the store's calls take turns), so one without
                # is a claim whose answer it never heard (a commit whose
                # acknowledgement was lost): nothing runs it. Its own file,
                # held by this very runner, would keep it forever.
                return False
            return self._held_file(_runner_file(runner_id))
        return held

    def _held_file(self, name: str) -> bool | None:
        try:
            # open_own, as every open in a checked folder: our own regular file, or refused.
            fd = open_own(name, os.O_RDWR, self._claims())
        except UnsafeFolder:
            return False  # not ours: no holder of our claim (``_held``); recovery removes it
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):
                return False  # a link or a folder at the name: not ours either
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def close(self) -> None:
        self._covered.clear()
        for token in list(self._fds):
            self.let_go(token, remove=False)
        for runner_id in list(self._runners):
            self.let_runner_go(runner_id)


_RUNNER_ID = re.compile(r"[0-9a-f]{1,64}")


def _runner_named(runner_id: str) -> bool:
    """Whether ``runner_id`` (read from the database) is safe as part of a file name."""
    return _RUNNER_ID.fullmatch(runner_id) is not None


def _runner_file(runner_id: str) -> str:
    return f"runner-{runner_id}.lock"


def reap_same_host(
    conn: Connection,
    queue: str,
    *,
    host: str,
    boot: str,
    locks: ClaimLocks,
    rule: Rule,
    report: RecoveryReport,
) -> None:
    """Recover at once the items (and rows) of dead runners of this host and boot."""
    if not boot:
        return  # without a boot id a pid proves nothing
    # Each pid is looked up once per call (/proc): a runner's items share its pid.
    gone: dict[int, bool] = {}
    dead = set(stop_dead_runners_here(conn, queue, host=host, boot=boot, gone=gone))
    found = conn.execute(sql.SAME_HOST, {"q": queue, "host": host, "boot": boot}).fetchall()
    only = rule[2]
    for item_id, token, pid, runner_id in found:
        if only is not None and int(item_id) not in only:
            continue
        if not _gone(int(pid), gone):
            continue
        dead.add(str(runner_id))
        if not locks.is_free(int(token), str(runner_id)):
            continue
        with conn.transaction():
            row = conn.execute(sql.ONE_HELD, {"q": queue, "id": item_id, "token": token})
            held = row.fetchone()
            if held is not None:
                recover_row(conn, queue, held, rule, report)
        locks.let_go(int(token), remove=True)
    if only is None:  # each of their claims was looked at: their own files are done with
        for runner_id in dead:
            locks.forget_runner(runner_id)


def stop_dead_runners_here(
    conn: Connection, queue: str, *, host: str, boot: str, gone: dict[int, bool] | None = None
) -> list[str]:
    """Mark stopped the rows of this host's runners whose pid is gone (their
    items are left to ``reap_same_host`` and the leases); their ids. ``gone``
    keeps what each pid looked up was found to be, for the caller's next looks."""
    if not boot:
        return []
    key = {"q": queue, "host": host, "boot": boot}
    stopped: list[str] = []
    seen: dict[int, bool] = {} if gone is None else gone
    for rid, pid in conn.execute(sql.SAME_HOST_RUNNERS, key).fetchall():
        if _gone(int(pid), seen):
            stopped.append(str(rid))
            with conn.transaction():
                marked = conn.execute(
                    "UPDATE statequeue.runners SET stopped_at = %s WHERE queue = %s"
                    " AND runner_id = %s AND stopped_at IS NULL",
                    (time.time(), queue, rid),
                ).rowcount
                # Only the process whose update marked it records it lost:
                # two that looked at once (a `status` beside a runner's
                # reaper) wrote the event twice.
                if marked:
                    lost = transitions.runner_lost_record(
                        rid, at=writes.now(), by=os.getpid(), how="pid"
                    )
                    writes.event(conn, queue, lost)
    return stopped


def _gone(pid: int, seen: dict[int, bool]) -> bool:
    """``queries.pid_gone``, looked up once per pid in ``seen``."""
    found = seen.get(pid)
    if found is None:
        found = seen[pid] = queries.pid_gone(pid)
    return found


REAP_LOCK_SAID_AFTER = 5.0
"""Seconds a reaper finds the queue's reap lock held, its turn due, before it says who holds it."""


class ReapWait:
    """Whether this store's reaper keeps finding the queue's reap lock held
    (a turn takes milliseconds: any role may take the lock and keep it), and
    the notice that says so, once per such wait."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.said = False
        self.notices: list[str] = []

    def clear(self) -> None:
        self.since, self.said = None, False

    def blocked(self, conn: Connection, queue: str) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
        if self.said or now - self.since < REAP_LOCK_SAID_AFTER:
            return
        key = lock_holders.key_of(conn, queue)
        who = lock_holders.holder(conn, REAP_LOCK, key)
        if who is None:
            return  # let go meanwhile (or a turn of another reaper)
        self.said = True
        self.notices.append(
            f"recovery of interrupted items in queue {queue!r} waits for its reap lock "
            f"(advisory lock {REAP_LOCK}, {key}), held for {now - self.since:.0f} s by {who}; "
            "the run goes on meanwhile"
        )

    def take(self) -> list[str]:
        notices, self.notices = self.notices, []
        return notices


def reap_expired(
    conn: Connection,
    queue: str,
    rule: Rule,
    report: RecoveryReport,
    locks: ClaimLocks,
    wait: ReapWait | None = None,
    own: Collection[str] = (),
) -> None:
    """If it is this store's turn, recover every item whose lease has expired,
    but for those a process of which still holds the claim lock on this host.
    Runners whose rows have expired are recorded lost, but for ``own`` (this
    store's: alive, as this call shows)."""
    settled: list[int] = []
    if conn.execute(sql.REAP_DUE, {"q": queue, "every": REAP_EVERY}).fetchone() is None:
        if wait is not None:
            wait.clear()  # another reaper had a turn: the lock is not kept
        return  # another reaper did it within REAP_EVERY (the turn below checks again)
    with conn.transaction():
        turn = conn.execute(
            sql.REAP_TURN, {"q": queue, "every": REAP_EVERY, "lock": REAP_LOCK}
        ).fetchone()
        if turn is None:
            if wait is not None:
                wait.blocked(conn, queue)
            return  # another reaper did it within REAP_EVERY, or holds the lock
        if wait is not None:
            wait.clear()
        gone = {"q": queue, "now": time.time(), "own": sorted(own)}
        for (rid,) in conn.execute(sql.LOST_RUNNERS, gone):
            lost = transitions.runner_lost_record(rid, at=writes.now(), by=os.getpid(), how="lease")
            writes.event(conn, queue, lost)
        only = rule[2]
        for *row, token, runner_id in conn.execute(sql.EXPIRED, {"q": queue}).fetchall():
            if only is not None and int(str(row[0])) not in only:
                continue
            if not locks.is_held(int(token), None if runner_id is None else str(runner_id)):
                recover_row(conn, queue, tuple(row), rule, report)
                settled.append(int(token))
    for token in settled:  # recovered (committed): its lock file is done with
        locks.let_go(token, remove=True)
    # The reaper's turn also folds the count deltas (every claim and finish
    # adds some): otherwise the first `status` after a long run pays for all.
    queries.roll_up_counts(conn, queue)


def recover_row(
    conn: Connection,
    queue: str,
    row: tuple[object, ...],
    rule: Rule,
    report: RecoveryReport,
) -> None:
    item_id, attempts, crashes = (int(str(v)) for v in row[:3])
    if row[3]:  # only its --verify check ran: no attempt, no crash (check_marks.py)
        check_marks.give_back_unchecked(conn, queue, item_id, attempts)
        report.retried.append(item_id)
        return
    policy, max_crashes, _ = rule
    target, bucket = writes.policy(policy, crashes + 1, max_crashes, report)
    writes.recover_one(conn, queue, item_id, attempts, crashes + 1, target, policy)
    bucket.append(item_id)
