"""`export` says which items `compact` archived, on both stores.

The PostgreSQL store's export said ``"archived": false`` for every item,
though `compact` had moved the done and cancelled ones to its archive
tables and `results --json` said ``"archived": true`` for them; the local
store's export said true. Now both say it of the archived items alone.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from statequeue.api.queue import Queue


def test_export_marks_what_compact_archived(store_url: str, sq_home: Path) -> None:
    q = Queue("q", store=store_url or None, home=sq_home)
    try:
        q.enqueue(["a", "b", "c"])
        for item in q.work():
            if item.item == "b":
                item.fail("boom")
            else:
                item.done()
            if item.item == "c":
                break
        q.compact()
        out = io.BytesIO()
        q.export(out)
    finally:
        q.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    archived = {e["item"]: e["archived"] for e in lines if "id" in e and "item" in e}
    assert archived == {"a": True, "b": False, "c": True}, lines
