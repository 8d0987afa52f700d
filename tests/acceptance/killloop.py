"""Kill-loop machinery: SIGKILL real `statequeue` processes at random moments.

Used by tests/acceptance/test_kill_loop.py (bounded runs in `make test`, a long
run under `make test-crash`) and by scripts/killloop.py (figures for notes).

How it counts. Each item runs a worker that appends ``start ITEM ATTEMPT PID``
to a log file (O_APPEND, one write) before its "work" (a short sleep) and
``end ITEM ATTEMPT PID`` as its very last action, where PID is its runner's
pid. From that log:

- re-runs: worker starts beyond the first, per item (an attempt that began
  again after a kill);
- duplicates: ``end`` lines beyond the first, per item (work completed twice);
- overlaps: an attempt that started while an earlier attempt of the same item
  was still alive (its ``end`` comes later in the log): promise 4.

Only processes started here are killed, by pid (and then their process group,
before they are reaped, to sweep helpers such as a --verify command). The
workers of ``statequeue run`` are in their own sessions and die with their
runner (the run's keeper kills them); in ``orphans`` mode the work runs in a background
subshell that outlives the runner on purpose (promise 4: "even when ... its
child lives on"). ``Harness.close`` kills and reaps every process started here,
then waits until no item's claim lock is held (no orphaned work is left).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent
STATEQUEUE = shutil.which("statequeue", path=str(BIN)) or "statequeue"

# The worker: $0 is the item; KILLLOOP_LOG and KILLLOOP_WORK come from the
# runner's environment. `echo ... >>` is one O_APPEND write.
# The run's pid (the one the loop started) is the grandparent of sh (sh,
# runner, keeper, then the waiter: run/guard.py), or its parent's parent
# with a PostgreSQL store (sh, keeper, runner): both are written, as
# "PARENT,GRANDPARENT" of sh's parent, and the line counts for either.
_WORK = (
    'read -r _ _ _ up1 _ < "/proc/$PPID/stat"; '
    'read -r _ _ _ up2 _ < "/proc/$up1/stat" 2>/dev/null; '
    'echo "start $0 $STATEQUEUE_ATTEMPT $up1,$up2" >> "$KILLLOOP_LOG"; '
    'sleep "$KILLLOOP_WORK"; '
    'echo "end $0 $STATEQUEUE_ATTEMPT $up1,$up2" >> "$KILLLOOP_LOG"'
)
# The same work in a background subshell, which may outlive `sh`; the keeper
# holds the item's claim until it has ended (or killed it with the runner).
_ORPHAN_WORK = "{ " + _WORK + "; } & wait"
# --verify: did an attempt of this item reach its last action?
_VERIFY = 'grep -q "^end $0 " "$KILLLOOP_LOG"'

POLL = 0.002  # seconds between checks while awaiting an event


def _ofd_claims_free(path: Path) -> bool:
    """True when no byte of the claims file is locked (OFD locks: one per claim)."""
    import struct

    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    try:
        probe = struct.pack("@hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)  # 0: to the end
        found = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
    finally:
        os.close(fd)
    return bool(struct.unpack("@hhqqi4x", found)[0] == fcntl.F_UNLCK)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(POLL)


# -- the worker log ------------------------------------------------------------


class WorkLog:
    """Reads the worker log incrementally and keeps what each item did."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""
        self._events = 0
        # item -> list of (kind, attempt, position in the log)
        self.events: dict[str, list[tuple[str, int, int]]] = {}
        self.by_pid: dict[tuple[str, int], int] = {}  # (kind, runner pid) -> lines
        self.starts = 0
        self.ends = 0
        self.malformed: list[str] = []

    def refresh(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        self._offset += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()  # an incomplete last line waits for its end
        for raw in lines:
            self._parse(raw.decode("utf-8", "replace"))

    def _parse(self, line: str) -> None:
        parts = line.split(" ")
        if len(parts) != 4 or parts[0] not in ("start", "end"):
            self.malformed.append(line)
            return
        kind, item, attempt = parts[0], parts[1], int(parts[2])
        self._events += 1
        self.events.setdefault(item, []).append((kind, attempt, self._events))
        for pid in {int(p) for p in parts[3].split(",") if p.isdigit()}:
            self.by_pid[kind, pid] = self.by_pid.get((kind, pid), 0) + 1
        if kind == "start":
            self.starts += 1
        else:
            self.ends += 1

    def count(self, kind: str, pid: int) -> int:
        """Lines of ``kind`` written by the work of runner ``pid`` so far."""
        return self.by_pid.get((kind, pid), 0)

    def ended_items(self) -> set[str]:
        return {i for i, evs in self.events.items() if any(k == "end" for k, _, _ in evs)}

    def analyse(self) -> dict[str, Any]:
        """Re-runs, duplicates, overlaps and reused attempt numbers, per item."""
        self.refresh()
        reruns = rerun_items = duplicates = duplicate_items = 0
        overlaps: list[str] = []
        reused: list[str] = []
        for item, evs in self.events.items():
            starts = [(a, pos) for k, a, pos in evs if k == "start"]
            ends = {a: pos for k, a, pos in evs if k == "end"}
            n_ends = sum(1 for k, _, _ in evs if k == "end")
            if len(starts) > 1:
                reruns += len(starts) - 1
                rerun_items += 1
            if n_ends > 1:
                duplicates += n_ends - 1
                duplicate_items += 1
            attempts = [a for a, _ in starts]
            if len(set(attempts)) != len(attempts) or n_ends != len(ends):
                reused.append(f"{item}: {evs}")
            for a, pos in starts:
                end = ends.get(a)
                if end is None:
                    continue
                later = [b for b, p in starts if pos < p < end]
                if later:
                    overlaps.append(f"{item}: attempt(s) {later} started while {a} ran: {evs}")
        return {
            "reruns": reruns,
            "rerun_items": rerun_items,
            "duplicates": duplicates,
            "duplicate_items": duplicate_items,
            "overlaps": overlaps,
            "reused_attempts": reused,
        }


# -- processes -------------------------------------------------------------------


class Proc:
    """One `statequeue` process started by the harness (in its own session)."""

    def __init__(
        self,
        role: str,
        argv: list[str],
        env: dict[str, str],
        *,
        stdout: Any,
        stderr: Any,
        out_path: Path | None = None,
    ) -> None:
        self.role = role
        self.argv = argv
        self.out_path = out_path
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        self.pid = self.popen.pid
        self.returncode: int | None = None
        self.killed = False
        # What ends this life: a deadline (monotonic), or the k-th line of a
        # kind ("start" or "end") from its work, then a delay.
        self.deadline: float | None = None
        self.after: tuple[str, int] | None = None
        self.jitter = 0.0
        self.at_launch: dict[str, int] = {}
        # enqueue only: the items offered, and which were acknowledged before.
        self.batch: list[str] = []
        self.batch_path: Path | None = None
        self.acked_before: frozenset[str] = frozenset()

    def alive(self) -> bool:
        if self.returncode is None and self.popen.poll() is not None:
            self.returncode = self.popen.returncode
        return self.returncode is None

    def kill(self) -> bool:
        """SIGKILL it by pid if it still runs; True when our signal ended it."""
        if not self.alive():
            return False
        os.kill(self.pid, signal.SIGKILL)
        # Not reaped yet, so the group id is still ours: sweep any helper it
        # started in its own group (a --verify command). Job children are in
        # their own sessions and die with it: the run's keeper kills them.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = self.popen.wait()
        self.killed = self.returncode == -signal.SIGKILL
        return self.killed

    def wait(self, timeout: float) -> int:
        self.returncode = self.popen.wait(timeout=timeout)
        return self.returncode


@dataclass
class Figures:
    """What a kill loop did and saw."""

    items: int = 0
    kills: int = 0
    run_kills: int = 0
    enqueue_kills: int = 0
    compact_kills: int = 0
    hook_kills: int = 0
    starts: int = 0
    reruns: int = 0
    rerun_items: int = 0
    duplicates: int = 0
    duplicate_items: int = 0
    overlaps: int = 0
    verified: int = 0
    torn_tails: int = 0
    acked_enqueues: int = 0
    processes: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self, label: str = "") -> str:
        kills = f"kills {self.kills} (run {self.run_kills}"
        if self.enqueue_kills or self.compact_kills or self.hook_kills:
            kills += (
                f", enqueue {self.enqueue_kills}, compact {self.compact_kills},"
                f" crash-hook {self.hook_kills}"
            )
        kills += ")"
        return (
            f"{label + ': ' if label else ''}items {self.items}, {kills}, "
            f"re-runs {self.reruns} ({self.rerun_items} items), "
            f"duplicates {self.duplicates} ({self.duplicate_items} items), "
            f"overlaps {self.overlaps}, verified {self.verified}, "
            f"torn tails repaired {self.torn_tails}, processes {self.processes}, "
            f"{self.seconds:.1f}s"
        )


# -- the harness -------------------------------------------------------------------


class Harness:
    """One queue, its worker log, and every process started against it."""

    def __init__(
        self,
        workdir: Path,
        *,
        home: Path | None = None,
        queue: str = "killloop",
        jobs: int = 1,
        work: float = 0.01,
        verify: bool = False,
        orphans: bool = False,
        seed: int | None = None,
        max_items: int = 1000,
        env: dict[str, str] | None = None,
        store: str = "",
        hosts: int = 0,
        lease: str = "",
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.home = home or workdir / "home"
        self.queue = queue
        self.jobs = jobs
        self.work = work
        self.verify = verify
        self.max_items = max_items  # how many new items the enqueue kills may add
        self.orphans = orphans
        self.seed = random.randrange(1 << 32) if seed is None else seed
        self.rng = random.Random(self.seed)
        self.log_path = workdir / "work.log"
        self.log_path.touch()
        self.log = WorkLog(self.log_path)
        self.env = dict(os.environ if env is None else env)
        self.env.update(
            STATEQUEUE_HOME=str(self.home),
            STATEQUEUE_QUEUE=queue,
            KILLLOOP_LOG=str(self.log_path),
            KILLLOOP_WORK=f"{work:.3f}",
            NO_COLOR="1",
            # Checkpoints every few records, so that kill -9 lands during and
            # around their writes, and every reopen must judge one.
            STATEQUEUE_CHECKPOINT_EVERY="25",
        )
        self.env.pop("STATEQUEUE_TEST_CRASH", None)
        if store:  # a PostgreSQL store: runners may play several hosts
            self.env["STATEQUEUE_STORE"] = store
        self.hosts = hosts
        self.lease = lease
        self._launched = 0
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        self.err_path = workdir / "stderr.log"
        self._err = open(self.err_path, "ab")  # noqa: SIM115  # closed in close()
        self.procs: list[Proc] = []  # not yet reaped
        self.figures = Figures()
        self.offered: list[str] = []  # every item ever given to enqueue
        self.acked: set[str] = set()  # items of enqueues that reported success
        self.started_at = time.monotonic()
        self._op = 0
        self._torn = 0  # torn tails repaired by open_check (in this process)

    # -- context ----------------------------------------------------------------

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill and reap everything still running; wait for orphaned work to end."""
        for proc in self.procs:
            proc.kill()
        self.procs.clear()
        with contextlib.suppress(AssertionError):
            self.wait_claims_free(timeout=10 + 2 * self.work)
        self._err.close()

    # -- plumbing -----------------------------------------------------------------

    def _spawn(
        self, role: str, args: list[str], *, env: dict[str, str] | None = None, out: bool = False
    ) -> Proc:
        out_path = None
        stdout: Any = subprocess.DEVNULL
        if out:
            self._op += 1
            out_path = self.workdir / f"out.{self._op}"
            stdout = open(out_path, "wb")  # noqa: SIM115  # closed just below
        try:
            proc = Proc(
                role,
                [STATEQUEUE, *args],
                env or self.env,
                stdout=stdout,
                stderr=self._err,
                out_path=out_path,
            )
        finally:
            if out:
                stdout.close()
        self.procs.append(proc)
        self.figures.processes += 1
        return proc

    def _forget(self, proc: Proc) -> None:
        with contextlib.suppress(ValueError):
            self.procs.remove(proc)

    def cli(self, *args: str, crash: str = "", timeout: float = 60) -> tuple[int, str]:
        """Run `statequeue ARGS` to completion; (exit code, stdout).

        ``crash`` ("KIND:K") sets the store's test-only hook, which SIGKILLs the
        process at its K-th operation of that kind.
        """
        env = dict(self.env, STATEQUEUE_TEST_CRASH=crash) if crash else None
        proc = self._spawn("cli", list(args), env=env, out=True)
        try:
            code = proc.wait(timeout)
        finally:
            proc.kill()
            self._forget(proc)
        assert proc.out_path is not None
        out = proc.out_path.read_text()
        proc.out_path.unlink()
        return code, out

    def status(self) -> dict[str, Any]:
        code, out = self.cli("status", "--json")
        assert code == 0, f"status exited {code}: {self.stderr_tail()}"
        data: dict[str, Any] = json.loads(out)
        return data

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = self.status()["counts"]
        return counts

    def stderr_tail(self, n: int = 4000) -> str:
        self._err.flush()
        return self.err_path.read_bytes()[-n:].decode("utf-8", "replace")

    def run_args(self, jobs: int | None = None) -> list[str]:
        jobs = self.jobs if jobs is None else jobs
        args = ["run", "--no-live", "--max-crashes", "1000000", "-j", str(jobs)]
        if self.verify:
            args += ["--verify", shlex.join(["sh", "-c", _VERIFY, "{}"])]
        if self.lease:
            args += ["--lease", self.lease]
        script = _ORPHAN_WORK if self.orphans else _WORK
        return [*args, "--", "sh", "-c", script, "{}"]

    def start_runner(self, jobs: int | None = None) -> Proc:
        self.log.refresh()
        env = None
        if self.hosts:  # each runner in turn plays the next host (STATEQUEUE_HOST)
            env = dict(self.env, STATEQUEUE_HOST=f"host{self._launched % self.hosts}")
        self._launched += 1
        proc = self._spawn("run", self.run_args(jobs), env=env)
        proc.at_launch = {k: self.log.count(k, proc.pid) for k in ("start", "end")}
        return proc

    # -- enqueue -------------------------------------------------------------------

    def new_items(self, n: int) -> list[str]:
        start = len(self.offered)
        items = [f"item-{i:06d}" for i in range(start, start + n)]
        self.offered.extend(items)
        return items

    def start_enqueue(self, items: list[str]) -> Proc:
        self._op += 1
        batch = self.workdir / f"batch.{self._op}"
        batch.write_text("".join(f"{i}\n" for i in items))
        proc = self._spawn("enqueue", ["enqueue", "--json", "--file", str(batch)], out=True)
        proc.batch, proc.batch_path = items, batch
        proc.acked_before = frozenset(self.acked)
        return proc

    def settle_enqueue(self, proc: Proc) -> None:
        """Account for a finished or killed enqueue."""
        assert proc.out_path is not None and proc.batch_path is not None
        out = proc.out_path.read_text()
        proc.out_path.unlink()
        proc.batch_path.unlink()
        if proc.killed:
            self.figures.enqueue_kills += 1
            # A line it printed before dying is an acknowledgement all the same.
            if not out.endswith("\n"):
                return
        else:
            assert proc.returncode == 0, f"enqueue exited {proc.returncode}: {self.stderr_tail()}"
        reply = json.loads(out)
        items = proc.batch
        assert reply["added"] + reply["skipped"] == len(items), reply
        # Dedupe, and nothing acknowledged lost: items acknowledged earlier are
        # all still known, so only the others may be added.
        fresh = set(items) - proc.acked_before
        assert reply["added"] <= len(fresh), f"{reply}: only {len(fresh)} could be new"
        self.acked.update(items)
        self.figures.acked_enqueues += 1

    def enqueue(self, n: int) -> list[str]:
        items = self.new_items(n)
        proc = self.start_enqueue(items)
        proc.wait(60)
        self._forget(proc)
        self.settle_enqueue(proc)
        return items

    # -- waiting -------------------------------------------------------------------

    def claims_free(self) -> bool:
        """True when no process holds an item's claim lock (no attempt is
        alive), nor a killed runner's keeper its liveness lock (it holds it
        until it has killed everything the runner left: run/guard.py). Only
        while no runner is alive."""
        if not _ofd_claims_free(self.home / self.queue / "claims.lock"):
            return False
        # The journal's claim files, or the PostgreSQL store's on this host.
        subs = (self.queue, f".postgres/{self.queue}")
        if not all(self._flocks_free(f) for f in subs):
            return False
        return self._flocks_free(self.queue, "runners")

    def _flocks_free(self, sub: str, kind: str = "claims") -> bool:
        folder = self.home / sub / kind
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return True
        for name in names:
            try:
                fd = os.open(folder / name, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            finally:
                os.close(fd)
        return True

    def wait_claims_free(self, timeout: float = 30) -> None:
        wait_for(self.claims_free, timeout, "every attempt's processes to end")

    # -- the kill loop -----------------------------------------------------------------

    def plan(self, proc: Proc, *, early: float = 0.2, max_starts: int = 4) -> None:
        """Pick the moment this runner dies: random, from launch or from its work."""
        rng = self.rng
        roll = rng.random()
        if roll < early:
            # Anywhere from start-up through registration, recovery, --verify
            # and its first items (start-up alone is ~0.2 s).
            proc.deadline = proc.started + rng.uniform(0.0, 0.4)
        elif roll < 0.7:
            # After its k-th child started, plus a random part of an item's
            # life: mid-work, between the child's exit and its record, ...
            proc.after = ("start", rng.randint(1, max_starts))
            proc.jitter = rng.uniform(0.0, 2.0 * self.work + 0.005)
        else:
            # Just after a child's last action: most often before its result
            # is recorded (the case a --verify hook exists for).
            proc.after = ("end", rng.randint(1, max_starts))
            proc.jitter = rng.uniform(0.0, 0.003)

    def _due(self, proc: Proc, now: float) -> bool:
        if proc.deadline is not None:
            return now >= proc.deadline
        if proc.after is not None:
            kind, k = proc.after
            if self.log.count(kind, proc.pid) - proc.at_launch[kind] >= k:
                proc.deadline = now + proc.jitter
                return proc.jitter == 0.0
        return False

    def kill_loop(
        self,
        *,
        kills: int,
        runners: int = 1,
        admin: bool = False,
        admin_kills: int = 0,
        early: float = 0.2,
        max_starts: int = 4,
        max_seconds: float = 600,
        on_kill: Callable[[Proc], object] | None = None,
    ) -> None:
        """Run ``runners`` runners (and with ``admin`` an enqueue/compact slot),
        killing them at random moments and restarting them, until ``kills``
        processes have died by our hand, ``admin_kills`` of them enqueue and as
        many compact (or, without ``admin``, until every item has ended)."""
        deadline = time.monotonic() + max_seconds
        slots: list[Proc] = []
        for _ in range(runners):
            proc = self.start_runner()
            self.plan(proc, early=early, max_starts=max_starts)
            slots.append(proc)
        admin_proc = self._start_admin() if admin else None
        try:
            fig = self.figures
            while fig.kills < kills or min(fig.enqueue_kills, fig.compact_kills) < admin_kills:
                assert time.monotonic() < deadline, f"kill loop too slow: {self.figures}"
                self.log.refresh()
                now = time.monotonic()
                for n, proc in enumerate(slots):
                    exited = not proc.alive()
                    if exited or self._due(proc, now):
                        killed = proc.kill()
                        self._forget(proc)
                        if killed:
                            self.figures.kills += 1
                            self.figures.run_kills += 1
                            if on_kill:
                                on_kill(proc)
                        elif proc.returncode not in (0, 3):
                            raise AssertionError(
                                f"runner exited {proc.returncode}: {self.stderr_tail()}"
                            )
                        if exited and not admin and self._all_ended():
                            return  # the queue ran dry before enough kills
                        slots[n] = self.start_runner()
                        self.plan(slots[n], early=early, max_starts=max_starts)
                if admin_proc is not None and (
                    not admin_proc.alive() or now >= (admin_proc.deadline or 0)
                ):
                    self._settle_admin(admin_proc, on_kill)
                    admin_proc = self._start_admin()
                time.sleep(POLL)
        finally:
            # Ending the loop is one more random moment: these kills count too
            # (a runner killed here may leave an item to re-run).
            for proc in slots:
                if proc.kill():
                    self.figures.kills += 1
                    self.figures.run_kills += 1
                self._forget(proc)
            if admin_proc is not None:
                self._settle_admin(admin_proc, on_kill)

    def _all_ended(self) -> bool:
        self.log.refresh()
        return len(self.log.ended_items()) >= len(set(self.offered))

    def _start_admin(self) -> Proc:
        rng = self.rng
        room = max(0, self.max_items - len(self.offered))
        if rng.random() < 0.6:
            # Items of killed enqueues offered again (as a client would), new
            # ones (mostly a few, sometimes many: a longer write that a kill may
            # tear), and acknowledged ones (dedupe must skip them).
            unacked = [i for i in self.offered if i not in self.acked]
            n = rng.randint(1, 30) if rng.random() < 0.9 else rng.randint(200, 1000)
            again = rng.sample(unacked, min(len(unacked), n))
            old = rng.sample(sorted(self.acked), min(len(self.acked), rng.randint(0, 10)))
            proc = self.start_enqueue(again + self.new_items(min(n, room)) + old)
        else:
            proc = self._spawn("compact", ["compact", "--json"], out=True)
        # Start-up takes 0.2-0.5 s, the work itself a few ms: aim all over both,
        # and let about half of them finish.
        proc.deadline = proc.started + rng.uniform(0.05, 0.8)
        return proc

    def _settle_admin(self, proc: Proc, on_kill: Callable[[Proc], object] | None) -> None:
        proc.kill()
        self._forget(proc)
        if proc.killed:
            self.figures.kills += 1
        elif proc.returncode != 0:
            raise AssertionError(f"{proc.role} exited {proc.returncode}: {self.stderr_tail()}")
        if proc.role == "enqueue":
            self.settle_enqueue(proc)
        else:
            assert proc.out_path is not None
            proc.out_path.unlink()
            if proc.killed:
                self.figures.compact_kills += 1
        if proc.killed and on_kill:
            on_kill(proc)

    # -- compaction crash points (the store's test-only SIGKILL hook) ------------------

    def crash_point_sweep(
        self, kinds: Iterable[str] = ("write", "fsync", "rename", "dirfsync")
    ) -> None:
        """Kill `compact` at each of its durable operations in turn (no runner active),
        with the store's test-only hook: the k-th write, fsync, rename, folder fsync.

        The state counts must be the same after every one (compaction changes
        the representation, never the state), and the queue must open.
        """
        self.wait_claims_free()  # the keepers of killed runs let go first
        before = self.library_counts()
        for kind in kinds:
            for k in range(1, 50):
                self.give_compaction_work()
                env = dict(self.env, STATEQUEUE_TEST_CRASH=f"{kind}:{k}")
                proc = self._spawn("compact", ["compact", "--json"], env=env, out=True)
                code = proc.wait(60)
                self._forget(proc)
                assert proc.out_path is not None
                proc.out_path.unlink()
                after = self.library_counts()
                assert after == before, f"compact killed at {kind}:{k} changed {before} -> {after}"
                if code != -signal.SIGKILL:
                    assert code == 0, f"compact exited {code}: {self.stderr_tail()}"
                    break  # it has fewer than k operations of this kind
                self.figures.hook_kills += 1
                self.figures.kills += 1
                self.figures.extra.setdefault("crash_points", []).append(f"{kind}:{k}")

    def give_compaction_work(self) -> None:
        """Make the journal hold more dead records than live items (pause and
        resume records: no item changes), so that the next compaction is put
        in place: one that archives nothing, shrinks nothing and drops fewer
        records than it keeps stops before its rename (online_compaction)."""
        from statequeue import Queue

        journal = self.home / self.queue / "journal.jsonl"
        with Queue(self.queue, home=self.home, create=False) as q:
            status = q.status()
            live = status.total - status.counts["done"]
            dead = journal.read_bytes().count(b"\n") - live - len(status.runners) - 1
            for _ in range(max(0, (live - dead) // 2 + 1)):  # each pair: 2 dead records
                q.pause()
                q.resume()

    def library_counts(self) -> dict[str, int]:
        """The state counts, read in this process with the library."""
        from statequeue import Queue

        with Queue(self.queue, home=self.home, create=False) as q:
            return dict(q.status().counts)

    # -- the end -------------------------------------------------------------------

    def run_to_completion(
        self, *, runners: int = 1, jobs: int = 4, rounds: int = 20
    ) -> dict[str, int]:
        """Run (unkilled) until no item is pending or running; returns the counts."""
        counts: dict[str, int] = {}
        for _ in range(rounds):
            # Work orphaned by a kill holds its item's claim until it ends;
            # the runner leaves such items alone, so wait for them first.
            self.wait_claims_free()
            procs = [self.start_runner(jobs=jobs) for _ in range(runners)]
            for proc in procs:
                code = proc.wait(300)
                self._forget(proc)
                assert code in (0, 3), f"runner exited {code}: {self.stderr_tail()}"
            counts = self.counts()
            if counts["pending"] == 0 and counts["running"] == 0:
                return counts
        return counts

    def collect(self) -> Figures:
        """Fill in the figures from the worker log and the runners' stderr."""
        fig = self.figures
        stats = self.log.analyse()
        fig.items = len(set(self.offered))
        fig.starts = self.log.starts
        fig.reruns = stats["reruns"]
        fig.rerun_items = stats["rerun_items"]
        fig.duplicates = stats["duplicates"]
        fig.duplicate_items = stats["duplicate_items"]
        fig.overlaps = len(stats["overlaps"])
        fig.extra["overlaps"] = stats["overlaps"]
        fig.extra["reused_attempts"] = stats["reused_attempts"]
        fig.extra["malformed_log_lines"] = self.log.malformed
        self._err.flush()
        errors = self.err_path.read_text("utf-8", "replace")
        fig.verified = errors.count("[verified]")
        fig.torn_tails = self._torn + errors.count("repaired a torn tail")
        fig.extra["tracebacks"] = errors.count("Traceback")
        fig.seconds = time.monotonic() - self.started_at
        return fig

    def offer(self, items: list[str]) -> dict[str, int]:
        """Enqueue ``items`` (to completion); returns the reply."""
        self._op += 1
        path = self.workdir / f"offer.{self._op}"
        path.write_text("".join(f"{i}\n" for i in items))
        code, out = self.cli("enqueue", "--json", "--file", str(path))
        path.unlink()
        assert code == 0, f"enqueue exited {code}: {self.stderr_tail()}"
        reply: dict[str, int] = json.loads(out)
        assert reply["added"] + reply["skipped"] == len(items), reply
        return reply

    def listing(self) -> list[dict[str, Any]]:
        """`statequeue list --json`; asserts that no item id is listed twice."""
        code, out = self.cli("list", "--json")
        assert code == 0, f"list exited {code}: {self.stderr_tail()}"
        rows = [json.loads(line) for line in out.splitlines()]
        twice = sorted(i for i, n in Counter(r["id"] for r in rows).items() if n > 1)
        assert not twice, f"items listed twice: {twice[:20]}"
        return rows

    def open_check(self) -> int:
        """Open the queue with the library, as the next process would; returns its total.

        Raises if it does not open; asserts nothing acknowledged is missing by count.
        """
        from statequeue import Queue

        with Queue(self.queue, home=self.home, create=False) as q:
            notices = q.notices()
            total = q.status().total
        self._torn += sum("torn tail" in n for n in notices)
        assert total >= len(self.acked), f"{total} items < {len(self.acked)} acknowledged"
        return total

    def check(self, *, max_reruns_per_kill: int | None = None) -> Figures:
        """Assert the promises on the queue, run to its end; returns the figures."""
        unacked = sorted(set(self.offered) - self.acked)
        if unacked:
            # Nothing acknowledged is lost: offering those items again adds none.
            # (Without killed enqueues, the last check below covers this.)
            reply = self.offer(sorted(self.acked))
            assert reply["added"] == 0, f"{reply['added']} acknowledged items were lost"
            self.offer(unacked)  # killed enqueues: some of these may be missing
        counts = self.run_to_completion()
        fig = self.collect()
        n = fig.items
        tail = self.stderr_tail()
        assert counts == {
            "pending": 0,
            "running": 0,
            "done": n,
            "failed": 0,
            "cancelled": 0,
            "held": 0,
        }, f"{counts} for {n} items (seed {self.seed}); {fig.line()}\n{tail}"
        # Nothing skipped: every item's work reached its last action.
        missing = set(self.offered) - self.log.ended_items()
        assert not missing, f"{len(missing)} items done without running: {sorted(missing)[:10]}"
        # Nothing acknowledged lost, and dedupe holds after all of it (compactions
        # included): offering every item again adds none.
        assert self.offer(self.offered)["added"] == 0
        # Item by item: each one listed once, done.
        listed = self.listing()
        assert len(listed) == n and {r["item"] for r in listed} == set(self.offered)
        assert {r["state"] for r in listed} == {"done"}
        per_kill = self.jobs if max_reruns_per_kill is None else max_reruns_per_kill
        bound = fig.run_kills * per_kill
        assert fig.reruns <= bound, f"{fig.reruns} re-runs > {bound} (seed {self.seed})"
        assert fig.duplicates <= bound, f"{fig.duplicates} duplicates > {bound}"
        assert not fig.extra["overlaps"], "two copies at once:\n" + "\n".join(
            fig.extra["overlaps"][:10]
        )
        assert not fig.extra["reused_attempts"], fig.extra["reused_attempts"][:10]
        assert not fig.extra["malformed_log_lines"], fig.extra["malformed_log_lines"][:10]
        assert fig.extra["tracebacks"] == 0, tail
        return fig
