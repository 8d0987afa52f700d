"""Item texts made safe to show: for JSON readers and for terminals.

Items are held as ``str`` with surrogate escapes for bytes that are not
UTF-8 (``find | statequeue enqueue`` meets such file names). JSON cannot hold
those, and a terminal must never receive an item's control characters raw (an
item could clear the screen or fake extra ``list`` lines). Every view uses
these two functions, so an item looks the same wherever it is shown.
"""

from __future__ import annotations

import base64
import os
from typing import Any

# Characters that move the cursor, reorder text or break a line without being
# C0/C1 controls: bidirectional overrides and isolates, line/paragraph separators.
_INVISIBLE = frozenset(
    "\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_NAMED = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a", "\b": "\\b"}
_NAMED |= {"\f": "\\f", "\v": "\\v"}


def item_json(item: str) -> dict[str, str]:
    """The JSON fields for ``item``: ``{"item": text}`` when it is valid UTF-8,
    else the text with U+FFFD for each undecodable byte plus ``item_b64``,
    the exact bytes in base64 (present only when the two differ)."""
    if item.isascii():
        return {"item": item}
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        raw = exact_bytes(item)
        replaced = raw.decode("utf-8", "replace")
        return {"item": replaced, "item_b64": base64.b64encode(raw).decode("ascii")}
    return {"item": item}


def json_text(text: str) -> str:
    """``text`` as JSON (and so a journal record or a jsonb column) can hold
    it: each byte that is not UTF-8 as U+FFFD, as ``item_json``'s ``item``.
    For texts kept to be shown, not run: a command line's arguments."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return exact_bytes(text).decode("utf-8", "replace")
    return text


def exact_bytes(text: str) -> bytes:
    """The bytes ``text`` stands for (surrogate escapes back to their bytes).

    A lone surrogate that no byte decodes to (only the API can pass one) is
    kept as its UTF-8 form rather than failing a display."""
    try:
        return os.fsencode(text)
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def escaped(text: str) -> str:
    """``text`` as a terminal may show it, in the style of GNU ``ls
    --quoting-style=escape``: undecodable bytes as ``\\xff``, control
    characters as ``\\n``, ``\\t``, ``\\x1b``..., a backslash as ``\\\\``."""
    if text.isprintable() and "\\" not in text:
        return text  # the common case, decided in C
    return "".join(map(_escape_char, text))


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    if 0xDC80 <= code <= 0xDCFF:  # a surrogate escape: the byte it stands for
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0x80 <= code < 0xA0 or 0xD800 <= code <= 0xDFFF or ch in _INVISIBLE:
        return f"\\u{code:04x}"
    return ch


def shown(text: str, width: int = 80) -> str:
    """``escaped(text)`` cut to ``width`` characters (with an ellipsis)."""
    return cut(escaped(text), width)


def cut(text: str, width: int) -> str:
    """``text`` (safe to show already) cut to ``width`` characters, the last
    one an ellipsis when some were left out."""
    return text if len(text) <= width else text[: width - 1] + "…"


def record_json(record: dict[str, Any]) -> dict[str, Any]:
    """A journal record as JSON views show it: an item stored as base64
    (``itemx``) is given as ``item`` plus ``item_b64``, like every other view."""
    if "itemx" not in record:
        return record
    out = {k: v for k, v in record.items() if k != "itemx"}
    out.update(item_json(os.fsdecode(base64.b64decode(record["itemx"]))))
    return out
