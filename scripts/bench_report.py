"""Benchmark `statequeue report` on a 1M-item queue (issue 25).

The queue is made through the library (``Queue.enqueue``, then the store's
``claim`` and ``finish_and_claim`` for four runners on two hosts, as a
runner records attempts): log-normal durations, 2% fail with exit code 1
and are retried once (a third of the retries fail again, for good), 0.3%
time out. It is built in a child process whose fsync is a no-op: the fixture
is thrown away, and a million fsyncs would take most of an hour; the
measured commands run unpatched.

Cases, each the real CLI in its own process, interleaved over --rounds:

  report           statequeue report -o FILE on the live journal
  stats cold       statequeue stats --json with its summary cache removed:
                   the same scan of every attempt, without the page (the
                   baseline: report / stats cold is the page's own cost)
  stats warm       statequeue stats --json from its summary cache
  ... compacted    each again after `statequeue compact` (the archive path)

Printed: median wall time and spread, the page's size and the peak RSS of
one more run (``/usr/bin/time -f %M``, as scripts/bench.py measures it),
beside the goals: <= 10 s and <= 5 MB for 1M items.

Examples:

  .venv/bin/python scripts/bench_report.py
  .venv/bin/python scripts/bench_report.py --items 100000 --rounds 1
  .venv/bin/python scripts/bench_report.py --fixture /var/tmp/sq-1m   # keep and reuse the queue
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import find_statequeue, read_rss, rss_wrapper

GOAL_S = 10.0
GOAL_MB = 5.0
MB = 1024 * 1024
QUEUE = "bench-report"


def build(home: Path, n: int, seed: int = 25) -> None:
    """The fixture queue (run in a child process: see the module docstring)."""
    os.fsync = lambda fd: None  # the fixture only; never the measured commands
    os.environ["STATEQUEUE_HOME"] = str(home)
    from statequeue.api.queue import Queue
    from statequeue.core.models import Outcome, RunnerInfo

    q = Queue(QUEUE, create=True)
    for start in range(0, n, 50_000):
        q.enqueue([f"https://example.org/page/{i}" for i in range(start, min(n, start + 50_000))])
    store = q.store
    runners = [
        RunnerInfo(f"bench-runner-{k}", os.getpid(), f"host-{k % 2}", "", time.time())
        for k in range(4)
    ]
    for r in runners:
        store.register_runner(r)
    rng = random.Random(seed)
    claims = [store.claim(r) for r in runners]
    k = 0
    while any(claims):
        k = (k + 1) % len(runners)
        claim = claims[k]
        if claim is None:
            continue
        roll, duration = rng.random(), rng.lognormvariate(-3, 1)
        retry_at = None
        if roll < 0.02 or (claim.attempt > 1 and roll < 0.33):
            outcome = Outcome(ok=False, exit_code=1, duration=duration, reason="exit code 1")
            retry_at = time.time() if claim.attempt == 1 else None
        elif roll < 0.023:
            reason = "timed out after 5s; ended by SIGTERM"
            outcome = Outcome(ok=False, signal=15, timed_out=True, duration=5.0, reason=reason)
        else:
            outcome = Outcome(ok=True, exit_code=0, duration=duration)
        _, claims[k] = store.finish_and_claim(claim, outcome, retry_at=retry_at, runner=runners[k])
    for r in runners:
        store.unregister_runner(r.runner_id)
    q.close()


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_report: {argv} exited {done.returncode}: {done.stderr[-500:]}")
    return wall


def peak_mb(argv: list[str], env: dict[str, str], workdir: Path) -> float:
    out = workdir / "rss"
    out.unlink(missing_ok=True)
    subprocess.run(rss_wrapper(out, argv), env=env, capture_output=True, check=True)
    return read_rss(out) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--fixture",
        type=Path,
        default=None,
        help="keep the queue's home here and reuse it (compacted after its first run)",
    )
    parser.add_argument("--build", type=Path, help=argparse.SUPPRESS)  # the child's job
    args = parser.parse_args()
    if args.build is not None:
        build(args.build, args.items)
        return
    exe = find_statequeue()
    if exe is None:
        raise SystemExit("bench_report: no statequeue command (make install first)")
    workdir = Path(tempfile.mkdtemp(prefix="sq-bench-report-", dir=args.workdir or "/var/tmp"))
    try:
        home = args.fixture or workdir / "home"
        if not (home / QUEUE).exists():
            started = time.perf_counter()
            child = [sys.executable, __file__, "--build", str(home), "--items", str(args.items)]
            subprocess.run(child, check=True)
            took = time.perf_counter() - started
            print(f"fixture: {args.items} items made through the library in {took:.0f} s")
        run(exe, workdir, home, args.items, args.rounds)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


Row = tuple[str, list[float], float, float | None]


def run(exe: str, workdir: Path, home: Path, n: int, rounds: int) -> None:
    env = {**os.environ, "STATEQUEUE_HOME": str(home)}
    env.pop("STATEQUEUE_STORE", None)
    page = workdir / "report.html"
    report = [exe, "-q", QUEUE, "report", "-o", str(page)]
    stats = [exe, "-q", QUEUE, "stats", "--json"]
    cache = home / QUEUE / "stats.ckpt"
    rows: list[Row] = []
    for compact in (False, True):
        if compact:
            subprocess.run([exe, "-q", QUEUE, "compact"], env=env, check=True, capture_output=True)
        suffix = " compacted" if compact else ""
        times: dict[str, list[float]] = {"report": [], "cold": [], "warm": []}
        for _ in range(rounds):
            times["report"].append(timed(report, env))
            cache.unlink(missing_ok=True)  # the same scan of every attempt the report does
            times["cold"].append(timed(stats, env))
            times["warm"].append(timed(stats, env))
        rows.append(
            (f"report{suffix}", times["report"], peak_mb(report, env, workdir), page.stat().st_size)
        )
        rows.append((f"stats cold{suffix}", times["cold"], 0.0, None))
        rows.append((f"stats warm{suffix}", times["warm"], peak_mb(stats, env, workdir), None))
    figures = json.loads(subprocess.run(stats, env=env, capture_output=True, check=True).stdout)
    print(f"queue: {figures['counts']}, {figures['attempts']} attempts")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average at the end: {load} ({os.cpu_count()} cores): compare within this run")
    show(rows, n)


def show(rows: list[Row], n: int) -> None:
    print(f"{'case':<22}{'median s':>9}{'spread s':>14}{'peak MB':>8}{'page MB':>8}  goal")
    report_median = 0.0
    for label, walls, rss, size in rows:
        median = statistics.median(walls)
        spread = f"{min(walls):.2f}-{max(walls):.2f}"
        note = ""
        if size is not None:
            mb = size / MB
            ok = median <= GOAL_S * n / 1_000_000 and mb <= GOAL_MB
            note = (
                f"<= {GOAL_S:g} s and <= {GOAL_MB:g} MB per 1M items: {'met' if ok else 'MISSED'}"
            )
            report_median = median
        elif label.startswith("stats cold"):
            note = f"the same scan, no page: report / this = {report_median / median:.2f}x"
        shown = "" if size is None else f"{size / MB:.2f}"
        peak = f"{rss:.0f}" if rss else "-"
        print(f"{label:<22}{median:>9.2f}{spread:>14}{peak:>8}{shown:>8}  {note}")


if __name__ == "__main__":
    main()
