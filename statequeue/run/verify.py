"""``run --verify SCRIPT``: a check that says whether an item's work is done.

The script runs as ``/bin/sh -c SCRIPT sh ITEM ...``: the item reaches the
shell only as a positional parameter, never pasted into the script's text, so
no item (quotes, ``$(...)``, backslashes, newlines, bytes that are not UTF-8)
can change what the script does. Each replacement string in the script is
rewritten to the parameter that holds its value:

``{}`` -> ``$1``, ``{.}`` -> ``$2``, ``{/}`` -> ``$3``, ``{//}`` -> ``$4``,
``{/.}`` -> ``$5``, ``{#}`` -> ``$6``, ``{%}`` -> ``$7``,

quoted for where it stands, so that it is always exactly one word: ``"$1"``
outside quotes (and inside ``$(...)`` or backquotes, which start afresh),
``${1}`` inside double quotes, ``'"$1"'`` inside single quotes (which it
closes and reopens). So ``test -s out/{}.json``, ``test -s "out/{}.json"``,
``test -s 'out/{}.json'`` and ``test -s "out/$(basename {} .txt).json"`` all
test the same file. Text after a ``#`` that starts a word is a comment and
is left alone. Everything else in the script is shell, exactly as ``sh -c``
reads it (``\\$`` stays a literal dollar sign, ``\\{}`` a literal ``{}``).

A script of one plain word and no replacement string (``--verify
./check.sh``) gets the item as its last word, as ``run`` gives it to a
command: run as is, the script would get no argument, and its check of
``out/$1`` would test the folder ``out/`` itself and pass for every item,
recording items done that never ran. Any other script that names no item
(no replacement string, no ``$1``, ``${1}``, ``$@`` or ``$*``) runs as
written, and the run warns that it answers the same for every item.

Exit 0 means done. 126 or 127 (the script's command cannot run or is not
found) means the check itself is broken: the run stops (exit 2) rather than
re-running every item. Any other status means not done: the item runs.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from statequeue.core.errors import UsageError
from statequeue.run.replacements import NAMES, TOKEN, JobItem, values

if TYPE_CHECKING:
    import subprocess

SHELL = "/bin/sh"
BROKEN = (126, 127)
STDERR_LINES = 5
_STEP = 0.05


def verify_script(text: str, *, pinned: bool = True) -> str:
    """The script ``sh -c`` runs for ``--verify text`` (and ``run --shell``):
    every replacement string rewritten to a quoted variable that the script
    sets first, from the positional parameter holding the value.

    A variable, not the parameter itself: inside a shell function ``$1`` is
    the function's own argument, and ``set --`` or ``shift`` replace it. A
    ``{}`` there once became the function's (empty) ``$1``: ``clean() { rm
    -rf data/{}; }; clean`` removed all of ``data``, and a check in a
    function said every item was done. ``pinned=False``: the parameters
    themselves (the ``sh -c`` form a message suggests, for a person to read)."""
    if not text.strip():
        raise UsageError("--verify needs a script, e.g. --verify 'test -s out/{}.json'")
    if _ONE_WORD.fullmatch(text):
        text = text.strip() + " {}"
    return _Rewriter(text, pinned=pinned).run()


_ONE_WORD = re.compile(r"\s*[A-Za-z0-9_./+-]+\s*")  # a program, alone: no shell syntax


VERIFY_NAMES_NO_ITEM = (
    "--verify names no item ({} or $1): its check answers the same for every item,"
    " and an item it says is done is recorded done without running"
)

# A positional parameter written by hand: the script takes the item itself.
_POSITIONAL = re.compile(r"\$\{?#?[1-9@*]")


def names_item(text: str) -> bool:
    """Whether a --verify script (as written, or as ``verify_script`` made
    it) uses the item: a replacement string or a positional parameter."""
    return bool(TOKEN.search(text) or _POSITIONAL.search(text))


_PARAM = {name[1:-1]: i + 1 for i, name in enumerate(NAMES)}
_NUMBERS = {_PARAM["#"], _PARAM["%"]}  # the id and the slot: ours, digits only
_SQ, _DQ, _SUB, _PAREN, _BQ, _ARITH = "'", '"', "$(", "(", "`", "$(("
_VAR = "__statequeue_"
"""The variables a rewritten script keeps the replacement strings' values in."""


_SETTING = re.compile(rf"(?:{_VAR}\d=\$\d )*{_VAR}\d=\$\d; ")
"""What a rewritten script starts with (on its first line: the shell's line
numbers in its errors stay the user's)."""


ONLY_ITEM = 'set -- "$1"; '
"""What a ``run --shell`` script runs after its assignments: its positional
parameters are then the item alone (``"$@"`` was the item and the six other
replacement strings' values)."""


def script_body(script: str) -> str:
    """A rewritten script without the assignments it starts with (nor the
    ``ONLY_ITEM`` after them)."""
    found = _SETTING.match(script)
    body = script[found.end() :] if found else script
    return body.removeprefix(ONLY_ITEM)


def only_the_item(script: str) -> str:
    """``script`` (rewritten) with ``ONLY_ITEM`` after its assignments, on its first line."""
    found = _SETTING.match(script)
    cut = found.end() if found else 0
    return script[:cut] + ONLY_ITEM + script[cut:]


class _Rewriter:
    """A small lexer for the quoting of ``sh``: single and double quotes,
    backslashes, ``$(...)`` (with nested parentheses), backquotes and
    comments; enough to know, at each replacement string, how to quote it."""

    def __init__(self, text: str, *, pinned: bool = True) -> None:
        self.text = text
        self.pinned = pinned
        self.out: list[str] = []
        self.stack: list[str] = []  # open contexts, innermost last
        self.used: set[int] = set()
        self.i = 0

    def run(self) -> str:
        while self.i < len(self.text):
            token = TOKEN.match(self.text, self.i)
            if token is not None:
                self.out.append(self._param(_PARAM[token.group(1)]))
                self.i = token.end()
            else:
                self._step()
        body = "".join(self.out)
        if not self.pinned or not self.used:
            return body
        # Set before the script's first word: no function, `set --` or `shift` yet.
        return " ".join(f"{_VAR}{n}=${n}" for n in sorted(self.used)) + "; " + body

    def _param(self, n: int) -> str:
        where = self.stack[-1] if self.stack else ""
        self.used.add(n)
        name = f"{_VAR}{n}" if self.pinned else str(n)
        if where == _ARITH:
            if n not in _NUMBERS:
                # Arithmetic evaluates what a variable holds (bash: `a[$(cmd)]`
                # runs cmd): only the id and the slot, which are digits.
                raise UsageError(
                    "a replacement string of the item inside $((...)) is not supported"
                    " (only {#} and {%} are numbers there)"
                )
            return f"${name}"
        if where == _SQ:
            return f"'\"${name}\"'"
        if where == _DQ:
            return f"${{{name}}}"
        return f'"${name}"'

    def _step(self) -> None:
        text, i = self.text, self.i
        where = self.stack[-1] if self.stack else ""
        c = text[i]
        size = 1
        if where == _SQ:
            if c == "'":
                self.stack.pop()
        elif c == "\\":
            size = 2  # the next character is literal, a {} included
        elif text.startswith("$((", i):
            self.stack.append(_ARITH)
            size = 3
        elif text.startswith("$(", i):
            self.stack.append(_SUB)
            size = 2
        elif c == "`":
            self._toggle_backquote()
        elif where == _DQ:
            if c == '"':
                self.stack.pop()
        else:
            size = self._unquoted(c)
        self.out.append(text[i : i + size])
        self.i += size

    def _toggle_backquote(self) -> None:
        if self.stack and self.stack[-1] == _BQ:
            self.stack.pop()
        else:
            self.stack.append(_BQ)

    def _unquoted(self, c: str) -> int:
        """Track what ``c`` opens or closes outside quotes; the characters consumed."""
        where = self.stack[-1] if self.stack else ""
        if c == "'":
            self.stack.append(_SQ)
        elif c == '"':
            self.stack.append(_DQ)
        elif c == "(":
            self.stack.append(_PAREN)
        elif c == ")" and where == _ARITH and self.text.startswith("))", self.i):
            self.stack.pop()
            return 2
        elif c == ")" and where in (_SUB, _PAREN):
            self.stack.pop()
        elif c == "#" and (self.i == 0 or self.text[self.i - 1] in " \t\n;&|("):
            end = self.text.find("\n", self.i)
            return (len(self.text) if end < 0 else end) - self.i  # a comment, as is
        return 1


def verify_argv(script: str, job: JobItem) -> list[str]:
    """``sh -c SCRIPT sh ITEM NOEXT BASENAME DIRNAME BASE_NOEXT ID SLOT``."""
    return [SHELL, "-c", script, "sh", *values(job)]


@dataclass(frozen=True)
class Verdict:
    """What one check said: ``done`` on exit 0, ``broken`` on 126 or 127; no
    ``code`` when it was cut short (the run was stopped, or it timed out)."""

    code: int | None
    stderr: str = ""

    @property
    def done(self) -> bool:
        return self.code == 0

    @property
    def broken(self) -> bool:
        return self.code in BROKEN


def run_verify(
    argv: list[str],
    env: Mapping[str, str],
    *,
    timeout: float,
    stop: Callable[[], bool],
    pass_fds: tuple[int, ...] = (),
) -> Verdict:
    """Run the check in its own process group, waited for in small steps so
    that ``stop()`` (a signal to the runner) or ``timeout`` ends it: then
    the verdict has no code. Its stderr is kept for the user."""
    # lazy: start-up time (--verify only)
    import subprocess
    import tempfile

    with tempfile.TemporaryFile(prefix="statequeue-verify-") as errors:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env=dict(env),
            start_new_session=True,
            pass_fds=pass_fds,
        )
        code = _wait(proc, time.monotonic() + timeout, stop)
        errors.seek(0)
        tail = errors.read()[-4096:].decode("utf-8", "replace")
    return Verdict(code, tail)


def _wait(proc: subprocess.Popen[bytes], limit: float, stop: Callable[[], bool]) -> int | None:
    import subprocess  # lazy: start-up time (--verify only; imported by run_verify already)

    while True:
        try:
            return proc.wait(timeout=_STEP)
        except subprocess.TimeoutExpired:
            pass
        if stop() or time.monotonic() >= limit:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None


def last_lines(text: str, count: int = STDERR_LINES) -> list[str]:
    """The last ``count`` non-empty lines of ``text``."""
    return [line for line in text.splitlines() if line.strip()][-count:]
