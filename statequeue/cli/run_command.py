"""`statequeue run`: its options as typer declares them (help, parsing).

What the run does with them is run_start.py's, shared with main.py's fast
path for a plain `run`."""

from __future__ import annotations

from typing import Annotated

import typer

from statequeue.cli import process
from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, StoreOpt, given_store
from statequeue.cli.root import app
from statequeue.cli.run_start import RUN_DEFAULTS, Where, start_run
from statequeue.core.rates import DEFAULT_MAX_DEFERRALS

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
        str,
        typer.Option(
            help="Output kept per attempt (500K, 1M).",
            metavar="SIZE",
            rich_help_panel=_OUTPUT,
        ),
    ] = "1M",
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
            help="Most starts a second, minute or hour, for runners given --rate (help rates).",
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
            help="Fail an item deferred more than N times.",
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
    given = dict(locals())
    args = {name: given[name] for name in RUN_DEFAULTS}
    glob = ctx.obj or {}
    where = Where(
        home if home is not None else glob.get("home"),
        queue if queue is not None else glob.get("queue"),
        given_store(ctx),
    )
    return start_run(args, where, owns_process=process.OWNS_PROCESS)
