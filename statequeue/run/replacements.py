"""GNU parallel's replacement strings, for building a command from an item.

==========  ====================================  ===================
string      meaning                               ``dir.x/a.tar.gz``
==========  ====================================  ===================
``{}``      the item                              ``dir.x/a.tar.gz``
``{.}``     without its last extension            ``dir.x/a.tar``
``{/}``     basename                              ``a.tar.gz``
``{//}``    dirname (``.`` when there is none)    ``dir.x``
``{/.}``    basename without its last extension   ``a.tar``
``{#}``     the item's id                         ``7``
``{%}``     the job slot, 1 to ``--jobs``         ``1``
==========  ====================================  ===================

Each is GNU parallel's rule, character for character: ``{.}`` is
``s:\\.[^/.]*$::`` (so an extension is looked for in the basename only),
``{/}`` is ``s:^.*/::``, ``{//}`` is Perl's ``File::Basename::dirname``.
Items are treated as bytes (a non-UTF-8 item stays as its surrogate escapes,
and goes back to the same bytes in argv); a newline is an ordinary character.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass

from statequeue.core.errors import UsageError

TOKEN = re.compile(r"\{(//|/\.|/|\.|#|%|)\}")
_EXTENSION = re.compile(r"\.[^/.]*\Z")


@dataclass(frozen=True)
class JobItem:
    """What the replacement strings are computed from."""

    item: str
    item_id: int = 0
    slot: int = 1


def strip_extension(path: str) -> str:
    """``{.}``: remove the last ``.ext`` of the basename, if it has one."""
    return _EXTENSION.sub("", path)


def basename(path: str) -> str:
    """``{/}``: everything after the last slash."""
    return path.rpartition("/")[2]


def dirname(path: str) -> str:
    """``{//}``: Perl's dirname: ``a`` -> ``.``, ``a/b/`` -> ``a``, ``/a`` -> ``/``."""
    head, sep, base = path.rpartition("/")
    parent = _strip_trailing_slashes(head + sep if sep else "./")
    if not base:  # a trailing slash: the dirname of what precedes it
        head, sep, _ = parent.rpartition("/")
        parent = _strip_trailing_slashes(head + sep if sep else "./")
    return parent


def _strip_trailing_slashes(path: str) -> str:
    # Perl's s{(.)/*\z}{$1}s: trailing slashes go, but never the first character.
    stripped = path.rstrip("/")
    return stripped or path[:1]


_VALUES: dict[str, Callable[[JobItem], str]] = {
    "": lambda j: j.item,
    ".": lambda j: strip_extension(j.item),
    "/": lambda j: basename(j.item),
    "//": lambda j: dirname(j.item),
    "/.": lambda j: strip_extension(basename(j.item)),
    "#": lambda j: str(j.item_id),
    "%": lambda j: str(j.slot),
}

NAMES: tuple[str, ...] = tuple("{" + key + "}" for key in _VALUES)
"""Every replacement string, ``{}`` first."""
SLOT = "{%}"
"""The job slot's: the one a persistent worker's command may hold."""


def has_token(arg: str) -> bool:
    return TOKEN.search(arg) is not None


@functools.lru_cache(maxsize=16)
def template_tokens(template: tuple[str, ...]) -> frozenset[str]:
    """The replacement strings used anywhere in a command template (one
    template per run: cached, so that each item does not scan it again)."""
    return frozenset(m.group(0) for arg in template for m in TOKEN.finditer(arg))


def replace(arg: str, job: JobItem) -> str:
    """``arg`` with every replacement string in it replaced."""
    return TOKEN.sub(lambda m: _VALUES[m.group(1)](job), arg)


def values(job: JobItem) -> list[str]:
    """Every replacement string's value, in the order of ``NAMES``."""
    return [value(job) for value in _VALUES.values()]


def refuse_item_tokens(command: tuple[str, ...]) -> None:
    """``--persistent``: refuse a command holding a replacement string other
    than ``{%}`` (the slot): a persistent worker gets its items on stdin."""
    if others := sorted(template_tokens(command) - {SLOT}):
        raise UsageError(
            f"--persistent: the command may not hold {', '.join(others)}: a persistent "
            "worker gets its items as requests on stdin (only {%}, the slot, is replaced)"
        )
