"""`run`'s options and rules in process: replacement strings, the --verify
script, episodes for --retries, the summary, the log limit, result files."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import orjson
import pytest

from statequeue import Queue
from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded
from statequeue.core.durations import format_setting
from statequeue.core.errors import UsageError
from statequeue.core.identity import new_runner
from statequeue.core.models import Claim, ItemState, Outcome
from statequeue.run.checks import check_verify_script
from statequeue.run.events import RunSummary
from statequeue.run.jobs import Job, JobSpec, build_argv
from statequeue.run.options import RunOptions
from statequeue.run.output_log import MARK, OutputLog
from statequeue.run.replacements import JobItem
from statequeue.run.verify import verify_argv, verify_script
from statequeue.store.records.state import QueueState

ODD = os.fsdecode(b"dir/od\xffd.tar.gz")  # not UTF-8: held as a surrogate escape


# -- replacement strings (GNU parallel's) -----------------------------------------


def argv_bytes(template: str, item: str, item_id: int = 7, slot: int = 2) -> bytes:
    (arg,) = build_argv((template,), item, item_id=item_id, slot=slot)
    return os.fsencode(arg)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{}", b"dir/od\xffd.tar.gz"),
        ("{.}", b"dir/od\xffd.tar"),
        ("{/}", b"od\xffd.tar.gz"),
        ("{//}", b"dir"),
        ("{/.}", b"od\xffd.tar"),
        ("{#}", b"7"),
        ("{%}", b"2"),
        ("out/{/.}.txt", b"out/od\xffd.tar.txt"),
        ("{}{}", b"dir/od\xffd.tar.gzdir/od\xffd.tar.gz"),
    ],
)
def test_each_replacement_string_keeps_odd_bytes(template: str, expected: bytes) -> None:
    assert argv_bytes(template, ODD) == expected


@pytest.mark.parametrize(
    ("item", "noext", "base", "parent", "base_noext"),
    [
        ("a", "a", "a", ".", "a"),
        ("dir.x/file", "dir.x/file", "file", "dir.x", "file"),
        ("/abs", "/abs", "abs", "/", "abs"),
        ("a/b/", "a/b/", "", "a", ""),
        ("a//b.c", "a//b", "b.c", "a", "b"),
        (".hidden", "", ".hidden", ".", ""),
        ("x.", "x", "x.", ".", "x"),
        ("a b/c d.e f", "a b/c d", "c d.e f", "a b", "c d"),
    ],
)
def test_replacement_strings_follow_gnu_parallel(
    item: str, noext: str, base: str, parent: str, base_noext: str
) -> None:
    got = build_argv(("{.}", "{/}", "{//}", "{/.}"), item)
    assert got == [noext, base, parent, base_noext]


def test_without_replacement_strings_the_item_is_appended() -> None:
    assert build_argv(("echo", "{x}", "{ }"), ODD) == ["echo", "{x}", "{ }", ODD]


# -- the --verify script ------------------------------------------------------------


def sh_verify(text: str, item: str, *, cwd: Path) -> int:
    argv = verify_argv(check_verify_script(text), JobItem(item))
    return subprocess.run(argv, cwd=cwd, check=False).returncode


def test_verify_passes_the_item_only_as_a_parameter(tmp_path: Path) -> None:
    v = "__statequeue_"
    assert verify_script("test -s out/{}.json") == f'{v}1=$1; test -s out/"${v}1".json'
    assert verify_script("{.} {/} {//} {/.} {#} {%}") == (
        f"{v}2=$2 {v}3=$3 {v}4=$4 {v}5=$5 {v}6=$6 {v}7=$7; "
        f'"${v}2" "${v}3" "${v}4" "${v}5" "${v}6" "${v}7"'
    )
    assert verify_script("\\{} '{}' \"{}\"") == f"{v}1=$1; \\{{}} ''\"${v}1\"'' \"${{{v}1}}\""
    # What a message suggests for a person to run: the parameters themselves.
    assert verify_script("test -s out/{}.json", pinned=False) == 'test -s out/"$1".json'
    evil = "$(touch pwned) `touch pwned2` ' \" \\$HOME"
    (tmp_path / evil).write_text("x")
    assert sh_verify("test -s {}", evil, cwd=tmp_path) == 0
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


@pytest.mark.parametrize(
    "script",
    [
        "test -s out/{}.json",
        'test -s "out/{}.json"',
        "test -s 'out/{}.json'",
        "test -s 'out/'{}'.json'",
        "sh -c 'test -s \"out/$0.json\"' '{}'",  # what shlex.join makes of a command
        '# a comment\'s quote does not count\ntest -s "$(printf %s out/{}.json)"',
    ],
)
def test_verify_quotes_the_item_wherever_it_stands(script: str, tmp_path: Path) -> None:
    item = 'it\'s a "b" $x'
    (tmp_path / "out").mkdir()
    assert sh_verify(script, item, cwd=tmp_path) == 1
    (tmp_path / "out" / f"{item}.json").write_text("{}")
    assert sh_verify(script, item, cwd=tmp_path) == 0


def test_verify_command_substitution_and_escaped_dollar(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "b c.json").write_text("{}")
    item = "in dir/b c.txt"
    assert sh_verify('test -s "out/$(basename {} .txt).json"', item, cwd=tmp_path) == 0
    assert sh_verify('test -s "out/$(basename {} .txt).jsonx"', item, cwd=tmp_path) == 1
    # \$ stays the shell's literal dollar sign: the script is not rewritten beyond {}.
    assert sh_verify('test "\\$1" = "$(printf %s "\\$1")" && test -n {}', item, cwd=tmp_path) == 0
    assert sh_verify('[ "\\$1" = "$1" ]', item, cwd=tmp_path) == 1


def test_verify_script_that_is_not_shell_is_refused() -> None:
    with pytest.raises(UsageError, match="invalid --verify script"):
        check_verify_script("'unterminated")
    with pytest.raises(UsageError):
        check_verify_script("   ")


# -- options --------------------------------------------------------------------------


def test_negative_log_limit_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError, match="--log-limit"):
        RunOptions(command=("true",), log_limit=-5)
    Queue("default").close()  # under the test's STATEQUEUE_HOME
    assert run_guarded(_invoke, ["run", "--log-limit", "-5", "--", "true"]) == 2
    assert capsys.readouterr().err == "statequeue: --log-limit must be >= 0 bytes, not -5\n"


def test_settings_are_shown_as_typed() -> None:
    assert [format_setting(s) for s in (2, 1, 0.5, 1.5, 90, 600, 5400)] == [
        "2s",
        "1s",
        "500ms",
        "1.5s",
        "90s",
        "10m",
        "1h30m",
    ]


# -- episodes: what --retries counts ------------------------------------------------


def fail_once(q: Queue, *, retry: bool) -> Claim:
    runner = new_runner(command=("x",))
    claim = q.claim(runner)
    assert claim is not None
    q.finish(claim, Outcome(ok=False, reason="exit code 1"), retry_at=0.0 if retry else None)
    return claim


def claim_of(q: Queue) -> Claim:
    claim = q.claim(new_runner(command=("x",)))
    assert claim is not None
    return claim


def test_failures_count_per_episode_and_retry_starts_a_new_one(tmp_path: Path) -> None:
    q = Queue("ep", home=tmp_path)
    q.enqueue(["a"])
    assert fail_once(q, retry=True).failures == 0
    assert fail_once(q, retry=False).failures == 1  # now failed for good
    q.store.retry(None)  # a user's retry: a new episode
    claim = claim_of(q)
    assert (claim.attempt, claim.failures) == (3, 0)
    q.store.release(claim, "interrupted: runner stopped by signal 15")
    q.finish(again := claim_of(q), Outcome(ok=False), retry_at=0.0)
    assert again.failures == 0  # the stop (a release) started one too
    assert claim_of(q).failures == 1
    q.close()


def test_a_crash_does_not_start_an_episode(tmp_path: Path) -> None:
    q = Queue("ep", home=tmp_path)
    q.enqueue(["a"])
    fail_once(q, retry=True)
    state = q.store.state
    state.apply({"seq": 10**6, "t": "intr", "id": 1, "state": "pending", "crashes": 1})
    assert state.get(1).failures == 1  # type: ignore[union-attr]
    q.close()


def test_an_attempt_given_back_uncounted_keeps_the_episode(tmp_path: Path) -> None:
    # The runner could not start the attempt (out of fds): as if never claimed,
    # so neither the attempt nor the episode's failure count starts over.
    q = Queue("ep", home=tmp_path)
    q.enqueue(["a"])
    fail_once(q, retry=True)
    claim = claim_of(q)
    assert (claim.attempt, claim.failures) == (2, 1)
    q.store.release(claim, "not started: Too many open files", uncounted=True)
    again = claim_of(q)
    assert (again.attempt, again.failures) == (2, 1)
    shown = q.store.history(1)
    assert {e.get("episode") for e in shown.events} == {1}
    q.close()


def test_episode_failures_survive_reopen_checkpoint_and_compaction(tmp_path: Path) -> None:
    q = Queue("ep", home=tmp_path)
    q.enqueue(["a", "b"])
    fail_once(q, retry=True)
    fail_once(q, retry=True)  # item 1 again: its retry is due at once
    ids = {i: q.store.state.get(i).failures for i in (1, 2)}  # type: ignore[union-attr]
    assert ids == {1: 2, 2: 0}
    meta, codes, locs = q.store.state.export()
    copy = QueueState()
    copy.restore(meta, codes, locs)
    assert {i: copy.items[i].failures for i in (1, 2)} == ids
    q.compact()
    q.close()
    again = Queue("ep", home=tmp_path)
    assert {i: again.store.state.get(i).failures for i in (1, 2)} == ids  # type: ignore[union-attr]
    assert any(orjson.loads(line).get("failures") for line in _journal_lines(tmp_path))
    again.close()


def _journal_lines(home: Path) -> list[bytes]:
    return (home / "ep" / "journal.jsonl").read_bytes().splitlines()


def test_an_older_checkpoint_row_is_refused_so_the_journal_is_replayed() -> None:
    state = QueueState()
    meta, codes, locs = state.export()
    meta["items"] = [[1, -1, 1, 1, 0, "", "", 1, False, 0.0]]  # ten fields: before episodes
    with pytest.raises(ValueError):
        state.restore(meta, codes, locs)


# -- the summary counts items -------------------------------------------------------


def test_summary_counts_each_item_once_by_where_it_ended() -> None:
    s = RunSummary(attempts=5)
    s.record(1, ItemState.PENDING)
    s.record(1, ItemState.PENDING)
    s.record(1, ItemState.DONE)
    s.record(2, ItemState.PENDING)
    s.record(2, ItemState.FAILED)
    s.record(3, ItemState.PENDING)
    assert (s.succeeded, s.failed, s.retried) == (1, 1, 1)
    assert s.text() == "items: 1 ok, 1 failed, 1 waiting for a retry; 5 attempts started"


def test_summary_says_deferred_for_items_that_asked_to_be_tried_later() -> None:
    """A deferral (exit 75) is no failure: "waiting for a retry" said it was."""
    s = RunSummary(attempts=4)
    s.record(1, ItemState.PENDING)
    s.defer(1)
    s.record(2, ItemState.PENDING)  # failed, a retry follows
    s.record(3, ItemState.PENDING)
    s.defer(3)
    s.record(3, ItemState.DONE)  # tried later, and done: deferred no more
    assert s.text() == (
        "items: 1 ok, 0 failed, 1 waiting for a retry, 1 deferred (to be tried later);"
        " 4 attempts started"
    )


# -- what a child leaves: its log and its result ------------------------------------


def bare_job(tmp_path: Path, *, log_limit: int = 1 << 20) -> Job:
    """A Job with no child behind it, for its log and result handling."""
    job = Job.__new__(Job)
    job.spec = JobSpec(template=("x",), queue="q", log_dir=tmp_path, log_limit=log_limit)
    job.log_file = str(tmp_path / "1.1.log")
    job.result_file = str(tmp_path / "1.1.result")
    job._name = "1.1"  # within log_dir (log_dir_fd -1: opened by path)
    job._out = OutputLog(log_limit, lambda: os.open(job.log_file, os.O_WRONLY | os.O_CREAT, 0o600))
    job.warnings = []
    return job


def test_log_limit_keeps_the_start_and_the_end(tmp_path: Path) -> None:
    job = bare_job(tmp_path, log_limit=8)  # 6 bytes of start, 2 of end
    job._out.add(b"123456")  # exactly the start's room
    job._out.add(b"7")
    job._out.add(b"more")
    job._out.close()
    assert Path(job.log_file).read_bytes() == b"123456" + MARK % 3 + b"re"


def test_a_result_nested_too_deeply_is_recorded_as_an_error(tmp_path: Path) -> None:
    job = bare_job(tmp_path)
    Path(job.result_file).write_bytes(b"[" * 300 + b"]" * 300)
    result = job._read_result()
    assert "cannot be stored" in result["error"]
    assert job.warnings and "cannot be stored" in job.warnings[0]
    orjson.dumps(result)  # what the journal writes


@pytest.mark.parametrize("value", ["0", "0s", "0m"])
def test_max_time_zero_is_refused_as_limit_zero_is(
    sq_home: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    # It would take no item and then exit as if the queue were empty.
    Queue("default", home=sq_home).enqueue(["a"])
    assert run_guarded(_invoke, ["run", "--max-time", value, "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err == "statequeue: --max-time must be more than 0 (leave it out for no limit)\n"
    assert Queue("default", home=sq_home, create=False).status().counts["pending"] == 1


def test_log_limit_takes_a_unit_as_recycle_rss_does() -> None:
    """`--log-limit 1M` was refused ("'1M' is not a valid integer") while
    `--recycle-rss 2G` was taken."""
    from statequeue.run.options import parse_log_limit

    assert parse_log_limit("1M") == 1 << 20
    assert parse_log_limit("500K") == 500 << 10
    assert parse_log_limit("4096") == 4096
    assert parse_log_limit("0") == 0
    assert parse_log_limit("-5") == -5  # RunOptions refuses it, naming the bytes
    with pytest.raises(UsageError, match="--log-limit must be a size"):
        parse_log_limit("lots")
