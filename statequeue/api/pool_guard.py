"""Promise 4 for ``statequeue.map(..., processes=True)``: the pool's workers
die with the program, and each item's claim is held by the worker running it.

Workers. The pool's workers are forked by multiprocessing's forkserver, a
child of the program that exits when the program dies (end of file on its
"alive" pipe). Each worker, before its first task, asks the kernel for
SIGKILL when its parent (the forkserver) dies: ``PR_SET_PDEATHSIG``, which no
busy or hung ``fn`` can delay. It then checks that the chain holds, i.e. its
parent is still the forkserver and the forkserver is still the program's
child; if the program died before the signal was armed, the worker kills
itself. As a second line, should the forkserver outlive the program (a
process the program forked without exec keeps its pipe open), a thread
waits on a pidfd of the program and kills the worker when it ends.

Claims. A claim (an OFD lock in the journal store, a claim-lock file on a
PostgreSQL host) lasts while any fd to its open file description is open.
The program lends each task's claim fds to the worker that runs it: the
worker fetches them over a unix socket (SCM_RIGHTS) before it calls ``fn``
and closes them after, so a claim the program lets go (it died, or gave the
item back on Ctrl-C) stays held until that worker, and any process ``fn``
started that inherited the fds, is gone. The lender keeps no copy of its
own: a task that never ran leaves nothing open.

A dead worker. When a worker dies, the executor fails every task in
flight with BrokenProcessPool and terminates (SIGTERM) the other workers.
Each lent task also carries the write end of a pipe of its own; every
process holding the claim fds (the worker, its sentinel, what ``fn``
started with them) holds it too, so end of file on the read end says that
the item's processes are gone: ``call`` waits for it before it says the
pool broke, and only then may the item be counted or given back. The
worker that fetched a task's fds is known (SO_PEERCRED); it died on its own
(its ``fn`` crashed it, or the OOM killer) unless it ended by the
executor's SIGTERM, or by the SIGKILL that follows it for a worker that
outlives a short grace (``pool_workers``): ``PoolBroken.crashed`` says so.

Descendants. Each worker has a sentinel (``pool_sentinel``) that, when the
worker dies, kills every process ``fn`` started (found by an environment
mark, whatever fds they closed) while it holds the item's claim fds too.

Not covered: a process ``fn`` starts with an environment of its own that
does not inherit the fds either; a detached process left by an ``fn`` that
returned (it goes on, as after a normal end of ``run``, but does not hold
the claim); systems without ``prctl`` (not Linux), where the pool runs
without these guards.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import secrets
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing.util import Finalize
from typing import TYPE_CHECKING, Any

from statequeue.api import pool_sentinel
from statequeue.api.pool_semaphores import unlink_once_open
from statequeue.api.pool_workers import Workers, end_idle, shut_down
from statequeue.core.errors import PoolBroken
from statequeue.core.process_state import stat_fields

if TYPE_CHECKING:
    from statequeue.api.pool_sentinel import Sentinel
    from statequeue.core.models import Claim

PR_SET_PDEATHSIG = 1
SUPPORTED = sys.platform == "linux"
"""Whether workers can be guarded (prctl and SO_PEERCRED are Linux's)."""
_KEY = struct.Struct("<Q")
_PEERCRED = struct.Struct("3i")  # pid, uid, gid
_MAX_FDS = 8
_FETCH_TIMEOUT = 30.0
_GONE_WAIT = 60.0
"""Seconds a broken task waits for its item's processes to end (milliseconds, as a rule)."""
_sentinel: Sentinel | None = None
"""In a worker: its sentinel (``pool_sentinel``)."""


class ProcessPool:
    """The process pool of one ``map`` call: ``call(fn, claim)`` runs
    ``fn(claim.item)`` in a worker that holds the claim while it runs."""

    def __init__(
        self, executor: Executor, lender: ClaimLender | None, workers: Workers | None = None
    ) -> None:
        self._executor = executor
        self._lender = lender
        self._workers = Workers([]) if workers is None else workers

    def call(self, fn: Callable[[str], Any], claim: Claim) -> Any:
        """The result of ``fn(claim.item)``; PoolBroken if a worker died (once
        the item's processes are gone, where the pool is guarded)."""
        # lazy: start-up time (multiprocessing; only a map with processes=True gets here)
        from concurrent.futures.process import BrokenProcessPool

        lender = self._lender
        if lender is None:
            try:
                return self._executor.submit(fn, claim.item).result()
            except BrokenProcessPool as exc:
                self._workers.end_broken()
                raise PoolBroken() from exc
        loan = lender.lend(claim.inherit_fds)
        try:
            future = self._executor.submit(run_holding, fn, claim.item, lender.address, loan.key)
            return future.result()
        except BrokenProcessPool as exc:
            worker = lender.take_back(loan)
            # Workers that ignore the executor's SIGTERM would hold the item's
            # loan (and the executor's join) for as long as their fn runs.
            self._workers.end_broken()
            gone = loan.wait_gone(_GONE_WAIT)
            code = self._exit_code(worker) if gone else None
            killed = self._workers.killed(worker)
            raise PoolBroken(worker=worker, worker_exit=code, ended_by_pool=killed) from exc
        finally:
            # Before the claim is recorded or given back (which closes its
            # fds): a worker that has not fetched them yet never will.
            lender.take_back(loan)
            loan.close()

    def stop(self) -> None:
        """End the workers now (SIGTERM, a grace, SIGKILL): the calls in flight
        break, and their items are given back once their processes are gone."""
        self._workers.stop()

    def _exit_code(self, worker: int | None) -> int | None:
        """How worker ``worker`` of the broken pool ended (-signal, or its exit
        code); None if unknown. Read once the executor's manager thread has
        ended: it terminates the other workers and joins them all (and reading
        a worker's status in two threads at once loses it)."""
        if worker is None:
            return None
        # Python has no public call for these; where they are missing, nothing is known.
        manager = getattr(self._executor, "_executor_manager_thread", None)
        if isinstance(manager, threading.Thread):
            manager.join(_GONE_WAIT)
            if manager.is_alive():
                return None
        processes = getattr(self._executor, "_processes", None)
        process = processes.get(worker) if isinstance(processes, dict) else None
        code = getattr(process, "exitcode", None)
        return code if isinstance(code, int) else None


@contextmanager
def process_pool(jobs: int) -> Iterator[ProcessPool]:
    """A pool of ``jobs`` worker processes, guarded where the platform allows."""
    # Not fork: a forked worker would inherit the queue's open files and
    # locks (a claim lock held by a worker outlives this process).
    method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    # Guarded only under a forkserver: its one thread forks every worker, so
    # a worker's parent-death signal fires when the forkserver ends (with
    # this process), never when one of our threads does.
    lender = ClaimLender() if SUPPORTED and method == "forkserver" else None
    try:
        if lender is None:
            executor = ProcessPoolExecutor(max_workers=jobs, mp_context=context)
        else:
            executor = ProcessPoolExecutor(
                max_workers=jobs,
                mp_context=context,
                initializer=guard_worker,
                initargs=(os.getpid(),),
            )
        _start_workers(executor)
        workers = Workers.of(executor)
        if lender is not None:  # Linux, forkserver: no semaphore name outlives a kill -9
            unlink_once_open(executor)
        try:
            yield ProcessPool(executor, lender, workers)
        except BaseException:
            shut_down(executor, workers)
            raise
        else:
            end_idle(executor, workers)
        finally:
            workers.close()
    finally:
        if lender is not None:
            lender.close()


def _start_workers(executor: ProcessPoolExecutor) -> None:
    """Start every worker now, before the executor's manager thread.

    Under forkserver or spawn, ``submit`` wakes the manager thread before it
    starts the worker for the task, so the thread may take its list of
    worker sentinels without the newest worker and never look again (no
    later wakeup comes while every slot waits on its task): that worker's
    death then goes unnoticed and the map hangs instead of stopping with
    PoolBroken. Started up front, as the executor does itself under fork,
    every worker is in the thread's first list. Python has no public call
    for this; where the private one is missing, workers start on demand."""
    launch = getattr(executor, "_launch_processes", None)
    if callable(launch):
        launch()


class ClaimLender:
    """Lends claim fds to the pool's workers: a listening unix socket in the
    abstract namespace and a thread that answers each worker's requests (on
    one connection per worker) with the fds lent under the key asked for, or
    nothing once the key is taken back."""

    def __init__(self) -> None:
        self.address = f"\0statequeue-pool-{os.getpid()}-{secrets.token_hex(8)}"
        self._lent: dict[int, tuple[int, ...]] = {}
        self._fetched: dict[int, int] = {}  # key -> pid of the worker that fetched its fds
        self._peers: dict[int, int] = {}  # connection fd -> the worker's pid
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(self.address)
        self._listener.listen(64)
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._serve, name="statequeue-pool-claims")
        self._thread.daemon = True
        self._thread.start()

    def lend(self, fds: Sequence[int]) -> Loan:
        """Make ``fds`` fetchable under the loan's key, until ``take_back``."""
        loan = Loan()
        with self._lock:
            self._lent[loan.key] = (*fds, loan.write_fd)
        return loan

    def take_back(self, loan: Loan) -> int | None:
        """After this, no worker gets the fds (the caller may close them). The
        pid of the worker that fetched them, if one did."""
        with self._lock:
            self._lent.pop(loan.key, None)
            return self._fetched.pop(loan.key, None)

    def close(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self) -> None:
        conns: dict[int, socket.socket] = {}
        try:
            while True:
                watched = [self._listener.fileno(), self._wake_r, *conns]
                ready = _readable(watched)
                if self._wake_r in ready:
                    return
                if self._listener.fileno() in ready:
                    self._accept(conns)
                for fd in ready:
                    conn = conns.get(fd)
                    if conn is not None and not self._answer(conn):
                        del conns[fd]
                        self._peers.pop(fd, None)
                        conn.close()
        finally:
            for conn in conns.values():
                conn.close()

    def _accept(self, conns: dict[int, socket.socket]) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self._listener.accept()
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            if _PEERCRED.unpack(creds)[1] != os.getuid():
                conn.close()  # another user's process: nothing to say
                return
            conn.settimeout(_FETCH_TIMEOUT)  # a worker that stops reading is dropped
            conns[conn.fileno()] = conn
            self._peers[conn.fileno()] = _PEERCRED.unpack(creds)[0]

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one request; False when the connection is done with."""
        try:
            raw = conn.recv(_KEY.size)
            if len(raw) != _KEY.size:
                return False
            # Sent under the lock: ``take_back`` waits, so the fds are still ours.
            key = _KEY.unpack(raw)[0]
            with self._lock:
                fds = self._lent.get(key)
                if fds is None:
                    conn.send(b"n")
                else:
                    self._fetched[key] = self._peers.get(conn.fileno(), 0)
                    socket.send_fds(conn, [b"y"], list(fds))
        except OSError:
            return False
        return True


class Loan:
    """One task's lent claim: its key, and a pipe whose write end is lent with
    the claim fds (end of file on the read end: every holder is gone)."""

    def __init__(self) -> None:
        self.key = secrets.randbits(63)  # unguessable: the socket is open to this user's processes
        self._read, self.write_fd = os.pipe2(os.O_CLOEXEC)

    def wait_gone(self, timeout: float) -> bool:
        """Let our write end go and wait until no process holds the claim's
        lent fds (False if some still does after ``timeout`` seconds)."""
        self._close_write()
        poller = select.poll()
        poller.register(self._read, select.POLLIN)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if poller.poll(left * 1000) and not os.read(self._read, 4096):
                return True  # end of file (nothing is ever written)
        return False

    def close(self) -> None:
        self._close_write()
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def _close_write(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


_link: dict[str, socket.socket] = {}
"""In a worker: its connection to the lender (one pool per worker)."""


def fetch(address: str, key: int) -> list[int] | None:
    """In a worker: the fds lent under ``key`` (None if taken back), inheritable,
    so a process ``fn`` starts with them keeps the claim while it lives."""
    conn = _link.get(address)
    if conn is None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn.settimeout(_FETCH_TIMEOUT)
        conn.connect(address)
        _link[address] = conn
    try:
        conn.send(_KEY.pack(key))
        answer, fds, _, _ = socket.recv_fds(conn, 1, _MAX_FDS)
    except OSError:
        del _link[address]
        conn.close()
        raise
    if answer != b"y":
        for fd in fds:
            os.close(fd)
        return None
    for fd in fds:
        os.set_inheritable(fd, True)
    return fds


class ClaimGivenBack(RuntimeError):
    """The program took the claim back before this worker started the item."""


def run_holding(fn: Callable[[str], Any], item: str, address: str, key: int) -> Any:
    """The task a worker runs: ``fn(item)`` while holding the item's claim."""
    fds = fetch(address, key)
    if fds is None:
        raise ClaimGivenBack(f"the claim of {item!r} was given back before it started")
    if _sentinel is not None:
        _sentinel.hold(fds)
    try:
        return fn(item)
    finally:
        for fd in fds:
            os.close(fd)
        if _sentinel is not None:
            _sentinel.drop()


def guard_worker(program: int) -> None:
    """A worker's initializer: die with the program, and have a sentinel kill
    what ``fn`` leaves running when we die (see the module docstring)."""
    global _sentinel
    watch = _pidfd(program)
    # Checked after arming: had the forkserver or the program died before,
    # the forkserver would no longer be our parent, or the program its.
    if not _arm(signal.SIGKILL) or _parent_of(os.getppid()) != program:
        _die()
    _sentinel = pool_sentinel.start(_arm)  # while this process has one thread
    # A normal exit (the pool shut down) is no reason to kill what fn left.
    Finalize(None, _sentinel.bye, exitpriority=0)
    if watch is not None:
        threading.Thread(target=_watch, args=(watch,), daemon=True).start()


def _arm(signum: int) -> bool:
    """Ask for ``signum`` when this process's parent dies."""
    try:
        import ctypes  # lazy: an optional module (some builds lack it): then no guard

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0)
    except (ImportError, OSError, AttributeError):
        return False


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (None where the kernel has none); opened before the
    chain is checked, so it names the program if the check passes."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _parent_of(pid: int) -> int:
    fields = stat_fields(pid)
    return int(fields[1]) if fields else -1


def _watch(pidfd: int) -> None:
    _readable([pidfd])  # readable once the program has exited
    _die()


def _readable(fds: list[int]) -> list[int]:
    """The fds of ``fds`` ready to read, waiting until one is. poll, not
    select: a program may hold fds past select's FD_SETSIZE (1024)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll()]


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
