"""Item validation: what may be queued. Below the stores, so that every store
and the Queue API check items the same way."""

from __future__ import annotations

import os
from collections.abc import Iterable

from statequeue.core.errors import InvalidItem, ItemTooLarge

MAX_ITEM_BYTES = 65536
"""The largest item, in bytes once encoded (Linux limits one argv element to 128 KiB)."""


def check_item(item: str) -> str:
    """Return ``item`` if it can be queued, else raise InvalidItem (a UsageError)."""
    if not isinstance(item, str):
        raise InvalidItem(f"an item must be a str, not {type(item).__name__}")
    if not item:
        raise InvalidItem("empty item")
    if "\0" in item:
        raise InvalidItem("item contains a NUL byte, which no command argument can hold")
    if not item.isascii():
        _check_bytes(item)
    if len(item) <= MAX_ITEM_BYTES // 4:  # 4 bytes per character at most: surely fits
        return item
    size = len(os.fsencode(item))
    if size > MAX_ITEM_BYTES:
        raise ItemTooLarge(f"item of {size} bytes exceeds the {MAX_ITEM_BYTES}-byte limit")
    return item


def _check_bytes(text: str) -> None:
    """InvalidItem if ``text`` holds a surrogate that stands for no byte (only
    the API can pass one: decoding with surrogateescape never makes it)."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError as exc:
        code = ord(text[exc.start])
        raise InvalidItem(
            f"item holds a lone surrogate (U+{code:04X}) that stands for no byte"
        ) from None


def check_items(items: Iterable[str]) -> list[str]:
    """``check_item`` for each of ``items``, with the common case (short texts,
    no NUL, none empty, every one encodable) decided by C-level passes over the
    whole list. A bad item's InvalidItem has its position in ``index``."""
    checked = list(items)
    try:
        short = max(map(len, checked), default=0) <= MAX_ITEM_BYTES // 4
        joined = "".join(checked)
        if short and all(checked) and "\0" not in joined and _encodable(joined):
            return checked
    except TypeError:
        pass  # not all str: found and named below
    for index, item in enumerate(checked):
        try:
            check_item(item)
        except InvalidItem as exc:
            exc.index = index
            raise
    return checked


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True
