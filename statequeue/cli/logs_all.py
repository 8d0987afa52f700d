"""`statequeue logs --all`: every item's last-attempt output, in item order.

What `parallel -k` gives (and with `--tag`, `parallel --tag`: each line
prefixed with its item and a tab; the item escaped as every human view
escapes it, and whole: a tab, newline or ESC in it cannot fake or garble a
line). Streamed: items are read a batch at a time and each log is written as
soon as it is read, so memory holds one attempt's log (at most --log-limit)
whatever the size of the queue.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import TYPE_CHECKING, BinaryIO

import orjson

from statequeue.core.textsafe import escaped, item_json

if TYPE_CHECKING:
    from statequeue.api.queue import Queue
    from statequeue.core.models import ItemState
    from statequeue.core.views import ItemView

__all__ = ["attempt_json", "write_all_logs"]


def write_all_logs(
    q: Queue, out: BinaryIO, *, state: ItemState | None, tag: bool, as_json: bool
) -> int:
    """Write each item's last-attempt log to ``out``; the number of items written.
    Items never attempted are left out, and so in text are those that logged
    nothing (as JSON they are written, with ``output`` "")."""
    written = 0
    for view, data in _last_logs(q, state):
        if as_json:
            out.write(orjson.dumps(_json(view, data)) + b"\n")
        elif data:
            out.write(_tagged(view.item, data) if tag else data)
            if not data.endswith(b"\n"):
                out.write(b"\n")  # the next item's output starts on a line of its own
        else:
            continue
        written += 1
    return written


def _last_logs(q: Queue, state: ItemState | None) -> Iterator[tuple[ItemView, bytes]]:
    for view in q.iter_items(state):
        if view.attempts >= 1:
            yield view, q.read_log(view.item_id, view.attempts) or b""


def _tagged(item: str, data: bytes) -> bytes:
    prefix = escaped(item).encode() + b"\t"  # never cut: the tag tells the items apart
    # Lines end at \n only, as for `parallel --tag`: a progress bar's \r
    # (splitlines' too) redraws within its line, and got a tag of its own.
    parts = data.split(b"\n")
    lines = [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    return b"".join(prefix + line for line in lines)


def _json(view: ItemView, data: bytes) -> dict[str, object]:
    return attempt_json(view.item_id, view.item, view.state, view.attempts, data)


def attempt_json(
    item_id: int, item: str, state: ItemState, attempt: int, data: bytes
) -> dict[str, object]:
    """An attempt's output as a JSON object (`logs --json`, `logs --all --json`)."""
    found: dict[str, object] = {
        "schema": 1,  # as every read command's --json objects
        "id": item_id,
        **item_json(item),
        "state": state.value,
        "attempt": attempt,
        "output": data.decode("utf-8", "replace"),
    }
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        found["output_b64"] = base64.b64encode(data).decode("ascii")  # the exact bytes
    return found
