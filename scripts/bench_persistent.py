"""Persistent workers against one process per item (issue 23), in one run.

Items/s of `statequeue run -jN -- python worker.py {}` (a new interpreter per item)
against `statequeue run --persistent -jN -- python worker.py` (one per slot), at -j1
and -j2, for two workers written with ``statequeue.serve``: a no-op (goal: at least
20x the items/s) and one whose imports take 0.3 s (``time.sleep(0.3)`` at import;
goal: at least 100x; the per-item side gets fewer items so that it ends). These two
figures are of whole runs, start-up included: paying for a start once per worker
instead of once per item is what they measure.

Then the cost per item of `run --persistent -j1` against a ``Queue.work()`` loop doing
the same no-op on the same store (goal: within 1.5x). Per item here is the steady
state of each run: the time from its first item's end record to its last one's (the
same records, written by the same store, on both sides), divided by the items between
them, so that neither side's start-up and shut-down (the CLI's imports, the keeper,
starting the worker; the loop's imports) count as a cost per item. The whole runs'
ratio is printed beside it (no goal), as are both cases' CPU per item (every process
of each, whole runs; no goal).

Every case runs the installed `statequeue` on a fresh queue of the journal store in a
temporary STATEQUEUE_HOME under /var/tmp (or --workdir). Cases are interleaved round by
round, and the two sides of each figure run one right after the other, so that they meet
the disk and the machine's load in the same state: each figure is the median over the
rounds of that round's ratio (the table shows the median time per item of each case).
A case's whole-run time (the table's `per item`) is its whole process, start-up included,
divided by its items; a case counts only when every item ended done. Items are enqueued
before the clock starts.

Examples:

  .venv-bench/bin/python scripts/bench_persistent.py
  .venv-bench/bin/python scripts/bench_persistent.py --quick
  .venv-bench/bin/python scripts/bench_persistent.py --rounds 5 --json out.json
  .venv-bench/bin/python scripts/bench_persistent.py --overhead-only --rounds 9
  .venv-bench/bin/python scripts/bench_persistent.py --overhead-only --against /tmp/main/.venv/bin

With --against BIN (another install's bin folder: its `statequeue` and its `python`,
e.g. main's code before a change), that install's `run --persistent -j1` runs too, in
each round next to this one's (first in every other round) and before the loop, and its
own ratio to the same loop is printed beside this one's: a change measured before and
after in one run.
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
    bin: Path | None = None
    """Another install's bin folder (--against): its statequeue and python run the case."""


LOOP = "Queue.work() loop"
CPU = " (CPU)"
STEADY = " (steady)"
FIGURES = [
    *(
        (f"{worker}: persistent / per item items/s, -j{jobs}",
         f"{worker} per item -j{jobs}", f"{worker} persistent -j{jobs}", ">=", goal)
        for worker, goal in (("noop", 20.0), ("slow-import", 100.0))
        for jobs in (1, 2)
    ),
    ("per item: persistent -j1 / Queue.work() loop", "noop persistent -j1" + STEADY,
     LOOP + STEADY, "<=", 1.5),
]  # fmt: skip
"""(figure, numerator, denominator, sense, goal): each a ratio of per-item times (a case's
name: of its whole run; + STEADY: of its steady state)."""
OVERHEAD = FIGURES[-1][1]
AGAINST = "noop persistent -j1 (--against)"


def cases(args: argparse.Namespace, folder: Path) -> list[Case]:
    """In the order they run: each figure's two sides next to each other."""
    python = sys.executable
    found = []
    if args.overhead_only:  # the last figure's two sides only, in the same order
        script = str(folder / "noop.py")
        persistent = ["--persistent", "-j1", "--", python, script]
        loop = [python, str(folder / "loop.py")]
        found = [Case("noop persistent -j1", args.items, persistent)]
        if args.against is not None:
            other = [*persistent[:-2], str(args.against / "python"), script]
            found.append(Case(AGAINST, args.items, other, bin=args.against))
        return [*found, Case(LOOP, args.items, loop, loop=True)]
    for worker in WORKERS:
        script = str(folder / f"{worker}.py")
        few = args.slow_items if worker == "slow-import" else args.per_item_items
        for jobs in (1, 2):
            per_item = [f"-j{jobs}", "--", python, script, "{}"]
            persistent = ["--persistent", f"-j{jobs}", "--", python, script]
            found.append(Case(f"{worker} per item -j{jobs}", few, per_item))
            found.append(Case(f"{worker} persistent -j{jobs}", args.items, persistent))
            if worker == "noop" and jobs == 1:
                loop = [python, str(folder / "loop.py")]
                found.append(Case(LOOP, args.items, loop, loop=True))
    return found


@dataclass(frozen=True)
class Timing:
    """One run of a case."""

    seconds: float
    """From process start to end."""
    cpu: float
    """CPU seconds (user + sys) of its process and every descendant it waited
    for (the keeper and, through it, the workers)."""
    steady: float
    """Seconds per item between its first and last item's end records."""


def run_case(case: Case, home: Path) -> Timing:
    """Run ``case`` on a fresh queue in ``home``."""
    queue_name = "bench"
    with Queue(queue_name, home=home) as queue:
        queue.enqueue([f"item-{n}" for n in range(case.items)])
    env = {**os.environ, "STATEQUEUE_HOME": str(home), "STATEQUEUE_QUEUE": queue_name}
    statequeue = STATEQUEUE if case.bin is None else str(case.bin / "statequeue")
    command = (
        [*case.command, queue_name] if case.loop else [statequeue, "run", "--quiet", *case.command]
    )
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code != 0:
            err.seek(0)
            raise SystemExit(f"{case.name}: exit {code}: {err.read().decode().strip()}")
    with Queue(queue_name, home=home) as queue:
        done = queue.status().counts.get("done", 0)
        ends = [record["at"] for record in queue.events() if record.get("t") == "end"]
    if done != case.items:
        raise SystemExit(f"{case.name}: {done} of {case.items} items done")
    steady = (max(ends) - min(ends)) / (len(ends) - 1) if len(ends) > 1 else seconds
    return Timing(seconds, usage.ru_utime + usage.ru_stime, steady)


def measure(args: argparse.Namespace, workdir: Path) -> list[dict[str, float]]:
    """Per round: each case's seconds per item (and its CPU seconds per item,
    under the case's name + CPU; its steady state's, under the name + STEADY)."""
    for worker, text in WORKERS.items():
        (workdir / f"{worker}.py").write_text(text)
    (workdir / "loop.py").write_text(WORK_LOOP)
    rounds = []
    for round_no in range(args.rounds):
        per_item = {}
        order = cases(args, workdir)
        if args.against is not None and round_no % 2:
            order[:2] = order[1::-1]  # every other round --against's case runs first
        for n, case in enumerate(order):
            home = workdir / f"home-{round_no}-{n}"
            timing = run_case(case, home)
            per_item[case.name] = timing.seconds / case.items
            per_item[case.name + CPU] = timing.cpu / case.items
            per_item[case.name + STEADY] = timing.steady
            shutil.rmtree(home)
        rounds.append(per_item)
    return rounds


def report(rounds: list[dict[str, float]], args: argparse.Namespace) -> dict[str, object]:
    print(f"{args.rounds} round(s); journal store; medians; per item = whole run / items;")
    print("steady = first to last item's end record / items between them")
    width = max(len(case.name) for case in cases(args, Path()))
    print(
        f"{'case':<{width}} {'items':>6} {'per item':>11} {'items/s':>9} {'CPU/item':>11}"
        f" {'steady':>11}"
    )
    median = {}
    for case in cases(args, Path()):
        for kind in ("", CPU, STEADY):
            median[case.name + kind] = statistics.median(r[case.name + kind] for r in rounds)
        seconds, cpu, steady = (median[case.name + kind] for kind in ("", CPU, STEADY))
        print(
            f"{case.name:<{width}} {case.items:>6} {seconds * 1e3:>9.2f}ms {1 / seconds:>9.1f}"
            f" {cpu * 1e3:>9.2f}ms {steady * 1e3:>9.3f}ms"
        )
    print(f"\n{'figure (median of per-round ratios)':<52} {'value':>8}  goal")
    figures = []
    for name, over, under, sense, goal in FIGURES:
        if args.overhead_only and over != OVERHEAD:
            continue
        ratios = [r[over] / r[under] for r in rounds]
        value = statistics.median(ratios)
        met = value >= goal if sense == ">=" else value <= goal
        spread = f"rounds {min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""
        verdict = "met" if met else "MISSED"
        print(f"{name:<52} {value:>7.2f}x  {sense} {goal:g}x {verdict}  {spread}")
        goal_text = f"{sense} {goal:g}x"
        figures.append(
            {"figure": name, "value": value, "rounds": ratios, "goal": goal_text, "met": met}
        )
    # No goal: the whole runs' ratio (start-up and shut-down included), and CPU
    # (runner, keeper and workers together), which other work on the machine moves
    # less than wall time, so it shows a change a loaded run hides.
    compared = [("noop persistent -j1", "")]
    if args.against is not None:
        compared.append((AGAINST, " --against"))
    for case_name, label in compared:
        for name, kind in (
            ("per item (steady)", STEADY),
            ("whole runs", ""),
            ("CPU per item", CPU),
        ):
            if kind == STEADY and not label:
                continue  # the goal's figure, above
            name = f"{name}{label}: persistent -j1 / work() loop"
            figures.append(_ratio(rounds, name, case_name + kind, LOOP + kind))
    return {"rounds": args.rounds, "per_item_s": median, "figures": figures}


def _ratio(rounds: list[dict[str, float]], name: str, over: str, under: str) -> dict[str, object]:
    """Print a figure with no goal: the median of per-round ratios, and their spread."""
    ratios = [r[over] / r[under] for r in rounds]
    value = statistics.median(ratios)
    print(f"{name:<52} {value:>7.2f}x  (no goal)  rounds {min(ratios):.2f}-{max(ratios):.2f}")
    return {"figure": name, "value": value, "rounds": ratios}


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
    parser.add_argument(
        "--overhead-only",
        action="store_true",
        help="only the last figure (persistent -j1 against the Queue.work() loop)",
    )
    parser.add_argument("--workdir", default="/var/tmp")
    parser.add_argument(
        "--against",
        type=Path,
        metavar="BIN",
        help="with --overhead-only: also run another install's persistent case (its bin folder)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.against is not None and not args.overhead_only:
        parser.error("--against goes with --overhead-only")
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
