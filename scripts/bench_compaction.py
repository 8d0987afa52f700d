"""Compaction pause figures (issue 14): what other processes wait while a queue compacts.

On a queue of --items done items (1M; --quick 100k), uncompacted, written
synthetically as scripts/bench.py writes its 1M-done queue:

  - another process runs `enqueue x` and `status` in a loop during `compact`:
    p50/p99/max latency of each, measured twice: inside a long-lived prober
    process (open the queue, do it, close it: the lock wait and the work), and
    as whole CLI processes (adds interpreter start-up, measured idle too);
  - the compaction's wall time and the peak RSS of the compacting process
    (under a fresh small wrapper, as bench.py measures RSS);
  - auto-compaction during a run: `run -j1 -- true` over --run-items new items
    on a queue with --run-done done items whose dead records trigger it; the
    runner's longest pause between two results (from their recorded times).

Each figure is measured for this checkout and for a baseline statequeue
(--baseline: a checkout with its own .venv, by default /work/main if it has
one) in the same run, and printed beside its goal, met or missed.

Examples:

  .venv/bin/python scripts/bench_compaction.py --quick
  .venv/bin/python scripts/bench_compaction.py --json compaction.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import read_rss, rss_wrapper, write_done_queue

GOAL_LATENCY_MS = 100.0
GOAL_COMPACT_S = 10.0
GOAL_RSS_MB = 300.0
GOAL_PAUSE_MS = 100.0
TIMEOUT = 900.0
KINDS = ("enqueue", "status")
IDLE_PROBES = 20  # prober operations timed before the compaction starts, for reference
NAN = float("nan")  # no goal for this figure

# Runs in the prober process, with the contender's own interpreter and library.
PROBER = """
import gc, json, os, resource, sys, time
from statequeue import Queue
home, name, stop, out = sys.argv[1:5]
n = 0
with open(out, "w") as f:
    while not os.path.exists(stop):
        for kind in ("enqueue", "status"):
            t0 = time.time(); c0 = time.perf_counter(); failed = ""
            try:
                q = Queue(name, home=home, create=False)
                if kind == "enqueue":
                    q.enqueue([f"probe-{os.getpid()}-{n}"])
                else:
                    q.status()
                q.close()
            except Exception as exc:  # a lock timeout (exit 8 for the CLI) counts too
                failed = type(exc).__name__
            row = [kind, t0, time.perf_counter() - c0, failed]
            f.write(json.dumps(row) + "\\n"); f.flush()
            n += 1
            q = None
            # Untimed: a closed queue's state is freed now, not at some later
            # full collection (the prober measures; it must not hoard).
            gc.collect()
            time.sleep(0.02)  # a loop of commands, not a busy loop
    f.write(json.dumps(["rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]) + "\\n")
"""


class Contender:
    """One statequeue installation: its CLI and its interpreter."""

    def __init__(self, label: str, bindir: Path, workdir: Path) -> None:
        self.label = label
        self.exe = str(bindir / "statequeue")
        self.python = str(bindir / "python")
        self.home = workdir / f"home-{label.split()[0]}"
        self.home.mkdir(mode=0o700)
        env = {k: v for k, v in os.environ.items() if not k.startswith("STATEQUEUE_")}
        env.update(STATEQUEUE_HOME=str(self.home), NO_COLOR="1")
        self.env = env

    def sq(self, *args: str, env: dict[str, str] | None = None) -> tuple[float, str]:
        started = time.perf_counter()
        out = subprocess.run(
            [self.exe, *args],
            env=env or self.env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        if out.returncode != 0:
            raise SystemExit(
                f"{self.label}: statequeue {args}: exit {out.returncode}: {out.stderr}"
            )
        return time.perf_counter() - started, out.stdout


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def spread(values: list[float]) -> dict[str, float]:
    """p50/p99/max in ms (empty if none)."""
    if not values:
        return {}
    ms = [v * 1000 for v in values]
    return {"n": len(ms), "p50": statistics.median(ms), "p99": pct(ms, 0.99), "max": max(ms)}


# -- compaction with another process in a loop ----------------------------------------


def measure_compaction(c: Contender, template: Path, *, cli: bool) -> dict[str, Any]:
    name = "big"
    shutil.copytree(template, c.home / name)
    c.sq("-q", name, "status")  # untimed: replays once, leaves the checkpoint a real queue has
    c.sq("-q", name, "enqueue", "warm-up")  # and the cached dedupe keys
    cli_idle = [c.sq("-q", name, kind, *extra)[0] for kind, extra in _cli_probes(10)]
    stop = c.home / "stop"
    probes = c.home / "probes.jsonl"
    prober = subprocess.Popen(
        [c.python, "-c", PROBER, str(c.home), name, str(stop), str(probes)],
        env=c.env,
        cwd=c.home,  # `python -c` imports from its cwd first: never another checkout's code
    )
    shell: list[tuple[str, float, float]] = []
    done = threading.Event()
    looper = threading.Thread(target=_cli_loop, args=(c, name, shell, done))
    try:
        _wait_for_lines(probes, IDLE_PROBES)  # the same operations before compaction
        if cli:
            looper.start()
        rss_file = c.home / "compact.rss"
        started = time.time()
        wall, _ = _timed(rss_wrapper(rss_file, [c.exe, "-q", name, "compact"]), c.env)
        ended = started + wall
    finally:
        stop.touch()
        done.set()
        prober.wait(TIMEOUT)
        if looper.is_alive():
            looper.join(TIMEOUT)
    rows = [json.loads(line) for line in probes.read_text().splitlines()]
    lib = [row for row in rows if len(row) == 4]
    prober_kb = max([row[1] for row in rows if row[0] == "rss"], default=0)
    return {
        "compact_s": wall,
        "compact_rss_mb": read_rss(rss_file) / 1024,
        "prober_rss_mb": prober_kb / 1024,
        "lib_idle": _by_kind([(k, d) for k, t0, d, _ in lib if t0 < started]),
        "lib": _by_kind([(k, d) for k, t0, d, _ in lib if started <= t0 < ended]),
        "lib_failed": [f for _, t0, _, f in lib if f and started <= t0 < ended],
        "cli": _by_kind([(k, d) for k, t0, d in shell if started <= t0 < ended]),
        "cli_idle": spread(cli_idle),
    }


def _by_kind(samples: list[tuple[str, float]]) -> dict[str, dict[str, float]]:
    return {k: spread([d for kind, d in samples if kind == k]) for k in KINDS}


def _cli_probes(n: int) -> list[tuple[str, tuple[str, ...]]]:
    return [("enqueue", (f"idle-{i}",)) if i % 2 == 0 else ("status", ()) for i in range(n)]


def _cli_loop(
    c: Contender, name: str, out: list[tuple[str, float, float]], done: threading.Event
) -> None:
    n = 0
    while not done.is_set():
        for kind, extra in (("enqueue", (f"cli-{n}",)), ("status", ())):
            t0 = time.time()
            wall, _ = c.sq("-q", name, kind, *extra)
            out.append((kind, t0, wall))
        n += 1


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    if out.returncode != 0:
        raise SystemExit(f"{argv}: exit {out.returncode}: {out.stderr}")
    return time.perf_counter() - started, out.stdout


def _wait_for_lines(path: Path, n: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        time.sleep(0.01)
    raise SystemExit(f"the prober wrote nothing to {path}")


# -- auto-compaction during a run ------------------------------------------------------


def measure_run_pause(c: Contender, template: Path, items: int, auto: int | None) -> dict[str, Any]:
    name = "run"
    shutil.copytree(template, c.home / name)
    feed = c.home / "items.txt"
    feed.write_text("".join(f"new-{i}\n" for i in range(items)))
    with feed.open() as stdin:
        subprocess.run([c.exe, "-q", name, "enqueue"], stdin=stdin, env=c.env, check=True)
    c.sq("-q", name, "status")  # untimed: the checkpoint a real queue has
    env = dict(c.env)
    if auto is not None:
        env["STATEQUEUE_AUTO_COMPACT"] = str(auto)
    wall, _ = _timed([c.exe, "-q", name, "run", "--no-live", "--", "true"], env)
    stamps = _result_times(c.home / name, first_new=_first_new_id(template))
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    archive = c.home / name / "archive.jsonl"
    return {
        "run_s": wall,
        "items": len(stamps),
        "compacted": archive.exists() and archive.stat().st_size > 0,
        "gap": spread(gaps),
    }


def _first_new_id(template: Path) -> int:
    with (template / "journal.jsonl").open("rb") as f:
        return sum(1 for line in f if b'"t":"enq"' in line) + 1


def _result_times(folder: Path, *, first_new: int) -> list[float]:
    """When each new item's result was recorded (its ``end``, or its ``arch``
    once compaction moved it), in order."""
    stamps: list[float] = []
    for name, kind in (("journal.jsonl", "end"), ("archive.jsonl", "arch")):
        path = folder / name
        if not path.exists():
            continue
        with path.open("rb") as f:
            for line in f:
                if f'"t":"{kind}"'.encode() not in line:
                    continue
                rec = json.loads(line)
                if rec["id"] >= first_new and "at" in rec:
                    stamps.append(rec["at"])
    return sorted(set(stamps))


# -- report ----------------------------------------------------------------------------


def verdict(value: float | None, goal: float) -> str:
    if value is None:
        return "n/a"
    return "met" if value <= goal else "missed"


def report(results: dict[str, dict[str, Any]], sizes: dict[str, int]) -> None:
    labels = list(results)
    rows: list[tuple[str, list[float | None], float, str]] = []

    def get(label: str, *path: str) -> float | None:
        node: Any = results[label]
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return float(node)

    shown_as = {"lib_idle": "in-process, no compaction", "lib": "in-process, during compact"}
    shown_as["cli"] = "whole CLI process, during compact"
    for where, shown in shown_as.items():
        for kind in KINDS:
            for stat in ("p50", "p99", "max"):
                vals = [get(lb, "compaction", where, kind, stat) for lb in labels]
                if all(v is None for v in vals):
                    continue
                goal = GOAL_LATENCY_MS if stat == "p99" and where != "lib_idle" else NAN
                rows.append((f"{kind}, {shown}, {stat} (ms)", vals, goal, "ms"))
    rows.append(
        (
            "CLI enqueue/status, no compaction, p50 (ms)",
            [get(lb, "compaction", "cli_idle", "p50") for lb in labels],
            NAN,
            "ms",
        )
    )
    rows.append(
        (
            "compact wall time (s)",
            [get(lb, "compaction", "compact_s") for lb in labels],
            GOAL_COMPACT_S,
            "s",
        )
    )
    rows.append(
        (
            "compact peak RSS (MB)",
            [get(lb, "compaction", "compact_rss_mb") for lb in labels],
            GOAL_RSS_MB,
            "MB",
        )
    )
    rows.append(
        (
            "prober process peak RSS (MB)",
            [get(lb, "compaction", "prober_rss_mb") for lb in labels],
            NAN,
            "MB",
        )
    )
    for stat in ("p99", "max"):
        vals = [get(lb, "run", "gap", stat) for lb in labels]
        goal = GOAL_PAUSE_MS if stat == "max" else NAN
        rows.append((f"runner pause between results, {stat} (ms)", vals, goal, "ms"))
    print(
        f"\ncompaction on {sizes['items']:,} done items; run of {sizes['run_items']:,} "
        f"items on {sizes['run_done']:,} done (auto-compaction)"
    )
    head = f"{'figure':<56}" + "".join(f"{lb:>22}" for lb in labels) + f"{'goal':>10}  verdict"
    print(head)
    print("-" * len(head))
    for title, vals, goal, _unit in rows:
        cells = "".join(f"{'-' if v is None else f'{v:,.1f}':>22}" for v in vals)
        has_goal = goal == goal  # not NaN
        ratio = ""
        if len(vals) > 1 and vals[0] and vals[1]:
            ratio = f"  ({vals[0] / vals[1]:.2f}x baseline)"
        goal_s = f"<= {goal:g}" if has_goal else ""
        judged = verdict(vals[0], goal) if has_goal else ""
        print(f"{title:<56}{cells}{goal_s:>10}  {judged}{ratio}")
    for label in labels:
        run = results[label].get("run", {})
        failed = results[label].get("compaction", {}).get("lib_failed", [])
        print(
            f"{label}: run {run.get('run_s', 0):.1f}s, compacted during it: "
            f"{run.get('compacted')}; prober operations that failed during compact: "
            f"{len(failed)} {sorted(set(failed))}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k items instead of 1M")
    parser.add_argument("--items", type=int, help="done items to compact (default 1M)")
    parser.add_argument("--run-done", type=int, help="done items under the run (default 200k)")
    parser.add_argument("--run-items", type=int, help="items the run takes (default 4000)")
    parser.add_argument("--baseline", type=Path, help="a checkout with .venv (default /work/main)")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument(
        "--cli", action="store_true", help="also loop whole CLI processes during compact"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp"))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args()
    items = args.items or (100_000 if args.quick else 1_000_000)
    run_done = args.run_done or (20_000 if args.quick else 200_000)
    run_items = args.run_items or (1500 if args.quick else 4000)
    auto = 10_000 if args.quick else None  # the default threshold (100k) for the full size

    here = Path(sys.executable).parent
    contenders_at = [("this checkout", here)]
    base = args.baseline or Path("/work/main")
    if not args.no_baseline and (base / ".venv" / "bin" / "statequeue").exists():
        contenders_at.append((f"baseline ({base.name})", base / ".venv" / "bin"))
    workdir = Path(tempfile.mkdtemp(prefix="sq-bench-compaction-", dir=args.workdir))
    results: dict[str, dict[str, Any]] = {}
    try:
        log(f"writing {items:,} done items and {run_done:,} done items in {workdir}")
        big = workdir / "template-big"
        write_done_queue(big, items)
        small = workdir / "template-run"
        write_done_queue(small, run_done)
        for label, bindir in contenders_at:
            c = Contender(label, bindir, workdir)
            log(f"{label}: compaction with another process in a loop")
            figures: dict[str, Any] = {"compaction": measure_compaction(c, big, cli=args.cli)}
            log(f"{label}: auto-compaction during a run")
            figures["run"] = measure_run_pause(c, small, run_items, auto)
            results[label] = figures
            shutil.rmtree(c.home, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    sizes = {"items": items, "run_done": run_done, "run_items": run_items}
    report(results, sizes)
    if args.json:
        args.json.write_text(json.dumps({"sizes": sizes, "results": results}, indent=2))


if __name__ == "__main__":
    main()
