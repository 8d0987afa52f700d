"""A persistent worker for the tests of `run --persistent` (tests/test_persistent_*.py).

It speaks the line protocol by hand (no statequeue import: it stands for a
worker in any language) and does what each item's prefix says, so one
program covers every case: ``ok-`` works (printing to stdout and stderr),
``fail-`` replies ok: false, ``nap-`` takes 3 s, ``die-`` exits mid-item, ``hang-`` and
``slow-`` (its first attempt) wait to be killed, ``grow-`` keeps 64 MiB,
``notjson-``/``otherid-``/``twice-`` break the protocol. Every result names
the worker's pid. MARKS (argv[1]) gets ITEM.pid for each item begun; an
item holds an flock on MARKS/ITEM while it runs, and one that finds it taken
(a second copy) writes a line in MARKS/overlap.
"""

from __future__ import annotations

from pathlib import Path

WORKER = r"""
import base64, fcntl, json, os, sys, time

MARKS = sys.argv[1]
reply = os.fdopen(int(os.environ["STATEQUEUE_REPLY_FD"]), "w")
kept = []

def send(obj):
    reply.write((obj if isinstance(obj, str) else json.dumps(obj)) + "\n")
    reply.flush()

def mark(item):
    path = os.path.join(MARKS, item)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(os.path.join(MARKS, "overlap"), "a") as f:
            f.write(item + "\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
    with open(path + ".pid", "a") as f:
        f.write(f"{os.getpid()}\n")
    return fd

print("worker starting", os.getpid(), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    if "item_b64" in req:
        raw = base64.b64decode(req["item_b64"])
        send({"id": req["id"], "ok": True, "result": {"hex": raw.hex(), "has_item": "item" in req}})
        continue
    item = req["item"]
    keep = mark(item)
    print(f"out {item}", flush=True)
    print(f"err {item}", file=sys.stderr, flush=True)
    kind = item.split("-")[0]
    if kind == "hang" or (kind == "slow" and req["attempt"] == 1):
        time.sleep(300)
    if kind == "nap":
        time.sleep(3)
    if kind == "die":
        os._exit(3)
    if kind == "grow":
        kept.append(bytearray(64 << 20))
        for i in range(0, len(kept[-1]), 4096):
            kept[-1][i] = 1
    if kind == "notjson":
        send("this is not json")
        continue
    if kind == "otherid":
        send({"id": req["id"] + 1000, "ok": True})
        continue
    result = {"pid": os.getpid(), "attempt": req["attempt"]}
    result["interrupted"] = req.get("interrupted", False)
    result["token"] = req.get("token")
    if kind == "twice":  # both in one write: they come together
        line = json.dumps({"id": req["id"], "ok": True})
        send(line + "\n" + line)
    elif kind == "fail":
        send({"id": req["id"], "ok": False, "reason": "asked to fail", "result": result})
    else:
        send({"id": req["id"], "ok": True, "result": result})
    os.close(keep)
"""


def write_worker(folder: Path) -> tuple[str, Path]:
    """The worker program (written into ``folder``) and its marks folder."""
    program = folder / "worker.py"
    program.write_text(WORKER)
    marks = folder / "marks"
    marks.mkdir()
    return str(program), marks
