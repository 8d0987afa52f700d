"""System calls per item of statequeue's own processes, counted with strace (issue 27).

`make bench` gives times; this gives the count behind them: how many system
calls, of which kind, statequeue's processes make for one item, so that a
change to the path of an item can be quoted before and after in the same
terms. Three shapes, each on a fresh queue of the journal store:

  per-item      statequeue run -j1 -- true              (the default)
  persistent    statequeue run --persistent -j1 -- python worker.py
                (a tiny worker that speaks the line protocol by hand, as
                tests/persistent_worker.py does: no statequeue import)
  serve         statequeue run --persistent -j1 -- python serve_worker.py
                (a no-op worker written with statequeue.serve: both sides of
                the protocol are statequeue's, so the worker's calls after
                its exec are counted too, as `serve worker`)
  work          a Python program: for item in Queue(name).work(): item.done(None)

How it counts. Each shape runs twice under `strace -f -ff -o DIR/tr`, once
over N items (default 1000) and once over 1 item; items are enqueued before,
untraced. strace writes one file per process or thread (DIR/tr.PID). Per
item = (count of the N-item run - count of the 1-item run) / (N - 1), per
system call name and per role, so start-up and shut-down (imports, opening
the queue, starting the keeper) drop out.

Which file is whose. Each file is read for the successful execve (`= 0`,
whose argv says what the process runs) and for the clone, clone3, fork and
vfork that return a new pid (which makes the process tree; a clone with
CLONE_THREAD makes a thread, counted with its process):

  - an item's command (argv[0] is the command: `true`, or the worker
    script): its calls before its execve are counted as `child pre-exec`
    (work done for statequeue between the spawn and the exec: file actions,
    dup2, close_range, prlimit, signal masks); the execve itself and all
    after it are the user's program's and are not counted;
  - `keeper`: a process that exec'd run/keeper_process.py;
  - the process strace started (its calls from its own execve on) is the
    `runner` when it or an exec'd keeper below it starts the items (the shape
    before issue 27); when the items are started by a process forked below
    it (the shape after: a waiter whose grandchild is the runner, under the
    keeper) that process is the `runner`, the one it was forked from (when
    not the started process) the `keeper`, and the started process the
    `waiter`;
  - any other process forked without an exec takes its parent's role with
    ` (fork)` after it; `work loop` is the Python program of the work shape.

A fourth shape, `floor`, counts the durable floor loop of scripts/bench.py at
-j1 (no statequeue at all) the same way, for comparison.

The table lists every role found, one column each, and their total; rows
are system call names, largest total first, then the total per item. The
processes of the N-item run, with the role given to each and why, follow,
so the attribution can be checked by eye.

Examples:

  .venv/bin/python scripts/strace_items.py
  .venv/bin/python scripts/strace_items.py --items 200 --shapes per-item,persistent,work
  .venv/bin/python scripts/strace_items.py --persistent   (persistent, serve, work)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
STATEQUEUE = shutil.which("statequeue", path=str(BIN)) or shutil.which("statequeue") or ""
SHAPES = ("per-item", "persistent", "serve", "work", "floor")

WORKER = """\
import json, os, sys
reply = os.fdopen(int(os.environ["STATEQUEUE_REPLY_FD"]), "w")
for line in sys.stdin:
    request = json.loads(line)
    reply.write(json.dumps({"id": request["id"], "ok": True}) + "\\n")
    reply.flush()
"""
SERVE_WORKER = """\
import statequeue

statequeue.serve(lambda item: None)
"""
# The durable floor of scripts/bench.py at -j1 (append a start record,
# posix_spawn, waitpid, append an end record, fdatasync): the least a durable
# runner does per item, for comparison.
FLOOR = """\
import os, shutil, sys
program = shutil.which("true")
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
for item in sys.stdin.buffer.read().splitlines():
    os.write(fd, b'{"t":"start","item":"%s"}\\n' % item)
    pid = os.posix_spawn(program, [program, item.decode()], os.environ)
    _, status = os.waitpid(pid, 0)
    os.write(fd, b'{"t":"end","item":"%s","status":%d}\\n' % (item, status))
    os.fdatasync(fd)
"""
WORK_LOOP = """\
import sys

from statequeue import Queue

with Queue(sys.argv[1]) as queue:
    for item in queue.work():
        item.done(None)
"""

CALL = re.compile(r"^([a-z_0-9]+)\(")
RESUMED = re.compile(r"^<\.\.\. ([a-z_0-9]+) resumed>")
RETURNS = re.compile(r"\)\s+=\s+(-?\d+)")
EXECVE_ARGS = re.compile(r'^execve\("((?:[^"\\]|\\.)*)", \[(.*?)\]')
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
SPAWNS = {"clone", "clone3", "fork", "vfork"}


@dataclass
class Process:
    """One trace file: a process or a thread."""

    pid: int
    argv: list[str] = field(default_factory=list)  # of its successful execve, if any
    before_exec: Counter[str] = field(default_factory=Counter)
    after_exec: Counter[str] = field(default_factory=Counter)
    children: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)
    parent: int | None = None
    role: str = ""
    why: str = ""

    @property
    def calls(self) -> Counter[str]:
        return self.before_exec + self.after_exec


def parse_trace(path: Path) -> Process:
    """Count one strace -ff file's calls, split at its successful execve."""
    proc = Process(int(path.name.rsplit(".", 1)[1]))
    pending_exec: list[str] = []
    pending_spawn = ""
    counts = proc.before_exec
    for line in path.read_text(errors="replace").splitlines():
        resumed = RESUMED.match(line)
        call = CALL.match(line)
        if call:
            name = call.group(1)
            counts[name] += 1  # counted where it starts; its resumed half is not
            if name == "execve" and (args := EXECVE_ARGS.match(line)):
                pending_exec = [
                    bytes(a, "ascii").decode("unicode_escape")
                    for a in QUOTED.findall(args.group(2))
                ]
            if name in SPAWNS:
                pending_spawn = line
        elif resumed:
            name = resumed.group(1)
        else:
            continue  # signals (---), exits (+++), anything else
        returned = RETURNS.search(line)
        if returned is None:
            continue
        value = int(returned.group(1))
        if name == "execve" and value == 0 and pending_exec:
            proc.argv = pending_exec
            counts[name] -= 1  # the exec itself: every launcher's, counted on neither side
            counts = proc.after_exec
        elif name in SPAWNS and value > 0:
            flags = pending_spawn if call is None else line
            (proc.threads if "CLONE_THREAD" in flags else proc.children).append(value)
    return proc


def read_traces(folder: Path) -> dict[int, Process]:
    procs = {p.pid: p for p in map(parse_trace, sorted(folder.glob("tr.*")))}
    for proc in procs.values():
        for child in proc.children + proc.threads:
            if child in procs:
                procs[child].parent = proc.pid
    return procs


def is_item(proc: Process, markers: tuple[str, ...]) -> bool:
    """An item's command: its exec'd argv[0] (or argv[1], a script) is one of ``markers``."""
    return any(os.path.basename(a) in markers for a in proc.argv[:2])


def assign_roles(
    procs: dict[int, Process], root: int, markers: tuple[str, ...], shape: str
) -> None:
    """Give each process its role (the module docstring says how)."""
    threads = {t: p.pid for p in procs.values() for t in p.threads}
    for proc in procs.values():
        if is_item(proc, markers):
            proc.role, proc.why = "child pre-exec", f"exec'd {' '.join(proc.argv[:2])}"
        elif any("keeper_process" in a for a in proc.argv):
            proc.role, proc.why = "keeper", "exec'd keeper_process.py"
    spawners = {
        p.pid
        for p in procs.values()
        if any(procs[c].role == "child pre-exec" for c in p.children if c in procs)
    }
    top = procs[root]
    if shape in ("work", "floor"):
        top.role, top.why = f"{shape} loop", "the program strace started"
    elif root in spawners or any(procs[s].role == "keeper" for s in spawners):
        top.role, top.why = "runner", "started by strace; it or its exec'd keeper starts the items"
    else:
        top.role, top.why = "waiter", "started by strace; the items are started by a fork below it"
        for pid in spawners:
            spawner = procs[pid]
            if not spawner.role:
                spawner.role, spawner.why = "runner", "forked; starts the items"
            parent = procs.get(spawner.parent or -1)
            if parent is not None and parent.pid != root and not parent.role:
                parent.role, parent.why = "keeper", "forked; the runner's parent"
    # the rest, from the top down: threads with their process, forks after their parent
    for _ in range(len(procs)):
        for proc in procs.values():
            if proc.role or proc.parent is None or not procs[proc.parent].role:
                continue
            parent = procs[proc.parent]
            base = parent.role.removesuffix(" (fork)")
            if base == "child pre-exec":
                proc.role, proc.why = "child pre-exec", "below an item's command"
            elif proc.pid in threads:
                proc.role, proc.why = parent.role, f"a thread of {parent.pid}"
            else:
                proc.role, proc.why = f"{base} (fork)", f"forked from {parent.pid}, no exec"
    for proc in procs.values():
        if not proc.role:
            proc.role, proc.why = "unattributed", "no parent found in the traces"


def counted(procs: dict[int, Process], root: int, shape: str) -> dict[str, Counter[str]]:
    """Calls per role: statequeue's own, an item's only before its exec (a
    statequeue.serve worker's after it too, as `serve worker`)."""
    by_role: dict[str, Counter[str]] = {}
    for proc in procs.values():
        if proc.role == "child pre-exec" and proc.argv:
            calls = proc.before_exec
            if shape == "serve":
                by_role.setdefault("serve worker", Counter()).update(proc.after_exec)
        elif proc.pid == root:
            calls = proc.after_exec  # before it, strace's own child ran
        else:
            calls = proc.calls
        by_role.setdefault(proc.role, Counter()).update(calls)
    return by_role


@dataclass
class Shape:
    name: str
    title: str
    markers: tuple[str, ...]


def shape_of(name: str) -> Shape:
    if name == "per-item":
        return Shape(name, "statequeue run -j1 --no-live -- true {}", ("true",))
    if name == "persistent":
        return Shape(
            name, "statequeue run --persistent -j1 --no-live -- python worker.py", ("worker.py",)
        )
    if name == "serve":
        return Shape(
            name,
            "statequeue run --persistent -j1 --no-live -- python serve_worker.py"
            " (statequeue.serve)",
            ("serve_worker.py",),
        )
    if name == "floor":
        return Shape(
            name, "the durable floor loop of bench.py, -j1, -- true (no statequeue)", ("true",)
        )
    return Shape(name, "Queue.work() loop (python loop.py): item.done(None)", ("loop-never",))


def trace_run(
    shape: Shape, items: int, work: Path, env: dict[str, str]
) -> tuple[dict[str, Counter[str]], dict[int, Process]]:
    """One traced run of ``shape`` over ``items`` on a fresh queue."""
    home = work / f"home-{shape.name}-{items}"
    traces = work / f"traces-{shape.name}-{items}"
    traces.mkdir()
    env = {**env, "STATEQUEUE_HOME": str(home)}
    queue = "q"
    lines = "".join(f"item-{n}\n" for n in range(items))
    stdin = None
    if shape.name == "floor":
        (work / f"items-{items}").write_text(lines)
        stdin = (work / f"items-{items}").open("rb")
        command = [sys.executable, str(work / "floor.py"), str(work / f"floor-{items}.jsonl")]
    else:
        enqueue = [STATEQUEUE, "-q", queue, "enqueue"]
        subprocess.run(
            enqueue, input=lines.encode(), env=env, check=True, stdout=subprocess.DEVNULL
        )
    if shape.name == "floor":
        pass
    elif shape.name == "work":
        command = [sys.executable, str(work / "loop.py"), queue]
    elif shape.name in ("persistent", "serve"):
        script = "worker.py" if shape.name == "persistent" else "serve_worker.py"
        command = [STATEQUEUE, "-q", queue, "run", "--no-live", "--persistent", "-j1"]
        command += ["--", sys.executable, str(work / script)]
    else:
        command = [STATEQUEUE, "-q", queue, "run", "--no-live", "-j1", "--", "true", "{}"]
    strace = ["strace", "-f", "-ff", "-qq", "-s", "200", "-o", str(traces / "tr")]
    out = subprocess.run(
        [*strace, *command], env=env, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    if stdin is not None:
        stdin.close()
    if out.returncode != 0:
        raise SystemExit(
            f"{shape.name}, {items} items: exit {out.returncode}: "
            f"{out.stderr.decode().strip()[-500:]}"
        )
    status = subprocess.run(
        [STATEQUEUE, "-q", queue, "status", "--json"], env=env, capture_output=True, text=True
    )
    try:
        done = json.loads(status.stdout)["counts"].get("done")
    except (ValueError, KeyError, TypeError):
        done = None
    if shape.name == "floor":
        done = (work / f"floor-{items}.jsonl").read_bytes().count(b'"t":"end"')
    if done != items:
        raise SystemExit(
            f"{shape.name}: {done} of {items} items done: {status.stdout.strip()[:300]}"
        )
    procs = read_traces(traces)
    root = min(procs, key=lambda pid: (procs[pid].parent is not None, pid))
    assign_roles(procs, root, shape.markers, shape.name)
    return counted(procs, root, shape.name), procs


def report(
    shape: Shape,
    items: int,
    full: dict[str, Counter[str]],
    one: dict[str, Counter[str]],
    procs: dict[int, Process],
) -> str:
    roles = sorted(set(full) | set(one), key=lambda r: (r in ("child pre-exec", "serve worker"), r))
    per: dict[str, dict[str, float]] = {
        role: {
            name: (full.get(role, Counter())[name] - one.get(role, Counter())[name]) / (items - 1)
            for name in set(full.get(role, Counter())) | set(one.get(role, Counter()))
        }
        for role in roles
    }
    names = {name for role in roles for name in per[role]}
    total = {name: sum(per[role].get(name, 0.0) for role in roles) for name in names}
    shown = sorted(
        (
            n
            for n in names
            if abs(total[n]) >= 0.005 or any(abs(per[r].get(n, 0)) >= 0.005 for r in roles)
        ),
        key=lambda n: (-total[n], n),
    )
    width = max([len(n) for n in shown] + [len("total per item")])
    columns = [*roles, "total"]
    colw = [max(8, len(c)) for c in columns]
    out = [
        f"## {shape.title}",
        f"system calls per item: ({items:,}-item run - 1-item run) / {items - 1:,}, "
        "the launcher's own processes (statequeue's; the floor loop's)",
        "",
        "  ".join(
            [f"{'syscall':<{width}}", *(f"{c:>{w}}" for c, w in zip(columns, colw, strict=True))]
        ),
    ]
    for name in shown:
        cells = [per[r].get(name, 0.0) for r in roles] + [total[name]]
        out.append(
            "  ".join(
                [
                    f"{name:<{width}}",
                    *(
                        f"{v:>{w}.2f}" if v else f"{'-':>{w}}"
                        for v, w in zip(cells, colw, strict=True)
                    ),
                ]
            )
        )
    sums = [sum(per[r].values()) for r in roles]
    out.append(
        "  ".join(
            [
                f"{'total per item':<{width}}",
                *(f"{v:>{w}.2f}" for v, w in zip([*sums, sum(sums)], colw, strict=True)),
            ]
        )
    )
    out += ["", f"processes of the {items:,}-item run (item commands grouped):"]
    items_seen = [p for p in procs.values() if p.role == "child pre-exec"]
    for proc in sorted(procs.values(), key=lambda p: p.pid):
        if proc.role == "child pre-exec":
            continue
        what = (
            " ".join(os.path.basename(a) if k == 0 else a for k, a in enumerate(proc.argv[:4]))
            or "(no exec)"
        )
        out.append(
            f"  {proc.pid:>8} {proc.role:<16} {sum(proc.calls.values()):>8} calls"
            f"  {what[:60]}  [{proc.why}]"
        )
    if items_seen:
        pre = sum(sum(p.before_exec.values()) for p in items_seen)
        out.append(
            f"  {len(items_seen):>8} item command processes: {pre / len(items_seen):.1f} calls"
            " each before their exec (counted), none after it"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="\n\n".join((__doc__ or "").split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--items", type=int, default=1000, help="items of the counted run (default 1000)"
    )
    parser.add_argument(
        "--shapes", default="per-item", help=f"comma-separated, of {', '.join(SHAPES)}"
    )
    parser.add_argument(
        "--persistent", action="store_true", help="the same as --shapes persistent,serve,work"
    )
    parser.add_argument("--quick", action="store_true", help="200 items")
    parser.add_argument("--workdir", default="/var/tmp", help="parent of the temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the traces")
    args = parser.parse_args(argv)
    shapes = (
        ["persistent", "serve", "work"]
        if args.persistent
        else [s.strip() for s in args.shapes.split(",") if s.strip()]
    )
    if bad := [s for s in shapes if s not in SHAPES]:
        parser.error(f"no such shape: {', '.join(bad)} (shapes: {', '.join(SHAPES)})")
    items = 200 if args.quick else args.items
    if items < 2:
        parser.error("--items must be at least 2 (a 1-item run is subtracted)")
    if shutil.which("strace") is None:
        print("strace_items: strace is not installed: no system-call counts", file=sys.stderr)
        return 0
    if not STATEQUEUE:
        print(
            "strace_items: no statequeue command beside this interpreter or on PATH",
            file=sys.stderr,
        )
        return 1
    work = Path(tempfile.mkdtemp(prefix="statequeue-strace-", dir=args.workdir))
    (work / "worker.py").write_text(WORKER)
    (work / "serve_worker.py").write_text(SERVE_WORKER)
    (work / "loop.py").write_text(WORK_LOOP)
    (work / "floor.py").write_text(FLOOR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STATEQUEUE_")}
    env["NO_COLOR"] = "1"
    try:
        for name in shapes:
            shape = shape_of(name)
            one, _ = trace_run(shape, 1, work, env)
            full, procs = trace_run(shape, items, work, env)
            print(report(shape, items, full, one, procs))
            print()
    finally:
        if args.keep:
            print(f"traces kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
