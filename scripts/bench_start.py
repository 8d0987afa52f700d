"""The start-and-enqueue figures of issue 27, each beside its baseline measured in the same run.

1. Start of `statequeue enqueue ITEM` on an existing queue, against the same
   interpreter's `python -c pass`: each round enqueues one new item (a shell
   loop's `statequeue enqueue "$f"`: open, dedupe probe, one append, fsync).
   Goal: at most 3x.
2. Start of the commands through typer (cli/command_table.py builds the
   invoked one alone), against the same `python -c pass`: `run` with nothing
   to do (the fixed cost a `run -j1` of short items pays once), `run` of one
   item (`-- true`; the item is enqueued before, untimed) and `status` (its
   own fast path, cli/main.py). Goal for `run` with nothing to do: at most 3x.
3. Enqueue of 1M items from stdin into a new queue, against the floor: the same
   interpreter reading the same stdin, writing the same ``enq`` records (one
   ``orjson.dumps`` of a dict per item, no checksum, no dedupe) to a new file
   and fsyncing it once. Goal: at most 1.5x. Beside it, for each tree, what
   the fill leaves to the commands after it (no goal; before and after a
   change, they show a cost moved rather than saved): a re-enqueue of the
   same items (all skipped: a cron job's), then the first small enqueue
   (``enqueue ITEM``, the first probe of the keys index).

Rounds are interleaved (A, B, A, B, ...) and each figure is the ratio of the
medians of wall time, with the ratio of CPU time (user + sys) beside it: on a
shared machine the wall time swings. The package is byte-compiled first and
PYTHONDONTWRITEBYTECODE is dropped, as for an installed package: otherwise
every start compiles every module (an editable install under that setting
measures the compiler, not statequeue).

``--before DIR`` also runs, in the same rounds, the package found in DIR
(e.g. from ``git archive OLDREV statequeue | tar -x -C DIR``) through
PYTHONPATH, and this checkout's the same way: a change is shown as before
and after, measured side by side.

Every command runs as a whole process with stdout and stderr to files; a
failed command stops the script. Queue data lives in a temporary folder
under /var/tmp (or --workdir), removed at the end.

Examples:

  .venv/bin/python scripts/bench_start.py
  .venv/bin/python scripts/bench_start.py --rounds 31 --items 200000 --enqueue-rounds 3
  .venv/bin/python scripts/bench_start.py --before /tmp/old   # old code beside new
  .venv/bin/python scripts/bench_start.py --only run --before /tmp/old
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

GOAL_START_VS_PYTHON = 3.0
GOAL_RUN_START_VS_PYTHON = 3.0
GOAL_ENQUEUE_VS_FLOOR = 1.5

FLOOR = """
import os, sys, orjson
out = sys.argv[1]
dumps = orjson.dumps
lines = sys.stdin.buffer.read().decode().splitlines()
data = b"".join(
    dumps({"t": "enq", "id": i, "item": text, "seq": i + 1}) + b"\\n"
    for i, text in enumerate(lines, 1)
)
fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
view = memoryview(data)
while view:
    view = view[os.write(fd, view):]
os.fsync(fd)
os.close(fd)
print(len(lines))
"""


class Sample(NamedTuple):
    wall: float  # seconds
    cpu: float  # user + sys seconds of the process (less sensitive to a busy machine)


def timed(argv: Sequence[str], env: dict[str, str], workdir: Path, stdin: Path | None) -> Sample:
    """``argv`` run as a whole process; exits the script if it fails."""
    with open(stdin or os.devnull, "rb") as inp, open(workdir / "err", "wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=inp, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{' '.join(argv)}: exit {code}: {(workdir / 'err').read_text()}")
    return Sample(wall, usage.ru_utime + usage.ru_stime)


class Setup:
    """Where the commands run, and which statequeue trees are measured (label, env)."""

    def __init__(self, exe: str, workdir: Path, before: Path | None) -> None:
        self.exe = exe
        self.workdir = workdir
        # Bytecode as an installed package has it: compiled once, read from
        # __pycache__ (PYTHONDONTWRITEBYTECODE would compile every module on
        # every start, and measure the compiler).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("STATEQUEUE_") and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(STATEQUEUE_HOME=str(workdir / "home"), NO_COLOR="1")
        self.env = env
        here = Path(__file__).resolve().parent.parent
        self.trees: list[tuple[str, dict[str, str]]] = [("statequeue", env)]
        if before is not None:
            self.trees = [
                ("before", {**env, "PYTHONPATH": str(before)}),
                ("after", {**env, "PYTHONPATH": str(here)}),
            ]
        for folder in (here, *([before] if before else [])):
            compiled = [sys.executable, "-m", "compileall", "-q", str(folder / "statequeue")]
            subprocess.run(compiled, env=env, check=True, stdout=subprocess.DEVNULL)


def start_figure(setup: Setup, rounds: int) -> None:
    """Figure 1: each tree's `enqueue ITEM` of one new item on an existing queue."""
    for label, env in setup.trees:
        timed([setup.exe, "-q", f"start-{label}", "enqueue", "first"], env, setup.workdir, None)
    ours: dict[str, list[Sample]] = {label: [] for label, _ in setup.trees}
    python: list[Sample] = []
    for r in range(rounds):
        for label, env in setup.trees:
            argv = [setup.exe, "-q", f"start-{label}", "enqueue", f"item-{r}"]
            ours[label].append(timed(argv, env, setup.workdir, None))
        python.append(timed([sys.executable, "-c", "pass"], setup.env, setup.workdir, None))
    for label, samples in ours.items():
        show(f"start of `{label} enqueue ITEM`", "python -c pass", samples, python, 1000, "ms",
             GOAL_START_VS_PYTHON)  # fmt: skip


def run_start_figure(setup: Setup, rounds: int) -> None:
    """Figure 2: each tree's `run` with nothing to do, `run` of one item, `status`."""
    cases = ("run with nothing to do", "run of 1 item", "status")
    for label, env in setup.trees:  # a queue with one finished item
        timed([setup.exe, "-q", f"run-{label}", "enqueue", "first"], env, setup.workdir, None)
        timed(_run(setup, label), env, setup.workdir, None)
    ours = {(label, case): list[Sample]() for label, _ in setup.trees for case in cases}
    python: list[Sample] = []
    for r in range(rounds):
        for label, env in setup.trees:
            ours[label, cases[0]].append(timed(_run(setup, label), env, setup.workdir, None))
            add = [setup.exe, "-q", f"run-{label}", "enqueue", f"item-{r}"]
            timed(add, env, setup.workdir, None)
            ours[label, cases[1]].append(timed(_run(setup, label), env, setup.workdir, None))
            status = [setup.exe, "-q", f"run-{label}", "status"]
            ours[label, cases[2]].append(timed(status, env, setup.workdir, None))
        python.append(timed([sys.executable, "-c", "pass"], setup.env, setup.workdir, None))
    for case in cases:
        goal = GOAL_RUN_START_VS_PYTHON if case == cases[0] else None
        for label, _ in setup.trees:
            show(f"`{label} {case}`", "python -c pass", ours[label, case], python, 1000, "ms",
                 goal)  # fmt: skip


def _run(setup: Setup, label: str) -> list[str]:
    return [setup.exe, "-q", f"run-{label}", "run", "--no-live", "--", "true"]


def enqueue_figure(setup: Setup, items: int, rounds: int) -> None:
    """Figure 3: each tree's enqueue of ``items`` from stdin, and the floor."""
    source = setup.workdir / "items.txt"
    source.write_bytes(b"".join(b"%d\n" % i for i in range(1, items + 1)))
    ours: dict[str, list[Sample]] = {label: [] for label, _ in setup.trees}
    again: dict[str, list[Sample]] = {label: [] for label, _ in setup.trees}
    first: dict[str, list[Sample]] = {label: [] for label, _ in setup.trees}
    floor: list[Sample] = []
    for r in range(rounds):
        for label, env in setup.trees:
            shutil.rmtree(setup.workdir / "home" / "big", ignore_errors=True)
            argv = [setup.exe, "-q", "big", "enqueue"]
            ours[label].append(timed(argv, env, setup.workdir, source))
            again[label].append(timed(argv, env, setup.workdir, source))
            one = [setup.exe, "-q", "big", "enqueue", "one-more"]
            first[label].append(timed(one, env, setup.workdir, None))
        out = setup.workdir / f"floor-{r}.jsonl"
        argv = [sys.executable, "-c", FLOOR, str(out)]
        floor.append(timed(argv, setup.env, setup.workdir, source))
        out.unlink()
    for label, samples in ours.items():
        show(f"`{label} enqueue` of {items:,} items from stdin", "orjson records + one fsync",
             samples, floor, 1, "s", GOAL_ENQUEUE_VS_FLOOR)  # fmt: skip
    for label, _ in setup.trees:
        plain(f"after it, `{label} enqueue` of the same items (all skipped)", again[label], 1, "s")
        plain(f"then the first `{label} enqueue ITEM`", first[label], 1000, "ms")


def plain(what: str, samples: list[Sample], scale: float, unit: str) -> None:
    """A figure without a baseline: medians of wall and CPU time."""
    wall = statistics.median(x.wall for x in samples) * scale
    cpu = statistics.median(x.cpu for x in samples) * scale
    rounds = len(samples)
    figure = f"{wall:.3g} {unit} (CPU time {cpu:.3g} {unit})"
    print(f"{what}: {figure} | medians of {rounds} rounds", flush=True)


def show(
    what: str,
    baseline: str,
    ours: list[Sample],
    base: list[Sample],
    scale: float,
    unit: str,
    goal: float | None,
) -> None:
    a = statistics.median(x.wall for x in ours) * scale
    b = statistics.median(x.wall for x in base) * scale
    ratio = a / b
    cpu = statistics.median(x.cpu for x in ours) / statistics.median(x.cpu for x in base)
    verdict = "" if goal is None else f"goal <= {goal:g}x: {'met' if ratio <= goal else 'missed'}; "
    spread = _spread(ours, scale)
    print(
        f"{what}: {a:.3g} {unit} ({spread}) | {baseline}: {b:.3g} {unit} | "
        f"{ratio:.2f}x ({verdict}CPU time {cpu:.2f}x) | "
        f"medians of {len(ours)} interleaved rounds",
        flush=True,
    )


def _spread(samples: list[Sample], scale: float) -> str:
    """The middle half of the wall times: how much the figure swings."""
    walls = sorted(x.wall * scale for x in samples)
    return f"middle half {walls[len(walls) // 4]:.3g}-{walls[(3 * len(walls)) // 4]:.3g}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds of figure 1")
    parser.add_argument("--items", type=int, default=1_000_000, help="items of figure 2")
    parser.add_argument("--enqueue-rounds", type=int, default=5, help="rounds of figure 2")
    parser.add_argument("--exe", default=str(Path(sys.executable).with_name("statequeue")))
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--only", choices=("start", "run", "enqueue"), help="one figure only")
    parser.add_argument("--before", type=Path, help="also measure the package in this folder")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="sq-bench-start-", dir=args.workdir))
    try:
        setup = Setup(args.exe, workdir, args.before)
        if args.only in (None, "start"):
            start_figure(setup, args.rounds)
        if args.only in (None, "run"):
            run_start_figure(setup, args.rounds)
        if args.only in (None, "enqueue"):
            enqueue_figure(setup, args.items, args.enqueue_rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
