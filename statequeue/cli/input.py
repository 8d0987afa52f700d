"""Reading items from arguments, stdin or a file."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from statequeue.errors import InvalidItem, UsageError


@dataclass(frozen=True)
class Positions:
    """Where each item came from, to name a bad one by its line."""

    source: str
    """"argument", "line" or "item" (NUL-separated)."""
    where: str = ""
    """"" for arguments and stdin, else the file's name."""
    empties: list[int] = field(default_factory=list)
    """0-based positions of the empty lines (or arguments) that were skipped."""

    def name(self, index: int) -> str:
        """How the user finds item ``index`` (0-based) of the input."""
        number = index + 1
        for empty in self.empties:  # every empty one skipped before it moves it down
            if empty >= number:
                break
            number += 1
        if self.source == "argument":
            return f"argument {number}"
        if self.source == "item":
            return f"item {number} " + (f"in {self.where}" if self.where else "on stdin")
        return f"{self.where}: line {number}" if self.where else f"line {number}"

    def locate(self, exc: InvalidItem) -> InvalidItem:
        """``exc`` with the bad item's position in front of its message."""
        if exc.index is None:
            return exc
        return type(exc)(f"{self.name(exc.index)}: {exc.message}")


def read_input(args: list[str], *, file: str | None, null: bool) -> tuple[list[str], Positions]:
    """Items from ``args``, else from ``file`` or stdin; empty lines are ignored.
    Returns them with what names their positions in error messages.

    Bytes that are not UTF-8 are kept losslessly (as surrogate escapes, the
    way Python decodes file names), so `find | statequeue enqueue` never
    crashes or corrupts the queue on odd file names.
    """
    if args and file is not None:
        raise UsageError("give items as arguments or with --file, not both")
    if args:
        items = [a for a in args if a]
        return items, Positions("argument", empties=_empties(items, args))
    if file is not None and file != "-":
        try:
            with open(file, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror}") from None
    else:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no items: give ITEM arguments, --file PATH, or pipe items on stdin")
        data = sys.stdin.buffer.read()
    sep = "\0" if null else "\n"
    # One decode for the whole input; surrogateescape keeps any byte exactly
    # (os.fsdecode per line does the same, a million times slower in sum).
    text = data.decode(sys.getfilesystemencoding(), "surrogateescape")
    del data
    parts = text.split(sep)
    del text
    items = [line for line in parts if line]
    where = file if file not in (None, "-") else ""
    return items, Positions("item" if null else "line", where or "", _empties(items, parts))


def _empties(items: list[str], parts: list[str]) -> list[int]:
    """Positions of the empty ``parts`` (only computed when one precedes an item)."""
    if len(items) + (parts[-1] == "") == len(parts):
        return []
    return [n for n, part in enumerate(parts) if not part]
