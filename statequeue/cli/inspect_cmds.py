"""Read commands: list, show, logs, results, queues, path, events."""

from __future__ import annotations

import os
import sys
import time
from typing import Annotated, Any

import typer

from statequeue.cli.app import app
from statequeue.cli.options import HomeOpt, JsonOpt, QueueOpt, open_queue
from statequeue.cli.render import emit_json, shown
from statequeue.errors import UsageError
from statequeue.models import ItemState

StateOpt = Annotated[
    str | None,
    typer.Option(
        "--state",
        "-s",
        metavar="STATE",
        help="Only items in STATE: pending, running, done, failed, cancelled or held.",
    ),
]
IdArg = Annotated[int, typer.Argument(help="The item id (see `statequeue list`).", min=1)]


def parse_state(value: str | None) -> ItemState | None:
    if value is None:
        return None
    try:
        return ItemState(value)
    except ValueError:
        names = ", ".join(s.value for s in ItemState)
        raise UsageError(f"unknown state {value!r}: use one of {names}") from None


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
    queue: QueueOpt = None,
) -> None:
    """List items, one per line, in id order (streams; fine on a million items).

    Example: statequeue list --state failed --json | jq -r .item
    """
    import orjson

    wanted = parse_state(state)
    q = open_queue(ctx, home, queue, create=False)
    out = sys.stdout.buffer
    for view in q.store.items(wanted):
        if json:
            out.write(orjson.dumps(view.to_json()) + b"\n")
        else:
            line = f"{view.item_id}\t{view.state.value}\t{view.attempts}\t{shown(view.item, 200)}"
            out.write(line.encode("utf-8", "replace") + b"\n")


@app.command()
def show(
    ctx: typer.Context,
    item_id: IdArg,
    json: JsonOpt = False,
    home: HomeOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Show one item: its state, every attempt, the result and the stderr tail.

    Example: statequeue show 42
    """
    q = open_queue(ctx, home, queue, create=False)
    h = q.store.history(item_id)
    if json:
        emit_json(h.to_json())
        return
    _write(f"item {h.item_id}: {shown(h.item, 200)}")
    _write(f"state: {h.state.value}")
    _write("history:")
    for ev in h.events:
        _write(f"  {describe_event(ev)}")
    if h.result is not None:
        import orjson

        _write("result: " + orjson.dumps(h.result).decode())
    if h.stderr_tail:
        _write("stderr (tail):")
        for line in h.stderr_tail.rstrip("\n").splitlines()[-20:]:
            _write(f"  {line}")
    for path in h.log_paths:
        _write(f"log: {path}")


@app.command()
def logs(
    ctx: typer.Context,
    item_id: IdArg,
    attempt: Annotated[
        int | None, typer.Option(help="Which attempt (default: the latest).", min=1)
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing while the item runs.")
    ] = False,
    home: HomeOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Print the output (stdout and stderr) an item's attempt wrote.

    Example: statequeue logs 42 --follow
    """
    q = open_queue(ctx, home, queue, create=False)
    out = sys.stdout.buffer
    shown_path: str | None = None
    offset = 0
    while True:
        h = q.store.history(item_id)  # state first: output read after it is complete
        paths = [p for p in h.log_paths if attempt is None or p.endswith(f".{attempt}.log")]
        if paths and paths[-1] != shown_path:
            shown_path, offset = paths[-1], 0
        if shown_path is not None:
            with open(os.open(shown_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
                f.seek(offset)
                data = f.read()
            out.write(data)
            out.flush()
            offset += len(data)
        waiting = h.state in (ItemState.PENDING, ItemState.RUNNING)
        if not follow or not waiting:
            break
        time.sleep(0.25)
    if shown_path is None:
        which = f"attempt {attempt} of " if attempt else ""
        typer.echo(f"statequeue: no output was recorded for {which}item {item_id}", err=True)


@app.command()
def results(
    ctx: typer.Context,
    state: StateOpt = None,
    json: Annotated[bool, typer.Option("--json", help="NDJSON, one result per line.")] = False,
    csv: Annotated[bool, typer.Option("--csv", help="CSV with a header row.")] = False,
    home: HomeOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Stream the result of every finished item, archived ones included.

    Example: statequeue results --state failed --json | jq -r .item
    """
    import orjson

    if json and csv:
        raise UsageError("choose one of --json and --csv")
    wanted = parse_state(state)
    if wanted not in (None, ItemState.DONE, ItemState.FAILED):
        raise UsageError("results exist only for done or failed items")
    q = open_queue(ctx, home, queue, create=False)
    out = sys.stdout.buffer
    writer: Any = None
    if csv:
        import csv as csvmod
        import io

        text = io.TextIOWrapper(out, encoding="utf-8", errors="backslashreplace", newline="")
        writer = csvmod.writer(text)
        writer.writerow(["id", "item", "state", "attempt", "exit", "duration", "reason", "result"])
    for r in q.store.results(wanted):
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
            line = f"{r.item_id}\t{r.state.value}\t{shown(r.item, 200)}\t{r.reason or res}"
            out.write(line.encode("utf-8", "replace") + b"\n")
    if writer is not None:
        text.flush()
        text.detach()


@app.command()
def queues(ctx: typer.Context, json: JsonOpt = False, home: HomeOpt = None) -> None:
    """List every queue under the home, with its counts.

    Example: statequeue queues --json
    """
    from statequeue.location import resolve_home
    from statequeue.queue import Queue
    from statequeue.store.integrity import holds_queue

    root = resolve_home(home if home is not None else (ctx.obj or {}).get("home"))
    rows = []
    folders = (
        # A folder whose journal is gone but whose archive remains is a damaged
        # queue (opening it refuses), never one to leave out silently.
        sorted(p for p in root.iterdir() if holds_queue(p)) if root.is_dir() else []
    )
    for folder in folders:
        with Queue(folder.name, home=root, create=False) as q:
            rows.append(q.status())
    if json:
        emit_json({"schema": 1, "home": str(root), "queues": [s.to_json() for s in rows]})
        return
    if not rows:
        _write(f"no queues in {root}")
    for st in rows:
        counts = "  ".join(f"{k} {v}" for k, v in st.counts.items() if v)
        _write(f"{st.queue}\t{st.total} items\t{counts or 'empty'}")


@app.command()
def path(ctx: typer.Context, home: HomeOpt = None, queue: QueueOpt = None) -> None:
    """Print the queue's folder (for backups and scripts).

    Example: tar czf backup.tgz -C "$(dirname "$(statequeue path)")" default
    """
    q = open_queue(ctx, home, queue, create=False)
    _write(str(q.path))


@app.command()
def events(
    ctx: typer.Context,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until Ctrl-C.")
    ] = False,
    json: Annotated[bool, typer.Option("--json", help="NDJSON, one record per line.")] = False,
    home: HomeOpt = None,
    queue: QueueOpt = None,
) -> None:
    """Print the journal as an event stream (enqueues, starts, results, recoveries).

    Example: statequeue events --follow --json | jq 'select(.t == "intr")'
    """
    import orjson

    q = open_queue(ctx, home, queue, create=False)
    out = sys.stdout.buffer
    cursor: object | None = None
    try:
        while True:
            found, cursor = q.store.read_events(cursor)
            for rec in found:
                if json:
                    out.write(orjson.dumps({"schema": 1, **rec}) + b"\n")
                else:
                    out.write(describe_event(rec).encode("utf-8", "replace") + b"\n")
            out.flush()
            if not follow:
                return
            time.sleep(0.25)
    except KeyboardInterrupt:
        return


def _runner(r: dict[str, Any]) -> str:
    return str(r.get("runner", ""))[:8]


_EVENT_TEXT: dict[str, Any] = {
    "enq": lambda r: f"enqueued #{r['id']}",
    "start": lambda r: f"start #{r['id']} attempt {r.get('attempt')} (runner {_runner(r)})",
    "end": lambda r: (
        f"end #{r['id']} attempt {r.get('attempt')}: {r.get('state')} "
        f"({r.get('reason') or 'exit ' + str(r.get('exit', '?'))})"
    ),
    "intr": lambda r: f"recovered #{r['id']} -> {r.get('state')}: {r.get('reason', '')}",
    "set": lambda r: f"#{r['id']} -> {r.get('state')} ({r.get('reason', '')})",
    "run": lambda r: f"runner {_runner(r)} started (pid {r.get('pid')} on {r.get('host')})",
    "stop": lambda r: f"runner {_runner(r)} stopped",
    "pause": lambda r: "queue paused" if r.get("paused") else "queue resumed",
    "snap": lambda r: f"snapshot: {r.get('archived')} archived, next id {r.get('next_id')}",
    "item": lambda r: f"#{r['id']} carried over by compaction: {r.get('state')}",
    "arch": lambda r: f"#{r['id']} archived",
}


def describe_event(rec: dict[str, Any]) -> str:
    """One human-readable line for a journal record."""
    at = rec.get("at")
    when = time.strftime(" %Y-%m-%d %H:%M:%S", time.localtime(at)) if at else ""
    fmt = _EVENT_TEXT.get(str(rec.get("t")))
    text = fmt(rec) if fmt is not None else f"{rec.get('t')} record"
    return f"seq {rec.get('seq', '?')}{when}  {text}"
