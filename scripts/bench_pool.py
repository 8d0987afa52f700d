"""What the pool guard of ``map(processes=True)`` costs per task (issue 21
point 1): a forkserver ProcessPoolExecutor running a no-op, bare, against the
same pool with the guard (each worker's parent-death signal and sentinel,
and each task's claim fd lent over the unix socket and handed to the
sentinel): ``pool_guard.process_pool``, as ``statequeue.map`` runs it.

The two cases run in interleaved rounds in this process, each submitting
``--items`` tasks one at a time from ``--jobs`` threads (as map's slots do)
to a pool of ``--jobs`` workers started and warmed before the clock starts.
The table prints the median per task and the guarded/bare ratio.

Examples:

  .venv/bin/python scripts/bench_pool.py
  .venv/bin/python scripts/bench_pool.py --items 2000 --rounds 5 --jobs 4
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from statequeue.api import pool_guard
from statequeue.core.models import Claim


def noop(item: str) -> None:
    return None


def bare(pool: ProcessPoolExecutor) -> Callable[[str], Any]:
    return lambda item: pool.submit(noop, item).result()


def guarded(pool: pool_guard.ProcessPool, fd: int) -> Callable[[str], Any]:
    def call(item: str) -> Any:
        claim = Claim(item_id=1, item=item, attempt=1, runner_id="bench", inherit_fds=(fd,))
        return pool.call(noop, claim)

    return call


def timed(call: Callable[[str], Any], items: int, jobs: int) -> float:
    """Seconds per task, ``items`` tasks from ``jobs`` threads."""
    share = [items // jobs + (n < items % jobs) for n in range(jobs)]

    def slot(count: int) -> None:
        for n in range(count):
            call(str(n))

    threads = [threading.Thread(target=slot, args=(c,)) for c in share]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return (time.perf_counter() - start) / items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=4)
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("forkserver")
    with (
        tempfile.TemporaryFile() as claim,
        ProcessPoolExecutor(args.jobs, mp_context=context) as plain,
        pool_guard.process_pool(args.jobs) as guard,
    ):
        cases = {"bare pool": bare(plain), "guarded pool": guarded(guard, claim.fileno())}
        for call in cases.values():
            timed(call, args.jobs * 20, args.jobs)  # start and warm every worker
        timings: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, call in cases.items():
                timings[name].append(timed(call, args.items, args.jobs))
    base = statistics.median(timings["bare pool"])
    print(f"{args.items} tasks, {args.jobs} workers and threads, {args.rounds} rounds (median)")
    for name, values in timings.items():
        per_task = statistics.median(values)
        print(f"{name:<14} {per_task * 1e6:>8.0f}us per task {per_task / base:>6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
