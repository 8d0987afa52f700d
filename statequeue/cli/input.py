"""Reading items from arguments, stdin or a file."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import BinaryIO, TypeVar

from statequeue.core.errors import InvalidItem, ItemTooLarge, QueueNotFound, UsageError
from statequeue.core.items import MAX_ITEM_BYTES, check_items

_Q = TypeVar("_Q")

_CHUNK = 1 << 22  # bytes read at a time: blank lines never pile up beyond one chunk


class Positions:
    """Where each item came from, to name a bad one by its line.

    ``source``: "argument", "line" or "item" (NUL-separated). ``where``: ""
    for arguments and stdin, else the file's name. ``gaps``: runs of skipped
    empty lines: (items before the run, its length); one pair
    per run, so 100 million blank lines cost one pair.
    """

    # A plain class, not a dataclass: every `enqueue` imports this module,
    # and a dataclass costs a compile per generated method at import.
    __slots__ = ("gaps", "source", "where")

    def __init__(
        self, source: str, where: str = "", gaps: list[tuple[int, int]] | None = None
    ) -> None:
        self.source = source
        self.where = where
        self.gaps = [] if gaps is None else gaps

    def name(self, index: int) -> str:
        """How the user finds item ``index`` (0-based) of the input."""
        number = index + 1
        for before, length in self.gaps:  # every empty one skipped before it moves it down
            if before > index:
                break
            number += length
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
    """Items from ``args`` (an empty one is refused: an unset shell variable,
    most often, which would add nothing in silence), else from ``file`` or
    stdin; empty lines are ignored
    (and never held: the input is read a chunk at a time), and a CR that ends
    a line (CRLF) is dropped, but not with ``null``. Returns them with what
    names their positions in error messages.

    Bytes that are not UTF-8 are kept losslessly (as surrogate escapes, the
    way Python decodes file names), so `find | statequeue enqueue` never
    crashes or corrupts the queue on odd file names.
    """
    if args and file is not None:
        raise UsageError("give items as arguments or with --file, not both")
    if args:
        if "" in args:
            raise UsageError(f"argument {args.index('') + 1}: empty item (an unset variable?)")
        return list(args), Positions("argument")
    where = file if file not in (None, "-") else ""
    reader = _Reader("\0" if null else "\n")
    positions = Positions("item" if null else "line", where, reader.gaps)
    try:
        if where:
            try:
                with open(where, "rb") as f:
                    reader.read_all(f)
            except OSError as exc:
                raise UsageError(f"cannot read {file}: {exc.strerror}") from None
        else:
            if sys.stdin is None or sys.stdin.isatty():
                raise UsageError(
                    "no items: give ITEM arguments, --file PATH, or pipe items on stdin"
                )
            reader.read_all(sys.stdin.buffer)
    except InvalidItem as exc:
        raise positions.locate(exc) from None
    return reader.items, positions


_BOM = b"\xef\xbb\xbf"


class _Reader:
    """Splits input into items a chunk at a time, counting empty lines in runs."""

    def __init__(self, sep: str) -> None:
        self.sep = sep
        self.items: list[str] = []
        self.gaps: list[tuple[int, int]] = []
        self.open_gap = 0  # empty lines in the run still going at the last chunk's end
        self.words = re.compile(f"[^{re.escape(sep)}]+")
        # Lines may end in CRLF (a list saved on Windows): that CR is no part
        # of the item. NUL-separated items are taken byte for byte.
        self.crlf = sep == "\n"

    def read_all(self, stream: BinaryIO) -> None:
        sep = self.sep.encode()
        carry: list[bytes] = []
        first = True
        while chunk := stream.read(_CHUNK):
            if first:
                first = False
                # A list saved by a Windows editor starts with a UTF-8 byte
                # order mark: no part of its first item (it made the item
                # fail, invisibly, and a second enqueue of it a duplicate).
                chunk = chunk.removeprefix(_BOM)
                if not chunk:
                    continue
            # Cut after the last separator: one byte that never occurs inside
            # a UTF-8 sequence, so each piece decodes exactly as the whole would.
            cut = chunk.rfind(sep) + 1
            if not cut:
                self._refuse_endless(sum(map(len, carry)), len(chunk))
                carry.append(chunk)
                continue
            self._take(b"".join([*carry, chunk[:cut]]))
            carry = [chunk[cut:]] if cut < len(chunk) else []
        if carry:
            self._take(b"".join(carry) + sep)

    def _refuse_endless(self, held: int, more: int) -> None:
        """ItemTooLarge (its index the item's) when an item of which ``held``
        bytes are read, already past the limit, goes on for ``more`` bytes
        without ending: input with no end of line (/dev/zero) is refused after
        two chunks, not held. One that ends is checked whole, as every item."""
        if held > MAX_ITEM_BYTES:
            self._close_gap()
            exc = ItemTooLarge(
                f"item of at least {held + more} bytes exceeds the {MAX_ITEM_BYTES}-byte limit"
            )
            exc.index = len(self.items)
            raise exc

    def _take(self, data: bytes) -> None:
        """Take whole lines (``data`` ends with a separator)."""
        if self.crlf:
            # Whole lines only, so no CRLF is split between two calls; the
            # last line without its LF gets one before it comes here. A line
            # of a CR alone becomes empty: skipped and counted, as any blank.
            data = data.replace(b"\r\n", b"\n")  # no copy when there is none
        # One decode per chunk; surrogateescape keeps any byte exactly (os.fsdecode
        # per line does the same, a million times slower in sum).
        text = data.decode(sys.getfilesystemencoding(), "surrogateescape")
        sep = self.sep
        if sep + sep not in text and not text.startswith(sep):
            self._close_gap()
            self.items += text.split(sep)[:-1]  # no empty line: all at C speed
            return
        # Empty lines are counted, never listed: a Python step per item only.
        end = 0
        for match in self.words.finditer(text):
            self._count_empty(text.count(sep, end, match.start()))
            self._close_gap()
            self.items.append(match.group())
            end = match.end() + 1  # past its own separator
        self._count_empty(text.count(sep, end))

    def _count_empty(self, n: int) -> None:
        self.open_gap += n

    def _close_gap(self) -> None:
        if self.open_gap:
            self.gaps.append((len(self.items), self.open_gap))
            self.open_gap = 0


def open_to_enqueue(opener: Callable[[bool], _Q], texts: list[str], where: Positions) -> _Q:
    """The queue to add ``texts`` to, opened with ``opener(create)``. A queue
    not there yet is made only once the items are known good: bad input
    changes nothing, not even by leaving an empty new queue behind (promise
    6). An existing queue pays for no extra check (``enqueue`` checks them)."""
    try:
        return opener(False)
    except QueueNotFound:
        pass
    try:
        check_items(texts)
    except InvalidItem as exc:
        raise where.locate(exc) from None
    return opener(True)
