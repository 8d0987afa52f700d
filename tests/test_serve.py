"""``statequeue.serve(fn)`` (issue 23): one worker file that speaks the persistent-worker
protocol under ``STATEQUEUE_WORKER`` and handles its argv items otherwise.

Each test starts the worker as a real subprocess and speaks the protocol by hand, as
`run --persistent` would: requests as JSON lines on its stdin, replies read from the
pipe whose write end it got as ``$STATEQUEUE_REPLY_FD``."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest

from statequeue.api.queue import Queue

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "statequeue" / "cli" / "topics" / "workers.md"
REPLY_FD = 3  # where the keeper puts a persistent worker's reply pipe

WORKER = """\
import math
import os
import subprocess
import sys

import statequeue

REPLY_FD = os.environ.get("STATEQUEUE_REPLY_FD")


def handle(item: str):
    if item == "boom":
        raise ValueError("bad checksum")
    if item == "set":
        return {1, 2}
    if item == "nan":
        return math.nan
    if item == "print":
        # No newline: stderr is line-buffered, and a partial line waits for a flush.
        print("out of the print attempt", end="")
        print("err of the print attempt", file=sys.stderr, end="")
        return "printed"
    if item == "leak":  # a child that inherited the reply fd would write on it
        return os.system(f"echo leaked 2>/dev/null >&{REPLY_FD}")
    if item == "stdin":  # a child reading stdin must not swallow the next request
        print("reading stdin", file=sys.stderr, flush=True)
        return subprocess.run(["cat"], stdout=subprocess.PIPE, check=True).stdout.decode()
    if item == "env":
        names = ["WORKER", "REPLY_FD", "ITEM", "ID", "ATTEMPT", "LEASE_TOKEN"]
        return [os.environ.get(f"STATEQUEUE_{name}") for name in names]
    if item.startswith("child-env"):  # what a program fn starts finds in its environment
        names = ["ITEM", "ID", "ATTEMPT", "LEASE_TOKEN"]
        script = "/".join(f"${{STATEQUEUE_{name}-unset}}" for name in names)
        shell = subprocess.run(["sh", "-c", f'printf %s "{script}"'], capture_output=True)
        return shell.stdout.decode()
    if item == "rss":
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    if item == "child-out":
        return os.system("echo from a child")
    if item == "exit":
        sys.exit(3)
    if item == "later":
        raise statequeue.TryLater(1.5)
    if item == "later-backoff":
        raise statequeue.TryLater(message="HTTP 429")
    if item == "later-bad":
        raise statequeue.TryLater(-1)
    if item == "later-huge":
        raise statequeue.TryLater(10**400)
    if item == "later-nan":
        raise statequeue.TryLater(float("nan"))
    if item == "later-once" and os.environ["STATEQUEUE_ATTEMPT"] == "1":
        raise statequeue.TryLater(0.5)
    return {"hex": os.fsencode(item).hex()}


statequeue.serve(handle)
"""


@pytest.fixture
def worker(tmp_path: Path) -> Path:
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


class Persistent:
    """A worker started as `run --persistent` starts one, driven by hand."""

    def __init__(self, command: list[str], cwd: Path | None = None) -> None:
        replies, reply_end = os.pipe()  # neither end inherited (PEP 446)

        def at_reply_fd() -> None:  # in the child: the write end at fd 3, as the keeper puts it
            if reply_end == REPLY_FD:
                os.set_inheritable(REPLY_FD, True)
            else:
                os.dup2(reply_end, REPLY_FD)

        env = {**os.environ, "STATEQUEUE_WORKER": "1", "STATEQUEUE_REPLY_FD": str(REPLY_FD)}
        env.pop("PYTHONUNBUFFERED", None)  # the flush before each reply is under test
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            close_fds=False, preexec_fn=at_reply_fd, env=env, cwd=cwd,
        )  # fmt: skip
        os.close(reply_end)
        self.replies = os.fdopen(replies, "rb")

    def send(self, *requests: dict[str, Any]) -> None:
        stdin = self.stdin
        stdin.write(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        stdin.flush()

    def reply(self) -> Any:
        line = self.replies.readline()
        assert line.endswith(b"\n"), f"no reply line: {line!r}"
        return json.loads(line)

    def ask(self, request_id: int, item: str) -> Any:
        self.send({"id": request_id, "item": item, "attempt": 1})
        return self.reply()

    def end_stdin(self) -> None:
        self.stdin.close()
        self.proc.stdin = None  # communicate() would flush it

    def finish(self) -> tuple[int, bytes, bytes, bytes]:
        """End stdin; (exit status, stdout, stderr, whatever else came on the reply fd)."""
        out, err = self.proc.communicate(timeout=60)
        rest = self.replies.read()
        self.replies.close()
        return self.proc.returncode, out, err, rest

    @property
    def stdin(self) -> IO[bytes]:
        assert self.proc.stdin is not None
        return self.proc.stdin


def persistent(worker: Path) -> Persistent:
    return Persistent([sys.executable, str(worker)])


def test_a_result_is_the_reply_and_the_end_of_stdin_exits_0(worker: Path) -> None:
    w = persistent(worker)
    assert w.ask(17, "a.pdf") == {"id": 17, "ok": True, "result": {"hex": b"a.pdf".hex()}}
    assert w.ask(18, "b.pdf")["result"] == {"hex": b"b.pdf".hex()}
    code, _, err, rest = w.finish()
    assert (code, rest) == (0, b""), err.decode()


def test_no_request_at_all_exits_0(worker: Path) -> None:
    code, out, err, rest = persistent(worker).finish()
    assert (code, out, err, rest) == (0, b"", b"", b"")


def test_an_exception_fails_the_attempt_and_its_traceback_goes_to_stderr(worker: Path) -> None:
    w = persistent(worker)
    assert w.ask(1, "boom") == {"id": 1, "ok": False, "reason": "ValueError: bad checksum"}
    assert w.ask(2, "a")["ok"] is True  # the worker goes on
    code, _, err, rest = w.finish()
    assert code == 0 and rest == b""
    assert "Traceback (most recent call last)" in err.decode()
    assert 'raise ValueError("bad checksum")' in err.decode()


@pytest.mark.parametrize(
    ("item", "problem"),
    [("set", "Type is not JSON serializable: set"), ("nan", "NaN or infinity")],
)
def test_a_result_json_cannot_hold_fails_the_attempt(worker: Path, item: str, problem: str) -> None:
    w = persistent(worker)
    reply = w.ask(5, item)
    assert reply["id"] == 5 and reply["ok"] is False
    assert reply["reason"].startswith("result cannot be stored as JSON: "), reply
    assert problem in reply["reason"]
    assert w.ask(6, "a")["ok"] is True
    assert w.finish()[0] == 0


def test_a_non_utf8_item_arrives_as_the_same_str_as_in_argv(worker: Path) -> None:
    raw = b"caf\xe9 \xff.pdf"
    w = persistent(worker)
    w.send({"id": 3, "item_b64": base64.b64encode(raw).decode(), "attempt": 2})
    assert w.reply() == {"id": 3, "ok": True, "result": {"hex": raw.hex()}}
    assert w.finish()[0] == 0
    by_argv = subprocess.run([sys.executable, str(worker), raw], capture_output=True, check=True)
    assert json.loads(by_argv.stdout) == {"hex": raw.hex()}


def test_prints_land_before_the_reply(worker: Path) -> None:
    w = persistent(worker)
    assert w.ask(9, "print")["result"] == "printed"
    # The reply is here: what the attempt printed must already be in the pipes (a
    # pipe's stdout is block-buffered, so without a flush it would come only at exit).
    for stream, text in ((w.proc.stdout, b"out of"), (w.proc.stderr, b"err of")):
        assert stream is not None
        os.set_blocking(stream.fileno(), False)
        assert text in os.read(stream.fileno(), 65536)
    assert w.finish()[0] == 0


def test_children_of_fn_get_neither_the_reply_fd_nor_the_requests(worker: Path) -> None:
    w = persistent(worker)
    leak = w.ask(1, "leak")
    assert leak["ok"] is True and leak["result"] != 0  # the shell found the fd closed
    w.send({"id": 2, "item": "stdin", "attempt": 1})
    assert w.proc.stderr is not None
    while w.proc.stderr.readline() != b"reading stdin\n":  # lines before it: the shell's
        pass
    # fn's `cat` is running: the next request and the end of stdin must not reach it.
    w.send({"id": 3, "item": "a", "attempt": 1})
    w.end_stdin()
    assert w.reply() == {"id": 2, "ok": True, "result": ""}
    assert w.reply() == {"id": 3, "ok": True, "result": {"hex": "61"}}
    code, _, err, rest = w.finish()
    assert (code, rest) == (0, b""), err.decode()


def test_fn_sees_the_items_variables_not_the_workers(worker: Path) -> None:
    """As a per-item child does (STATEQUEUE_ITEM, _ID, _ATTEMPT, _LEASE_TOKEN); the
    worker's own two are gone, so a serve() program that fn starts handles its argv."""
    w = persistent(worker)
    w.send({"id": 3, "item": "env", "attempt": 2, "token": 41}, {"id": 4, "item": "env"})
    assert w.reply() == {"id": 3, "ok": True, "result": [None, None, "env", "3", "2", "41"]}
    assert w.reply() == {"id": 4, "ok": True, "result": [None, None, "env", "4", "", None]}
    assert w.finish()[0] == 0


def test_programs_fn_starts_find_each_requests_variables(worker: Path) -> None:
    """Set in the process's environment, not only in ``os.environ``: a shell fn starts
    sees the item of the request at hand, and no token once a request has none."""
    w = persistent(worker)
    w.send(
        {"id": 3, "item": "child-env-a", "attempt": 2, "token": 41},
        {"id": 4, "item": "child-env-b", "attempt": 2},
        {"id": 5, "item": "child-env-c", "attempt": 1},
    )
    assert w.reply()["result"] == "child-env-a/3/2/41"
    assert w.reply()["result"] == "child-env-b/4/2/unset"
    assert w.reply()["result"] == "child-env-c/5/1/unset"
    assert w.finish()[0] == 0


def test_the_items_variables_cost_no_memory_per_request(worker: Path, tmp_path: Path) -> None:
    """glibc's setenv keeps every value it was given (some 140 bytes a request, for the
    worker's life): 40,000 requests would grow the worker by over 5 MB. Its requests
    come from a file and its replies go to one, as fast as it can take them."""

    def request(n: int, item: str) -> bytes:
        return json.dumps({"id": n, "item": item, "attempt": 1}).encode() + b"\n"

    warm, measured = 2000, 40000
    lines = [request(n, f"item-{n:06d}") for n in range(1, warm + measured + 1)]
    lines.insert(warm, request(0, "rss"))
    lines.append(request(0, "rss"))
    requests = tmp_path / "requests"
    requests.write_bytes(b"".join(lines))
    replies = tmp_path / "replies"
    with requests.open("rb") as stdin, replies.open("wb") as reply_file:
        fd = reply_file.fileno()
        env = {**os.environ, "STATEQUEUE_WORKER": "1", "STATEQUEUE_REPLY_FD": str(fd)}
        out = subprocess.run(
            [sys.executable, str(worker)], stdin=stdin, env=env, pass_fds=(fd,),
            capture_output=True, timeout=120,
        )  # fmt: skip
    assert out.returncode == 0, out.stderr.decode()
    rss = [r["result"] for r in map(json.loads, replies.read_bytes().splitlines()) if r["id"] == 0]
    assert len(rss) == 2
    assert rss[1] - rss[0] < 1 << 20, f"grew {(rss[1] - rss[0]) / measured:.0f} bytes a request"


def test_an_exit_inside_fn_ends_the_worker_without_a_reply(worker: Path) -> None:
    w = persistent(worker)
    w.send({"id": 1, "item": "exit", "attempt": 1})
    code, _, _, rest = w.finish()
    assert (code, rest) == (3, b"")  # the runner counts the attempt as interrupted


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"not json\n", "request line 1 refused"),
        (b'{"item": "a"}\n', 'integer "id"'),
        (b'{"id": 1}\n', 'string "item"'),
        (b'{"id": 1, "item": "a", "item_b64": "@@"}\n', '"item_b64" is not base64'),
        (b'{"id": 1, "item": "a\\u0000b"}\n', "the item holds a NUL"),
        (b'{"id": 1, "item_b64": "YQBi"}\n', "the item holds a NUL"),
        (b'{"id": 1, "item": "\\ud800"}\n', "no low surrogate"),  # orjson's words
        (b'{"id": 1, "item": "a", "token": "x"}\n', '"token" is not an integer'),
        (b'{"id": 1, "item": "a", "attempt": true}\n', '"attempt" is not an integer'),
    ],
)
def test_a_bad_request_is_one_line_and_exit_2(worker: Path, line: bytes, why: str) -> None:
    w = persistent(worker)
    w.stdin.write(line)
    code, _, err, rest = w.finish()
    assert (code, rest) == (2, b"")
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("statequeue.serve: "), lines
    assert why in lines[0]


def test_a_worker_without_its_reply_fd_is_one_line_and_exit_2(worker: Path) -> None:
    env = {**os.environ, "STATEQUEUE_WORKER": "1", "STATEQUEUE_REPLY_FD": "77"}
    out = subprocess.run(
        [sys.executable, str(worker)], input=b"", env=env, capture_output=True, timeout=60
    )
    assert out.returncode == 2
    assert out.stderr.decode().splitlines() == [
        "statequeue.serve: STATEQUEUE_WORKER is set but STATEQUEUE_REPLY_FD is not an open"
        " file descriptor"
    ]


def test_by_hand_the_replies_may_share_stdout(worker: Path) -> None:
    """STATEQUEUE_REPLY_FD=1 (trying a worker at a terminal): replies come on stdout,
    and the programs fn starts still have their stdout."""
    env = {**os.environ, "STATEQUEUE_WORKER": "1", "STATEQUEUE_REPLY_FD": "1"}
    env.pop("PYTHONUNBUFFERED", None)
    requests = b'{"id": 1, "item": "a"}\n{"id": 2, "item": "child-out"}\n'
    out = subprocess.run(
        [sys.executable, str(worker)], input=requests, env=env, capture_output=True, timeout=60
    )
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().splitlines() == [
        '{"id":1,"ok":true,"result":{"hex":"61"}}',
        "from a child",
        '{"id":2,"ok":true,"result":0}',
    ]


def argv_run(worker: Path, *items: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("STATEQUEUE_")}
    return subprocess.run(
        [sys.executable, str(worker), *items], env={**clean, **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_argv_items_print_their_results_one_json_line_each(worker: Path) -> None:
    out = argv_run(worker, "a.pdf", "b.pdf")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ['{"hex":"612e706466"}', '{"hex":"622e706466"}']


def test_argv_with_a_failing_item_exits_1_and_says_why(worker: Path) -> None:
    out = argv_run(worker, "a.pdf", "boom", "set")
    assert out.returncode == 1
    assert out.stdout.splitlines() == ['{"hex":"612e706466"}']
    assert "Traceback" in out.stderr
    assert "boom: ValueError: bad checksum" in out.stderr.splitlines()
    assert any(line.startswith("set: result cannot be stored") for line in out.stderr.splitlines())


def test_argv_with_no_item_does_nothing_and_exits_0(worker: Path) -> None:
    out = argv_run(worker)
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


def test_argv_writes_the_result_to_statequeue_result(worker: Path, tmp_path: Path) -> None:
    path = tmp_path / "1.1.result"
    out = argv_run(worker, "a.pdf", STATEQUEUE_RESULT=str(path))
    assert (out.returncode, out.stdout) == (0, "")
    assert json.loads(path.read_bytes()) == {"hex": "612e706466"}
    path.unlink()
    out = argv_run(worker, "boom", STATEQUEUE_RESULT=str(path))
    assert out.returncode == 1 and not path.exists()
    out = argv_run(worker, "a", "boom", STATEQUEUE_RESULT=str(path))
    assert out.returncode == 1 and json.loads(path.read_bytes()) == [{"hex": "61"}, None]


def test_one_file_serves_run_per_item(worker: Path, sq_env: dict[str, str]) -> None:
    """The same worker under the real `run -- python worker.py {}`: results stored, a
    raise recorded as a failure whose stderr tail holds the traceback."""
    with Queue("serve-per-item") as queue:
        queue.enqueue(["a.pdf", "boom"])
    command = ["statequeue", "-q", "serve-per-item", "run", "--", sys.executable, str(worker)]
    out = subprocess.run([*command, "{}"], env=sq_env, capture_output=True, timeout=120)
    assert out.returncode == 1, out.stderr.decode()
    with Queue("serve-per-item") as queue:
        done, failed = queue.result("a.pdf"), queue.history("boom")
    assert done is not None and done.result == {"hex": "612e706466"}
    assert failed.state.value == "failed"
    assert "boom: ValueError: bad checksum" in failed.stderr_tail


needs_the_runner = pytest.mark.skipif(
    importlib.util.find_spec("statequeue.run.persistent") is None,
    reason="run --persistent (the runner side of issue 23) is not in this tree",
)


@needs_the_runner
def test_one_file_serves_run_persistent(worker: Path, sq_env: dict[str, str]) -> None:
    """The same worker under the real `run --persistent`: results, a raise recorded as
    a failure with its reason, prints and the traceback each in their attempt's log,
    and a non-UTF-8 item handed over intact."""
    raw = b"caf\xe9 \xff.pdf"
    items = ["a.pdf", "boom", "print", os.fsdecode(raw)]
    with Queue("serve-persistent") as queue:
        queue.enqueue(items)
    env = {k: v for k, v in sq_env.items() if k != "PYTHONUNBUFFERED"}  # the flush is ours
    command = ["statequeue", "-q", "serve-persistent", "run", "--persistent", "--"]
    out = subprocess.run(
        [*command, sys.executable, str(worker)], env=env, capture_output=True, timeout=120
    )
    assert out.returncode == 1, out.stderr.decode()  # boom failed
    with Queue("serve-persistent") as queue:
        results = {r.item: r for r in queue.results()}
        logs = {item: queue.read_log(results[item].item_id, 1) or b"" for item in items}
    assert results["a.pdf"].result == {"hex": b"a.pdf".hex()}
    assert results[os.fsdecode(raw)].result == {"hex": raw.hex()}
    assert (results["boom"].state.value, results["boom"].reason) == (
        "failed", "ValueError: bad checksum",
    )  # fmt: skip
    assert b"Traceback" in logs["boom"] and b"Traceback" not in logs["print"]
    assert b"out of the print attempt" in logs["print"]
    assert b"err of the print attempt" in logs["print"]
    assert all(b"print attempt" not in logs[item] for item in items if item != "print")


def shell_worker() -> str:
    """The plain-sh worker of `statequeue help workers`, as the page shows it."""
    blocks = re.findall(r"```sh\n(#!/bin/sh\n.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 1, "the page shows one sh worker"
    return str(blocks[0])


def test_the_pages_sh_worker_speaks_the_protocol(tmp_path: Path) -> None:
    script = tmp_path / "worker.sh"
    script.write_text(shell_worker())
    (tmp_path / "a.txt").write_bytes(b"12345")
    w = Persistent(["sh", str(script)], cwd=tmp_path)
    assert w.ask(4, "a.txt") == {"id": 4, "ok": True, "result": {"bytes": 5}}
    reply = w.ask(5, "missing.txt")
    assert reply["id"] == 5 and reply["ok"] is False and reply["reason"]
    # The spacing of the runner's JSON is not the page's business: compact lines work too.
    w.stdin.write(b'{"id":6,"item":"a.txt","attempt":1}\n')
    w.stdin.flush()
    assert w.reply() == {"id": 6, "ok": True, "result": {"bytes": 5}}
    code, _, _, rest = w.finish()
    assert (code, rest) == (0, b"")


# -- TryLater (issue 24): one worker file defers in both modes ---------------------------


def test_try_later_replies_later_with_its_seconds(worker: Path) -> None:
    w = persistent(worker)
    assert w.ask(1, "later") == {"id": 1, "later": 1.5}
    assert w.ask(2, "later-backoff") == {"id": 2, "later": None, "reason": "HTTP 429"}
    why = "TryLater: seconds must be a number >= 0, not -1"
    assert w.ask(3, "later-bad") == {"id": 3, "ok": False, "reason": why}
    assert w.ask(4, "a") == {"id": 4, "ok": True, "result": {"hex": "61"}}
    # The library's rule (core/rates.delay_problem): an int past a float's range
    # waits the longest deferral, as work() and map() take it; NaN fails the attempt.
    assert w.ask(5, "later-huge") == {"id": 5, "later": 86400.0}
    nan = "TryLater: seconds must be a number >= 0, not nan"
    assert w.ask(6, "later-nan") == {"id": 6, "ok": False, "reason": nan}
    w.end_stdin()
    assert w.finish()[0] == 0


def test_try_later_in_argv_mode_exits_75_with_retry_after(worker: Path, tmp_path: Path) -> None:
    path = tmp_path / "1.1.result"
    out = argv_run(worker, "later", STATEQUEUE_RESULT=str(path))
    assert out.returncode == 75, out.stderr
    assert json.loads(path.read_bytes()) == {"retry_after": 1.5}
    assert "later: try later (after 1.5s)" in out.stderr
    path.unlink()
    out = argv_run(worker, "later-backoff", STATEQUEUE_RESULT=str(path))
    assert out.returncode == 75 and not path.exists()  # no retry_after: run's backoff
    out = argv_run(worker, "later-bad", STATEQUEUE_RESULT=str(path))
    assert out.returncode == 1 and "seconds must be a number >= 0" in out.stderr


@needs_the_runner
@pytest.mark.parametrize("persistent_mode", [False, True], ids=["per-item", "persistent"])
def test_one_file_defers_under_run_in_both_modes(
    worker: Path, sq_env: dict[str, str], persistent_mode: bool
) -> None:
    """TryLater(0.5) on the first attempt under the real `run`: deferred for 0.5 s, not
    failed (--retries 0), then done on the next attempt."""
    with Queue("serve-later") as queue:
        queue.enqueue(["later-once"])
    mode = ["--persistent"] if persistent_mode else []
    command = ["statequeue", "-q", "serve-later", "run", "--retries", "0", *mode, "--"]
    argv = [sys.executable, str(worker)] + ([] if persistent_mode else ["{}"])
    out = subprocess.run([*command, *argv], env=sq_env, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    listed = subprocess.run(
        ["statequeue", "-q", "serve-later", "events", "--json"], env=sq_env, capture_output=True
    )
    records = [r for line in listed.stdout.splitlines() if (r := json.loads(line)).get("id") == 1]
    assert [r["t"] for r in records] == ["enq", "start", "defer", "start", "end"]
    assert (records[2]["delay"], records[2]["exit"], records[4]["state"]) == (0.5, 75, "done")
