"""Where the PostgreSQL server spends its time per item (issue 21 point 14).

Starts a throwaway cluster (as the tests do: tests/pg.py) with
pg_stat_statements tracking nested statements too (``track = all``: the
statements inside the claim and finish functions), drains N items with one
loop (or --loops) of each kind in turn (the psycopg floor, ``store`` claim +
finish, ``fused`` finish_and_claim, ``work``: the library's Queue.work()),
and prints for each kind the items/s, the WAL written and flushed per item
(pg_stat_wal), what the backends were waiting for (pg_stat_activity sampled
every millisecond), and the statements that took the most server time, with
their calls and mean milliseconds. Also prints the server settings that decide
what a commit waits for. ``--wal-by-relation`` adds, from pg_waldump, the WAL
bytes and records per item by kind of record and relation (record lengths,
full-page images left out): which table or index each write goes to. And the
CPU per item: the loops' (from their start to their end) and the server's
(every process of the cluster, the backends that exited included, less the
sampler's own backend): where the loops run CPU-bound, as 16 of them on a
small machine do, the sum of the two is what bounds the items per second.

  .venv/bin/python scripts/probe_pg_statements.py [--items 2000] [--top 12] [--loops 16]
  .venv/bin/python scripts/probe_pg_statements.py --kinds work --loops 4 --wal-by-relation
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import psycopg
except ImportError:
    print("probe_pg_statements: skipped, psycopg is not installed")
    sys.exit(0)

import bench_pg

from tests.pg import _start_cluster, find_bin_dir

SETTINGS = (
    "synchronous_commit",
    "fsync",
    "wal_sync_method",
    "commit_delay",
    "commit_siblings",
    "wal_level",
    "full_page_writes",
    "jit",
    "shared_buffers",
)


def top_statements(url: str, top: int) -> list[tuple[int, float, float, float, str]]:
    """(calls, total exec ms, mean exec ms, total planning ms, query) by server time."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT calls, total_exec_time, mean_exec_time, total_plan_time, query"
            " FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY total_exec_time + total_plan_time DESC LIMIT %s",
            (top,),
        ).fetchall()
    return [
        (int(c), float(t), float(m), float(pl), " ".join(str(q).split())[:100])
        for c, t, m, pl, q in rows
    ]


def wal_line(url: str, done: int, seconds: float) -> str:
    """WAL written and flushed per item (pg_stat_wal: the whole cluster, reset before)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes, wal_write, wal_sync, wal_sync_time"
            " FROM pg_stat_wal"
        ).fetchone()
    assert row is not None
    records, fpi, size, _writes, syncs, sync_ms = (float(v) for v in row)
    n = max(done, 1)
    return (
        f"WAL per item: {records / n:.1f} records, {fpi / n:.2f} full-page images,"
        f" {size / n:,.0f} bytes, {syncs / n:.2f} flushes taking {sync_ms / n:.3f} ms"
        f" ({sync_ms / 1000 / seconds:.0%} of the wall time)"
    )


_WAL_LINE = re.compile(r"rmgr: (\S+)\s+len \(rec/tot\):\s+(\d+)/\s*\d+.*?desc: (\S+)")
_WAL_REL = re.compile(r"rel \d+/\d+/(\d+)")


def wal_lsn(url: str) -> str:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    return str(row[0])


def wal_by_relation(
    url: str, waldump: Path, wal_dir: Path, span: tuple[str, str], done: int
) -> str:
    """Lines of WAL bytes and records per item between two LSNs, by record kind and relation."""
    with psycopg.connect(url, autocommit=True) as conn:
        names = dict(
            conn.execute(
                "SELECT pg_relation_filenode(oid)::text, relname::text FROM pg_class"
                " WHERE pg_relation_filenode(oid) IS NOT NULL"
            ).fetchall()
        )
    dump = subprocess.run(
        [str(waldump), "-p", str(wal_dir), "-s", span[0], "-e", span[1]],
        capture_output=True,
        text=True,
        check=False,
    )
    size: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for line in dump.stdout.splitlines():
        found = _WAL_LINE.search(line)
        if found is None:
            continue
        rel = _WAL_REL.search(line)
        where = names.get(rel.group(1), rel.group(1)) if rel else "-"
        key = f"{found.group(1)}/{found.group(3)} {where}"
        size[key] += int(found.group(2))
        count[key] += 1
    n = max(done, 1)
    lines = [f"{b / n:7.1f} B {count[k] / n:5.2f} records  {k}" for k, b in size.most_common(16)]
    total = f"total {sum(size.values()) / n:,.0f} B, {sum(count.values()) / n:.1f} records per item"
    return "\n  ".join(["WAL by record and relation, per item:", *lines, total])


class WaitSampler:
    """Samples what the database's active backends wait for, in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: Counter[str] = Counter()
        self.locked: Counter[str] = Counter()  # the statements waiting for a lock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.cpu = 0.0  # CPU seconds its own backend spent sampling

    def __enter__(self) -> WaitSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            backend = int(row[0]) if row else 0
            while not self._stop.wait(0.001):
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'on CPU'),"
                    " wait_event_type = 'Lock', left(regexp_replace(query, '\\s+', ' ', 'g'), 70)"
                    " FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state = 'active' AND pid <> pg_backend_pid()"
                ).fetchall()
                self.seen.update(str(r[0]) for r in rows)
                self.locked.update(str(r[2]) for r in rows if r[1])
            self.cpu = bench_pg.process_cpu(backend)

    def line(self) -> str:
        total = sum(self.seen.values()) or 1
        top = ", ".join(f"{k} {n / total:.0%}" for k, n in self.seen.most_common(6))
        waiting = "; ".join(f"{n}x {q}" for q, n in self.locked.most_common(3))
        return f"active backends were: {top}" + (
            f"\n  waiting for a lock: {waiting}" if waiting else ""
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--kinds", default="floor,store,fused,work")
    parser.add_argument("--loops", type=int, default=1, help="processes per kind")
    parser.add_argument("--wal-by-relation", action="store_true", help="pg_waldump breakdown")
    args = parser.parse_args()
    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit("probe_pg_statements: PostgreSQL binaries (initdb, pg_ctl) not found")
    cluster = _start_cluster(bin_dir)
    try:
        cluster.stop()
        options = (
            f"-c listen_addresses='' -c unix_socket_directories={cluster.socket_dir}"
            " -c shared_preload_libraries=pg_stat_statements"
            " -c pg_stat_statements.track=all -c track_io_timing=on"
            " -c track_wal_io_timing=on -c pg_stat_statements.track_planning=on"
        )
        cluster.pg_ctl("-o", options, "-l", str(cluster.root / "log"), "-w", "start")
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
            for name in SETTINGS:
                row = conn.execute(f"SHOW {name}").fetchone()
                print(f"  {name} = {row[0] if row else '?'}")
        for kind in args.kinds.split(","):
            url = cluster.new_database()
            bench_pg.FILLS.get(kind, bench_pg.filled_store)(url, args.items)
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.execute("SELECT pg_stat_statements_reset()")
                conn.execute("SELECT pg_stat_reset_shared('wal')")
            start = wal_lsn(url)
            server = bench_pg.server_cpu(cluster.data_dir)
            with WaitSampler(url) as waits:
                runner = bench_pg.RUNNERS[kind]
                done, seconds, client = bench_pg.drain_measured(runner, url, args.loops)
            server = bench_pg.server_cpu(cluster.data_dir) - server - waits.cpu
            span = (start, wal_lsn(url))
            print(f"\n{kind} x{args.loops}: {done / seconds:,.0f} items/s ({seconds:.2f} s)")
            n = max(done, 1)
            print(
                f"  CPU per item: loops {client / n * 1000:.3f} ms + server"
                f" {server / n * 1000:.3f} ms = {(client + server) / n * 1000:.3f} ms"
                f" ({os.cpu_count()} CPUs)"
            )
            print("  " + wal_line(url, done, seconds))
            if args.wal_by_relation:
                waldump = bin_dir / "pg_waldump"
                print("  " + wal_by_relation(url, waldump, cluster.data_dir / "pg_wal", span, done))
            print("  " + waits.line(), flush=True)
            for calls, total, mean, plan, query in top_statements(url, args.top):
                per_item, planned = total / max(done, 1), plan / max(done, 1)
                print(
                    f"  {calls:7} calls {mean:7.3f} ms mean {per_item:6.3f} ms/item"
                    f" +{planned:6.3f} planning  {query}"
                )
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    main()
