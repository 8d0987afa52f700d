"""Commands that change what runs: retry, cancel, pause, resume, fsck, drop."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from statequeue.cli.completion import complete_queue
from statequeue.cli.errors import with_queue
from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, StoreOpt, open_queue, store_url
from statequeue.cli.render import emit_json, plural
from statequeue.cli.root import app
from statequeue.core.errors import UsageError
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState

IdsArg = Annotated[list[int] | None, typer.Argument(help="Item ids.", show_default=False)]


@app.command()
def retry(
    ctx: typer.Context,
    ids: IdsArg = None,
    failed: Annotated[bool, typer.Option("--failed", help="Every failed item.")] = False,
    held: Annotated[bool, typer.Option("--held", help="Every held (poison) item.")] = False,
    cancelled: Annotated[
        bool, typer.Option("--cancelled", help="Every cancelled item (a cancel undone).")
    ] = False,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Put failed, held or cancelled items back as pending, so the next run takes them.

    Example: statequeue retry --failed
    """
    if not ids and not (failed or held or cancelled):
        raise UsageError("give item ids, --failed, --held or --cancelled")
    if ids and (failed or held or cancelled):
        raise UsageError("give item ids or --failed/--held/--cancelled, not both")
    q = open_queue(ctx, home, queue, create=False)
    if ids:
        report = q.retry_report(ids)
    else:
        # Chosen by the store under its lock: an item that a concurrent
        # `retry --failed` already put back is not an error.
        flags = (
            (ItemState.FAILED, failed),
            (ItemState.HELD, held),
            (ItemState.CANCELLED, cancelled),
        )
        wanted = [s for s, on in flags if on]
        report = q.retry_report(None, states=wanted)
    if json:
        emit_json({"schema": 1, "changed": report.changed, "recovered": list(report.recovered)})
        return
    if report.recovered:
        # Its runner died during the --verify check: recovery made it pending.
        named = ", ".join(f"#{i}" for i in report.recovered)
        print(
            f"{plural(len(report.recovered), 'item')} recovered, pending again "
            f"(the runner died during the --verify check): {named}"
        )
    if report.put_back or not report.recovered:
        _report(list(report.put_back), "put back as pending", json)


@app.command()
def cancel(
    ctx: typer.Context,
    ids: Annotated[list[int], typer.Argument(help="Item ids.", show_default=False)],
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Cancel pending, failed or held items: they never run (`retry ID` undoes it).

    Example: statequeue cancel 12 13
    """
    q = open_queue(ctx, home, queue, create=False)
    _report(q.cancel(ids), "cancelled", json)


def _report(changed: list[int], what: str, json: bool) -> None:
    if json:
        emit_json({"schema": 1, "changed": changed})
    else:
        print(f"{plural(len(changed), 'item')} {what}")


@app.command()
def pause(
    ctx: typer.Context, home: HomeOpt = None, queue: QueueOpt = None, store: StoreOpt = None
) -> None:
    """Stop runners from taking new items; they finish what they are running.

    Example: statequeue pause && statequeue resume
    """
    open_queue(ctx, home, queue, create=False).pause()
    print(with_queue("paused: runners take no new items until `statequeue resume`"))


@app.command()
def resume(
    ctx: typer.Context, home: HomeOpt = None, queue: QueueOpt = None, store: StoreOpt = None
) -> None:
    """Let runners take items again after `pause` (no restart needed).

    Example: statequeue resume -q crawl
    """
    open_queue(ctx, home, queue, create=False).resume()
    print("resumed")


@app.command()
def fsck(
    ctx: typer.Context,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair", help="Salvage valid records into a new journal; keep the damaged file."
        ),
    ] = False,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> int:
    """Check every record's checksum and sequence; --repair salvages what is valid.

    With a PostgreSQL store: recount the states and compare them with the
    counters `status` shows (--repair corrects them), and report a transaction
    open so long that it holds back vacuum.

    Exit 0 when clean (or repaired), 5 when damage was found and not repaired.

    Example: statequeue fsck || statequeue fsck --repair
    """
    from statequeue.api.maintenance import fsck_queue  # lazy: start-up time

    glob = ctx.obj or {}
    report = fsck_queue(
        queue if queue is not None else glob.get("queue"),
        home=home if home is not None else glob.get("home"),
        store=store_url(ctx),
        repair=repair,
    )
    if json:
        emit_json(report.to_json())
    else:
        for line in report.report_lines():
            print(line)
        for text in report.warnings:
            print(f"warning: {text}", file=sys.stderr)
    if report.damaged and not report.repaired:
        print(f"damage found: {with_queue(report.advice())}", file=sys.stderr)
        return int(ExitCode.DAMAGED)
    return 0


@app.command("drop")
def drop(
    ctx: typer.Context,
    name: Annotated[
        str | None,
        typer.Argument(
            help="The queue to delete (or name it with -q).",
            metavar="QUEUE",
            autocompletion=complete_queue,
            show_default=False,
        ),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    queue: QueueOpt = None,
    home: HomeOpt = None,
    store: StoreOpt = None,
) -> None:
    """Delete a queue with all its items, results and logs.

    The queue is named by its argument or by -q (as every command takes it);
    never the default one by omission. Asks for confirmation on a terminal;
    scripts pass --yes. With a PostgreSQL store, deletes the queue's rows in
    batches; an interrupted drop is finished by running it again. Refused
    (exit 4) while a runner is active on the queue: stop it first.

    Example: statequeue drop old-crawl --yes
    """
    from statequeue.api.maintenance import drop_queue  # lazy: start-up time

    flagged = queue if queue is not None else (ctx.obj or {}).get("queue")
    if name is not None and flagged is not None and name != flagged:
        raise UsageError(f"two queues named: {name!r} and -q {flagged!r}; drop one at a time")
    name = name if name is not None else flagged
    if name is None:  # $STATEQUEUE_QUEUE or the default, by omission: too easy to lose
        raise UsageError("name the queue to drop: `statequeue drop QUEUE` (or -q QUEUE)")

    def confirm(place: str) -> None:
        if not yes:
            if not sys.stdin.isatty():
                raise UsageError(f"refusing to drop {name!r} without confirmation: pass --yes")
            typer.confirm(f"Delete queue {name!r} and everything in {place}?", abort=True)

    given_home = home if home is not None else (ctx.obj or {}).get("home")
    drop_queue(name, home=given_home, store=store_url(ctx), confirm=confirm)
    print(f"dropped queue {name!r}")


app.command("rm", help="Delete a queue (same as `drop`).\n\nExample: statequeue rm old --yes")(drop)
