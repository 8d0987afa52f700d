"""The library's overhead per item (issue 13): ``statequeue.map`` with a no-op
function and ``statequeue.map_async`` with ``asyncio.sleep(0)``, against the
least a durable loop can do: append one JSON line per item and fsync it.

All cases run in this process, in interleaved rounds (round 1: loop, map,
map_async; round 2: ...), each on a fresh queue in a temporary folder under
/var/tmp (or --workdir), so that they meet the same disk in the same state.
A case's time covers the whole call (enqueue, claims, results, each fsynced
before its slot claims again). The table prints the median per item and the
ratio against the loop measured in the same run, beside the goal (<= 1.5x).

Examples:

  .venv-bench/bin/python scripts/bench_library.py
  .venv-bench/bin/python scripts/bench_library.py --items 500 --rounds 3 --json out.json
  .venv-bench/bin/python scripts/bench_library.py --profile map   # where the time goes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson

import statequeue

GOAL = 1.5


def plain_loop(folder: Path, items: list[str]) -> None:
    """The baseline: one JSON line per item, appended and fsynced, in order."""
    fd = os.open(folder / "results.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        for item in items:
            os.write(fd, orjson.dumps({"item": item, "result": None}) + b"\n")
            os.fsync(fd)
    finally:
        os.close(fd)


def noop(item: str) -> None:
    return None


async def anoop(item: str) -> None:
    await asyncio.sleep(0)


def cases(jobs: int, concurrency: int) -> dict[str, Callable[[Path, list[str]], object]]:
    return {
        "plain loop (append + fsync)": plain_loop,
        "map, jobs=1": lambda home, items: statequeue.map(
            noop, items, queue="b", home=home, jobs=1
        ),
        f"map, jobs={jobs}": lambda home, items: statequeue.map(
            noop, items, queue="b", home=home, jobs=jobs
        ),
        f"map_async, concurrency={concurrency}": lambda home, items: asyncio.run(
            statequeue.map_async(anoop, items, queue="b", home=home, concurrency=concurrency)
        ),
    }


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, list[float]]:
    items = [f"https://example.org/item/{n}" for n in range(args.items)]
    timings: dict[str, list[float]] = {}
    for round_no in range(args.rounds):
        for name, run in cases(args.jobs, args.concurrency).items():
            folder = workdir / f"r{round_no}-{len(timings.get(name, []))}-{abs(hash(name))}"
            folder.mkdir(mode=0o700)
            start = time.perf_counter()
            run(folder, items)
            timings.setdefault(name, []).append((time.perf_counter() - start) / len(items))
            shutil.rmtree(folder)
    return timings


def report(timings: dict[str, list[float]], args: argparse.Namespace) -> dict[str, object]:
    names = list(timings)
    base = statistics.median(timings[names[0]])
    rows = []
    print(f"{args.items} items, {args.rounds} rounds (median per item)")
    print(f"{'case':<34} {'per item':>10} {'ratio':>7}  goal")
    for name in names:
        per_item = statistics.median(timings[name])
        ratio = per_item / base
        verdict = "" if name == names[0] else f"<= {GOAL}x {'met' if ratio <= GOAL else 'missed'}"
        print(f"{name:<34} {per_item * 1e6:>8.0f}us {ratio:>6.2f}x  {verdict}")
        rows.append({"case": name, "per_item_s": per_item, "ratio": ratio, "rounds": timings[name]})
    return {"items": args.items, "rounds": args.rounds, "goal_ratio": GOAL, "cases": rows}


def profile(args: argparse.Namespace, workdir: Path) -> None:
    import cProfile
    import pstats

    items = [f"https://example.org/item/{n}" for n in range(args.items)]
    wanted = {"map": f"map, jobs={args.jobs}", "map1": "map, jobs=1"}.get(
        args.profile, f"map_async, concurrency={args.concurrency}"
    )
    run = cases(args.jobs, args.concurrency)[wanted]
    folder = workdir / "profile"
    folder.mkdir(mode=0o700)
    prof = cProfile.Profile()
    prof.enable()
    run(folder, items)
    prof.disable()
    print(f"profile of {wanted} ({args.items} items), by own time:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workdir", default="/var/tmp")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    parser.add_argument("--profile", choices=["map", "map1", "map_async"])
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="statequeue-bench-library-", dir=args.workdir))
    try:
        if args.profile:
            profile(args, workdir)
            return 0
        figures = report(measure(args, workdir), args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
