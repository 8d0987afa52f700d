"""Benchmark: ``Queue.result(item)`` on a 1M-item queue, both stores (issue 21 point 12).

Goal: the median lookup is at most 20 ms on 1M items, on the journal and on
PostgreSQL, with the results in the live journal (or table) and after a
compaction moved them to the archive. Beside it, in the same run, the full
scan ``result`` used to do (every result read to find one), as the baseline.

  journal     a fresh queue under /var/tmp (or --workdir): N items through the
              fast (bulk) enqueue path, then every one claimed and finished
              (done, with a small JSON result; group commit, one fsync at the
              end), auto-compaction off; then ``compact()`` archives them all
  postgres    a throwaway cluster (as the tests: tests/pg.py); N done items
              through ``import_items`` (COPY-style batches), then ``compact()``

Lookups are by exact item text (``find`` then ``result``), for --lookups items
drawn at random (seeded); the first call in the process is shown apart (it
loads the dedupe index and the archive's index, or builds the latter after a
compaction). Prints the median and the 90th percentile.

  .venv/bin/python scripts/bench_result.py [--items 1000000] [--lookups 200] [--no-postgres]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from statequeue.api.queue import Queue
from statequeue.core.exported import ExportedItem
from statequeue.core.identity import new_runner
from statequeue.core.models import ItemState, Outcome
from statequeue.store.journal.store import JournalStore

GOAL_MS = 20.0


def texts(n: int) -> list[str]:
    return [f"https://example.com/page/{i}" for i in range(n)]


def full_scan(q: Queue, text: str) -> Any:
    """What ``Queue.result`` did before issue 21: every result read to find one."""
    item_id = q.find(text)
    state = q.states([item_id])[item_id]
    return next((r for r in q.results(state) if r.item_id == item_id), None)


def timed_ms(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1000


def lookups(q: Queue, items: list[str], count: int, label: str, baseline: int) -> None:
    rng = random.Random(21)
    picks = [rng.choice(items) for _ in range(count)]
    first = timed_ms(lambda: q.result(picks[0]))
    found = q.result(picks[1])
    assert found is not None and found.state is ItemState.DONE, found
    times = sorted(timed_ms(lambda t=t: q.result(t)) for t in picks)  # type: ignore[misc]
    median = statistics.median(times)
    p90 = times[int(len(times) * 0.9)]
    verdict = "met" if median <= GOAL_MS else "MISSED"
    print(
        f"  {label:34} median {median:7.3f} ms  p90 {p90:7.3f} ms  first call {first:8.1f} ms"
        f"  (goal <= {GOAL_MS:g} ms: {verdict})",
        flush=True,
    )
    if baseline:
        scans = [timed_ms(lambda t=t: full_scan(q, t)) for t in picks[:baseline]]  # type: ignore[misc]
        scan = statistics.median(scans)
        print(f"  {'  baseline: full scan (before)':34} median {scan:9.1f} ms"
              f"  = {scan / median:,.0f}x the lookup", flush=True)  # fmt: skip


def journal_case(workdir: Path, n: int, count: int, baseline: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="sqbench-result-", dir=workdir))
    try:
        items = texts(n)
        store = JournalStore(folder / "q", create=True, auto_compact=0)
        start = time.perf_counter()
        store.enqueue(items)
        runner = new_runner(("bench",))
        store.register_runner(runner)
        done = 0
        while (claim := store.claim(runner)) is not None:
            store.finish(claim, Outcome(ok=True, result={"n": done, "ok": True}), sync=False)
            done += 1
        store.sync()
        store.unregister_runner(runner.runner_id)
        store.close()
        print(f"journal: {n:,} items enqueued and done in {time.perf_counter() - start:.0f} s")
        with Queue("q", store=JournalStore(folder / "q", create=False, auto_compact=0)) as q:
            lookups(q, items, count, "journal, results in the journal", baseline)
        with Queue("q", store=JournalStore(folder / "q", create=False, auto_compact=0)) as q:
            start = time.perf_counter()
            q.compact()
            print(f"  (compacted in {time.perf_counter() - start:.1f} s)")
        with Queue("q", store=JournalStore(folder / "q", create=False, auto_compact=0)) as q:
            lookups(q, items, count, "journal, results archived", baseline)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def postgres_case(n: int, count: int, baseline: int) -> None:
    try:
        from tests.pg import _start_cluster, find_bin_dir
    except ImportError:  # pytest missing: tests/pg.py imports it
        print("postgres: skipped (the tests' cluster helper needs pytest)")
        return
    bin_dir = find_bin_dir()
    if bin_dir is None:
        print("postgres: skipped (PostgreSQL binaries not found)")
        return
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("postgres: skipped (psycopg is not installed)")
        return
    cluster = _start_cluster(bin_dir)
    home = Path(tempfile.mkdtemp(prefix="sqbench-result-"))
    try:
        url = cluster.new_database()
        items = texts(n)
        entries = [
            ExportedItem(
                item_id=i + 1,
                item=t,
                state=ItemState.DONE,
                attempts=1,
                history=({"t": "end", "attempt": 1, "ok": True, "result": {"n": i}, "at": 0.0},),
            )
            for i, t in enumerate(items)
        ]
        start = time.perf_counter()
        with Queue("q", store=url, home=home) as q:
            q.store.import_items(entries)
        print(f"postgres: {n:,} done items imported in {time.perf_counter() - start:.0f} s")
        del entries
        with Queue("q", store=url, home=home) as q:
            lookups(q, items, count, "postgres, results in results", baseline)
            start = time.perf_counter()
            q.compact()
            print(f"  (compacted in {time.perf_counter() - start:.1f} s)")
        with Queue("q", store=url, home=home) as q:
            lookups(q, items, count, "postgres, results archived", baseline)
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--lookups", type=int, default=200)
    parser.add_argument("--baseline", type=int, default=1, help="full scans timed (0: none)")
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-journal", action="store_true")
    args = parser.parse_args()
    print(f"Queue.result on {args.items:,} items, {args.lookups} lookups each", flush=True)
    if not args.no_journal:
        journal_case(args.workdir, args.items, args.lookups, args.baseline)
    if not args.no_postgres:
        postgres_case(args.items, args.lookups, args.baseline)


if __name__ == "__main__":
    main()
