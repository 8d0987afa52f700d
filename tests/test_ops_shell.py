"""Issue 26, point 2: GNU parallel's one-word shell command.

Without --shell it is refused before anything is claimed (exit 2) with the
`sh -c '...' sh {}` form; with --shell it runs through `sh -c`, each item one
quoted word whatever it holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from statequeue.core.errors import UsageError
from statequeue.run.shell_command import shell_template
from tests.conftest import STATEQUEUE

HOSTILE = ["a b", "c'd", 'e"f', "$(touch pwned)", "g;h", "-n"]


def _sq(
    env: dict[str, str], cwd: Path, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [STATEQUEUE, *args],
        env=env,
        cwd=cwd,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_one_word_shell_command_is_refused_before_any_claim(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    _sq(sq_env, tmp_path, "enqueue", stdin="a\nb\n")
    out = _sq(sq_env, tmp_path, "run", "--", "gzip -9 -c {} > out/{}.gz")
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1, out.stderr  # one line
    assert (
        'use --shell, or: statequeue run -- sh -c \'gzip -9 -c "$1" > out/"$1".gz\' sh {}'
        in out.stderr
    )
    status = json.loads(_sq(sq_env, tmp_path, "status", "--json").stdout)
    assert status["counts"]["pending"] == 2
    events = _sq(sq_env, tmp_path, "events", "--json").stdout
    assert '"start"' not in events and "attempt" not in events, events


def test_the_hint_runs_as_shown(tmp_path: Path, sq_env: dict[str, str]) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "a b").write_text("hello")
    _sq(sq_env, tmp_path, "enqueue", stdin="a b\n")
    hint = _sq(sq_env, tmp_path, "run", "--", "cat {} > out/{/.}.copy").stderr
    shown = hint.split("or: ", 1)[1].strip()
    ran = subprocess.run(
        ["sh", "-c", shown], env=sq_env, cwd=tmp_path, capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "out" / "a b.copy").read_text() == "hello"


def test_a_program_with_a_space_in_its_name_still_runs(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    program = tmp_path / "my tool"
    program.write_text('#!/bin/sh\necho "$1" >> "$(dirname "$0")/seen"\n')
    program.chmod(0o755)
    _sq(sq_env, tmp_path, "enqueue", stdin="x\n")
    out = _sq(sq_env, tmp_path, "run", "--", str(program))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "seen").read_text() == "x\n"


def test_shell_quotes_every_item(tmp_path: Path, sq_env: dict[str, str]) -> None:
    (tmp_path / "out").mkdir()
    _sq(sq_env, tmp_path, "enqueue", stdin="\n".join(HOSTILE) + "\n")
    out = _sq(sq_env, tmp_path, "run", "--shell", "--", "printf '%s\\n' {} > out/{#}.txt")
    assert out.returncode == 0, out.stderr
    written = [(tmp_path / "out" / f"{n}.txt").read_text() for n in range(1, len(HOSTILE) + 1)]
    assert written == [item + "\n" for item in HOSTILE]
    assert not (tmp_path / "pwned").exists()


def test_shell_joins_words_and_appends_the_item_without_a_replacement_string(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    _sq(sq_env, tmp_path, "enqueue", stdin="it's\n")
    out = _sq(sq_env, tmp_path, "run", "--shell", "--", "echo", "got >>", "seen")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "seen").read_text() == "got it's\n"


def test_shell_refuses_a_replacement_string_it_cannot_quote() -> None:
    with pytest.raises(UsageError, match="after a backslash"):
        shell_template(("echo \\{}",))


# -- found by outside testing: {} where "$1" is not the item -----------------------


def test_shell_item_inside_a_function_is_the_item_not_the_functions_argument(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    """`{}` once became "$1", which inside a function is the function's own
    (empty) argument: this removed all of data/, not data/old."""
    data = tmp_path / "data"
    (data / "keep").mkdir(parents=True)
    (data / "old").mkdir()
    (data / "keep" / "important").touch()
    _sq(sq_env, tmp_path, "enqueue", stdin="old\n")
    out = _sq(sq_env, tmp_path, "run", "--shell", "--", f"clean() {{ rm -rf {data}/{{}}; }}; clean")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in data.iterdir()) == ["keep"]


def test_shell_item_survives_set_and_shift(tmp_path: Path, sq_env: dict[str, str]) -> None:
    _sq(sq_env, tmp_path, "enqueue", stdin="dir/a b.tar.gz\n")
    script = 'set -- other words; shift; echo "item={} base={/.} id={#} rest=$*"'
    assert _sq(sq_env, tmp_path, "run", "--shell", "--", script).returncode == 0
    logged = _sq(sq_env, tmp_path, "logs", "1").stdout
    assert logged == "item=dir/a b.tar.gz base=a b.tar id=1 rest=words\n"


def test_verify_in_a_function_checks_each_item(tmp_path: Path, sq_env: dict[str, str]) -> None:
    """A check in a function once tested the function's empty "$1": out/
    exists, so every item was recorded done without running."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "2").touch()  # only item 2 is done already
    _sq(sq_env, tmp_path, "enqueue", stdin="1\n2\n3\n")
    check = f"done_already() {{ test -e {out_dir}/{{}}; }}; done_already"
    ran = _sq(
        sq_env, tmp_path, "run", "--verify-first", "--verify", check, "--",
        "sh", "-c", f'touch {out_dir}/"$1"', "sh", "{}",
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "3 ok (1 verified, not run), 0 failed; 2 attempts started" in ran.stderr, ran.stderr
    assert sorted(p.name for p in out_dir.iterdir()) == ["1", "2", "3"]


def test_shell_numbers_in_arithmetic_and_no_item_there(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    _sq(sq_env, tmp_path, "enqueue", stdin="x\n")
    assert _sq(sq_env, tmp_path, "run", "--shell", "--", "echo $(( {#} * 2 ))").returncode == 0
    assert _sq(sq_env, tmp_path, "logs", "1").stdout == "2\n"
    # Arithmetic evaluates what it is given (bash runs `a[$(cmd)]`): not an item's text.
    refused = _sq(sq_env, tmp_path, "run", "--shell", "--", "echo $(( {} * 2 ))")
    assert refused.returncode == 2 and "$((" in refused.stderr


def test_shell_script_naming_its_parameter_gets_the_item_once(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    """With no {} but "$1", --shell once appended "$1" too: gzip wrote twice.
    And its parameters are the item alone, as the docs say ("takes the item
    itself"): "$@" was the item and the six other replacement strings' values,
    so a loop over "$@" handled each item seven times."""
    _sq(sq_env, tmp_path, "enqueue", stdin="one two\n")
    ran = _sq(sq_env, tmp_path, "run", "--shell", "--", 'echo "n=$# first=$1"; printf "[%s]" "$@"')
    assert ran.returncode == 0, ran.stderr
    assert _sq(sq_env, tmp_path, "logs", "1").stdout == "n=1 first=one two\n[one two]"


@pytest.mark.parametrize(
    ("script", "said"),
    [
        ("echo {} |", "invalid --shell command 'echo {} |': "),
        ("if true; then echo {}", "invalid --shell command 'if true; then echo {}': "),
        ("no-such-program-sq {} > /dev/null", "--shell command not found in PATH: no-such"),
        ("no-such-program-sq {} && echo {}", "--shell command not found in PATH: no-such"),
        ("./missing.sh {}", "--shell command not found: ./missing.sh; nothing was run"),
    ],
)
def test_a_shell_command_that_cannot_run_is_refused_before_any_claim(
    tmp_path: Path, sq_env: dict[str, str], script: str, said: str
) -> None:
    """Every item would fail alike (exit 2 of sh, or 127): refused up front,
    exit 2 and one line, as a missing program is without --shell."""
    _sq(sq_env, tmp_path, "enqueue", stdin="a\nb\n")
    out = _sq(sq_env, tmp_path, "run", "--shell", "--", script)
    assert out.returncode == 2, out.stderr
    assert out.stderr.count("\n") == 1 and said in out.stderr, out.stderr
    status = json.loads(_sq(sq_env, tmp_path, "status", "--json").stdout)
    assert status["counts"]["pending"] == 2 and status["counts"]["failed"] == 0
    events = _sq(sq_env, tmp_path, "events", "--json").stdout
    assert '"start"' not in events, events


@pytest.mark.parametrize(
    "script",
    [
        "myfn () { printf '%s' \"$1\" >> out.txt; }; myfn {}",  # a function, defined with a blank
        "no-such-program-sq {} || printf '%s' {} >> out.txt",  # a fallback
        "no-such-program-sq {} 2>/dev/null; printf '%s' {} >> out.txt",  # a list
    ],
)
def test_a_shell_script_that_may_run_without_its_first_program_is_not_refused(
    tmp_path: Path, sq_env: dict[str, str], script: str
) -> None:
    """Refused as "command not found in PATH" though every item would succeed."""
    _sq(sq_env, tmp_path, "enqueue", stdin="a\n")
    out = _sq(sq_env, tmp_path, "run", "--shell", "--", script)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out.txt").read_text() == "a"


def test_a_shell_command_starting_with_a_builtin_or_a_function_runs(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    _sq(sq_env, tmp_path, "enqueue", stdin="a\n")
    script = "f() { printf '%s' \"$1\" > out.txt; }; cd . && f {}"
    out = _sq(sq_env, tmp_path, "run", "--shell", "--", script)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out.txt").read_text() == "a"


PERSISTENT_WORKER = """
import json, os, sys
out = os.fdopen(int(os.environ["STATEQUEUE_REPLY_FD"]), "w")
for line in sys.stdin:
    request = json.loads(line)
    out.write(json.dumps({"id": request["id"], "ok": True, "result": sys.argv[1:]}) + "\\n")
    out.flush()
"""


def test_persistent_workers_run_under_shell_with_the_slot(
    tmp_path: Path, sq_env: dict[str, str]
) -> None:
    """`--persistent --shell` was always refused: the shell's parameters
    for every replacement string were taken for ones the command names."""
    (tmp_path / "worker.py").write_text(PERSISTENT_WORKER)
    _sq(sq_env, tmp_path, "enqueue", stdin="a\nb\nc\n")
    script = 'cd . && exec "$PYTHON" worker.py {%}'
    env = {**sq_env, "PYTHON": sys.executable}
    out = _sq(env, tmp_path, "run", "--persistent", "--shell", "-j2", "--", script)
    assert out.returncode == 0, out.stderr
    results = _sq(sq_env, tmp_path, "results", "--json").stdout.splitlines()
    slots = [json.loads(line)["result"] for line in results]
    assert len(slots) == 3 and all(slot in (["1"], ["2"]) for slot in slots), slots
    refused = _sq(sq_env, tmp_path, "run", "--persistent", "--shell", "--", "cat {/}")
    assert refused.returncode == 2 and "may not hold {/}" in refused.stderr, refused.stderr
