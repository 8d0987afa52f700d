"""`statequeue run`: the runner's options and its exit code."""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, StoreOpt, open_queue, store_url
from statequeue.cli.render import emit_json
from statequeue.cli.root import app
from statequeue.core.durations import parse_duration
from statequeue.core.errors import UsageError
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import OnInterrupted
from statequeue.core.rates import DEFAULT_MAX_DEFERRALS, RateLimit, parse_rate

if TYPE_CHECKING:
    from statequeue.run.events import RunSummary
    from statequeue.run.guard import GuardLink

RUN_EPILOG = """\
Examples:

  statequeue run -j4 --timeout 10m --retries 3 -- ./fetch.sh {}

  statequeue run --verify 'test -s out/{/.}.json' -- ./convert {} out/{/.}.json

  statequeue run --single --quiet --max-time 50m -- ./nightly {}

  statequeue run --shell -- 'gzip -c {} > {}.gz'

  statequeue run -j8 --rate 20/s -- python call_api.py {}   (exit 75: try later)

  statequeue run --persistent -j4 --recycle-rss 2G -- python worker.py

Replacement strings (as in GNU parallel): {} item, {.} without extension,
{/} basename, {//} dirname, {/.} basename without extension, {#} item id,
{%} job slot.
"""


# Panel titles use words of the options' own help: the commands page (click's
# plain text, without panels) must say every word --help says.
_RECOVERY = "Interrupted items"
_OUTPUT = "Output"
_SWITCHES = "Live output and the journal"
_POSTGRES = "PostgreSQL store"
_RATES = "Rate limit (statequeue help rates)"
_WORKERS = "Persistent workers (statequeue help workers)"


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


@app.command(
    epilog=RUN_EPILOG,
    context_settings={"allow_interspersed_args": False},
)
def run(
    ctx: typer.Context,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="The command to run per item, after `--`.", show_default=False),
    ] = None,
    jobs: Annotated[
        int, typer.Option("--jobs", "-j", help="Items to run at once.", metavar="N")
    ] = 1,
    timeout: Annotated[
        str | None,
        typer.Option(help="Per-item limit: TERM, then KILL after --grace.", metavar="DUR"),
    ] = None,
    grace: Annotated[str, typer.Option(help="Wait after TERM before KILL.", metavar="DUR")] = "5s",
    retries: Annotated[
        int,
        typer.Option(help="Retry up to N failures per episode, with backoff.", metavar="N"),
    ] = 0,
    retry_delay: Annotated[
        str, typer.Option(help="First backoff; doubles, with jitter.", metavar="DUR")
    ] = "1s",
    on_interrupted: Annotated[
        str,
        typer.Option(
            help="Items whose runner died: retry, fail or hold.",
            metavar="POLICY",
            rich_help_panel=_RECOVERY,
        ),
    ] = "retry",
    verify: Annotated[
        str | None,
        typer.Option(
            help="Check run as sh -c SCRIPT sh ITEM before an interrupted item runs "
            "again; exit 0: done.",
            metavar="SCRIPT",
            rich_help_panel=_RECOVERY,
        ),
    ] = None,
    verify_first: Annotated[
        bool,
        typer.Option(
            "--verify-first",
            help="Also --verify before each item's first run (skips what is done).",
            rich_help_panel=_RECOVERY,
        ),
    ] = False,
    max_crashes: Annotated[
        int,
        typer.Option(
            help="Hold an item as poison after N runner crashes.",
            metavar="N",
            rich_help_panel=_RECOVERY,
        ),
    ] = 3,
    limit: Annotated[
        int | None,
        # 0 is refused (exit 2), as `xargs -n 0` is: it would run nothing.
        typer.Option(help="Process at most N items.", metavar="N", min=1),
    ] = None,
    max_time: Annotated[
        str | None,
        typer.Option(help="Take no new items after this long.", metavar="DUR"),
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", help="Wait for new items until a signal.")
    ] = False,
    halt_on_failure: Annotated[
        bool, typer.Option("--halt-on-failure", help="No new item after a failure.")
    ] = False,
    single: Annotated[
        bool,
        typer.Option("--single", help="Exit 4 if another runner is active."),
    ] = False,
    shell: Annotated[
        bool,
        typer.Option("--shell", help="Run the words, joined, with sh -c (items quoted)."),
    ] = False,
    stdin: Annotated[
        bool, typer.Option("--stdin", help="Feed the item on the child's stdin.")
    ] = False,
    persistent: Annotated[
        bool,
        typer.Option(
            "--persistent",
            help="One COMMAND per slot for all items (statequeue help workers).",
            rich_help_panel=_WORKERS,
        ),
    ] = False,
    recycle_after: Annotated[
        int | None,
        typer.Option(
            "--recycle-after",
            help="Replace a persistent worker after N items.",
            metavar="N",
            show_default=False,
            rich_help_panel=_WORKERS,
        ),
    ] = None,
    recycle_rss: Annotated[
        str | None,
        typer.Option(
            "--recycle-rss",
            help="Replace a persistent worker at SIZE of memory.",
            metavar="SIZE",
            show_default=False,
            rich_help_panel=_WORKERS,
        ),
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live",
            help="Show the children's output live (default: with -j1 on a terminal).",
            show_default=False,
            rich_help_panel=_SWITCHES,
        ),
    ] = None,
    auto_compact: Annotated[
        bool,
        typer.Option(
            "--auto-compact/--no-auto-compact",
            help="Compact the journal as dead records pile up.",
            rich_help_panel=_SWITCHES,
        ),
    ] = True,
    log_limit: Annotated[
        int,
        typer.Option(
            help="Output bytes kept per attempt.",
            metavar="BYTES",
            rich_help_panel=_OUTPUT,
        ),
    ] = 1 << 20,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            help="Stderr stays empty unless an item failed for good or a warning "
            "needs action (cron).",
            rich_help_panel=_OUTPUT,
        ),
    ] = False,
    exit_empty: Annotated[
        int,
        typer.Option(
            help="Exit code when nothing was due.",
            metavar="CODE",
            min=0,
            max=255,
            rich_help_panel=_OUTPUT,
        ),
    ] = 0,
    lease: Annotated[
        str,
        typer.Option(
            help="How long a claim's lease lasts (renewed every third).",
            metavar="DUR",
            rich_help_panel=_POSTGRES,
        ),
    ] = "30s",
    give_up_after: Annotated[
        str | None,
        typer.Option(
            "--give-up-after",
            help="Exit 11 once the database was unreachable this long "
            "(default: 10m; never with --follow; 0: never).",
            metavar="DUR",
            show_default=False,
            rich_help_panel=_POSTGRES,
        ),
    ] = None,
    rate: Annotated[
        str | None,
        typer.Option(
            help="Most starts a second, minute or hour (statequeue help rates).",
            metavar="N/s|N/m|N/h",
            show_default=False,
            rich_help_panel=_RATES,
        ),
    ] = None,
    burst: Annotated[
        int,
        typer.Option(
            help="Starts at once after a pause, above the rate limit.",
            metavar="N",
            rich_help_panel=_RATES,
        ),
    ] = 1,
    max_deferrals: Annotated[
        int,
        typer.Option(
            help="Fail an item after N exit 75s (later).",
            metavar="N",
            rich_help_panel=_RATES,
        ),
    ] = DEFAULT_MAX_DEFERRALS,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> int:
    """Run COMMAND once per pending item, recording each result before the next.

    {} in an argument becomes the item (see below for its parts); without
    one, the item is the last argument. No shell runs it unless --shell.
    Details: statequeue help commands.

    Example: statequeue run -j4 -- python worker.py {}
    """
    # lazy: start-up time (the run's options, only for `run`)
    from statequeue.run.guard import report_runner_cpu
    from statequeue.run.options import RunOptions, parse_size, parse_verify
    from statequeue.run.resources import stop_when_short_of_resources
    from statequeue.run.shell_command import shell_template

    if not command:
        raise UsageError("no command given: use `statequeue run [OPTIONS] -- COMMAND [ARG]...`")
    try:
        policy = OnInterrupted(on_interrupted)
    except ValueError:
        raise UsageError(
            f"--on-interrupted must be retry, fail or hold, not {on_interrupted!r}"
        ) from None
    options = RunOptions(
        command=shell_template(tuple(command)) if shell else tuple(command),
        jobs=jobs,
        timeout=_duration(timeout) or None,  # 0: no limit, as for coreutils' timeout
        grace=_duration(grace) or 0.0,
        retries=retries,
        retry_delay=_duration(retry_delay) or 0.0,
        on_interrupted=policy,
        max_crashes=max_crashes,
        verify=parse_verify(verify) if verify is not None else "",
        verify_first=verify_first,
        limit=limit,
        max_time=_max_time(max_time),
        follow=follow,
        halt_on_failure=halt_on_failure,
        single=single,
        item_on_stdin=stdin,
        log_limit=log_limit,
        lease=_duration(lease),
        give_up_after=_duration(give_up_after),
        rate=_rate(rate, burst),
        max_deferrals=max_deferrals,
        persistent=persistent,
        recycle_after=recycle_after,
        recycle_rss=None if recycle_rss is None else parse_size(recycle_rss, "--recycle-rss"),
    )
    with stop_when_short_of_resources():  # EMFILE anywhere: exit 10, as at a spawn
        link = _guard(store_url(ctx) is not None)  # before any thread, fd or store is opened
        # lazy: start-up time (imported after the fork: in the runner alone,
        # while the keeper starts beside it)
        from statequeue.cli.progress import LiveSink, make_view
        from statequeue.run.runner import Runner

        q = open_queue(ctx, home, queue, create=False, auto_compact=None if auto_compact else 0)
        tty = sys.stderr is not None and sys.stderr.isatty()  # None: started with it closed
        on_tty = sys.stdout is not None and sys.stdout.isatty()
        show_live = live if live is not None else (jobs == 1 and on_tty and not quiet)
        pending = q.status().counts["pending"]
        view = make_view(tty=tty and not json, live=show_live, quiet=quiet, total=pending)
        sink = LiveSink() if show_live else None
        try:
            runner = Runner(q, options, on_event=view.handle, live=sink, guard=link)
            runner.install_signal_handlers()  # INT, TERM and HUP (a closed terminal)
            summary = runner.run()
        finally:
            view.close()
            report_runner_cpu()  # $STATEQUEUE_BENCH_CPU (scripts/bench.py), in both shapes
    code = _exit_code(summary, follow=follow, exit_empty=exit_empty)
    if not json:
        view.summary(f"statequeue: {summary.text()}", failed=summary.failed > 0)
        return code
    # If the reader went away, the exit code still tells what happened.
    with contextlib.suppress(BrokenPipeError):
        emit_json(_summary_json(summary, code))
    return code


def _guard(has_leases: bool) -> GuardLink | None:
    """Fork into the guarded shape (run/guard.py) when this process is the
    console command's own (never inside a caller's process, e.g. a test's
    CliRunner) and the store needs no fencing keeper (no leases: the
    PostgreSQL store has them, see Store.has_leases)."""
    from statequeue.cli import root  # lazy: start-up time (only `run` forks)
    from statequeue.run import guard  # lazy: start-up time (only `run` forks)

    if not root.OWNS_PROCESS or has_leases or not guard.available():
        return None
    return guard.launch()


def _summary_json(summary: RunSummary, code: int) -> dict[str, int]:
    return {
        "succeeded": summary.succeeded,
        "failed": summary.failed,
        "retry_pending": summary.retried,
        "verified": summary.verified,
        "interrupted": summary.released,
        "attempts": summary.attempts,
        "started": summary.attempts,
        "exit_code": code,
    }


def _exit_code(summary: RunSummary, *, follow: bool, exit_empty: int) -> int:
    """The run's exit code (`statequeue help exit-codes`)."""
    if follow and summary.stopped_by == signal.SIGTERM and summary.clean_stop:
        return int(ExitCode.OK)  # a service's normal stop (systemd sends TERM)
    if summary.stopped_by == signal.SIGINT:
        return int(ExitCode.INTERRUPTED_INT)
    if summary.stopped_by == signal.SIGHUP:
        return int(ExitCode.INTERRUPTED_HUP)
    if summary.stopped_by is not None:
        return int(ExitCode.INTERRUPTED_TERM)
    if summary.failed:
        return int(ExitCode.FAILED)
    if summary.attempts == 0 and summary.verified == 0 and not summary.waiting:
        return exit_empty
    return int(ExitCode.OK)
