"""`statequeue run` once its command line is parsed: options, guard, runner, exit code.

Without typer or click: the typer command (run_command.py) and main.py's fast
path for a plain `run` (cli/run_argv.py) both end here, with the same
``RunArgs``, so the two cannot differ past parsing. A plain `run` then skips
importing typer and click (~30 ms of its start; issue 27).
"""

from __future__ import annotations

import contextlib
import shlex
import signal
import sys
from typing import TYPE_CHECKING, Any

from statequeue.core.durations import parse_duration
from statequeue.core.errors import (
    KeeperLost,
    QueueNotFound,
    RunnerActive,
    StateQueueError,
    StoreFailed,
    StoreUnreachable,
    UsageError,
)
from statequeue.core.exitcodes import ExitCode
from statequeue.core.location import DEFAULT_QUEUE
from statequeue.core.models import OnInterrupted
from statequeue.core.rates import DEFAULT_MAX_DEFERRALS, RateLimit, parse_rate

if TYPE_CHECKING:
    from collections.abc import Callable

    from statequeue.api.queue import Queue
    from statequeue.cli.progress import View
    from statequeue.run.events import RunSummary
    from statequeue.run.guard import GuardLink
    from statequeue.run.options import RunOptions

RUN_DEFAULTS: dict[str, Any] = {
    "command": None,
    "jobs": 1,
    "timeout": None,
    "grace": "5s",
    "retries": 0,
    "retry_delay": "1s",
    "on_interrupted": "retry",
    "verify": None,
    "verify_first": False,
    "max_crashes": 3,
    "limit": None,
    "max_time": None,
    "follow": False,
    "halt_on_failure": False,
    "single": False,
    "shell": False,
    "stdin": False,
    "persistent": False,
    "recycle_after": None,
    "recycle_rss": None,
    "live": None,
    "auto_compact": True,
    "log_limit": "1M",
    "quiet": False,
    "exit_empty": 0,
    "lease": "30s",
    "give_up_after": None,
    "rate": None,
    "burst": 1,
    "max_deferrals": DEFAULT_MAX_DEFERRALS,
    "json": False,
}
"""Every option of `run` as the typer command declares it (its parameter
names and defaults; a test holds the two equal), less --home, --queue and
--store, which come with ``Where``."""

RunArgs = dict[str, Any]
"""``RUN_DEFAULTS`` with what the command line gave, the values as typer
passes them (strings for durations, sizes, rates; ints and bools converted)."""


class Where:
    """The queue the command line names: command options win over global ones."""

    def __init__(self, home: str | None, queue: str | None, store: str | None) -> None:
        self.home = home
        self.queue = queue
        self.store = store
        """--store as given (None: $STATEQUEUE_STORE, else the local journal)."""


def start_run(args: RunArgs, where: Where, *, owns_process: bool) -> int:
    """Run the queue's items as ``args`` say; the run's exit code.
    ``owns_process``: this is the console command's own process, which may
    fork into the guarded shape (run/guard.py)."""
    # lazy: start-up time (the run's options, only for `run`)
    from statequeue.run.guard import report_runner_cpu
    from statequeue.run.resources import stop_when_short_of_resources
    from statequeue.store.opening import chosen_url

    options = _options(args)
    store = chosen_url(where.store)
    with stop_when_short_of_resources(jobs=options.jobs):  # EMFILE anywhere: exit 10
        # before any thread, fd or store is opened
        link = _guard(store is not None) if owns_process else None
        if owns_process and link is None and store is not None:
            # The keeper's children come to us if it dies: none may outlive
            # it while its items are given back (run/orphans.py, promise 4).
            from statequeue.run.orphans import adopt_orphans  # lazy: start-up time

            adopt_orphans()
        # lazy: start-up time (imported after the fork: in the runner alone,
        # while the keeper starts beside it)
        from statequeue.api.queue import Queue
        from statequeue.cli.progress import LiveSink, make_view
        from statequeue.cli.render import print_notices
        from statequeue.run.runner import Runner
        from statequeue.run.wakeup import follow_poll

        follow_poll()  # a bad STATEQUEUE_FOLLOW_POLL is refused before a queue is made
        auto_compact = None if args["auto_compact"] else 0
        quiet, json = args["quiet"], args["json"]
        with _reached(
            lambda: _open_queue(Queue, where, auto_compact, store, follow=options.follow),
            options,
        ) as q:
            print_notices(q.notices())
            tty = sys.stderr is not None and sys.stderr.isatty()  # None: started with it closed
            on_tty = sys.stdout is not None and sys.stdout.isatty()
            live = args["live"]
            show_live = live if live is not None else (options.jobs == 1 and on_tty and not quiet)
            pending = q.status().counts["pending"]
            view = make_view(tty=tty and not json, live=show_live, quiet=quiet, total=pending)
            sink = LiveSink() if show_live else None
            lost: StateQueueError | None = None
            runner: Runner | None = None
            try:
                runner = Runner(q, options, on_event=view.handle, live=sink, guard=link)
                runner.install_signal_handlers()  # INT, TERM and HUP (a closed terminal)
                summary = runner.run()
            except StateQueueError as exc:  # its summary too: what was done before it
                if quiet and isinstance(exc, RunnerActive):
                    # `--single --quiet` in cron: the last run still going is
                    # the overlap --single is for, not news to mail; exit 4 says it.
                    return int(exc.exit_code)
                if runner is None or not (
                    isinstance(exc, KeeperLost) or runner.summary.settled_any or json
                ):
                    # Before the run began, or no attempt ended: nothing to sum
                    # up (but --json promises its object once the run began).
                    raise
                lost, summary = exc, runner.summary
                if not isinstance(exc, (StoreUnreachable, StoreFailed)):
                    summary.ended(q.store, None)  # the store still answers: ask it
            finally:
                view.close()
                report_runner_cpu()  # $STATEQUEUE_BENCH_CPU (scripts/bench.py), in both shapes
    if lost is not None:
        _say_summary(view, summary, json, int(lost.exit_code))
        raise lost  # its line, and its exit code
    code = exit_code(summary, follow=options.follow, exit_empty=args["exit_empty"])
    _say_summary(view, summary, json, code)
    return code


def _say_summary(view: View, summary: RunSummary, json: bool, code: int) -> None:
    """The run's summary: its line on stderr, or with --json its object."""
    if not json:
        view.summary(f"statequeue: {summary.text()}", failed=summary.needs_a_look)
        return
    # lazy: start-up time (the JSON summary only)
    from statequeue.cli.render import emit_json

    # If the reader went away, the exit code still tells what happened.
    with contextlib.suppress(BrokenPipeError):
        emit_json(_summary_json(summary, code))


def _options(args: RunArgs) -> RunOptions:
    """The runner's options; UsageError for a value that cannot be one."""
    # lazy: start-up time (the run's options, only for `run`)
    from statequeue.core.command_text import given_shell
    from statequeue.run.options import RunOptions, parse_log_limit, parse_size, parse_verify
    from statequeue.run.shell_command import shell_template

    command = args["command"]
    if not command:
        raise UsageError("no command given: use `statequeue run [OPTIONS] -- COMMAND [ARG]...`")
    try:
        policy = OnInterrupted(args["on_interrupted"])
    except ValueError:
        raise UsageError(
            f"--on-interrupted must be retry, fail or hold, not {args['on_interrupted']!r}"
        ) from None
    verify, rss = args["verify"], args["recycle_rss"]
    return RunOptions(
        command=(
            shell_template(tuple(command), persistent=args["persistent"])
            if args["shell"]
            else tuple(command)
        ),
        given_command=given_shell(command) if args["shell"] else (),
        jobs=args["jobs"],
        timeout=_duration(args["timeout"]) or None,  # 0: no limit, as for coreutils' timeout
        grace=_duration(args["grace"]) or 0.0,
        retries=args["retries"],
        retry_delay=_duration(args["retry_delay"]) or 0.0,
        on_interrupted=policy,
        max_crashes=args["max_crashes"],
        verify=parse_verify(verify) if verify is not None else "",
        verify_first=args["verify_first"],
        limit=args["limit"],
        max_time=_max_time(args["max_time"]),
        follow=args["follow"],
        halt_on_failure=args["halt_on_failure"],
        single=args["single"],
        item_on_stdin=args["stdin"],
        log_limit=parse_log_limit(args["log_limit"]),
        lease=_duration(args["lease"]),
        give_up_after=_duration(args["give_up_after"]),
        rate=_rate(args["rate"], args["burst"]),
        max_deferrals=args["max_deferrals"],
        persistent=args["persistent"],
        recycle_after=args["recycle_after"],
        recycle_rss=None if rss is None else parse_size(rss, "--recycle-rss"),
    )


def _duration(value: str | None) -> float | None:
    return None if value is None else parse_duration(value)


def _max_time(value: str | None) -> float | None:
    """--max-time: 0 is refused (exit 2), as --limit 0 is: it would take no item."""
    seconds = _duration(value)
    if seconds is not None and seconds <= 0:
        raise UsageError("--max-time must be more than 0 (leave it out for no limit)")
    return seconds


def _rate(value: str | None, burst: int) -> RateLimit | None:
    if value is None:
        if burst != 1:
            raise UsageError("--burst needs --rate")
        return None
    return parse_rate(value, burst)


def _guard(has_leases: bool) -> GuardLink | None:
    """Fork into the guarded shape (run/guard.py), unless the store needs a
    fencing keeper (leases: the PostgreSQL store has them, see
    Store.has_leases) or the shape is not available here."""
    from statequeue.run import guard  # lazy: start-up time (only `run` forks)

    if has_leases or not guard.available():
        return None
    return guard.launch()


def _summary_json(summary: RunSummary, code: int) -> dict[str, int | list[int]]:
    return {
        "schema": 1,  # as every --json object
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "held": summary.held,
        "retry_pending": summary.retry_pending,
        "deferred": len(summary.deferred),
        "verified": summary.verified,
        "interrupted": summary.released,
        "left_pending": summary.left_pending,
        "attempts": summary.attempts,
        "started": summary.attempts,
        "held_by_dead_runner": list(summary.held_by_dead_runner),
        "silent_runner_items": list(summary.silent),
        "cut_short": sorted(summary.cut_short),
        "output_cut": sorted(summary.output_cut),
        "exit_code": code,
    }


def exit_code(summary: RunSummary, *, follow: bool, exit_empty: int) -> int:
    """The run's exit code (`statequeue help exit-codes`)."""
    if follow and summary.stopped_by == signal.SIGTERM and summary.clean_stop:
        return int(ExitCode.OK)  # a service's normal stop (systemd sends TERM)
    if summary.stopped_by == signal.SIGINT:
        return int(ExitCode.INTERRUPTED_INT)
    if summary.stopped_by == signal.SIGHUP:
        return int(ExitCode.INTERRUPTED_HUP)
    if summary.stopped_by is not None:
        return int(ExitCode.INTERRUPTED_TERM)
    if summary.needs_a_look:  # an item failed for good, or was held
        return int(ExitCode.FAILED)
    if (
        summary.attempts == 0
        and summary.verified == 0
        and not summary.waiting
        and not summary.left_pending  # --max-time ran out with items pending: not empty
    ):
        return exit_empty
    return int(ExitCode.OK)


START_RETRY_MAX = 30.0
"""Seconds at most between tries to reach a store that was down as the run began."""


def _reached(open_queue: Callable[[], Queue], options: RunOptions) -> Queue:
    """The queue, once its store answers. A store down as the run begins
    (PostgreSQL restarting; a service started before its database) is tried
    again with backoff, as an outage during the run is: with --follow for as
    long as --give-up-after allows (default: for good), without it only when
    --give-up-after is given (a cron job is told at once, exit 11)."""
    import time  # lazy: start-up time (only when the store is down)

    from statequeue.run.outage import outage_limit  # lazy: start-up time (idem)

    began = time.monotonic()
    pause, said = 1.0, False
    while True:
        try:
            return open_queue()
        except StoreUnreachable as exc:
            if not options.follow and options.give_up_after is None:
                raise
            limit = outage_limit(options.give_up_after, follow=options.follow)
            waited = time.monotonic() - began
            if limit is not None and waited >= limit:
                raise
            if not said:
                said = True
                print(f"statequeue: {exc}; trying again with backoff", file=sys.stderr, flush=True)
            time.sleep(pause if limit is None else min(pause, limit - waited))
            pause = min(pause * 2, START_RETRY_MAX)


def _open_queue(
    queue: type[Queue], where: Where, auto_compact: int | None, store: str | None, *, follow: bool
) -> Queue:
    """The queue to run; with --follow (a service, perhaps started before the
    first enqueue) a missing one is created, and said so, instead of exit 7."""
    try:
        return queue(
            where.queue, home=where.home, create=False, auto_compact=auto_compact, store=store
        )
    except QueueNotFound as exc:
        if not follow:
            # `seq 3 | statequeue run -- echo`: run takes items from a queue,
            # never from its stdin (its commands may read that).
            name = where.queue or DEFAULT_QUEUE
            named = f" -q {shlex.quote(name)}" if name != DEFAULT_QUEUE else ""
            hint = f"put items in it first: ... | statequeue{named} enqueue"
            raise QueueNotFound(f"{exc}; {hint}") from None
    q = queue(where.queue, home=where.home, create=True, auto_compact=auto_compact, store=store)
    print(
        f"statequeue: queue {q.name} did not exist: created it; waiting for items", file=sys.stderr
    )
    return q
