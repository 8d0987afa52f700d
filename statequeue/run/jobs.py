"""One child process running one item: spawn, capture output, stop, report.

The child runs in its own process group (so a timeout or a stop reaches its
descendants too), with stdin from /dev/null or the item, and its stdout and
stderr read through pipes into a size-bounded log. The run's keeper
(keeper.py) starts it with posix_spawn (no fork of an interpreter), is its
parent, reports its exit, and holds its claim until no process of the item
is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from statequeue.core.durations import format_setting
from statequeue.core.errors import InvalidResult, KeeperLost
from statequeue.core.fileio import CRASH, create_own
from statequeue.core.models import Claim, Outcome
from statequeue.core.records import json_problem, load_result
from statequeue.run.keeper import Keeper
from statequeue.run.output_log import OutputLog
from statequeue.run.pipes import PipeStock, make_pipes, read_some
from statequeue.run.replacements import JobItem, replace, template_tokens

STDERR_TAIL_BYTES = 4096
RESULT_MAX_BYTES = 1 << 20
OutputSink = Callable[[int, bytes], None]
"""Receives (1 or 2, bytes) as a child writes to stdout or stderr, for live display."""


@dataclass(frozen=True)
class JobSpec:
    """How to launch the command for one claimed item."""

    template: tuple[str, ...]
    queue: str
    log_dir: Path
    log_dir_fd: int = -1
    """``log_dir`` held open (relative to the queue folder, never through a
    link): logs and results are opened relative to it. -1: by path."""
    log_limit: int = 1 << 20
    item_on_stdin: bool = False
    live: OutputSink | None = None
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    """The children's environment before the STATEQUEUE_* variables: copied
    from ours once per run, since copying os.environ per item cost ~0.3 ms."""
    pipes: PipeStock | None = None
    """Output pipes made ahead (the runner's); None: made for each child."""


def build_argv(
    template: tuple[str, ...], item: str, *, item_id: int = 0, slot: int = 1
) -> list[str]:
    """Replace every replacement string (``{}``, ``{.}``, ``{/}``, ``{//}``,
    ``{/.}``, ``{#}``, ``{%}``; see replacements.py) in each argument; with
    none anywhere, the item is appended as the last argument."""
    tokens = template_tokens(template)
    if not tokens:
        return [*template, item]
    if tokens == {"{}"}:  # the common case, at str.replace speed (~5x the regex)
        return [arg.replace("{}", item) for arg in template]
    job = JobItem(item, item_id, slot)
    return [replace(arg, job) for arg in template]


def child_env(
    claim: Claim, queue: str, result_path: str, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a child for ``claim``: ``base`` (default: ours) plus
    the STATEQUEUE_* variables."""
    env = dict(os.environ if base is None else base)
    env.update(item_env(claim, queue, result_path))
    return env


def item_env(claim: Claim, queue: str, result_path: str) -> dict[str, str]:
    """The STATEQUEUE_* variables of a child for ``claim`` (the keeper adds
    them to the run's environment, which it was sent once)."""
    env = {
        "STATEQUEUE_ITEM": claim.item,
        "STATEQUEUE_ID": str(claim.item_id),
        "STATEQUEUE_ATTEMPT": str(claim.attempt),
        "STATEQUEUE_QUEUE": queue,
        "STATEQUEUE_RESULT": result_path,
    }
    if claim.token is not None:  # stores that fence (PostgreSQL): for the child's own fencing
        env["STATEQUEUE_LEASE_TOKEN"] = str(claim.token)
    return env


class Job:
    """A running child for one claim."""

    watch_now = False
    """Whether its pipes are watched from its start (else after a delay: output_watch.py)."""
    result_by_file = True
    """Whether the result comes in a file at STATEQUEUE_RESULT (else: in a worker's reply)."""
    process_per_attempt = True
    """Whether the attempt is a process of its own, which ends with it (else a
    request to a persistent worker, which lives on): ``cut`` ends its item."""
    interruption = ""
    """Set when the attempt died with its process and is to be recorded as
    interrupted (a crash), not as a failure: a persistent worker's (persistent.py)."""
    given_back: tuple[str, bool] | None = None  # why, uncounted: back to pending, no crash

    def __init__(self, claim: Claim, spec: JobSpec, keeper: Keeper, *, slot: int = 1) -> None:
        self.claim = claim
        self.spec = spec
        self.keeper = keeper
        self.slot = slot  # {%}: which of the --jobs slots runs it
        self.started = time.monotonic()
        self.deadline: float | None = None
        self.kill_at: float | None = None
        self.stop_reason = ""  # "timeout" or "stopped" once the runner signals it
        self.grace = 0.0  # how long the runner waited after TERM before KILL
        self.killed = False  # the runner sent SIGKILL when the grace ran out
        self.lease_kill_at: float | None = None  # the keeper's hard stop (stores with leases)
        self.watch_at: float | None = None  # when the runner starts reading its pipes (None: now)
        self.warnings: list[str] = []  # for the user: e.g. a result that was not stored
        self.returncode: int | None = None
        # Plain strings, not Paths: building Paths cost more than the syscalls.
        stem = f"{spec.log_dir}/{claim.item_id}.{claim.attempt}"
        self.log_file = f"{stem}.log"
        self.result_file = f"{stem}.result"
        self._name = f"{claim.item_id}.{claim.attempt}"  # within log_dir_fd
        self._out = OutputLog(spec.log_limit, self._open_log)
        self._tail = bytearray()
        self.pipes: dict[int, int] = {}
        # The child writes its result by path: a file (or planted link) left
        # there must not receive it, nor be read back as this attempt's result.
        if self.result_by_file:
            self._unlink(f"{self._name}.result")
        self.program = ""  # argv[0], once built
        self.token = self._spawn()

    def _spawn(self) -> int:
        """Have the keeper start the child: in its own session (so its whole
        process group can be signalled), stdout and stderr on pipes, and the
        claim's fds at high numbers (so ``exec 9>file`` in a worker keeps them).
        Raises OSError if a pipe fails (EMFILE: see runner); a failed spawn
        shows later, in ``spawn_error``."""
        argv = build_argv(
            self.spec.template, self.claim.item, item_id=self.claim.item_id, slot=self.slot
        )
        self.program = argv[0]  # named in the reason if it cannot be started
        env = item_env(self.claim, self.spec.queue, self.result_file)
        stock = self.spec.pipes
        out_r, out_w, err_r, err_w = stock.take() if stock is not None else make_pipes()
        streams = [out_w, err_w]
        CRASH.hit("spawn")
        try:
            if self.spec.item_on_stdin:
                streams.append(_memfd(os.fsencode(self.claim.item) + b"\n"))
            token = self.keeper.spawn(
                item_id=self.claim.item_id,
                argv=argv,
                env=env,
                streams=streams,
                claim_fds=self.claim.inherit_fds,
            )
        except BaseException:
            for fd in (out_r, err_r):
                os.close(fd)
            raise
        finally:
            for fd in streams:
                os.close(fd)
        self.pipes[out_r] = 1
        self.pipes[err_r] = 2
        return token

    # -- output ------------------------------------------------------------------

    def read(self, fd: int) -> bool:
        """Read what the child wrote on ``fd``; False at end of file."""
        data = read_some(fd)
        if data is None:
            return True
        if not data:
            return False
        self._consume(self.pipes[fd], data)
        return True

    def drain(self) -> None:
        """Read whatever is buffered, without waiting for descendants to close."""
        for fd, stream in self.pipes.items():
            while data := read_some(fd):
                self._consume(stream, data)

    def _consume(self, stream: int, data: bytes) -> None:
        if stream == 2:
            self._tail += data
            del self._tail[:-STDERR_TAIL_BYTES]
        self._out.add(data)
        if self.spec.live is not None:
            self.spec.live(stream, data)

    @property
    def has_log(self) -> bool:
        """Whether this attempt's log file was opened (the child wrote something)."""
        return self._out.opened

    @property
    def log_path(self) -> Path | None:
        """This attempt's log, or None if the child wrote nothing (no file)."""
        return Path(self.log_file) if self.has_log else None

    # -- stopping ------------------------------------------------------------------

    def enforce_times(self, now: float, grace: float) -> None:
        """Act on a time that has come (the child still runs): KILL when the
        grace after TERM ran out, TERM when the --timeout did."""
        if self.kill_at is not None and now >= self.kill_at:
            self.killed = True  # the grace ran out: said in the reason, and on stop
            self.signal_group(signal.SIGKILL)
        elif self.deadline is not None and now >= self.deadline and not self.stop_reason:
            self.stop_reason = "timeout"
            self.signal_group(signal.SIGTERM)
            self.grace = grace
            self.kill_at = now + grace

    def next_time(self) -> float | None:
        """The soonest time the runner must look at this job again, if any."""
        times = [t for t in (self.deadline, self.kill_at, self.watch_at) if t is not None]
        return min(times) if times else None

    def signal_group(self, signum: int) -> None:
        """Signal the child's process group. The keeper does it, and only while
        the child is unreaped (its pid, so its group id, is still reserved);
        once signalled, the rest of the group is killed when the child exits."""
        with contextlib.suppress(KeeperLost):  # nothing left to signal
            self.keeper.signal(self.token, signum)

    def cut(self) -> None:
        """The child of a stopped or timed-out attempt has ended: nothing of
        the attempt may outlive it -- what is left of its group, and the
        detached descendants of its item (a new session), are killed; the
        claim stays held until none is left."""
        self.signal_group(signal.SIGKILL)
        with contextlib.suppress(KeeperLost):
            self.keeper.cut(self.claim.item_id)

    def exited(self) -> bool:
        """True once the keeper reported the child's exit (or failed spawn)."""
        if self.returncode is not None:
            return True
        return self.token in self.keeper.exits or self.token in self.keeper.failed

    def start_failed(self) -> bool:
        """Whether the keeper said already that the child could not be
        started (``spawn_error`` then takes the reason)."""
        return self.token in self.keeper.failed

    def spawn_error(self) -> OSError | None:
        """Why the child could not be started, if it could not."""
        code = self.keeper.failed.pop(self.token, None)
        return None if code is None else OSError(code, os.strerror(code), self.program)

    def reap(self) -> int:
        """The exited child's status (exit code, or -signal), waiting for it."""
        if self.returncode is None:
            try:
                self.returncode = self.keeper.wait_exit(self.token)
            except KeeperLost:
                self.returncode = -1
        return self.returncode

    # -- result ----------------------------------------------------------------------

    def finish(self) -> Outcome:
        """The outcome of the exited child; closes its pipes and files."""
        self.drain()
        code = self.reap()
        self.close()
        duration = time.monotonic() - self.started
        sig = -code if code is not None and code < 0 else None
        exit_code = code if sig is None else None
        result = self._read_result()
        timed_out = self.stop_reason == "timeout"
        ok = code == 0 and not timed_out
        return Outcome(
            ok=ok,
            exit_code=exit_code,
            signal=sig,
            duration=duration,
            stderr_tail=self._tail.decode("utf-8", "replace"),
            reason="" if ok else self._reason(exit_code, sig, duration),
            result=result,
            timed_out=timed_out,
            log_cut=self._log_loss(),
        )

    def with_log_loss(self, outcome: Outcome) -> Outcome:
        """``outcome``, marked (and warned of) if this attempt's log was cut:
        for an attempt whose outcome is not built by ``finish`` (persistent.py)."""
        cut = self._log_loss()
        return dataclasses.replace(outcome, log_cut=cut) if cut else outcome

    def _log_loss(self) -> str:
        """Why the log (closed) lost output, with the run's warning for it
        (``Notice``, once per attempt: recorder.py), or "" if it kept all of it.
        A full disk is not the item's failure: its state stays its exit code's."""
        why = self._out.lost
        if why:
            kept = f"log cut at {self._out.kept:,} bytes" if self._out.opened else "no log file"
            self.warnings.append(f"its output was not kept: {why} ({kept})")
        return why

    def _reason(self, exit_code: int | None, sig: int | None, duration: float) -> str:
        if self.stop_reason == "timeout":
            return self._timeout_reason(exit_code, sig)
        if sig is not None:
            return f"killed by signal {sig} ({_signame(sig)})"
        return f"exit code {exit_code}"

    def _timeout_reason(self, exit_code: int | None, sig: int | None) -> str:
        limit = format_setting((self.deadline or self.started) - self.started)
        if self.killed:
            end = f"killed (SIGKILL) after {format_setting(self.grace)} grace"
        elif sig is not None:
            end = f"ended by {_signame(sig)}"
        else:
            end = f"exited with code {exit_code} after SIGTERM"
        return f"timed out after {limit}; {end}"

    def _read_result(self) -> Any:
        # O_NONBLOCK: a FIFO there must not block the open (PEP 475 retries it
        # on EINTR, so not even SIGTERM would end the wait); only a regular
        # file of this user is read (another user's, planted there, is not
        # the item's result), anything else is an error value, as a link is.
        try:
            fd = self._open(f"{self._name}.result", os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:  # the common case: no result, nothing to unlink
            return None
        except OSError as exc:  # a link (ELOOP), a socket (ENXIO): no target is read
            self._unlink(f"{self._name}.result")
            return self._not_stored(f"result file not read: {exc.strerror}")
        try:
            refused = _refused(os.fstat(fd))  # before open(): it refuses a directory
            if refused:
                os.close(fd)
                return self._not_stored(f"result file not read: {refused}")
            with open(fd, "rb") as f:
                raw = f.read(RESULT_MAX_BYTES + 1)
        except OSError as exc:  # e.g. EIO: this item's error, not the run's end
            return self._not_stored(f"result file not read: {exc.strerror}")
        finally:
            self._unlink(f"{self._name}.result")
        if len(raw) > RESULT_MAX_BYTES:
            return self._not_stored(f"result file larger than {RESULT_MAX_BYTES} bytes", True)
        if not raw.strip():  # created (the runner never does) but nothing written: no result
            return None
        try:
            value = load_result(raw)
        except orjson.JSONDecodeError:
            text = raw[:4096].decode(errors="replace")
            return {**self._not_stored("result file is not valid JSON"), "text": text}
        except InvalidResult:
            return self._unstorable("an integer exceeds the 64-bit range")
        problem = json_problem(value, parsed=True)  # the journal and an export must hold it
        return value if problem is None else self._unstorable(problem)

    def _not_stored(self, why: str, said: bool = False) -> dict[str, str]:
        """The error value recorded, with a warning, for a result file not stored as written."""
        self.warnings.append(f"{why}; recorded an error instead")
        return {"error": f"{why}; not stored" if said else why}

    def _unstorable(self, problem: str) -> dict[str, str]:
        """The error value recorded (with a warning) for a result JSON that cannot be stored."""
        note = f"result JSON cannot be stored ({problem}); recorded an error instead"
        self.warnings.append(note)
        return {"error": note}

    def _open(self, name: str, flags: int) -> int:
        """Open ``name`` in the log folder, never following a link."""
        flags |= os.O_NOFOLLOW | os.O_CLOEXEC
        if self.spec.log_dir_fd < 0:
            return os.open(f"{self.spec.log_dir}/{name}", flags, 0o600)
        return os.open(name, flags, 0o600, dir_fd=self.spec.log_dir_fd)

    def _open_log(self) -> int:
        """This attempt's log, created for writing: a regular file of this
        user's only (``fileio.create_own``: never blocking on a FIFO, which
        a signal could not end, PEP 475 retrying the open). A link, a FIFO or
        another user's file at its name (planted by the child: the folder is
        its result's; or while the folder was open to others) is removed and
        the log created afresh, so the attempt's output is kept (OSError: a
        folder there, no log is kept)."""
        name = f"{self._name}.log"
        if self.spec.log_dir_fd < 0:
            return create_own(f"{self.spec.log_dir}/{name}", None)
        return create_own(name, self.spec.log_dir_fd)

    def _unlink(self, name: str) -> None:
        remove_left(str(self.spec.log_dir), self.spec.log_dir_fd, name)

    def close_pipe(self, fd: int) -> None:
        """Close one output pipe at its end of file (the child closed its side)."""
        del self.pipes[fd]
        os.close(fd)

    def close(self) -> None:
        for fd in self.pipes:
            os.close(fd)
        self.pipes.clear()
        self._out.close()


def remove_left(folder: str, folder_fd: int, name: str) -> None:
    """Remove what a child left at ``name`` in the log folder (held open as
    ``folder_fd``, or by path when -1): a file, a link (not followed), a FIFO,
    or a directory, walked by fds. A directory that cannot be removed stays,
    harmlessly: no regular file is read there, and it must not end the run."""
    try:  # not contextlib.suppress: this runs for every item
        if folder_fd < 0:
            os.unlink(f"{folder}/{name}")
        else:
            os.unlink(name, dir_fd=folder_fd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        import shutil  # lazy: start-up time (a directory left in place: rare)

        if folder_fd < 0:
            shutil.rmtree(f"{folder}/{name}", ignore_errors=True)
        else:
            shutil.rmtree(name, ignore_errors=True, dir_fd=folder_fd)


def _refused(st: os.stat_result) -> str:
    """Why a result file with status ``st`` is not read ("" when it is)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    return "" if st.st_uid == os.geteuid() else "not owned by this user"


def _memfd(data: bytes) -> int:
    """A file descriptor reading ``data`` from its start, to hand to a child as stdin."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("statequeue-stdin", os.MFD_CLOEXEC)
    else:  # no memfd here: an unlinked temp file does the same
        import tempfile  # lazy: start-up time (only where there is no memfd)

        fd, path = tempfile.mkstemp(prefix="statequeue-stdin-")
        os.unlink(path)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "unknown"
