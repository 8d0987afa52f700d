"""Benchmark: issue 12's PostgreSQL figures, each beside its goal, in one run.

Starts a throwaway PostgreSQL cluster of its own (initdb + pg_ctl, unix
socket only, in a short temp folder; as root the server runs as ``postgres``;
stopped with pg_ctl at the end, always; the same helper as the tests) and
measures, on a fresh database each:

  claim+finish   P = 1, 4, 16 runner processes on one queue, no-op job:
                   store    each process loops PostgresStore.claim + finish (sync=True)
                   fused    each process loops PostgresStore.finish_and_claim (one
                            statement and one synchronous commit per item: what
                            `statequeue run` does)
                   work     each process runs the library loop, ``for item in
                            Queue(store=URL).work(): item.done()`` (issue 21 point 14)
                   floor    a minimal psycopg loop: one FOR UPDATE SKIP LOCKED claim
                            UPDATE and one finish UPDATE per item, synchronous_commit on
                   CLI      P `statequeue --store URL run -- true` processes (whole
                            processes: start-up and a fork of `true` per item included)
                   procrastinate  the peer: P procrastinate workers (one process
                            each, concurrency 1, wait=False: they stop once the
                            queue is drained) running a no-op task, on a database
                            of their own in the same cluster
                 goal: store >= 0.7x floor at 16 processes; faster than procrastinate;
                 work >= 0.7x floor at 16 processes and >= 0.5x at 1
  enqueue        N items through PostgresStore.enqueue; goal >= 40k items/s
  re-enqueue     the same N again (all skipped); goal >= 100k items/s
  status         on the N-item queue: the first call after the enqueue (it folds
                 the count deltas) and then folded (best of 3); goal <= 0.2 s

Sizes: N = 1,000,000 and 5,000 items per claim run (--quick: 100,000 and
2,000). procrastinate runs where it is installed (the bench environment). On a
shared or small machine the absolute figures vary between runs: compare the
ratios to the floor, measured in the same run. ``--rounds R`` runs the
claim+finish kinds R times over, each round the kinds one after the other, and
shows the median rate and the median of the rounds' ratios to their own
floor: one round's ratio swings by half and more where other work shares
the CPUs, as the machine's load comes and goes between two kinds' runs.
Each kind's CPU per item (its loops' from the barrier on, plus the
server's over the same span, from /proc) is shown beside its rate, and in
the table as a ratio to the floor's: where the loops and the server are
CPU-bound together (16 loops on 2 CPUs) it bounds the rate, and it moves
less than the rate ratio, which also moves with the floor's fsync cost.

  .venv/bin/python scripts/bench_pg.py --quick [--json PATH] [--no-cli] [--claims-only]
  .venv/bin/python scripts/bench_pg.py --quick --no-cli --claims-only --kinds floor,work
  .venv/bin/python scripts/bench_pg.py --quick --no-cli --claims-only --kinds work \
      --procs 1,16 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    import psycopg

    from statequeue.core.identity import new_runner
    from statequeue.core.models import Outcome
    from statequeue.store.postgres import PostgresStore
except ImportError:  # the bench environment may lack the postgres extra
    print("bench_pg: skipped, psycopg is not installed (pip install '.[postgres]')")
    sys.exit(0)
from tests.pg import PgCluster, _start_cluster, find_bin_dir

PROCESSES = (1, 4, 16)
FLOOR_RATIO_GOAL = 0.7
WORK_GOALS = {1: 0.5, 16: 0.7}  # Queue.work() against the floor, by loops
ENQUEUE_GOAL = 40_000.0
REENQUEUE_GOAL = 100_000.0
STATUS_GOAL = 0.2
STATEQUEUE = shutil.which("statequeue", path=str(Path(sys.executable).parent)) or "statequeue"

FLOOR_SCHEMA = """
CREATE TABLE floor (id bigint PRIMARY KEY, item text NOT NULL, state text NOT NULL);
CREATE INDEX floor_pending ON floor (id) WHERE state = 'pending';
"""
FLOOR_CLAIM = """
UPDATE floor SET state = 'running' WHERE id = (
    SELECT id FROM floor WHERE state = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
) RETURNING id, item
"""
FLOOR_FINISH = "UPDATE floor SET state = 'done' WHERE id = %s"


def items(n: int) -> list[str]:
    return [f"https://example.com/page/{i}" for i in range(n)]


# -- claim + finish: one function per kind of runner process -----------------
# Each opens its connection first, waits at the barrier with the others (so
# connecting is not timed), drains the queue and reports (done, end time, CPU
# seconds it spent from the barrier on), then waits at the barrier again, its
# connections open, until the server's CPU is read (``reported``): a backend
# that exits is counted only once its postmaster reaps it, so one that ends
# between the two readings went missing from the server's figure.


def reported(out: Any, go: Barrier, done: int, cpu: float) -> None:
    """Report (done, end time, CPU seconds since ``cpu``), and wait for the server's reading."""
    out.put((done, time.monotonic(), time.process_time() - cpu))
    go.wait(timeout=600)


def store_runner(url: str, go: Barrier, out: Any) -> None:
    store = PostgresStore(url, "q")
    runner = new_runner(("true",))
    store.register_runner(runner)
    ok = Outcome(ok=True, exit_code=0)
    done = 0
    go.wait()
    cpu = time.process_time()
    while (claim := store.claim(runner)) is not None:
        store.finish(claim, ok, sync=True)
        done += 1
    reported(out, go, done, cpu)
    store.unregister_runner(runner.runner_id)
    store.close()


def fused_runner(url: str, go: Barrier, out: Any) -> None:
    store = PostgresStore(url, "q")
    runner = new_runner(("true",))
    store.register_runner(runner)
    ok = Outcome(ok=True, exit_code=0)
    done = 0
    go.wait()
    cpu = time.process_time()
    claim = store.claim(runner)
    while claim is not None:
        _, claim = store.finish_and_claim(claim, ok, runner=runner)
        done += 1
        if claim is None:  # none due with the fused claim: a plain one recovers first
            claim = store.claim(runner)
    reported(out, go, done, cpu)
    store.unregister_runner(runner.runner_id)
    store.close()


def work_runner(url: str, go: Barrier, out: Any) -> None:
    """The library's loop: Queue.work() with a no-op body (``item.done()``)."""
    # The loop's own module too, before the barrier: Queue.work() imports it
    # lazily, ~3.5 ms of CPU once per process (16 processes, 125 items each:
    # ~0.03 ms per item), and the other kinds import what they use first.
    import statequeue.api.work  # noqa: F401
    from statequeue.api.queue import Queue

    # Its home (the claims' lock files): under /var/tmp, as bench_library's
    # queues, never the user's. Not /tmp: on the shared test machine each file
    # create + unlink there cost ~0.9 ms against ~0.02 ms in /var/tmp.
    home = tempfile.mkdtemp(prefix="sqbench-work-", dir="/var/tmp")
    q = Queue("q", store=url, home=home)
    done = 0
    go.wait()
    cpu = time.process_time()
    for item in q.work():
        item.done()
        done += 1
    reported(out, go, done, cpu)
    q.close()
    shutil.rmtree(home, ignore_errors=True)


def procrastinate_app(url: str) -> Any:
    """A procrastinate app on ``url`` with one no-op task, "noop" (None: not installed)."""
    try:
        import procrastinate
    except ImportError:
        return None
    # A pool of at most 2 connections per process (its default opens more:
    # 16 workers would pass the server's max_connections).
    logging.getLogger("procrastinate").setLevel(logging.ERROR)  # "App in the main module"
    conn = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=2)
    app = procrastinate.App(connector=conn)
    app.task(name="noop")(noop)
    return app


async def noop() -> None:
    """procrastinate's no-op task (async: run on its event loop, no thread hop)."""


def procrastinate_runner(url: str, go: Barrier, out: Any) -> None:
    app = procrastinate_app(url)
    go.wait()
    cpu = time.process_time()
    # Not listening: like the store's runs here, it only claims until the queue is drained.
    app.run_worker(concurrency=1, wait=False, install_signal_handlers=False, listen_notify=False)
    reported(out, go, 0, cpu)  # its jobs are counted in the database afterwards


def floor_runner(url: str, go: Barrier, out: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET synchronous_commit = on")
        done = 0
        go.wait()
        cpu = time.process_time()
        while (row := conn.execute(FLOOR_CLAIM).fetchone()) is not None:
            conn.execute(FLOOR_FINISH, (row[0],))
            done += 1
        reported(out, go, done, cpu)


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_ticks(pid: int, *, reaped: bool = False) -> int:
    """``pid``'s user + system CPU ticks (``reaped``: and its waited-for children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    # utime, stime, cutime, cstime are fields 14-17 of stat, 12-15 after the name
    return sum(int(f) for f in fields[11 : 15 if reaped else 13])


def process_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` has spent so far (user + system)."""
    return _cpu_ticks(pid) / _TICK


def server_cpu(data_dir: Path) -> float:
    """CPU seconds spent by the cluster so far: the postmaster with the
    children it reaped (backends that exited), and those still running."""
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    ticks = _cpu_ticks(postmaster, reaped=True)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        if int(stat.rsplit(") ", 1)[1].split()[1]) == postmaster:
            ticks += _cpu_ticks(int(entry.name))
    return ticks / _TICK


def drain(target: Callable[[str, Barrier, Any], None], url: str, procs: int) -> tuple[int, float]:
    """(items done, seconds) for ``procs`` processes running ``target`` at once."""
    done, seconds, _ = drain_measured(target, url, procs)
    return done, seconds


def drain_measured(
    target: Callable[[str, Barrier, Any], None],
    url: str,
    procs: int,
    data_dir: Path | None = None,
) -> tuple[int, float, float]:
    """As ``drain``, and the CPU seconds the processes spent from the barrier
    on; with the cluster's ``data_dir``, the server's CPU seconds over the
    same span added (its backends', from the barrier to the last report)."""
    ctx = mp.get_context("spawn")  # no connection of this process leaks into a child
    go, out = ctx.Barrier(procs + 1), ctx.Queue()
    workers = [ctx.Process(target=target, args=(url, go, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    go.wait(timeout=120)
    start = time.monotonic()
    server = 0.0 if data_dir is None else server_cpu(data_dir)
    reports = [out.get(timeout=600) for _ in workers]
    if data_dir is not None:
        server = server_cpu(data_dir) - server
    go.wait(timeout=120)  # read: the processes may close their connections
    for w in workers:
        w.join(timeout=60)
        if w.exitcode != 0:
            raise SystemExit(f"bench_pg: a {target.__name__} process failed")
    return (
        sum(r[0] for r in reports),
        max(r[1] for r in reports) - start,
        sum(r[2] for r in reports) + server,
    )


def cli_drain(url: str, procs: int) -> tuple[int, float]:
    """P whole `statequeue run` processes, from their start to the last one's exit."""
    home = tempfile.mkdtemp(prefix="sqbench-pg-")  # never the user's data folder
    env = {**os.environ, "STATEQUEUE_STORE": url, "STATEQUEUE_HOME": home}
    cmd = [STATEQUEUE, "run", "-q", "q", "--quiet", "--", "true"]
    start = time.monotonic()
    runs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(procs)
    ]
    for r in runs:
        if r.wait(timeout=900) != 0:
            raise SystemExit(f"bench_pg: `statequeue run` exited with {r.returncode}")
    seconds = time.monotonic() - start
    shutil.rmtree(home, ignore_errors=True)
    store = PostgresStore(url, "q", create=False)
    done = store.status().counts.get("done", 0)
    store.close()
    return done, seconds


def filled_store(url: str, n: int) -> None:
    store = PostgresStore(url, "q")
    store.enqueue(items(n))
    store.close()
    settled(url, "statequeue.items", "statequeue.live")


def settled(url: str, *tables: str) -> None:
    """Each kind's tables vacuumed and analysed after its fill, the same for
    every kind (the floor's and procrastinate's were, the store's were not:
    its run then met the planner without statistics, and the autovacuum
    that the fill set off)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {', '.join(tables)}")


def dropped(cluster: PgCluster, url: str) -> None:
    """A measured database dropped once its run ended: else the autovacuum of
    its dead rows ran during the next kind's run, on the same CPUs, and was
    counted as that kind's server time."""
    name = url.split("?", 1)[0].rsplit("/", 1)[1]
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def filled_procrastinate(url: str, n: int) -> None:
    app = procrastinate_app(url)
    with app.open():
        app.schema_manager.apply_schema()
        for start in range(0, n, 1000):
            app.tasks["noop"].batch_defer(*({} for _ in range(min(1000, n - start))))
    settled(url, "procrastinate_jobs")


def procrastinated(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        found = row.fetchone()
    return 0 if found is None else int(found[0])


def filled_floor(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FLOOR_SCHEMA)
        with conn.cursor().copy("COPY floor (id, item, state) FROM STDIN") as copy:
            for i, item in enumerate(items(n)):
                copy.write_row((i + 1, item, "pending"))
    settled(url, "floor")


RUNNERS = {
    "floor": floor_runner,
    "store": store_runner,
    "fused": fused_runner,
    "work": work_runner,
}
FILLS = {"floor": filled_floor, "procrastinate": filled_procrastinate}


def one_run(kind: str, url: str, procs: int, data_dir: Path) -> tuple[int, float, float | None]:
    """(items done, seconds, CPU seconds of the loops and the server; None: not measured)."""
    if kind == "cli":
        return (*cli_drain(url, procs), None)
    if kind == "procrastinate":
        _, seconds = drain(procrastinate_runner, url, procs)
        return procrastinated(url), seconds, None
    return drain_measured(RUNNERS[kind], url, procs, data_dir)


def kinds(cli: bool, only: list[str] | None) -> list[str]:
    found = ["floor", "store", "fused", "work"] + (["cli"] if cli else [])
    found += ["procrastinate"] if procrastinate_app("") is not None else []
    return [k for k in found if only is None or k in only or k == "floor"]


def throughput(
    cluster: PgCluster,
    n: int,
    cli: bool,
    only: list[str] | None = None,
    processes: tuple[int, ...] = PROCESSES,
) -> dict[str, float]:
    figures: dict[str, float] = {}
    for procs in processes:
        for kind in kinds(cli, only):
            url = cluster.new_database()
            FILLS.get(kind, filled_store)(url, n)
            done, seconds, cpu = one_run(kind, url, procs, cluster.data_dir)
            dropped(cluster, url)
            if done != n:
                raise SystemExit(f"bench_pg: {kind} x{procs} finished {done} of {n} items")
            figures[f"{kind}_{procs}_per_s"] = n / seconds
            line = f"  claim+finish {kind:13} x{procs:<2}: {n / seconds:8,.0f} items/s"
            if cpu is not None:
                figures[f"{kind}_{procs}_cpu_ms"] = cpu / n * 1000
                line += f", CPU {cpu / n * 1000:.3f} ms/item (loops + server)"
            print(line, flush=True)
    return figures


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds, and (``KIND_P_ratio``) the median
    of each round's ratio to that round's floor."""
    f = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    for key in rounds[0]:
        if not key.endswith("_per_s"):
            continue
        kind, procs = key.removesuffix("_per_s").rsplit("_", 1)
        if kind != "floor" and f"floor_{procs}_per_s" in rounds[0]:
            ratios = [r[key] / r[f"floor_{procs}_per_s"] for r in rounds]
            f[f"{kind}_{procs}_ratio"] = statistics.median(ratios)
            f[f"{kind}_{procs}_ratio_min"] = min(ratios)
            f[f"{kind}_{procs}_ratio_max"] = max(ratios)
    return f


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def big_queue(url: str, n: int) -> dict[str, float]:
    data = items(n)
    store = PostgresStore(url, "big")
    figures = {"enqueue_per_s": n / timed(lambda: store.enqueue(data))}
    figures["reenqueue_per_s"] = n / timed(lambda: store.enqueue(data))
    figures["status_first_s"] = timed(store.status)
    figures["status_s"] = min(timed(store.status) for _ in range(3))
    store.close()
    return figures


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def claim_rows(f: dict[str, float], claims: int, procs: int) -> list[tuple[str, str, str, str]]:
    rows: list[tuple[str, str, str, str]] = []
    if f"floor_{procs}_per_s" not in f:  # not run (--procs)
        return rows
    floor = f[f"floor_{procs}_per_s"]
    for kind in ("store", "fused", "work", "cli", "procrastinate"):
        rate = f.get(f"{kind}_{procs}_per_s")
        if rate is None:
            continue
        goal: float | None = None
        if kind in ("store", "fused") and procs == 16:
            goal = FLOOR_RATIO_GOAL
        elif kind == "work":
            goal = WORK_GOALS.get(procs)
        ratio = f.get(f"{kind}_{procs}_ratio", rate / floor)
        spread = ""
        if f"{kind}_{procs}_ratio_min" in f:
            spread = f" [{f[f'{kind}_{procs}_ratio_min']:.2f}-{f[f'{kind}_{procs}_ratio_max']:.2f}]"
        cpu, floor_cpu = f.get(f"{kind}_{procs}_cpu_ms"), f.get(f"floor_{procs}_cpu_ms")
        used = ""
        if cpu is not None and floor_cpu:
            # What bounds the rate where the loops and the server share the
            # CPUs (16 loops on a small machine): steadier than the rate
            # ratio, which moves with the floor's fsync cost (two commits an item).
            used = f"; CPU/item {cpu / floor_cpu:.2f}x the floor's ({cpu:.3f} ms)"
        rows.append(
            (
                f"claim+finish {kind} x{procs} ({claims:,} items)",
                f"{rate:,.0f}/s = {ratio:.2f}x{spread} floor ({floor:,.0f}/s){used}",
                "-" if goal is None else f">= {goal}x floor",
                "-" if goal is None else verdict(ratio >= goal),
            )
        )
    peer = f.get(f"procrastinate_{procs}_per_s")
    for kind in ("store", "fused") if peer is not None else ():
        ratio = f[f"{kind}_{procs}_per_s"] / (peer or 1.0)
        rows.append(
            (
                f"  {kind} x{procs} vs procrastinate x{procs}",
                f"{ratio:.2f}x",
                "> 1x (faster)",
                verdict(ratio > 1),
            )
        )
    return rows


def table(f: dict[str, float], n: int, claims: int) -> list[tuple[str, str, str, str]]:
    rows = [row for procs in PROCESSES for row in claim_rows(f, claims, procs)]
    if "enqueue_per_s" not in f:  # --claims-only
        return rows
    rows += [
        (
            f"enqueue {n:,}",
            f"{f['enqueue_per_s']:,.0f}/s",
            f">= {ENQUEUE_GOAL:,.0f}/s",
            verdict(f["enqueue_per_s"] >= ENQUEUE_GOAL),
        ),
        (
            f"re-enqueue {n:,} (all skipped)",
            f"{f['reenqueue_per_s']:,.0f}/s",
            f">= {REENQUEUE_GOAL:,.0f}/s",
            verdict(f["reenqueue_per_s"] >= REENQUEUE_GOAL),
        ),
        (
            f"status, {n:,} items, first after enqueue",
            f"{f['status_first_s']:.4f} s = {f['status_first_s'] / f['status_s']:.1f}x folded",
            "-",
            "-",
        ),
        (
            f"status, {n:,} items, deltas folded",
            f"{f['status_s']:.4f} s",
            f"<= {STATUS_GOAL} s",
            verdict(f["status_s"] <= STATUS_GOAL),
        ),
    ]
    return rows


def show(rows: list[tuple[str, str, str, str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in [("measure", "figure", "goal", "verdict"), *rows]:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k items (2,000 per claim run)")
    parser.add_argument("--no-cli", action="store_true", help="skip the `statequeue run` rows")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument(
        "--claims-only", action="store_true", help="only the claim+finish rows (no 1M queue)"
    )
    parser.add_argument(
        "--kinds", metavar="K,K", help="only these claim+finish kinds (the floor always runs)"
    )
    parser.add_argument(
        "--procs", metavar="P,P", default="1,4,16", help="the claim+finish process counts"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="claim+finish rounds: medians (shared machines)"
    )
    args = parser.parse_args()
    processes = tuple(int(p) for p in args.procs.split(","))
    only = args.kinds.split(",") if args.kinds else None
    n, claims = (100_000, 2_000) if args.quick else (1_000_000, 5_000)
    bin_dir = find_bin_dir()
    if bin_dir is None:
        sys.exit("bench_pg: PostgreSQL binaries (initdb, pg_ctl) not found")
    cluster = _start_cluster(bin_dir)
    try:
        print(f"PostgreSQL store figures ({bin_dir}), {os.cpu_count()} CPUs", flush=True)
        rounds = []
        for number in range(1, args.rounds + 1):
            if args.rounds > 1:
                print(f" round {number} of {args.rounds}", flush=True)
            rounds.append(throughput(cluster, claims, not args.no_cli, only, processes))
        f = medians(rounds) if args.rounds > 1 else rounds[0]
        if not args.claims_only:
            f.update(big_queue(cluster.new_database(), n))
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
    show(table(f, n, claims))
    if "procrastinate_1_per_s" not in f:
        print("  procrastinate: not run as a peer (not installed in this environment)")
    if args.json:
        Path(args.json).write_text(json.dumps({"items": n, "claims": claims, **f}, indent=2) + "\n")


if __name__ == "__main__":
    main()
