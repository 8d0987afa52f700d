"""A run's command as its user gave it, to be stored and shown.

`run --shell -- 'gzip -c {} > {}.gz'` runs ``/bin/sh -c SCRIPT sh {} {.} ...``
with the script rewritten (run/shell_command.py); a warning or `stats` that
showed that form would show something the user never typed. A run records
its command as given instead: the words of the command, or for ``--shell``
the pair (``--shell``, TEXT), TEXT the words joined as the shell runs them.
No program can be named ``--shell`` (`run -- --shell` finds none, and runs
nothing), so the pair means one thing.

Records of older versions hold the rewritten form; ``command_text`` shows
that as ``--shell 'SCRIPT'`` too (the script as rewritten: its text as typed
was never stored).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from statequeue.core.textsafe import escaped

__all__ = ["SHELL_FLAG", "command_text", "given_shell", "quoted"]

SHELL_FLAG = "--shell"

# The tail of the rewritten --shell form: `sh` ($0), then every replacement
# string (run/replacements.py: NAMES; a test holds the two equal).
SHELL_TAIL = ("sh", "{}", "{.}", "{/}", "{//}", "{/.}", "{#}", "{%}")
_TOKENS = re.compile(r"\{(?:|\.|/|//|/\.|#|%)\}")
"""The replacement strings: literal words to every shell (no brace expansion
without a comma or ``..``), shown unquoted."""


def given_shell(words: Sequence[str]) -> tuple[str, str]:
    """What a run records for `run --shell -- WORDS...`."""
    return (SHELL_FLAG, " ".join(words))


def command_text(command: Sequence[str]) -> str:
    """One line for a stored command, quoted as a shell would need it:
    ``./convert {} 'out dir'``, ``--shell 'echo "[$1]"'``. Ready to show
    as it is (no ``escaped`` over it, which would double its backslashes): a
    word with a control character or a byte that is not UTF-8 is written as
    bash's ``$'...'`` (``$'a\\x1bb'``), so none reaches a terminal raw."""
    words = list(command)
    if len(words) == 2 and words[0] == SHELL_FLAG:
        return f"{SHELL_FLAG} {quoted(words[1])}"
    if len(words) == 3 + len(SHELL_TAIL) and words[1] == "-c" and tuple(words[3:]) == SHELL_TAIL:
        return f"{SHELL_FLAG} {quoted(words[2])}"  # an older record of a --shell run
    return " ".join(map(quoted, words))


def quoted(word: str) -> str:
    """``word`` as a shell takes it back: ``shlex.quote``, or ``$'...'``
    with escapes (textsafe.escaped's, which bash reads alike) when it holds
    a character a terminal must not get raw."""
    shown = escaped(word)
    if shown == word.replace("\\", "\\\\"):  # nothing but backslashes escaped
        rest = _TOKENS.sub("", word)
        if rest != word and (not rest or shlex.quote(rest) == rest):
            return word  # `out/{}.gz`, as typed: no shell expands a replacement string
        return shlex.quote(word)
    return "$'" + shown.replace("'", "\\'") + "'"
