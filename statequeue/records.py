"""The journal's record format: one JSON object per line, checksummed.

A record is the orjson encoding of a dict with a ``seq`` field, with a CRC32
of those bytes appended as a last ``crc`` field::

    {"seq":7,"t":"enq","id":3,"item":"a.pdf","crc":"1c291ca3"}

The line stays valid JSON (so ``jq`` reads the journal), and the checksum
covers exactly the bytes before it, so checking it costs no re-encoding.
"""

from __future__ import annotations

import base64
import os
import zlib
from typing import Any

import orjson

from statequeue.errors import InvalidResult

_CRC_PREFIX = b',"crc":"'
_SUFFIX_LEN = len(_CRC_PREFIX) + 8 + 2  # ,"crc":"xxxxxxxx"}
_crc32 = zlib.crc32
_loads = orjson.loads

Record = dict[str, Any]


def encode(record: Record) -> bytes:
    """Encode one record (which must hold ``seq``) as a checksummed line."""
    raw = orjson.dumps(record)
    return b'%s%s%08x"}\n' % (raw[:-1], _CRC_PREFIX, zlib.crc32(raw))


def encode_enqueued(
    first_id: int, first_seq: int, texts: list[str]
) -> tuple[bytes, list[int]] | None:
    """The ``enq`` lines for ``texts`` (ids and seqs counting up from the firsts),
    byte for byte what ``encode`` makes of ``{"t": "enq", "id", "item", "seq"}``,
    built without a dict per item, joined, with each line's length. None if a
    text is not valid UTF-8 (then the caller falls back to ``encode``, which
    stores it as ``itemx``)."""
    if not texts:
        return b"", []
    try:
        joined = orjson.dumps(texts)
    except orjson.JSONEncodeError:
        return None
    # Inside a JSON string a quote is always escaped, so '","' only ever
    # separates elements: one encode call, split into each text's JSON body.
    bodies = joined[2:-2].split(b'","')
    n = len(texts)
    if len(bodies) != n:
        return None
    # Two formatting passes over the whole batch instead of two per item: the
    # records without their checksum (JSON never holds a raw newline, so they
    # split back apart), then each with its crc field.
    args: list[object] = [None] * (3 * n)
    args[0::3] = range(first_id, first_id + n)
    args[1::3] = bodies
    args[2::3] = range(first_seq, first_seq + n)
    raws = ((b'{"t":"enq","id":%d,"item":"%s","seq":%d\n' * n) % tuple(args)).split(b"\n")
    raws.pop()
    crc32 = zlib.crc32
    parts: list[object] = [None] * (2 * n)
    parts[0::2] = raws
    parts[1::2] = [crc32(b"}", crc32(raw)) for raw in raws]
    data = (b'%s,"crc":"%08x"}\n' * n) % tuple(parts)
    return data, [len(raw) + _SUFFIX_LEN + 1 for raw in raws]


def decode(line: bytes) -> Record | None:
    """Decode one line (without its newline). Returns None unless it is intact."""
    if len(line) <= _SUFFIX_LEN or line[-_SUFFIX_LEN:-10] != _CRC_PREFIX or line[-2:] != b'"}':
        return None
    # crc32 of the bytes before the crc field plus a closing brace (crc32
    # continues from a previous value), formatted as the writer did: this also
    # refuses digits in any other form (upper case, signs, spaces).
    if b"%08x" % _crc32(b"}", _crc32(line[:-_SUFFIX_LEN])) != line[-10:-2]:
        return None
    try:
        record = _loads(line)
    except orjson.JSONDecodeError:
        return None
    if type(record) is not dict or type(record.get("seq")) is not int:
        return None
    del record["crc"]
    return record


def item_fields(item: str) -> Record:
    """The JSON fields that store ``item``.

    Text that is valid UTF-8 is stored as ``item``. Anything else (file names
    read from stdin may hold arbitrary bytes; they arrive here as surrogate
    escapes) is stored losslessly as base64 in ``itemx``.
    """
    if item.isascii():
        return {"item": item}
    try:
        item.encode("utf-8")
    except UnicodeEncodeError:
        return {"itemx": base64.b64encode(os.fsencode(item)).decode("ascii")}
    return {"item": item}


def item_text(record: Record) -> str:
    """The item stored in ``record`` by ``item_fields``."""
    text = record.get("item")
    if isinstance(text, str):
        return text
    return os.fsdecode(base64.b64decode(record["itemx"]))


def check_json(value: Any, what: str = "result") -> None:
    """InvalidResult, naming the problem, unless ``value`` can go in a record
    (orjson refuses sets, non-str keys, lone surrogates, nesting past 254)."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError as exc:
        raise InvalidResult(f"{what} cannot be stored as JSON: {exc}") from None
