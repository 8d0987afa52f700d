"""Read commands: list, show, logs, results, queues, path, events."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO

import orjson
import typer

from statequeue.cli.completion import complete_state
from statequeue.cli.errors import hint_for, with_queue
from statequeue.cli.event_text import describe_events
from statequeue.cli.logs_all import attempt_json, write_all_logs
from statequeue.cli.options import (
    HomeOpt,
    JsonOpt,
    QueueOpt,
    StoreOpt,
    open_queue,
    store_url,
)
from statequeue.cli.render import emit_json, err, escaped, plural, shown
from statequeue.cli.root import app
from statequeue.core.errors import ItemNotFound, NoAccess, StateQueueError, UsageError
from statequeue.core.exitcodes import ExitCode
from statequeue.core.models import ItemState, item_state
from statequeue.core.textsafe import record_json

if TYPE_CHECKING:
    from statequeue.api.queue import Queue
    from statequeue.core.views import ItemHistory, Status

StateOpt = Annotated[
    str | None,
    typer.Option(
        "--state",
        "-s",
        metavar="STATE",
        help="Only items in STATE: pending, running, done, failed, cancelled or held.",
        autocompletion=complete_state,
    ),
]
IdArg = Annotated[int, typer.Argument(help="The item id (see `statequeue list`).", min=1)]


def parse_state(value: str | None) -> ItemState | None:
    """``--state``: the library's check (UnknownState, a usage error, exit 2)."""
    return None if value is None else item_state(value)


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
            line = f"{view.item_id}\t{state_text}\t{view.attempts}\t{shown(view.item, 200)}"
            out.write(line.encode("utf-8", "replace") + b"\n")


@app.command()
def show(
    ctx: typer.Context,
    item_id: Annotated[
        int | None,
        typer.Argument(help="The item id (see `statequeue list`).", min=1, show_default=False),
    ] = None,
    item: Annotated[
        str | None,
        typer.Option("--item", metavar="TEXT", help="The item with exactly this text (not an id)."),
    ] = None,
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
    _write(f"item {h.item_id}: {shown(h.item, 200)}")
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
        cut = cuts.pop(_logged_attempt(path), None)
        _write(f"log: {shown(path, 400)}" + (f" (cut: {shown(cut, 80)})" if cut else ""))
    for attempt, cut in sorted(cuts.items()):  # no log file could be made (a full disk)
        _write(f"log: none kept for attempt {attempt} ({shown(cut, 80)})")


def _logged_attempt(path: str) -> int:
    """The attempt a log is of: its name is ID.N.log (a file's, or a stored log's)."""
    return int(os.path.basename(path).split(".")[1])


@app.command()
def logs(
    ctx: typer.Context,
    item_id: Annotated[
        int | None,
        typer.Argument(help="The item id (see `statequeue list`).", min=1, show_default=False),
    ] = None,
    item: Annotated[
        str | None,
        typer.Option("--item", metavar="TEXT", help="The item with exactly this text (not an id)."),
    ] = None,
    attempt: Annotated[
        int | None, typer.Option(help="Which attempt (default: the latest).", min=1)
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing while the item runs.")
    ] = False,
    every: Annotated[
        bool,
        typer.Option("--all", help="Every item's last-attempt output, in item order (streamed)."),
    ] = False,
    tag: Annotated[
        bool, typer.Option("--tag", help="With --all: prefix each line with its item and a tab.")
    ] = False,
    state: StateOpt = None,
    json: Annotated[
        bool,
        typer.Option(
            "--json", help="One JSON object: the attempt's output (with --all, one per item)."
        ),
    ] = False,
    home: HomeOpt = None,
    store: StoreOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Print the output (stdout and stderr) an item's attempt wrote.

    Output the runner could not write (a full disk) is not kept: then a line
    on stderr says the log was cut, and why (the exit code stays 0).

    Name the item by id, or by its exact text with --item (exit 7 when no item has it).

    Example: statequeue logs 42 --follow

    Example: statequeue logs --all --tag --state failed
    """
    if item is not None and (item_id is not None or every):
        raise UsageError("give an item id, --item TEXT or --all (one of them)")
    if every:
        _check_all_options(item_id, attempt, follow)
        q = open_queue(ctx, home, queue, create=False)
        write_all_logs(q, sys.stdout.buffer, state=parse_state(state), tag=tag, as_json=json)
        return
    if item_id is None and item is None:
        raise UsageError("logs needs an item id (or --item TEXT), or --all for every item's output")
    if tag or state is not None:
        raise UsageError("--tag and --state go with --all")
    if json and follow:
        raise UsageError("--json prints the output as it is now: not with --follow")
    q = open_queue(ctx, home, queue, create=False)
    wanted_id = item_id if item_id is not None else q.history(item).item_id
    if json:
        _item_log_json(q, wanted_id, attempt)
        return
    _item_logs(q, wanted_id, attempt, follow)


def _check_all_options(item_id: int | None, attempt: int | None, follow: bool) -> None:
    if item_id is not None:
        raise UsageError("logs --all takes no item id")
    if attempt is not None or follow:
        raise UsageError("--attempt and --follow go with one item id, not --all")


def _item_logs(q: Queue, item_id: int, attempt: int | None, follow: bool) -> None:
    if attempt is not None:
        _check_attempt(q.history(item_id), attempt)
    out = sys.stdout.buffer
    shown_path: str | None = None
    offset = 0
    while True:
        h = q.history(item_id)  # state first: output read after it is complete
        # The latest attempt by default, as `logs --all` shows, even when it
        # logged nothing: an older attempt's output would pass for its own.
        wanted = attempt or _latest_attempt(h)
        paths = [p for p in h.log_paths if p.endswith(f".{wanted}.log")]
        if paths:
            # The same attempt's log under another name (PostgreSQL: this
            # host's file while it runs, the stored copy once it ends) goes
            # on from the offset: from 0 it was printed twice.
            if shown_path is None or _logged_attempt(paths[-1]) != _logged_attempt(shown_path):
                offset = 0
            shown_path = paths[-1]
        if shown_path is not None:
            # Read through the store (relative to the queue folder, no link
            # followed); the path only names the attempt: logs/ID.N.log.
            logged = _logged_attempt(shown_path)
            data = q.read_log(item_id, logged, offset) or b""
            out.write(data)
            out.flush()
            offset += len(data)
        waiting = h.state in (ItemState.PENDING, ItemState.RUNNING)
        if not follow or not waiting:
            break
        time.sleep(0.25)
    if shown_path is None:
        typer.echo(f"statequeue: {with_queue(_no_output(h, wanted))}", err=True)
    elif cut := h.log_cuts().get(wanted):
        # On stderr, after the output: a script reading stdout gets the log as it is.
        note = f"the output of item {h.item_id} (attempt {wanted}) was cut: {shown(cut, 80)}"
        typer.echo(f"statequeue: {note}; the rest of it was not kept", err=True)


def _item_log_json(q: Queue, item_id: int, attempt: int | None) -> None:
    """`logs ID --json`: the attempt's output as `logs --all --json` gives
    each item's (``cut`` added when its log stops short)."""
    h = q.history(item_id)
    if attempt is not None:
        _check_attempt(h, attempt)
    wanted = attempt or _latest_attempt(h)
    logged = any(_logged_attempt(p) == wanted for p in h.log_paths)
    data = (q.read_log(item_id, wanted, 0) or b"") if logged else b""
    found = attempt_json(item_id, h.item, h.state, wanted, data)
    if cut := h.log_cuts().get(wanted):
        found["cut"] = cut
    emit_json(found)


def _no_output(h: ItemHistory, wanted: int) -> str:
    """Why attempt ``wanted`` (0: the item has had none) shows no output, and
    which other attempt has some. Compaction removes an archived item's logs
    by age: while an earlier attempt's log is kept, a later one's (newer) was
    not removed, so the attempt recorded none."""
    logged = sorted({_logged_attempt(p) for p in h.log_paths})
    which = f"attempt {wanted} of " if wanted else ""
    archived = any(e.get("t") == "arch" for e in h.events)
    if archived and not any(a < wanted for a in logged):
        # Archived by `compact`: whatever it wrote was removed after --keep-logs.
        why = "it was archived, and compaction removes archived items' logs (--keep-logs)"
        text = f"no output is kept for {which}item {h.item_id}: {why}"
    elif cut := h.log_cuts().get(wanted):  # no log file could be made (a full disk)
        text = f"no output was kept for {which}item {h.item_id}: {shown(cut, 80)}"
    else:
        text = f"no output was recorded for {which}item {h.item_id}"
    others = [a for a in logged if a != wanted]
    if wanted and others:
        other = max((a for a in others if a < wanted), default=others[-1])
        text += f" (attempt {other} has output: `statequeue logs {h.item_id} --attempt {other}`)"
    return text


def _check_attempt(h: ItemHistory, attempt: int) -> None:
    """ItemNotFound unless the item has had attempt ``attempt``."""
    made = _latest_attempt(h)
    if attempt > made:
        raise ItemNotFound(f"item {h.item_id} has no attempt {attempt} (it has {made})")


def _interrupted_note(h: ItemHistory) -> str:
    """What `status` says of the item when its runner died while it ran."""
    attempt = _latest_attempt(h)
    if h.held_by_dead_runner:
        return (
            f" (orphaned: its runner died during attempt {attempt}, whose processes still run;"
            " no run takes it until they end, then the next run recovers it)"
        )
    if not h.interrupted:
        return ""
    return f" (interrupted: its runner died during attempt {attempt}; the next run recovers it)"


def _latest_attempt(h: ItemHistory) -> int:
    return max((_attempt_of(e) for e in h.events), default=0)


def _attempt_of(record: dict[str, Any]) -> int:
    kind = record.get("t")
    if kind == "item":  # carried over by compaction: counts its attempts so far
        return int(record.get("attempts", 0))
    return int(record.get("attempt", 0)) if kind in ("start", "end", "arch") else 0


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
    state: StateOpt = None,
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
            res = "" if r.result is None else orjson.dumps(r.result).decode()
            line = f"{r.item_id}\t{r.state.value}\t{shown(r.item, 200)}\t{escaped(r.reason or res)}"
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
        counts = "  ".join(f"{k} {v}" for k, v in e.counts.items() if v)
        _write(f"{e.queue}\t{plural(e.total, 'item')}\t{counts or 'empty'}")


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
