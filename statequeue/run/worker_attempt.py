"""One request to a persistent worker (``run --persistent``): an attempt, to the runner's loop.

Each request is one attempt (``WorkerAttempt``): to the runner's loop it is a
``Job`` that ends when the reply comes, whose log is what the worker wrote on
stdout and stderr between the request and the reply. The workers and their
slots are persistent.py's (``WorkerPool``); the process and its pipes,
worker_process.py's; the line protocol, protocol.py's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import TYPE_CHECKING

from statequeue.core.errors import KeeperLost
from statequeue.core.models import Claim, Outcome
from statequeue.core.rates import TRY_LATER_EXIT
from statequeue.run.jobs import Job, JobSpec
from statequeue.run.keeper import Keeper
from statequeue.run.pipes import READ_SIZE, read_some
from statequeue.run.protocol import BadReply, ExtraReply, Reply
from statequeue.run.resources import RESOURCE_ERRNOS

if TYPE_CHECKING:
    from statequeue.run.persistent import WorkerPool

__all__ = ["WorkerAttempt"]

REPLY_CLOSED_WAIT = 1.0  # seconds a worker that closed its reply fd has to exit on its own


class WorkerAttempt(Job):
    """One request to a persistent worker: a Job to the runner's loop."""

    watch_now = True  # the reply must wake the runner at once
    result_by_file = False  # it comes in the reply
    process_per_attempt = False  # the worker lives on for the next item

    def __init__(
        self, claim: Claim, spec: JobSpec, keeper: Keeper, *, slot: int, pool: WorkerPool
    ) -> None:
        self._pool = pool
        self.reply: Reply | None = None
        self.bad = ""  # how the worker broke the protocol
        self.stray = ""  # the second reply to an earlier request that stopped its worker
        self.reply_closed = False
        super().__init__(claim, spec, keeper, slot=slot)

    def _spawn(self) -> int:
        self.worker = self._pool.worker_for(self.slot, self.keeper)
        if self.worker.replied_unasked():
            # A second reply to its last request (or one it wrote unasked):
            # the worker is out of step; this item, which it never saw, goes
            # to a new one rather than failing for it.
            self.warnings.append(
                f"the worker of slot {self.slot} sent a reply it was not asked for; "
                "it was stopped, and this item went to a new worker"
            )
            self.worker = self._pool.renew(self.slot, self.keeper)
        self.worker.busy = True
        self.worker.attempt = self  # what its pipes report is this attempt's
        self._answered_before = self.worker.done > 0
        self.program = self.spec.template[0]
        self.pipes = dict(self.worker.pipes)
        problem = self.worker.send(self.claim)
        if problem:
            self._broken(problem)
        self._pool.in_flight += 1
        return self.worker.token

    def cut(self) -> None:
        """A stopped attempt's worker: its group is killed, but not the
        detached processes of the run: a worker's leftovers carry no item's
        mark, and one an earlier item started may rightly live on."""
        self.signal_group(signal.SIGKILL)

    # -- output and the reply ------------------------------------------------

    def read(self, fd: int) -> bool:
        stream = self.pipes[fd]
        if stream == 0:  # its stdin, reported only once no process reads it any more
            return False
        if stream != 3:
            return self._read_output(fd, stream)
        data = read_some(fd)
        if data is None:
            return True
        if not data:
            return False
        if self.reply is None and not self.bad and not self.stray:
            self._take(data)
        elif self.reply is not None:  # after its reply: a second one
            self._second_reply(repr(data[:80].decode("utf-8", "replace")))
        return True

    def _read_output(self, fd: int, stream: int) -> bool:
        """Read what the worker wrote on stdout or stderr: all of it, so that
        output it wrote before its reply, read in the reply's batch, is this
        attempt's log (output_watch.py); a read that fills the buffer may have
        left more. False at end of file."""
        while True:
            data = read_some(fd)
            if data is None:
                return True
            if not data:
                return False
            self._consume(stream, data)
            if len(data) < READ_SIZE:
                return True

    def _take(self, data: bytes) -> None:
        worker = self.worker
        try:
            reply = worker.reader.take(data, self.claim.item_id, worker.answered)
        except ExtraReply as exc:
            self._second_reply(str(exc))
            return
        except BadReply as exc:
            self._broken(str(exc))
            return
        if reply is not None:
            self.reply = reply
            worker.done += 1
            worker.answered.append(self.claim.item_id)
            self._pool.start_failures = 0
            if worker.reader.pending():  # more came with it
                self._second_reply("more than one reply to this request")

    def _second_reply(self, problem: str) -> None:
        """The worker replied twice to one request: it is out of step, so it
        is stopped. A reply recorded or in hand stands; an item it had read
        since goes back to pending, counting no crash (``_died``)."""
        if self.stray:
            return
        self.stray = problem
        self._pool.ended(self.worker, answered=True)
        self.warnings.append(
            f"the worker of slot {self.slot} sent a second reply ({problem}); it was stopped"
        )

    def _broken(self, problem: str) -> None:
        self.bad = f"bad reply from the persistent worker: {problem}"
        self.worker.retire()

    def close_pipe(self, fd: int) -> None:
        """A pipe of the worker reached end of file: neither it nor the next attempt reads it."""
        stream = self.pipes.pop(fd)
        if stream == 0:
            self._requests_closed()
            return
        if self.worker.pipes.pop(fd, None) is not None:
            os.close(fd)
        if stream == 3 and self.reply is None and not self.bad and self.kill_at is None:
            # Most often it is dying (its exit comes next); if it lives on
            # without a way to reply, the runner kills it then (_reap).
            self.reply_closed = True
            self.kill_at = time.monotonic() + REPLY_CLOSED_WAIT

    def _requests_closed(self) -> None:
        """No process reads the worker's stdin any more (it ended, or closed
        it): it gets no more requests. If it never read this one it cannot
        answer it, so it is stopped (alive, it would hold the run for good)
        and its exit gives the item back (``_died``)."""
        unread = self.worker.request_unread()  # before the close: the pipe is looked at
        self.worker.stdin_eof()
        if unread and self.reply is None and not self.bad:
            self.worker.retire()

    def close(self) -> None:
        """Close this attempt's log; the worker's pipes only if it is leaving."""
        self.pipes = {}
        if self.worker.attempt is self:
            self.worker.attempt = None  # what its pipes say now is no attempt's
        super().close()
        if self.worker.retired:
            self.worker.close()

    # -- the end -----------------------------------------------------------------

    def exited(self) -> bool:
        return self.reply is not None or bool(self.bad) or self.worker.dead()

    def spawn_error(self) -> OSError | None:
        """A shortage (EMFILE...) as for an item's child: the runner gives the
        item back and runs fewer at once. Any other reason the worker could
        not start is its command's, not the item's: the item goes back
        uncounted, and the run stops (``WorkerPool.unstartable``)."""
        error = super().spawn_error()
        if error is None:
            return None
        self._pool.ended(self.worker, answered=True)  # not started: not its fault
        if error.errno in RESOURCE_ERRNOS:
            return error
        self._pool.unstartable(error)
        self.given_back = (f"not started: {self._pool.cannot_start}", True)
        return None

    def reap(self) -> int:
        if self.worker.dead():
            return super().reap()
        return 0

    def finish(self) -> Outcome:
        self.worker.busy = False
        self._pool.in_flight -= 1
        duration = time.monotonic() - self.started
        tail = self._tail.decode("utf-8", "replace")
        if self.stop_reason or self.bad or self.reply is None:
            # The worker is not to be given another item.
            with contextlib.suppress(KeeperLost):
                self.keeper.signal(self.token, signal.SIGKILL)
        if self.given_back is not None:  # decided already (spawn_error): nothing to reap
            outcome = Outcome(ok=False, duration=duration, reason=self.given_back[0])
        elif self.stop_reason:
            outcome = self._stopped(duration, tail)
        elif self.bad:
            self._pool.ended(self.worker, answered=True)
            outcome = Outcome(ok=False, duration=duration, stderr_tail=tail, reason=self.bad)
        elif self.reply is not None:
            # It leaves the item when it gets the next (ASSIGN) or, if it gets
            # none, in ``WorkerPool.tend``: one message to the keeper per item.
            self.worker.owes_idle = True
            outcome = _replied(self.reply, duration, tail)
        else:
            outcome = self._died(duration, tail)
        self.close()
        return self.with_log_loss(outcome)

    def _stopped(self, duration: float, tail: str) -> Outcome:
        """A timeout, a stop or a fence: the worker goes; the attempt fails as a child's would."""
        code = self.reap() if self.worker.dead() else None
        self._pool.ended(self.worker, answered=True)
        sig = -code if code is not None and code < 0 else None
        exit_code = code if sig is None else None
        timed_out = self.stop_reason == "timeout"
        if timed_out:
            reason = self._timeout_reason(exit_code, sig)
        else:
            reason = f"{self.stop_reason}: the persistent worker was stopped"
        return Outcome(
            ok=False,
            exit_code=exit_code,
            signal=sig,
            duration=duration,
            stderr_tail=tail,
            reason=reason,
            timed_out=timed_out,
        )

    def _died(self, duration: float, tail: str) -> Outcome:
        """The worker ended with no reply: the attempt is interrupted (recorder.py)."""
        code = super().reap()
        if self.stray:  # stopped for another request's second reply: not this item's fault
            why = "interrupted: its persistent worker was stopped for a second reply"
            self.given_back = (why, self.worker.request_unread())
            return Outcome(ok=False, duration=duration, stderr_tail=tail, reason=why)
        if self.reply_closed and self.killed:  # it lived on, unable to reply
            self._pool.ended(self.worker, answered=True)
            reason = "bad reply from the persistent worker: it closed its reply fd"
            return Outcome(ok=False, duration=duration, stderr_tail=tail, reason=reason)
        self._pool.last_item = self.claim.item_id
        self._pool.ended(self.worker, answered=self._answered_before)
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        if self.worker.request_unread():
            # Nothing of the attempt ran: no crash, and no attempt counted.
            why = f"not started: its persistent worker {how} before reading the request"
            self.given_back = (why, True)
            self.warnings.append(f"{why}; it goes to a new worker (no attempt counted)")
            return Outcome(ok=False, duration=duration, stderr_tail=tail, reason=why)
        self.interruption = (
            f"interrupted: its persistent worker {how} during attempt {self.claim.attempt}"
        )
        return Outcome(
            ok=False,
            exit_code=None if code < 0 else code,
            signal=-code if code < 0 else None,
            duration=duration,
            stderr_tail=tail,
            reason=self.interruption,
        )


def _replied(reply: Reply, duration: float, tail: str) -> Outcome:
    """The outcome of an attempt the worker replied to. A ``later`` reply is
    the outcome of a per-item command that exits 75 (with ``retry_after`` in
    its result when it named seconds), so the recorder defers it by the one
    rule both modes share (recorder.py)."""
    if not reply.later:
        return Outcome(
            ok=reply.ok,
            exit_code=0 if reply.ok else None,
            duration=duration,
            stderr_tail=tail,
            reason=reply.reason,
            result=reply.result,
        )
    seconds = reply.retry_after
    return Outcome(
        ok=False,
        exit_code=TRY_LATER_EXIT,
        duration=duration,
        stderr_tail=tail,
        reason=reply.reason or 'the persistent worker replied "later"',
        result=None if seconds is None else {"retry_after": seconds},
    )
