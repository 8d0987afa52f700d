"""The CLI surface: odd items in every view, closed pipes, status, help,
completion, plurals and the event stream (issue 11; issue 10 points 6 and 11)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statequeue.api.queue import Queue
from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded
from tests.conftest import STATEQUEUE

Env = dict[str, str]

BAD_BYTES = os.fsdecode(b"bad\xff")  # `find` hands over file names like this
TERMINAL = "esc\x1b[2J\nfake\tline"  # clears the screen and fakes a `list` line
ITEMS = [BAD_BYTES, TERMINAL, "plain"]


class Cli:
    """The full CLI in this process, with its exit code and raw output."""

    def __init__(self, capfd: pytest.CaptureFixture[bytes]) -> None:
        self.capfd = capfd

    def __call__(self, *args: str) -> tuple[int, bytes, str]:
        self.capfd.readouterr()
        code = run_guarded(_invoke, list(args))
        sys.stdout.flush()
        out, err = self.capfd.readouterr()
        return code, out, err.decode("utf-8", "replace")


@pytest.fixture
def cli(capfdbinary: pytest.CaptureFixture[bytes]) -> Cli:
    return Cli(capfdbinary)


def fail_all(q: Queue, stderr: str = "") -> None:
    """Fail every pending item through the library, with ``stderr`` as each one's tail."""
    from statequeue.core.models import Outcome

    for item in q.work():
        q.finish(item.claim, Outcome(ok=False, reason="exit code 1", stderr_tail=stderr))
        item.settled = True


@pytest.fixture
def odd_queue(sq_home: Path) -> Iterator[Queue]:
    """Queue `default`: items 1 (bad bytes) and 2 (terminal escapes) failed, 3 pending."""
    with Queue(home=sq_home) as q:
        q.enqueue(ITEMS[:2])
        fail_all(q, stderr="first\nlast words \x1b[31mred\n")
        q.enqueue(ITEMS[2:])
        yield q


def json_lines(out: bytes) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


def check_item_fields(obj: dict[str, object]) -> None:
    """``obj`` (a JSON view of item 1 or 2) carries its item losslessly."""
    if obj["id"] == 1:
        assert obj["item"] == "bad\ufffd"
        assert base64.b64decode(str(obj["item_b64"])) == b"bad\xff"
    else:
        assert obj["item"] == TERMINAL
        assert "item_b64" not in obj


JSON_VIEWS = [
    ["list", "--json"],
    ["results", "--json"],
    ["show", "1", "--json"],
    ["show", "2", "--json"],
    ["status", "--json"],
    ["queues", "--json"],
    ["events", "--json"],
]


@pytest.mark.parametrize("args", JSON_VIEWS, ids=lambda a: " ".join(a))
def test_json_views_carry_odd_items_losslessly(odd_queue: Queue, cli: Cli, args: list[str]) -> None:
    code, out, err = cli(*args)
    assert code == 0, err
    docs = json_lines(out)
    if args[0] in ("list", "results"):
        objs = [d for d in docs if d["id"] in (1, 2)]
    elif args[0] == "show":
        objs = [docs[0]]
        events = [e for e in docs[0]["events"] if e["t"] == "enq"]  # type: ignore[attr-defined]
        objs += events
    elif args[0] == "status":
        objs = list(docs[0]["recent_failures"])  # type: ignore[call-overload]
    elif args[0] == "queues":
        objs = list(docs[0]["queues"][0]["recent_failures"])  # type: ignore[index]
    else:
        objs = [d for d in docs if d["t"] == "enq" and d["id"] in (1, 2)]
    assert len(objs) >= 1
    for obj in objs:
        check_item_fields(obj)


@pytest.mark.parametrize("args", [["list"], ["results"], ["show", "1"], ["show", "2"], ["status"]])
def test_human_views_escape_odd_items(odd_queue: Queue, cli: Cli, args: list[str]) -> None:
    code, out, err = cli(*args)
    assert code == 0, err
    text = out.decode("utf-8")  # valid UTF-8: no lone surrogate reaches the terminal
    assert "\x1b" not in text
    assert "\\udc" not in text
    wanted = "bad\\xff" if args[-1] != "2" else "esc\\x1b[2J\\nfake\\tline"
    assert wanted in text
    if args[0] == "list":
        assert len(text.splitlines()) == 3  # one line per item, however odd
    if args[0] == "status":
        assert "esc\\x1b[2J\\nfake\\tline" in text


def test_results_csv_keeps_the_exact_bytes(odd_queue: Queue, cli: Cli) -> None:
    code, out, _ = cli("results", "--csv")
    assert code == 0
    assert b"bad\xff" in out


@pytest.mark.parametrize(
    "args",
    [["list"], ["results"], ["events"], ["show", "1"], ["status"], ["queues"], ["logs", "1"]],
    ids=lambda a: a[0],
)
def test_read_commands_exit_quietly_on_a_closed_pipe(
    odd_queue: Queue, sq_env: Env, args: list[str]
) -> None:
    log = odd_queue.path / "logs" / "1.1.log"  # type: ignore[operator]
    log.parent.mkdir(exist_ok=True)
    log.write_bytes(b"output\n")
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: `| head` that quit
    try:
        done = subprocess.run(
            [STATEQUEUE, *args], env=sq_env, stdout=write, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr
    assert b"Exception ignored" not in done.stderr


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
@pytest.mark.parametrize(
    "args", [["status"], ["show", "1"], ["stats"], ["list"]], ids=lambda a: a[0]
)
def test_views_escape_what_the_output_encoding_cannot_hold(
    sq_home: Path, sq_env: Env, encoding: str, args: list[str]
) -> None:
    """stdout in ASCII or latin-1 (PYTHONIOENCODING, an old locale): `status`,
    `show` and `stats` once ended in a UnicodeEncodeError traceback, exit 1."""
    with Queue(home=sq_home) as q:
        q.enqueue(["café \u2603"])  # latin-1 has the é, not the snowman
        fail_all(q, stderr="boom\n")
    env = {**sq_env, "PYTHONIOENCODING": encoding}
    done = subprocess.run([STATEQUEUE, *args], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert b"Traceback" not in done.stderr + done.stdout
    if args == ["list"]:  # for pipelines: the item's exact bytes, whatever the encoding
        assert "café \u2603".encode() in done.stdout, done.stdout
    else:
        assert b"\\u2603" in done.stdout, done.stdout


def test_status_shows_done_and_failed_apart_with_the_next_command(sq_home: Path, cli: Cli) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue([f"item{i}" for i in range(8)])
        fail_all(q, stderr="Traceback (most recent call last):\nValueError: bad input\n")
    code, out, _ = cli("status")
    text = out.decode()
    assert code == 0
    assert "100.0% finished" not in text
    assert "(0.0% done, 8 failed)" in text
    assert text.count("stderr: ValueError: bad input") == 5
    assert "and 3 more: `statequeue list -s failed`" in text
    assert "`statequeue retry --failed`" in text


def test_the_last_stderr_line_survives_compaction_and_reopening(odd_queue: Queue) -> None:
    assert odd_queue.compact().archived == 0  # failed items stay in the journal
    with Queue(home=odd_queue.path.parent) as q:  # type: ignore[union-attr]
        lines = [f.stderr_last for f in q.status().recent_failures]
    assert lines == ["last words \x1b[31mred"] * 2


def test_the_last_stderr_line_is_the_last_attempts(sq_home: Path) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
        fail_all(q, stderr="first attempt\n")
        q.retry([1])
        fail_all(q, stderr="")  # the second attempt wrote nothing to stderr
        assert [f.stderr_last for f in q.status().recent_failures] == [""]


def test_status_fast_path_matches_the_full_cli_for_odd_items(
    odd_queue: Queue, sq_env: Env, cli: Cli
) -> None:
    for args in (["status"], ["status", "--json"]):
        fast = subprocess.run([STATEQUEUE, *args], env=sq_env, capture_output=True, timeout=60)
        code, out, _ = cli(*args)
        assert fast.returncode == code == 0, fast.stderr
        if "--json" in args:  # the rate moves with the clock
            fast_doc, full_doc = json.loads(fast.stdout), json.loads(out)
            for doc in (fast_doc, full_doc):
                del doc["rate"], doc["eta_seconds"]
            assert fast_doc == full_doc
        else:
            assert fast.stdout == out


def test_help_shows_the_environment_variables(cli: Cli) -> None:
    code, out, _ = cli("status", "--help")
    text = " ".join(out.decode().replace("│", " ").split())  # unwrap the rich panel
    assert code == 0
    assert "[env: STATEQUEUE_HOME; default: the user data dir]" in text
    assert "[env: STATEQUEUE_QUEUE; default: default]" in text


def test_a_typo_suggests_the_command_once(cli: Cli) -> None:
    code, _, err = cli("compcat")  # not "statu": `stats` is as close to it as `status`
    assert code == 2
    assert err.count("Did you mean 'compact'?") == 1
    assert len(err.splitlines()) == 1


def test_version(sq_env: Env) -> None:
    from importlib.metadata import version

    done = subprocess.run([STATEQUEUE, "--version"], env=sq_env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"statequeue {version('statequeue')}\n"


def complete(env: Env, words: str) -> list[str]:
    env = {**env, "_STATEQUEUE_COMPLETE": "complete_bash", "COMP_WORDS": words}
    env["COMP_CWORD"] = str(len(words.split(" ")) - 1)
    done = subprocess.run([STATEQUEUE], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().split()


def test_completion_offers_queue_and_state_names(sq_home: Path, sq_env: Env) -> None:
    for name in ("crawl", "cron"):
        Queue(name, home=sq_home).close()
    assert complete(sq_env, "statequeue status -q cr") == ["crawl", "cron"]
    assert complete(sq_env, "statequeue drop c") == ["crawl", "cron"]
    assert complete(sq_env, "statequeue list --state f") == ["failed"]


def test_counts_use_the_singular_for_one(odd_queue: Queue, cli: Cli) -> None:
    code, out, _ = cli("retry", "1")
    assert code == 0
    assert out.decode() == "1 item put back as pending\n"
    code, out, _ = cli("queues")
    assert "3 items" in out.decode()
    with Queue("single", home=odd_queue.path.parent) as q:  # type: ignore[union-attr]
        q.enqueue(["x"])
    _, out, _ = cli("status", "-q", "single")
    assert out.decode().startswith("queue single: 1 item (")


def test_logs_of_a_missing_attempt_is_not_found(odd_queue: Queue, cli: Cli) -> None:
    code, _, err = cli("logs", "1", "--attempt", "5")
    assert code == 7
    assert err == "statequeue: item 1 has no attempt 5 (it has 1)\n"


def test_a_bad_item_on_stdin_is_named_by_line(sq_env: Env) -> None:
    data = b"a\n\nb\n" + b"x" * 70000 + b"\nc\n"
    done = subprocess.run(
        [STATEQUEUE, "enqueue"], input=data, env=sq_env, capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.startswith(b"statequeue: line 4: item of 70000 bytes exceeds")
    done = subprocess.run(
        [STATEQUEUE, "enqueue", "-0"],
        input=b"a\0b\0" + b"y" * 70000,
        env=sq_env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(b"statequeue: item 3 on stdin: item of 70000 bytes")


def test_bad_items_in_a_file_or_arguments_are_named_by_position(
    cli: Cli, tmp_path: Path, sq_home: Path
) -> None:
    listing = tmp_path / "list.txt"
    listing.write_bytes(b"a\n\n\nb\n" + b"z" * 70000 + b"\n")
    code, _, err = cli("enqueue", "--json", "--file", str(listing))
    assert code == 2
    assert err.startswith(f"statequeue: {listing}: line 5: item of 70000 bytes exceeds")
    code, _, err = cli("enqueue", "a", "b", "z" * 70000)
    assert code == 2
    assert err.startswith("statequeue: argument 3: item of 70000 bytes exceeds")
    # An empty argument (an unset variable, most often) once added nothing in silence.
    code, out, err = cli("enqueue", "a", "", "b")
    assert (code, out) == (2, b"")
    assert err == "statequeue: argument 2: empty item (an unset variable?)\n"
    with Queue(home=sq_home) as q:
        assert q.status().total == 0  # nothing was enqueued


def test_retry_failed_is_fine_with_items_another_process_retried(
    odd_queue: Queue, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    from statequeue.store.journal.store import JournalStore

    retry = JournalStore.retry
    raced: list[bool] = []

    def another_retry_first(self: JournalStore, *args: Any, **kwargs: Any) -> list[int]:
        if not raced:  # a second `retry --failed` gets in just before this one
            raced.append(True)
            with Queue(home=odd_queue.path.parent) as other:  # type: ignore[union-attr]
                other.store.retry([1, 2])
        return retry(self, *args, **kwargs)

    monkeypatch.setattr(JournalStore, "retry", another_retry_first)
    code, out, err = cli("retry", "--failed")
    assert code == 0, err
    assert out.decode() == "0 items put back as pending\n"
    assert [v.state.value for v in odd_queue.items()] == ["pending"] * 3


def test_events_show_lost_runners_timestamps_and_seq_labels(sq_env: Env, sq_home: Path) -> None:
    code = (
        "import os,sys; from statequeue import Queue; q=Queue(); w=q.work(); next(w); os._exit(9)"
    )
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b"])
    subprocess.run([sys.executable, "-c", code], env=sq_env, timeout=60, check=False)
    with Queue(home=sq_home) as q:
        fail_all(q)
    done = subprocess.run([STATEQUEUE, "events"], env=sq_env, capture_output=True, timeout=60)
    lines = done.stdout.decode().splitlines()
    assert done.returncode == 0, done.stderr
    assert any("lost" in line and "stop record" in line for line in lines), lines
    for line in lines:
        seq, stamp = line.split()[:2], line.split()[2:4]
        assert seq[0] == "seq" and seq[1].isdigit(), line
        assert stamp[0][:1] in "~2" and ":" in stamp[1], line


def _commands(group: Any) -> Iterator[Any]:
    yield group
    for sub in getattr(group, "commands", {}).values():
        yield from _commands(sub)


def test_no_help_text_loses_a_bracketed_part_to_rich_markup() -> None:
    """Rich reads `[default: ...]` in a help string as a markup tag and drops
    it, leaving "as it comes ." in `run --help`; brackets must be escaped."""
    import re

    import typer.main

    from statequeue.cli.app import app

    tag = re.compile(r"(?<!\\)\[[a-z/][^\]]*\]")  # what rich would take for a style tag
    eaten = [
        f"{command.name} {param.name}: {param.help}"
        for command in _commands(typer.main.get_command(app))
        for param in getattr(command, "params", [])
        if tag.search(getattr(param, "help", None) or "")
    ]
    assert eaten == []


@pytest.mark.parametrize("args", [[], ["db"]])
def test_a_bare_command_prints_its_help_once(sq_env: Env, args: list[str]) -> None:
    """`statequeue` and `statequeue db` with nothing after them print their
    help once, on stdout, and exit 2: the help was printed twice (click made
    it when it raised, and the handler asked for it again)."""
    for color in ({"NO_COLOR": "1"}, {"NO_COLOR": "", "COLUMNS": "100"}):
        done = subprocess.run(
            [STATEQUEUE, *args],
            env={**sq_env, **color},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert done.stdout.count("Usage: statequeue") == 1, done.stdout
        assert "Commands" in done.stdout and done.stderr == ""
