"""Read commands: list, show, results, queues, path, events (logs: logs_cmd.py)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO

import orjson
import typer

from statequeue.cli.attempt_numbers import latest_attempt, logged_attempt
from statequeue.cli.errors import hint_for
from statequeue.cli.event_text import describe_events
from statequeue.cli.options import (
    HomeOpt,
    ItemIdArg,
    ItemTextOpt,
    JsonOpt,
    QueueOpt,
    ResultStateOpt,
    StateOpt,
    StoreOpt,
    open_queue,
    parse_state,
    store_url,
)
from statequeue.cli.render import emit_json, err, escaped, plural, shown
from statequeue.cli.root import app
from statequeue.core.errors import NoAccess, StateQueueError, UsageError
from statequeue.core.exitcodes import ExitCode
from statequeue.core.textsafe import record_json

if TYPE_CHECKING:
    from statequeue.core.views import ItemHistory, Status

IdArg = Annotated[int, typer.Argument(help="The item id (see `statequeue list`).", min=1)]


def _write(line: str) -> None:
    sys.stdout.write(line + "\n")


@app.command("list")
def list_items(
    ctx: typer.Context,
    state: StateOpt = None,
    json: Annotated[
        bool, typer.Option("--json", help="One JSON object per line (NDJSON).")
    ] = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """List items, one per line, in id order (streams; fine on a million items).

    A running item whose runner died (`status` lists it as interrupted) shows
    as interrupted; one whose dead runner's processes still run it, as orphaned;
    with --json its state stays running, with "interrupted" or
    "held_by_dead_runner": true.

    Example: statequeue list --state failed --json | jq -r .item
    """
    wanted = parse_state(state)
    q = open_queue(ctx, home, queue, create=False)
    out = sys.stdout.buffer
    for view in q.iter_items(wanted):
        if json:
            out.write(orjson.dumps(view.to_json()) + b"\n")
        else:
            # "interrupted" as `status` says it: running, but its runner died
            # (one word: the columns stay as they were; --json keeps "state").
            state_text = (
                "interrupted"
                if view.interrupted
                else "orphaned"
                if view.held_by_dead_runner
                else view.state.value
            )
            line = f"{view.item_id}\t{state_text}\t{view.attempts}\t{escaped(view.item)}"
            out.write(line.encode("utf-8", "replace") + b"\n")


@app.command()
def show(
    ctx: typer.Context,
    item_id: ItemIdArg = None,
    item: ItemTextOpt = None,
    json: JsonOpt = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Show one item: its state, every attempt, the result and the stderr tail.

    Name it by id, or by its exact text with --item (exit 7 when no item has it).

    Example: statequeue show 42; statequeue show --item https://example.org/a
    """
    if (item_id is None) == (item is None):
        raise UsageError("give an item id or --item TEXT (one of them)")
    q = open_queue(ctx, home, queue, create=False)
    h = q.history(item_id if item_id is not None else item)
    if json:
        emit_json(h.to_json())
        return
    _write(f"item {h.item_id}: {escaped(h.item)}")
    _write(f"state: {h.state.value}{_interrupted_note(h)}")
    _write("history (--retries counts failures per episode; `retry` or a stop starts one):")
    episode = 0
    for ev, line in zip(h.events, describe_events(h.events)[0], strict=True):
        if ev.get("episode", episode) != episode:
            episode = ev["episode"]
            _write(f" episode {episode}:")
        _write(f"  {line}")
    if h.result is not None:
        _write("result: " + orjson.dumps(h.result).decode())
    if h.stderr_tail:
        _write("stderr (tail):")
        for line in h.stderr_tail.rstrip("\n").split("\n")[-20:]:
            _write(f"  {shown(line, 400)}")
    cuts = h.log_cuts()
    for path in h.log_paths:
        cut = cuts.pop(logged_attempt(path), None)
        _write(f"log: {shown(path, 400)}" + (f" (cut: {shown(cut, 80)})" if cut else ""))
    for attempt, cut in sorted(cuts.items()):  # no log file could be made (a full disk)
        _write(f"log: none kept for attempt {attempt} ({shown(cut, 80)})")


def _interrupted_note(h: ItemHistory) -> str:
    """What `status` says of the item when its runner died while it ran."""
    attempt = latest_attempt(h)
    if h.held_by_dead_runner:
        return (
            f" (orphaned: its runner died during attempt {attempt}, whose processes still run;"
            " no run takes it until they end, then the next run recovers it)"
        )
    if not h.interrupted:
        return ""
    return f" (interrupted: its runner died during attempt {attempt}; the next run recovers it)"


class _BytesOut:
    """A text sink for csv.writer that writes straight to stdout's bytes.

    CSV is for programs: the item's exact bytes, as `find -print` gives them
    (surrogate escapes back to their bytes). Not a TextIOWrapper: one left
    behind by a broken pipe closes stdout when it is collected."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out

    def write(self, text: str) -> int:
        return self.out.write(text.encode("utf-8", "surrogateescape"))


@app.command()
def results(
    ctx: typer.Context,
    state: ResultStateOpt = None,
    json: Annotated[bool, typer.Option("--json", help="NDJSON, one result per line.")] = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV with a header row.")] = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Stream the result of every finished item, archived ones included.

    Example: statequeue results --state failed --json | jq -r .item
    """
    if json and csv:
        raise UsageError("choose one of --json and --csv")
    wanted = parse_state(state)
    q = open_queue(ctx, home, queue, create=False)
    found = q.iter_results(wanted)  # checks the state before anything is printed
    out = sys.stdout.buffer
    writer: Any = None
    if csv:
        import csv as csvmod  # lazy: start-up time (only --csv)

        writer = csvmod.writer(_BytesOut(out))
        writer.writerow(["id", "item", "state", "attempt", "exit", "duration", "reason", "result"])
    for r in found:
        if json:
            out.write(orjson.dumps(r.to_json()) + b"\n")
        elif writer is not None:
            res = "" if r.result is None else orjson.dumps(r.result).decode()
            writer.writerow(
                [
                    r.item_id,
                    r.item,
                    r.state.value,
                    r.attempt,
                    r.exit_code,
                    r.duration,
                    r.reason,
                    res,
                ]
            )
        else:
            # The result as `show` prints it: compact JSON is one line, its
            # control characters escaped by JSON itself; escaping it again
            # (\" as \\") made it invalid JSON. A reason is text: escaped.
            res = "" if r.result is None else orjson.dumps(r.result).decode()
            last = escaped(r.reason) if r.reason else res
            line = f"{r.item_id}\t{r.state.value}\t{escaped(r.item)}\t{last}"
            out.write(line.encode("utf-8", "replace") + b"\n")


@app.command()
def queues(
    ctx: typer.Context, json: JsonOpt = False, home: HomeOpt = None, store: StoreOpt = None
) -> int:
    """List every queue under the home (or in the PostgreSQL store), with its counts.

    A queue too damaged to open is listed on its own line as damaged, with
    the reason (in --json: {"queue": NAME, "damaged": REASON}); the others
    are listed as usual, and the exit code is 5 (run `statequeue -q NAME fsck`).

    Example: statequeue queues --json
    """
    from statequeue.api.maintenance import list_queues, queues_place  # lazy: start-up time

    given_home = home if home is not None else (ctx.obj or {}).get("home")
    where, place = queues_place(given_home, store=store_url(ctx))
    damaged: dict[str, str] = {}
    unreadable: list[NoAccess] = []
    # One unsafe entry (a link) must not hide every good queue: warn, skip it;
    # nor one damaged queue: it is listed as such; nor one this user cannot
    # read: skipped with a warning, and the exit code is its error's.
    rows = list_queues(
        given_home,
        store=store_url(ctx),
        on_unsafe=_warn_skipped,
        on_damaged=lambda name, exc: damaged.update({name: hint_for(exc.message, name)}),
        on_no_access=unreadable.append,
    )
    _show_queues(rows, damaged, where, place, json)
    for exc in unreadable:
        _warn_skipped(exc)
    if damaged:
        if len(damaged) == 1:
            (name,) = damaged
            err(f"statequeue: queue {name!r} is damaged; run `statequeue -q {name} fsck`")
        else:
            names = ", ".join(repr(name) for name in damaged)
            err(f"statequeue: queues {names} are damaged; run `statequeue -q NAME fsck` on each")
        return int(ExitCode.DAMAGED)
    return int(unreadable[0].exit_code) if unreadable else int(ExitCode.OK)


def _warn_skipped(exc: StateQueueError) -> None:
    err(f"statequeue: warning: skipped: {exc.message}")


def _show_queues(
    rows: list[Status], damaged: dict[str, str], where: str, place: str, json: bool
) -> None:
    entries: list[tuple[str, Status | str]] = [(s.queue, s) for s in rows]
    entries += damaged.items()
    entries.sort(key=lambda entry: entry[0])  # by name, as the folders are listed
    if json:
        listed = [
            {"schema": 1, "queue": name, "damaged": e} if isinstance(e, str) else e.to_json()
            for name, e in entries
        ]
        emit_json({"schema": 1, where: place, "queues": listed})
        return
    if not entries:
        _write(f"no queues in {place}")
    for name, e in entries:
        if isinstance(e, str):
            _write(f"{name}\tdamaged\t{escaped(e)}")
            continue
        _write(f"{e.queue}\t{plural(e.total, 'item')}\t{_counts_text(e) or 'empty'}")


def _counts_text(status: Status) -> str:
    """``pending 3  running 2 (1 interrupted)``: the running items whose
    runner died are said so, as `status` lists them: interrupted, or
    orphaned (still run by a process of the dead runner; `report` says so)."""
    notes = [
        f"{len(ids)} {what}"
        for ids, what in (
            (status.interrupted, "interrupted"),
            (status.held_by_dead_runner, "orphaned"),
        )
        if ids
    ]
    parts = []
    for state, n in status.counts.items():
        if n:
            note = f" ({', '.join(notes)})" if state == "running" and notes else ""
            parts.append(f"{state} {n}{note}")
    return "  ".join(parts)


@app.command()
def path(
    ctx: typer.Context, home: HomeOpt = None, queue: QueueOpt = None, store: StoreOpt = None
) -> None:
    """Print the queue's folder (for backups and scripts).

    A queue in a PostgreSQL store has no folder: prints the store's URL (the
    password masked) and the queue's name, separated by a tab.

    Example: tar czf backup.tgz -C "$(dirname "$(statequeue path)")" default
    """
    q = open_queue(ctx, home, queue, create=False)
    url = store_url(ctx)
    if url is not None:
        from statequeue.store.urls import mask  # lazy: start-up time (the store package)

        _write(f"{mask(url)}\t{q.name}")
        return
    _write(str(q.path))


@app.command()
def events(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    json: Annotated[bool, typer.Option("--json", help="NDJSON, one record per line.")] = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Print the journal as an event stream (enqueues, starts, results, recoveries).

    Example: statequeue events --follow --json | jq 'select(.t == "intr")'
    """
    q = open_queue(ctx, home, queue, create=False)
    out = sys.stdout.buffer
    last: float | None = None
    # Ctrl-C ends --follow as it ends every other command: exit 130 (SIGINT), not 0.
    for found in q.event_batches(follow=follow):
        last = _print_events(out, found, json, last)
        out.flush()


def _print_events(
    out: Any, records: list[dict[str, Any]], json: bool, last: float | None
) -> float | None:
    """Write ``records``; returns the last known time (see ``describe_events``)."""
    if json:
        for rec in records:
            out.write(orjson.dumps({"schema": 1, **record_json(rec)}) + b"\n")
        return last
    lines, last = describe_events(records, last)
    for line in lines:
        out.write(line.encode("utf-8", "replace") + b"\n")
    return last
