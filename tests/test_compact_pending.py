"""`compact` of a queue with nothing finished never makes its files bigger.

Compaction carries each unfinished item over as an ``item`` record, which says
more than the ``enq`` record it replaces (state, counts, enqueue time): a queue
of pending items alone came out of `compact` about twice its size. A rewrite
that archives nothing, is no smaller and drops fewer records than it keeps is
now not put in place (the journal stays as it was). One that drops more
records than it keeps is still made: replay gets faster, and it is what the
automatic compaction starts for.
"""

from __future__ import annotations

from pathlib import Path

from statequeue import Queue
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from statequeue.core.records import decode

ITEMS = [f"https://example.org/page/{i}" for i in range(1, 1001)]


def _sizes(folder: Path) -> int:
    """Bytes of the queue's journal and archive (the caches aside)."""
    return sum(
        (folder / name).stat().st_size
        for name in ("journal.jsonl", "archive.jsonl")
        if (folder / name).exists()
    )


def _journal(folder: Path) -> list[dict[str, object]]:
    lines = (folder / "journal.jsonl").read_bytes().splitlines()
    return [r for r in map(decode, lines) if r is not None]


def test_compacting_only_pending_items_never_grows_the_queue(sq_home: Path) -> None:
    folder = sq_home / "default"
    with Queue(home=sq_home) as q:
        q.enqueue(ITEMS[:600])
        q.enqueue(ITEMS[600:])
        before = _sizes(folder)
        result = q.compact()
        assert result.bytes_after <= result.bytes_before
        assert _sizes(folder) <= before
        again = q.compact()
        assert again.bytes_after <= again.bytes_before
        assert _sizes(folder) <= before
        assert q.enqueue(ITEMS).added == 0  # dedupe still holds
    with Queue(home=sq_home, create=False) as q:  # read back from the files
        assert [v.item for v in q.store.items()] == ITEMS
        runner = new_runner()
        claim = q.claim(runner)
        assert claim is not None and claim.item == ITEMS[0]
        q.finish(claim, Outcome(ok=True))


def test_a_few_runner_records_do_not_make_it_grow(sq_home: Path) -> None:
    folder = sq_home / "default"
    with Queue(home=sq_home) as q:
        q.enqueue(ITEMS)
        for _ in range(3):  # runs that started and stopped with nothing claimed
            runner = new_runner()
            q.register_runner(runner)
            q.unregister_runner(runner.runner_id)
        before = _sizes(folder)
        q.compact()
        assert _sizes(folder) <= before
        assert q.status().counts["pending"] == len(ITEMS)


def test_a_rewrite_that_drops_most_records_is_still_made(sq_home: Path) -> None:
    """Failed items, each with a start and an end record beside its enqueue:
    the rewrite keeps one record each (bigger ones: the result and a summary
    of the attempt), so it is made even if the bytes do not shrink."""
    folder = sq_home / "default"
    with Queue(home=sq_home) as q:
        q.enqueue(ITEMS[:100])
        runner = new_runner()
        while (claim := q.claim(runner)) is not None:
            q.finish(claim, Outcome(ok=False, exit_code=1, reason="exit code 1"))
        q.compact()
        kinds = [r["t"] for r in _journal(folder)]
        assert kinds == ["snap"] + ["item"] * 100
        assert q.status().counts["failed"] == 100
