"""CLI edges an outside tester found: closed pipes, Ctrl-C, odd names, messages."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.api.queue import Queue
from statequeue.cli.app import _invoke
from statequeue.cli.errors import run_guarded
from statequeue.core.models import Outcome
from tests.conftest import STATEQUEUE

Env = dict[str, str]


class Cli:
    """The full CLI in this process, with its exit code and output."""

    def __init__(self, capfd: pytest.CaptureFixture[str]) -> None:
        self.capfd = capfd

    def __call__(self, *args: str) -> tuple[int, str, str]:
        self.capfd.readouterr()
        code = run_guarded(_invoke, list(args))
        sys.stdout.flush()
        out, err = self.capfd.readouterr()
        return code, out, err


@pytest.fixture
def cli(capfd: pytest.CaptureFixture[str]) -> Cli:
    return Cli(capfd)


def finish_all(q: Queue, *, ok: bool = True) -> None:
    for item in q.work():
        q.finish(item.claim, Outcome(ok=ok, reason="" if ok else "exit code 1"))
        item.settled = True


def one_line_error(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("statequeue: "), err
    assert "Traceback" not in err
    return lines[0]


# -- 1 and 4: a reader that went away --------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [["results", "--csv"], ["--help"], ["run", "--help"], ["stats", "--help"]],
    ids=lambda a: " ".join(a),
)
def test_closed_pipe_is_quiet_for_csv_and_help(sq_home: Path, sq_env: Env, args: list[str]) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue([f"item {i}" for i in range(50)])
        finish_all(q)
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first write: `| head` that quit
    try:
        done = subprocess.run(
            [STATEQUEUE, *args], env=sq_env, stdout=write, stderr=subprocess.PIPE, timeout=60
        )
    finally:
        os.close(write)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""


def test_results_csv_under_head_reads_one_line_quietly(sq_home: Path, sq_env: Env) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue([f"item {i:04d} " + "x" * 100 for i in range(2000)])  # > a pipe's buffer
        finish_all(q)
    with subprocess.Popen(
        [STATEQUEUE, "results", "--csv"],
        env=sq_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().startswith(b"id,item,state")
        proc.stdout.close()  # as `head -1` does
        err = proc.stderr.read()
        code = proc.wait(timeout=60)
    assert code == 0, err
    assert err == b""


# -- 2 and 3: Ctrl-C ---------------------------------------------------------------


def test_ctrl_c_while_enqueue_reads_stdin_exits_130_without_traceback(
    sq_home: Path, sq_env: Env
) -> None:
    read, write = os.pipe()  # stdin that stays open: enqueue waits on it
    proc = subprocess.Popen([STATEQUEUE, "enqueue"], env=sq_env, stdin=read, stderr=subprocess.PIPE)
    os.close(read)
    try:
        os.write(write, b"first\n")
        _wait_blocked_reading_stdin(proc)
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    finally:
        os.close(write)
    assert code == 130, err
    assert err == "statequeue: interrupted\n"
    assert not (sq_home / "default").exists()  # nothing was queued: the input was not whole


_READ_SYSCALL = {"x86_64": "0", "aarch64": "63"}


def _wait_blocked_reading_stdin(proc: subprocess.Popen[bytes]) -> None:
    """Return once ``proc`` sleeps in read(2) of fd 0 (the event we need)."""
    import platform

    number = _READ_SYSCALL.get(platform.machine())
    if number is None:
        pytest.skip("needs the read(2) syscall number of this machine")
    syscall = Path(f"/proc/{proc.pid}/syscall")
    while proc.poll() is None:
        fields = syscall.read_text().split()
        if fields[:2] == [number, "0x0"]:
            return
        os.sched_yield()
    raise AssertionError("enqueue ended before reading stdin")


_ENTRY_PROBE = """
import signal, sys
seen = set()
class Probe:
    def find_spec(self, name, path=None, target=None):
        if name in ("orjson", "typer", "rich") and name not in seen:
            seen.add(name)
            dfl = signal.getsignal(signal.SIGINT) is signal.SIG_DFL
            sys.stderr.write(f"probe {name} {dfl}\\n")
            sys.stderr.flush()
        return None
sys.meta_path.insert(0, Probe())
import statequeue.cli.main as entry
sys.stderr.write("probe entry-imported\\n")
try:
    entry.main(sys.argv[1:])
except SystemExit:
    restored = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    sys.stderr.write(f"probe restored {restored}\\n")
"""


@pytest.mark.parametrize("args", [["list"], ["status"]], ids=["full cli", "fast path"])
def test_the_entry_lets_ctrl_c_end_the_process_during_imports(
    sq_home: Path, sq_env: Env, args: list[str]
) -> None:
    """Ctrl-C while the CLI imports its modules ends the process at once (the
    kernel's default action): no traceback, no crash inside a module's init."""
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    done = subprocess.run(
        [sys.executable, "-c", _ENTRY_PROBE, *args],
        env=sq_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    probes = [line.split()[1:] for line in done.stderr.splitlines() if line.startswith("probe")]
    # The entry module itself is light: the heavy imports come after SIGINT is set.
    assert probes[0] == ["entry-imported"], probes
    heavy = {p[0]: p[1] for p in probes[1:] if p[0] != "restored"}
    assert "orjson" in heavy, probes
    assert set(heavy.values()) == {"True"}, probes
    if args == ["list"]:  # the fast path leaves by os._exit; test_ctrl_c_while_enqueue... covers it
        assert ["restored", "True"] in probes, "commands must get KeyboardInterrupt back"


def test_importing_the_library_leaves_sigint_alone(sq_env: Env) -> None:
    code = (
        "import signal, statequeue\n"
        "from statequeue import Queue, WorkItem, WorkPolicy\n"
        "import orjson\n"
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=sq_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- 5: durations ----------------------------------------------------------------------


@pytest.mark.parametrize("option", ["--grace", "--timeout", "--retry-delay", "--max-time"])
def test_a_negative_duration_says_it_must_not_be_negative(
    sq_home: Path, cli: Cli, option: str
) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    code, _, err = cli("run", option, "-1", "--", "true", "{}")
    line = one_line_error(err)
    assert code == 2
    assert "must not be negative" in line
    assert "finite" not in line


def test_an_infinite_duration_still_says_finite(sq_home: Path, cli: Cli) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    code, _, err = cli("run", "--grace", "inf", "--", "true", "{}")
    assert code == 2
    assert "finite" in one_line_error(err)


# -- 6: export to a missing folder -----------------------------------------------------


def test_export_into_a_missing_folder_is_not_found(sq_home: Path, tmp_path: Path, cli: Cli) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a"])
    missing = tmp_path / "nonexistent" / "dir"
    code, _, err = cli("export", "-o", str(missing / "x"))
    line = one_line_error(err)
    assert code == 7
    assert f"no such folder: {missing}" in line
    assert "acknowledging" not in line


# -- 7: an unsafe entry in the home ----------------------------------------------------


def test_queues_skips_a_linked_entry_with_one_warning(
    sq_home: Path, tmp_path: Path, cli: Cli
) -> None:
    with Queue("good", home=sq_home) as q:
        q.enqueue(["a"])
    elsewhere = tmp_path / "elsewhere"
    with Queue("real", home=elsewhere) as q:
        q.enqueue(["b"])
    (sq_home / "linked").symlink_to(elsewhere / "real")
    code, out, err = cli("queues")
    assert code == 0, err
    assert out.startswith("good\t")
    assert "linked" not in out
    line = one_line_error(err)
    assert "linked" in line and "symbolic link" in line
    code, out, err = cli("queues", "--json")
    assert code == 0
    assert '"good"' in out and '"linked"' not in out


def test_queues_still_refuses_an_unsafe_home(sq_home: Path, cli: Cli) -> None:
    with Queue("good", home=sq_home) as q:
        q.enqueue(["a"])
    sq_home.chmod(0o777)
    code, out, err = cli("queues")
    assert code == 9
    assert out == ""
    one_line_error(err)


def test_queues_refuses_a_home_that_is_a_file_as_status_does(tmp_path: Path, cli: Cli) -> None:
    # `--home /etc/passwd queues` said "no queues" and exit 0; status said exit 2.
    home = tmp_path / "a-file"
    home.write_text("not a folder\n")
    for command in ("queues", "status"):
        code, _out, err = cli("--home", str(home), command)
        assert code == 2, (command, err)
        assert err.strip() == f"statequeue: home {home} exists and is not a folder"


# -- 8: queue names shown readably -----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shown"),
    [("név", "'név'"), ("a\x1bb", "'a\\x1bb'"), ("a\\b", "'a\\\\b'")],
    ids=["accented", "escape", "backslash"],
)
def test_a_bad_queue_name_is_shown_readably(cli: Cli, name: str, shown: str) -> None:
    code, _, err = cli("-q", name, "status")
    line = one_line_error(err)
    assert code == 2
    assert f"invalid queue name {shown}:" in line


# -- 9: run --limit 0 and a stopped --follow ---------------------------------------


def test_run_limit_zero_is_a_usage_error(sq_home: Path, cli: Cli) -> None:
    with Queue(home=sq_home) as q:
        q.enqueue(["a", "b", "c"])
    code, _, err = cli("run", "--limit", "0", "--", "true", "{}")
    line = one_line_error(err)
    assert code == 2
    assert "--limit" in line
    assert "nothing to do" not in line
    with Queue(home=sq_home) as q:
        assert q.status().counts["pending"] == 3


def test_a_run_stopped_with_nothing_done_does_not_say_nothing_to_do() -> None:
    from statequeue.cli.run_start import exit_code as _exit_code
    from statequeue.run.events import RunSummary

    summary = RunSummary(stopped_by=signal.SIGINT)
    assert "nothing to do" not in summary.text()
    assert "stopped" in summary.text()
    assert _exit_code(summary, follow=True, exit_empty=0) == 130
    assert "nothing to do" in RunSummary().text()


# -- 10: help and README text --------------------------------------------------------


def test_every_command_summary_is_one_line() -> None:
    import typer

    from statequeue.cli.app import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, command in group.commands.items():
        first = (command.help or "").split("\n\n")[0]
        assert "\n" not in first.strip(), f"{name}: {first!r}"


def test_readme_mentions_only_real_options_and_messages(cli: Cli) -> None:
    root = Path(__file__).parent.parent  # the README and the help pages, where its text moved
    readme = "".join(
        p.read_text() for p in [root / "README.md", *root.glob("statequeue/cli/topics/*.md")]
    )
    assert "stats --watch" not in readme
    code, _, err = cli("statu")
    assert code == 2
    suggestion = err.split("No such command", 1)[1].strip().rstrip(")").split("(", 1)[1]
    assert suggestion.split(" (see")[0] in readme, err


def test_readme_promises_the_schema_field_only_where_it_is(sq_home: Path, cli: Cli) -> None:
    """The help pages promise `"schema": 1` for read commands' objects and for
    the summaries of the commands that change a queue (enqueue --json had
    none, as run, compact and import did not: an outside tester's finding);
    both hold."""
    root = Path(__file__).parent.parent  # the README and the help pages, where its text moved
    readme = "".join(
        p.read_text() for p in [root / "README.md", *root.glob("statequeue/cli/topics/*.md")]
    )
    assert "Every read command takes `--json`. Its objects carry" in readme
    assert "(`enqueue`, `run`, `retry`, `cancel`, `compact`, `import`" in readme
    code, out, _ = cli("enqueue", "--json", "x")
    assert code == 0 and '"schema":1' in out
    code, out, _ = cli("status", "--json")
    assert code == 0 and '"schema":1' in out


# -- 11: an item that cannot start counts as an attempt ------------------------------


def test_run_summary_counts_attempts_as_the_store_does(sq_home: Path, cli: Cli) -> None:
    """An item whose program cannot start (the item names it) has an attempt
    recorded, as `list`, `show` and `stats` count it; so does the summary."""
    import json

    with Queue(home=sq_home) as q:
        q.enqueue(["/bin/true", str(sq_home / "nonexistent")])
    code, out, err = cli("run", "--json", "--", "{}")
    summary = json.loads(out)
    assert code == 1, err
    assert (summary["succeeded"], summary["failed"]) == (1, 1)
    with Queue(home=sq_home) as q:
        stored = q.stats().to_json()["attempts"]
    assert stored == 2
    assert summary["attempts"] == stored
    code, _, err = cli("enqueue", str(sq_home / "other-missing"))
    assert code == 0, err
    code, _, err = cli("run", "--", "{}")
    assert code == 1
    assert "1 failed; 1 attempt" in err, err


# -- 12: status of a paused queue ----------------------------------------------------


def _paused_status(paused: bool) -> object:
    from statequeue.core.views import ActiveRunner, Status

    runner = ActiveRunner(runner_id="r", pid=1, host="h", started_at=0.0, running=(1,))
    counts = {"pending": 5, "running": 1, "done": 10, "failed": 0, "cancelled": 0, "held": 0}
    return Status(queue="q", counts=counts, runners=(runner,), paused=paused, rate=2.0)


def test_status_of_a_paused_queue_says_the_eta_is_paused() -> None:
    from statequeue.cli.render import status_text
    from statequeue.core.views import Status

    st = _paused_status(True)
    assert isinstance(st, Status)
    text = status_text(st)
    assert "ETA paused" in text
    assert "ETA 3" not in text
    assert st.to_json()["eta_seconds"] is None
    assert st.to_json()["paused"] is True
    running = _paused_status(False)
    assert isinstance(running, Status)
    assert "ETA 3.0s" in status_text(running)


def test_run_timeout_zero_means_no_limit(sq_env: dict[str, str]) -> None:
    """`--timeout 0` disables the limit (as coreutils' `timeout 0` does); it
    used to time every item out at once."""
    sq = [STATEQUEUE, "-q", "t0"]
    assert subprocess.run([*sq, "enqueue", "a"], env=sq_env, capture_output=True).returncode == 0
    ran = subprocess.run(
        [*sq, "run", "--timeout", "0", "--", "sh", "-c", "sleep 0.2"],
        env=sq_env,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr
    shown = subprocess.run([*sq, "results", "--json"], env=sq_env, capture_output=True, text=True)
    assert '"state":"done"' in shown.stdout.replace(" ", "")


def test_status_json_has_no_eta_while_no_runner_is_active() -> None:
    """The text said no ETA once the runner was gone (killed -9), `stats`
    said "no runner is active", and `status --json` still gave
    ``eta_seconds`` from the rate of its last minute. Found by an outside
    tester comparing the stores' views."""
    from dataclasses import replace

    from statequeue.core.views import Status

    st = _paused_status(False)
    assert isinstance(st, Status)
    assert st.to_json()["eta_seconds"] == 3.0
    alone = replace(st, runners=())
    assert alone.to_json()["eta_seconds"] is None and alone.rate == 2.0
