"""Benchmark `statequeue export` / `import` against enqueue of the same items.

Each round, in a fresh temporary home: enqueue N items into a local queue
(the baseline: the cheapest way to fill a queue), finish a tenth of them,
export it to a file, import that file into a new local queue, and (with
--store URL) import it into PostgreSQL and export it back. Every step runs
the real CLI as a whole process (each PostgreSQL round leaves a queue
``bench-*`` behind: use a throwaway database); the table shows the median over the rounds,
items per second, and the ratio to the enqueue measured in the same run.

    python scripts/bench_transfer.py [--items N] [--rounds R] [--store URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

BIN = Path(sys.executable).parent
STATEQUEUE = shutil.which("statequeue", path=str(BIN)) or "statequeue"


def timed(env: dict[str, str], *args: str, stdin: bytes = b"") -> float:
    start = time.perf_counter()
    subprocess.run([STATEQUEUE, *args], input=stdin, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def one_round(items: int, store: str | None) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(prefix="sqbench-transfer-", dir="/var/tmp"))
    try:
        env = {**os.environ, "STATEQUEUE_HOME": str(home)}
        env.pop("STATEQUEUE_STORE", None)
        data = b"".join(b"/data/file-%08d.pdf\n" % i for i in range(items))
        export = home / "e.ndjson"
        out = {"enqueue": timed(env, "enqueue", "-q", "src", stdin=data)}
        _finish_some(home, items // 10)
        out["export"] = timed(env, "export", "-q", "src", "-o", str(export))
        out["import (local)"] = timed(env, "import", "-q", "dst", str(export))
        if store:
            queue = f"bench-{uuid.uuid4().hex[:8]}"
            pg = ("--store", store)
            out["import (PostgreSQL)"] = timed(env, *pg, "import", "-q", queue, str(export))
            out["export (PostgreSQL)"] = timed(env, *pg, "export", "-q", queue, "-o", str(export))
        return out
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _finish_some(home: Path, n: int) -> None:
    """Record results for ``n`` items through the library (no child processes)."""
    from statequeue.api.queue import Queue
    from statequeue.core.identity import new_runner
    from statequeue.core.models import Outcome

    runner = new_runner()
    with Queue("src", home=home) as q:
        for i in range(n):
            claim = q.claim(runner)
            assert claim is not None
            q.finish(claim, Outcome(ok=True, exit_code=0, result={"i": i}), sync=False)
        q.store.sync()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--store", help="a PostgreSQL store URL to import into and export from")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rounds = [one_round(args.items, args.store) for _ in range(args.rounds)]
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    base = medians["enqueue"]
    if args.json:
        print(json.dumps({"items": args.items, "rounds": args.rounds, "seconds": medians}))
        return
    print(f"{args.items} items ({args.items // 10} with results), median of {args.rounds} rounds")
    print(f"{'step':<22}{'seconds':>10}{'items/s':>12}{'x enqueue':>12}")
    for step, seconds in medians.items():
        rate = args.items / seconds
        print(f"{step:<22}{seconds:>10.3f}{rate:>12,.0f}{seconds / base:>12.2f}")


if __name__ == "__main__":
    main()
