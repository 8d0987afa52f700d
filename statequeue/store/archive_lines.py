"""Compaction's fast path: the ``arch`` record of an item done at its first
try, spliced from the bytes of its ``enq`` and ``end`` lines.

Nearly every line compaction reads is one of those two, in the exact layout
this package's encoder writes. Decoding both into dicts and encoding the
``arch`` record again cost ~12 us per item; matching them in C and splicing
the JSON fields as they are costs a few. A line in any other layout (an item
stored as ``itemx``, an ``end`` that is not done, an older writer's key
order) is left to the general path, which decodes it.

The ``arch`` record keeps the ``end`` record's fields but ``t``, ``id``,
``state``, ``ok`` and ``seq``, in the ``end`` record's key order; readers go
by key, as for any record.
"""

from __future__ import annotations

import re
import zlib

import orjson

ENQ_PREFIX = b'{"t":"enq",'
END_PREFIX = b'{"t":"end",'
# A JSON string's body: no raw quote or backslash but escaped ones.
_ENQ = re.compile(
    rb'\{"t":"enq","id":(\d+),"item":"((?:[^"\\]|\\.)*)","seq":\d+,"crc":"[0-9a-f]{8}"\}'
)
# ``seq`` and ``crc`` end every record, so the greedy middle stops before them.
_END_DONE = re.compile(
    rb'\{"t":"end","id":(\d+),("attempt":\d+),"state":"done","ok":true,(.+),"seq":\d+,"crc":"[0-9a-f]{8}"\}'
)
_crc32 = zlib.crc32
_SUFFIX = len(b',"crc":"') + 8 + 2  # the checksum field and the closing brace


def _intact(line: bytes) -> bool:
    """The line's checksum holds (its layout was matched already)."""
    return b"%08x" % _crc32(b"}", _crc32(line[:-_SUFFIX])) == line[-10:-2]


def enqueued(line: bytes) -> tuple[int, bytes] | None:
    """(id, the item's JSON string body) of an intact ``enq`` line in the
    usual layout, else None."""
    found = _ENQ.fullmatch(line)
    if found is None or not _intact(line):
        return None
    return int(found[1]), found[2]


def done_at_once(line: bytes) -> tuple[int, bytes] | None:
    """(id, its result's JSON fields) of an intact ``end`` line that made an
    item done, in the usual layout, else None."""
    found = _END_DONE.fullmatch(line)
    if found is None or not _intact(line):
        return None
    return int(found[1]), found[2] + b"," + found[3]


def arch_line(item_id: int, body: bytes, fields: bytes, seq: int) -> bytes:
    """The encoded ``arch`` record of item ``item_id`` (JSON string body
    ``body``) with the result ``fields``, numbered ``seq``."""
    raw = b'{"t":"arch","id":%d,"item":"%s",%s,"seq":%d' % (item_id, body, fields, seq)
    return b'%s,"crc":"%08x"}\n' % (raw, _crc32(b"}", _crc32(raw)))


def text_of(body: bytes) -> str:
    """The item text a JSON string body holds."""
    if b"\\" not in body:
        return body.decode("utf-8")
    text = orjson.loads(b'"%s"' % body)
    assert isinstance(text, str)
    return text
