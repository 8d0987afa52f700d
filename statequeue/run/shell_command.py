"""A command written for a shell: ``run --shell``, and the refusal of a
one-word shell command without it.

GNU parallel users write ``parallel 'gzip -9 -c {} > out/{}.gz'``: one word
that parallel hands to a shell. Without ``--shell`` statequeue runs no shell,
so such a word would be looked up as a program and every item would fail the
same way; it is refused before anything is claimed, with the ``sh -c`` form
that does what was meant.

With ``--shell`` the command's words are joined by spaces (as parallel does)
and run by ``sh -c``. The item never becomes shell text: each replacement
string is rewritten, quoted for where it stands, to the positional parameter
that holds its value (the rewriting of ``--verify``, verify.py), so an item
with quotes, ``$(...)`` or newlines is one word, as parallel's quoting makes it.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping

from statequeue.core.errors import UsageError
from statequeue.run.keeper_os import find_program
from statequeue.run.replacements import (
    NAMES,
    SLOT,
    TOKEN,
    refuse_item_tokens,
    template_tokens,
)
from statequeue.run.verify import SHELL, names_item, only_the_item, verify_script

__all__ = ["EMPTY_COMMAND", "refuse_shell_word", "shell_template"]

EMPTY_COMMAND = "the command is empty; nothing was run (e.g. statequeue run -- ./work.sh {})"

# Characters that mean a shell was expected: blanks, quotes, redirections,
# pipes, lists, expansions and globs.
_SHELL_SYNTAX = re.compile(r"""[\s'"`$|&;<>()*?\\]""")


def shell_template(command: tuple[str, ...], *, persistent: bool = False) -> tuple[str, ...]:
    """``run --shell``: ``sh -c SCRIPT sh {} {.} ...`` for the command's words
    joined by spaces; with no replacement string, the item is the last word.
    ``persistent``: a worker started once, that reads its items as requests:
    no item is added, and only ``{%}`` (the slot) may be named; the other
    parameters are empty, so the command holds no item's replacement string."""
    text = " ".join(command)
    if not text.strip():
        # `sh -c ' "$1"'` would run each item as a command of its own.
        raise UsageError(f"--shell: {EMPTY_COMMAND}")
    if persistent:
        refuse_item_tokens((text,))
    elif not names_item(text):  # a script that names $1 (or $@, $*) takes the item itself
        text += " {}"
    script = verify_script(text)
    if TOKEN.search(script):
        # Left after a backslash or in a comment: `run` would replace it in
        # the script's text, which must never hold an item.
        raise UsageError(
            "--shell: a replacement string after a backslash or in a comment is "
            f"not supported: {text!r}"
        )
    if persistent:
        return (SHELL, "-c", script, "sh", *("" for _ in NAMES[:-1]), SLOT)
    return (SHELL, "-c", only_the_item(script), "sh", *NAMES)


def refuse_shell_word(command: tuple[str, ...], env: Mapping[str, str]) -> None:
    """Refuse, before anything is claimed, a one-word command that holds shell
    syntax and names no program (a UsageError, exit 2, with the ``sh -c`` form)."""
    if len(command) != 1 or not _SHELL_SYNTAX.search(command[0]):
        return
    word = command[0]
    if os.path.exists(word) or find_program(word, env.get("PATH", os.defpath)):
        return  # a program whose name has a space in it
    raise UsageError(
        f"the command {word!r} is one word with shell syntax in it, and no shell "
        f"runs it; use --shell, or: statequeue run -- {_sh_form(word)}"
    )


def _sh_form(word: str) -> str:
    """``sh -c 'SCRIPT' sh {} ...``: the one-word command as a shell runs it."""
    used = template_tokens((word,))
    text = word if used else word + " {}"
    last = max((NAMES.index(name) for name in used), default=0)
    script = verify_script(text, pinned=False)
    return f"sh -c {shlex.quote(script)} sh {' '.join(NAMES[: last + 1])}"
