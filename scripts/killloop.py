"""Kill-loop figures for notes: SIGKILL `statequeue` at random moments, then check.

Runs the machinery of tests/acceptance/killloop.py in a fresh temporary folder
(its own STATEQUEUE_HOME) and prints one line of figures: items, kills,
re-runs, duplicates, overlaps. Exit status 1 if a promise was broken.

Examples:

  .venv/bin/python scripts/killloop.py                       # 200 items, 20 kills
  .venv/bin/python scripts/killloop.py --verify --kills 50
  .venv/bin/python scripts/killloop.py --runners 3 -j2 --kills 100
  .venv/bin/python scripts/killloop.py --runners 2 --admin --kills 1000 --json
  .venv/bin/python scripts/killloop.py --store postgresql://... --runners 3 -j2 --hosts 3 --lease 2s
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.acceptance.killloop import Harness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=200, help="items enqueued first")
    parser.add_argument("--kills", type=int, default=20, help="kills to make (at least)")
    parser.add_argument("--runners", type=int, default=1, help="concurrent runners")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="-j of each runner")
    parser.add_argument("--work", type=float, default=0.01, help="seconds of work per item")
    parser.add_argument("--verify", action="store_true", help="runners use --verify")
    parser.add_argument(
        "--orphans", action="store_true", help="the work outlives its runner (promise 4)"
    )
    parser.add_argument(
        "--admin", action="store_true", help="also kill enqueue and compact at random"
    )
    parser.add_argument(
        "--max-items", type=int, default=3000, help="new items --admin enqueues may add"
    )
    parser.add_argument("--crash-points", action="store_true", help="sweep compact's crash hook")
    parser.add_argument("--store", default="", help="a PostgreSQL store URL (default: local)")
    parser.add_argument(
        "--hosts", type=int, default=0, help="runners play this many hosts (STATEQUEUE_HOST)"
    )
    parser.add_argument("--lease", default="", help="run --lease (PostgreSQL store)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="statequeue-killloop-"))
    ok = True
    started = time.monotonic()
    with Harness(
        folder,
        jobs=args.jobs,
        work=args.work,
        verify=args.verify,
        orphans=args.orphans,
        seed=args.seed,
        max_items=args.max_items,
        store=args.store,
        hosts=args.hosts,
        lease=args.lease,
    ) as h:
        try:
            h.enqueue(args.items)
            h.kill_loop(
                kills=args.kills,
                runners=args.runners,
                admin=args.admin,
                on_kill=lambda p: None if p.role == "run" else h.open_check(),
                max_seconds=3600,
            )
            loop_seconds = time.monotonic() - started
            if args.crash_points:
                h.crash_point_sweep()
            fig = h.check()
        except AssertionError as exc:
            ok = False
            fig = h.collect()
            loop_seconds = time.monotonic() - started
            print(f"FAILED (seed {h.seed}, folder {folder}): {exc}", file=sys.stderr)
    fig.extra["loop_seconds"] = round(loop_seconds, 1)
    if args.json:
        data = dataclasses.asdict(fig)
        data["seed"] = h.seed
        print(json.dumps(data))
    else:
        print(f"{fig.line()} [seed {h.seed}; kill phase {loop_seconds:.1f}s]")
    if not args.keep and ok:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    elif args.keep or not ok:
        print(f"work folder kept: {folder}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
