"""Benchmark: what issue 21's PostgreSQL checks cost (points 3 and 4).

Starts a throwaway cluster (as the tests do: tests/pg.py) and measures, each
against its baseline in the same run, rounds alternating:

  check query      the owner and trigger check alone (one catalog query)
  open             PostgresStore open + close, no scratch folder, with the
                   check (as shipped) and without it (check patched out)
  open + scratch   the same with the scratch folders opened and checked
  claim + finish   per item through the server-side functions, with their
                   search_path pinned (schema 6) and with it reset (schema 5)

Prints medians; --json PATH writes them too.

  .venv/bin/python scripts/bench_pg_security.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import psycopg

    from statequeue.store.postgres import PostgresStore, owners, schema
except ImportError:  # the bench environment may lack the postgres extra
    print("bench_pg_security: skipped, psycopg is not installed (pip install '.[postgres]')")
    sys.exit(0)
from statequeue.core.identity import new_runner
from statequeue.core.models import Outcome
from tests.pg import _start_cluster, find_bin_dir

FUNCTIONS = """
SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.pronamespace = 'statequeue'::regnamespace
"""


def median_ms(call: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def opens(url: str, scratch: Path | None, n: int, *, checked: bool) -> float:
    real = schema.check_owners
    if not checked:
        schema.check_owners = lambda conn: None  # type: ignore[assignment]
    try:
        return median_ms(lambda: PostgresStore(url, "q", scratch=scratch).close(), n)
    finally:
        schema.check_owners = real


def set_pinned(url: str, pinned: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for (fn,) in conn.execute(FUNCTIONS).fetchall():
            change = "SET search_path = pg_catalog, pg_temp" if pinned else "RESET search_path"
            conn.execute(f"ALTER FUNCTION {fn} {change}".encode())


def items_ms(url: str, items: int) -> float:
    """Per item: claim and finish ``items`` fresh items, one at a time."""
    store = PostgresStore(url, "bench")
    try:
        store.enqueue([f"item-{time.monotonic_ns()}-{i}" for i in range(items)])
        runner = new_runner(command=["true"])
        store.register_runner(runner)
        start = time.perf_counter()
        for _ in range(items):
            claim = store.claim(runner)
            assert claim is not None
            store.finish(claim, Outcome(ok=True, exit_code=0))
        return (time.perf_counter() - start) * 1000 / items
    finally:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--opens", type=int, default=40, help="opens per round")
    parser.add_argument("--items", type=int, default=500, help="items per round")
    parser.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    bin_dir = find_bin_dir()
    if bin_dir is None:
        print("bench_pg_security: skipped, no PostgreSQL binaries")
        return
    cluster = _start_cluster(bin_dir)
    figures: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    try:
        url = cluster.new_database()
        PostgresStore(url, "q").close()
        home = Path(tempfile.mkdtemp(prefix="sqbench"))
        scratch = home / ".postgres" / "q"
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(args.rounds):
                add("check query (ms)", median_ms(lambda: owners.check_owners(conn), args.opens))
        for _ in range(args.rounds):
            add("open, no check (ms)", opens(url, None, args.opens, checked=False))
            add("open, checked (ms)", opens(url, None, args.opens, checked=True))
            add("open + scratch, checked (ms)", opens(url, scratch, args.opens, checked=True))
            set_pinned(url, False)
            add("claim+finish, search_path unpinned (ms/item)", items_ms(url, args.items))
            set_pinned(url, True)
            add("claim+finish, search_path pinned (ms/item)", items_ms(url, args.items))
    finally:
        cluster.stop("immediate")
    result = {name: round(statistics.median(v), 3) for name, v in figures.items()}
    for name, value in result.items():
        print(f"{name:48} {value:8.3f}   rounds: {', '.join(f'{x:.3f}' for x in figures[name])}")
    base, checked = result["open, no check (ms)"], result["open, checked (ms)"]
    print(f"the check adds {checked - base:.3f} ms to an open ({checked / base - 1:+.1%})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
