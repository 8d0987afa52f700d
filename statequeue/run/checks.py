"""What a run checks before and around its items: that the command exists,
that the --verify script is valid shell and can run, and what recovery did."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from statequeue.core.command_text import command_text
from statequeue.core.errors import CommandNotFound, UsageError, VerifyBroken
from statequeue.core.models import Claim, OnInterrupted
from statequeue.core.rates import Pace, rate_text
from statequeue.core.textsafe import json_text
from statequeue.core.views import RecoveryReport
from statequeue.run.events import Notice, RunEvent
from statequeue.run.jobs import child_env, remove_left
from statequeue.run.keeper_os import find_program
from statequeue.run.replacements import JobItem, has_token
from statequeue.run.shell_command import EMPTY_COMMAND, refuse_shell_word
from statequeue.run.verify import (
    ONLY_ITEM,
    SHELL,
    Verdict,
    last_lines,
    run_verify,
    script_body,
    verify_argv,
    verify_script,
)
from statequeue.store.base import Store

SHOWN_IDS = 10


def check_command(command: tuple[str, ...], env: Mapping[str, str]) -> None:
    """Refuse a command whose executable is missing or not executable, before
    anything is claimed (else every item would fail the same way). A program
    named by a replacement string differs per item: it is checked per item.
    A one-word shell command is refused with the ``sh -c`` form (shell_command.py)."""
    refuse_shell_word(command, env)
    program = command[0]
    if not program.strip():  # `run -- "$CMD" {}` with CMD unset
        raise CommandNotFound(EMPTY_COMMAND)
    if has_token(program):
        return
    if "/" in program:
        if problem := _path_problem(program):
            raise CommandNotFound(f"command {problem}: {program}; nothing was run")
        if problem := start_problem(program):
            raise CommandNotFound(f"cannot start command '{program}': {problem}; nothing was run")
        return
    found = find_program(program, env.get("PATH", os.defpath))
    if not found:
        raise CommandNotFound(f"command not found in PATH: {program}; nothing was run")
    if problem := start_problem(found):
        raise CommandNotFound(f"cannot start command '{found}': {problem}; nothing was run")


_ELF = b"\x7fELF"


def start_problem(path: str) -> str:
    """Why the system would not start the executable file at ``path``: a
    ``#!`` line naming an interpreter that is missing, or a text file with
    no ``#!`` line (exec format error: xargs's execvp hands such a file to
    sh, a spawn does not); "" when neither (or when it cannot be read)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return ""
        with open(path, "rb") as file:
            head = file.read(512)
    except OSError:
        return ""  # execute-only, say: the system decides
    if head.startswith(b"#!"):
        # As the kernel reads it: up to a blank or the newline; a \r (a file
        # saved with CRLF) is part of the name, and no such program exists.
        line = head[2:].split(b"\n", 1)[0].lstrip(b" \t")
        interpreter = os.fsdecode(re.split(rb"[ \t]", line, maxsplit=1)[0])
        if not interpreter:
            return "its #! line is empty"
        if interpreter.endswith("\r"):
            return "its #! line ends in a carriage return (the file has CRLF line ends)"
        if not os.path.exists(interpreter):
            return f"the interpreter its #! line names is missing: {interpreter}"
        if not os.path.isfile(interpreter) or not os.access(interpreter, os.X_OK):
            return f"the interpreter its #! line names is no program: {interpreter}"
        return ""
    if head.startswith(_ELF) or b"\0" in head:
        return ""  # a binary: the system knows its format, or says why at the start
    return "it has no #! line (make #!/bin/sh its first line, or run it with sh)"


def _path_problem(program: str) -> str:
    """Why the program at path ``program`` cannot run ("not found", "is not
    executable"), or "" when it can."""
    if not os.path.exists(program):
        return "not found"
    if os.path.isdir(program) or not os.access(program, os.X_OK):
        return "is not executable"
    return ""


def check_verify_script(text: str) -> str:
    """The script for ``sh -c`` (see verify.py), refused early when the shell
    cannot parse it (``sh -n``): a syntax error must not read as "not done"."""
    script = verify_script(text)
    check_syntax(script, f"invalid --verify script {text!r}", "--verify")
    return script


def check_syntax(script: str, invalid: str, option: str) -> None:
    """Refuse (UsageError, ``invalid: why``) a script ``sh -n`` cannot parse."""
    import subprocess  # lazy: start-up time (--verify and --shell only)

    try:
        parsed = subprocess.run(
            [SHELL, "-n", "-c", script],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except OSError as exc:
        raise UsageError(f"{option} needs {SHELL}: {exc.strerror or exc}") from None
    if parsed.returncode != 0:
        why = " ".join(parsed.stderr.decode("utf-8", "replace").split()) or "syntax error"
        raise UsageError(f"{invalid}: {why}")


_FIRST_WORD = re.compile(r"\s*([A-Za-z0-9_./+-]+)(?=[\s;&|]|$)(?!\s*\()")  # not `f () {`
# After the first command, what may let the script succeed without it: a
# fallback (`|| true`), a list (`x; y`), a pipeline (its last command's
# status), a background job, another line. Then a missing first program is
# no proof that every item fails, and the script is not refused for it.
_MORE_THAN_ONE = re.compile(r"\|\||;|(?<![|&])[|&](?![|&])|\n")


def check_commands(
    command: tuple[str, ...], verify: str | None, env: Mapping[str, str], *, shell: str = ""
) -> None:
    """``check_command`` for the command, and ``check_verify_command`` for a
    --verify script: what a run checks before it claims anything. ``shell``:
    the command as given to ``run --shell`` (its words joined), whose script
    (``command[2]``) is checked the same way as a --verify script's: every
    item would fail alike on a syntax error or a missing first program."""
    check_command(command, env)
    if shell:
        check_syntax(command[2], f"invalid --shell command {shell!r}", "--shell")
        if word := missing_first_word(command[2], env, "--shell"):
            raise CommandNotFound(f"--shell command {word}; nothing was run")
    if verify:
        check_verify_command(verify, env)


def check_verify_command(script: str, env: Mapping[str, str]) -> None:
    """Refuse a --verify script whose first command is missing or not
    executable, before anything is claimed, as ``check_command`` does for the
    command (the check would fail with 126 or 127 on the first item)."""
    if word := missing_first_word(script, env, "--verify"):
        raise VerifyBroken(f"--verify command {word}; nothing was run")


def missing_first_word(script: str, env: Mapping[str, str], option: str) -> str:
    """What is wrong with a rewritten script's first command ("not found in
    PATH: x", "x is not executable"...), or "" when nothing is. Only a plain
    first word is looked at (not ``VAR=x cmd``, ``(...)``, a quoted or
    replaced word); the shell decides what it names (a builtin, a keyword,
    a function, a program on the run's PATH)."""
    import subprocess  # lazy: start-up time (--verify and --shell only)

    body = script_body(script)
    found = _FIRST_WORD.match(body)
    if found is None or _MORE_THAN_ONE.search(body, found.end()):
        return ""
    word = found.group(1)
    if "/" in word:
        problem = _path_problem(word)
        return f"{problem}: {word}" if problem else ""
    try:
        known = subprocess.run(
            [SHELL, "-c", 'command -v "$1" >/dev/null', "sh", word],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env=dict(env),
            check=False,
        )
    except OSError as exc:
        raise UsageError(f"{option} needs {SHELL}: {exc.strerror or exc}") from None
    return "" if known.returncode == 0 else f"not found in PATH: {word}"


@dataclass
class Verifier:
    """Runs the --verify script for claimed items and judges its answers."""

    script: str
    queue: str
    result_dir: str
    base_env: Mapping[str, str]
    timeout: float
    stopping: Callable[[], bool]
    log_dir_fd: int = -1  # result_dir held open (see JobSpec.log_dir_fd)
    shown_failure: bool = False

    def check(self, claim: Claim, slot: int) -> tuple[Verdict, list[tuple[str, bool]]]:
        """The verdict for ``claim``, and notices for the user, each with
        whether it is a warning (which --quiet shows): the stderr of the first
        check that says "not done" in this run (no warning: "not done" is the
        normal answer for a new item) and a timed-out check (a warning). Raises
        VerifyBroken when the script itself cannot run (exit 126 or 127)."""
        argv = verify_argv(self.script, JobItem(claim.item, claim.item_id, slot))
        result = f"{self.result_dir}/{claim.item_id}.verify"
        env = child_env(claim, self.queue, result, self.base_env)
        # The hook may write to $STATEQUEUE_RESULT by path: a file or link left
        # there must not receive it (nothing reads it back).
        self._remove(f"{claim.item_id}.verify")
        try:
            verdict = run_verify(
                argv, env, timeout=self.timeout, stop=self.stopping, pass_fds=claim.inherit_fds
            )
        finally:
            self._remove(f"{claim.item_id}.verify")
        if verdict.broken:
            raise VerifyBroken(self._broken_message(claim, verdict))
        notes: list[tuple[str, bool]] = []
        if verdict.code is None and not self.stopping():
            notes.append((f"item {claim.item_id}: --verify timed out; taken as not done", True))
        elif not verdict.done and verdict.code is not None and not self.shown_failure:
            self.shown_failure = True
            lines = last_lines(verdict.stderr)
            said = ": " + " | ".join(lines) if lines else " (no stderr)"
            text = f"item {claim.item_id}: --verify said not done (exit {verdict.code}){said}"
            notes.append((text, False))
        return verdict, notes

    def _remove(self, name: str) -> None:
        remove_left(self.result_dir, self.log_dir_fd, name)  # a directory too (issue 21, 7)

    def _broken_message(self, claim: Claim, verdict: Verdict) -> str:
        lines = last_lines(verdict.stderr)
        said = ": " + " | ".join(lines) if lines else ""
        what = "not found" if verdict.code == 127 else "cannot run"
        return (
            f"--verify script failed with exit {verdict.code} ({what}) on item "
            f"{claim.item_id}{said}; no item was started after it (fix the script)"
        )


def command_drift(
    earlier: list[list[str]], given: tuple[str, ...], template: tuple[str, ...] = ()
) -> str:
    """The warning when the queue was last run with another command ("" if not).
    ``given``: the command as the user gave it (core/command_text.py), as runs
    record it; ``template``: the form it runs as, which older versions
    recorded. Compared as stored (core/identity.py: ``json_text``), so that an
    argument that is not UTF-8 does not warn on every run."""
    if not earlier:
        return ""
    last = tuple(earlier[-1])
    # Older versions recorded a --shell script without ONLY_ITEM (verify.py).
    older = tuple(word.replace(ONLY_ITEM, "", 1) for word in template)
    if any(last == tuple(map(json_text, form)) for form in (given, template, older) if form):
        return ""
    return (
        "warning: this queue was last run with a different command: "
        f"{command_text(last)} (now: {command_text(given)})"
    )


def unpaced_note(pace: Pace) -> str:
    """The note of a runner without ``--rate`` on a queue whose runners use one."""
    limit = rate_text(pace.limit)
    return (
        f"note: this queue has a start rate (at most {limit}, burst {pace.burst}) that this"
        f" runner does not follow: only runners given --rate are paced"
        f" (--rate {limit} --burst {pace.burst} to follow it)"
    )


def report_recovery(
    store: Store,
    policy: OnInterrupted,
    max_crashes: int,
    verify: bool,
    on_event: Callable[[RunEvent], None],
    *,
    asked: OnInterrupted = OnInterrupted.RETRY,
) -> RecoveryReport:
    """Recover what dead runners left in flight now, to say so (a claim
    would do it silently), and return what it did (the run's summary counts
    the items it failed or held). ``asked``: the run's --on-interrupted, which
    ``policy`` (the one recovery applies) is not when --verify decides first."""
    report = store.recover(on_interrupted=policy, max_crashes=max_crashes)
    notes = recovery_notice(report.retried, report.failed, report.held, policy, verify, asked=asked)
    for text, warning in notes:
        on_event(Notice(text, warning=warning))
    return report


_THEN = {
    OnInterrupted.RETRY: "verifying, then retrying what is not done",
    OnInterrupted.FAIL: "verifying; what is not done is marked failed (--on-interrupted fail)",
    OnInterrupted.HOLD: "verifying; what is not done is held (--on-interrupted hold)",
}


def recovery_notice(
    retried: list[int],
    failed: list[int],
    held: list[int],
    policy: OnInterrupted,
    verify: bool,
    *,
    asked: OnInterrupted = OnInterrupted.RETRY,
) -> list[tuple[str, bool]]:
    """What recovery did with items left in flight by dead runners: one line
    each, and whether it is a warning that --quiet still shows (an item
    settled as failed or held without running: a cron job must hear of it)."""
    notes: list[tuple[str, bool]] = []
    if retried:
        then = _THEN[asked] if verify else "retrying"
        notes.append((f"recovered {_items(retried)}: {then}", False))
    if failed:
        notes.append((f"recovered {_items(failed)}: marked failed (--on-interrupted fail)", True))
    if held and policy is OnInterrupted.HOLD:
        notes.append((f"recovered {_items(held)}: held (--on-interrupted hold)", True))
    elif held:
        poison = (
            f"held {_items(held, 'poison item')}: in flight during too many runner crashes "
            "(--max-crashes); see `statequeue show ID`, then `statequeue retry ID`"
        )
        notes.append((poison, True))
    return notes


def _items(ids: list[int], noun: str = "interrupted item") -> str:
    shown = ", ".join(str(i) for i in ids[:SHOWN_IDS])
    more = f", … {len(ids) - SHOWN_IDS} more" if len(ids) > SHOWN_IDS else ""
    plural = "s" if len(ids) != 1 else ""
    return f"{len(ids)} {noun}{plural} ({shown}{more})"
