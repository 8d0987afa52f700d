"""Persistent workers against one process per item (issue 23), in one run.

Items/s of `statequeue run -jN -- python worker.py {}` (a new interpreter per item)
against `statequeue run --persistent -jN -- python worker.py` (one per slot), at -j1
and -j2, for two workers written with ``statequeue.serve``: a no-op (goal: at least
20x the items/s) and one whose imports take 0.3 s (``time.sleep(0.3)`` at import;
goal: at least 100x; the per-item side gets fewer items so that it ends). Then the
time per item of `run --persistent -j1` against a ``Queue.work()`` loop doing the same
no-op on the same store, each a whole process from start to end (goal: within 1.5x).

Every case runs the installed `statequeue` on a fresh queue of the journal store in a
temporary STATEQUEUE_HOME under /var/tmp (or --workdir); cases are interleaved round by
round so that they meet the disk in the same state, and the table shows medians. A case
counts only when every item ended done. Items are enqueued before the clock starts.

Examples:

  .venv-bench/bin/python scripts/bench_persistent.py
  .venv-bench/bin/python scripts/bench_persistent.py --quick
  .venv-bench/bin/python scripts/bench_persistent.py --rounds 5 --json out.json
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
from dataclasses import dataclass
from pathlib import Path

from statequeue import Queue

BIN = Path(sys.executable).parent
STATEQUEUE = shutil.which("statequeue", path=str(BIN)) or "statequeue"

WORKERS = {
    "noop": "import statequeue\n\nstatequeue.serve(lambda item: None)\n",
    "slow-import": (
        "import time\n\nimport statequeue\n\n"
        "time.sleep(0.3)  # imports that take 0.3 s, as numpy and pandas do\n"
        "statequeue.serve(lambda item: None)\n"
    ),
}
WORK_LOOP = """\
import sys

from statequeue import Queue

with Queue(sys.argv[1]) as queue:
    for item in queue.work():
        item.done(None)
"""


@dataclass(frozen=True)
class Case:
    name: str
    items: int
    command: list[str]
    """After `statequeue run`, or a whole command when ``loop``."""
    loop: bool = False


def cases(args: argparse.Namespace, folder: Path) -> list[Case]:
    python = sys.executable
    found = []
    for worker in WORKERS:
        script = str(folder / f"{worker}.py")
        few = args.slow_items if worker == "slow-import" else args.per_item_items
        for jobs in (1, 2):
            per_item = [f"-j{jobs}", "--", python, script, "{}"]
            persistent = ["--persistent", f"-j{jobs}", "--", python, script]
            found.append(Case(f"{worker} per item -j{jobs}", few, per_item))
            found.append(Case(f"{worker} persistent -j{jobs}", args.items, persistent))
    loop = [python, str(folder / "loop.py")]
    found.append(Case("Queue.work() loop", args.items, loop, loop=True))
    return found


def run_case(case: Case, home: Path) -> float:
    """Seconds for ``case`` on a fresh queue in ``home``, from process start to end."""
    queue_name = "bench"
    with Queue(queue_name, home=home) as queue:
        queue.enqueue([f"item-{n}" for n in range(case.items)])
    env = {**os.environ, "STATEQUEUE_HOME": str(home), "STATEQUEUE_QUEUE": queue_name}
    command = (
        [*case.command, queue_name] if case.loop else [STATEQUEUE, "run", "--quiet", *case.command]
    )
    start = time.perf_counter()
    out = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{case.name}: exit {out.returncode}: {out.stderr.decode().strip()}")
    with Queue(queue_name, home=home) as queue:
        done = queue.status().counts.get("done", 0)
    if done != case.items:
        raise SystemExit(f"{case.name}: {done} of {case.items} items done")
    return seconds


def measure(args: argparse.Namespace, workdir: Path) -> dict[str, list[float]]:
    for worker, text in WORKERS.items():
        (workdir / f"{worker}.py").write_text(text)
    (workdir / "loop.py").write_text(WORK_LOOP)
    per_item: dict[str, list[float]] = {}
    for round_no in range(args.rounds):
        for n, case in enumerate(cases(args, workdir)):
            home = workdir / f"home-{round_no}-{n}"
            per_item.setdefault(case.name, []).append(run_case(case, home) / case.items)
            shutil.rmtree(home)
    return per_item


def report(per_item: dict[str, list[float]], args: argparse.Namespace) -> dict[str, object]:
    median = {name: statistics.median(times) for name, times in per_item.items()}
    print(f"{args.rounds} round(s); medians; journal store; per item = whole run / items")
    print(f"{'case':<28} {'items':>6} {'per item':>11} {'items/s':>9}")
    for case in cases(args, Path()):
        seconds = median[case.name]
        print(f"{case.name:<28} {case.items:>6} {seconds * 1e3:>9.2f}ms {1 / seconds:>9.1f}")
    figures = []
    print(f"\n{'figure':<46} {'value':>8}  goal")
    for worker, goal in (("noop", 20.0), ("slow-import", 100.0)):
        for jobs in (1, 2):
            speedup = (
                median[f"{worker} per item -j{jobs}"] / median[f"{worker} persistent -j{jobs}"]
            )
            figures.append(
                _figure(f"{worker}: persistent / per item items/s, -j{jobs}", speedup, ">=", goal)
            )
    overhead = median["noop persistent -j1"] / median["Queue.work() loop"]
    figures.append(_figure("per item: persistent -j1 / Queue.work() loop", overhead, "<=", 1.5))
    return {"rounds": args.rounds, "per_item_s": median, "figures": figures}


def _figure(name: str, value: float, sense: str, goal: float) -> dict[str, object]:
    met = value >= goal if sense == ">=" else value <= goal
    print(f"{name:<46} {value:>7.1f}x  {sense} {goal:g}x {'met' if met else 'MISSED'}")
    return {"figure": name, "value": value, "goal": f"{sense} {goal:g}x", "met": met}


def has_persistent() -> bool:
    out = subprocess.run([STATEQUEUE, "run", "--help"], capture_output=True, text=True)
    return "--persistent" in out.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--items", type=int, default=2000, help="per persistent and loop case")
    parser.add_argument("--per-item-items", type=int, default=100, help="per no-op per-item case")
    parser.add_argument("--slow-items", type=int, default=12, help="per slow-import per-item case")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one round, fewer items")
    parser.add_argument("--workdir", default="/var/tmp")
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.items, args.per_item_items, args.slow_items = 1, 500, 40, 6
    if not has_persistent():
        print("bench_persistent: this statequeue has no `run --persistent`", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="statequeue-bench-persistent-", dir=args.workdir))
    try:
        figures = report(measure(args, workdir), args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
