"""Durations as users type them: ``90``, ``1.5s``, ``500ms``, ``2m``, ``1h30m``, ``1d``."""

from __future__ import annotations

import re

from statequeue.core.errors import InvalidDuration

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
MAX_DURATION = 3650 * 86400.0
"""The longest duration any option takes, ten years (every duration option:
`run --timeout`, `--grace`, `--max-time`, ...): a longer one is a typo
(`99999999999d`), and far longer ones overflowed the time_t and poll()
timeouts they reach. Days-long timeouts for long crawls stay well inside."""
MAX_DURATION_TEXT = "3650d (ten years)"


def parse_duration(text: str, *, limit: float | None = MAX_DURATION) -> float:
    """Seconds in ``text``; a bare number is seconds. Raises InvalidDuration,
    also past ``limit`` (None: no bound, for a look-back window such as
    `stats --since`, where a span longer than the history means all of it)."""
    raw = text.strip().lower()
    try:
        value = float(raw)
    except ValueError:
        value = _parse_units(raw, text)
    if value < 0:
        raise InvalidDuration(f"invalid duration {text!r}: must not be negative")
    if not value < float("inf"):  # inf, or nan (which compares false with everything)
        raise InvalidDuration(f"invalid duration {text!r}: must be a finite number of seconds")
    if limit is not None and value > limit:
        raise InvalidDuration(f"invalid duration {text!r}: must be at most {MAX_DURATION_TEXT}")
    return value


def _parse_units(raw: str, text: str) -> float:
    pos = 0
    total = 0.0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(raw):
        raise InvalidDuration(
            f"invalid duration {text!r}: use seconds or units like 500ms, 30s, 5m, 1h30m, 2d"
        )
    return total


def format_duration(seconds: float) -> str:
    """A short human form: ``850ms``, ``12.3s``, ``4m05s``, ``2h03m``."""
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def format_setting(seconds: float) -> str:
    """A duration as a user would type it: ``2s``, ``1.5s``, ``500ms``, ``10m``, ``1h30m``."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:.3g}ms"
    if seconds < 60 or seconds % 60:
        return f"{seconds:.3f}".rstrip("0").rstrip(".") + "s"
    minutes = int(seconds // 60)
    if minutes < 60 or (minutes % 60 and minutes < 600):
        hours, rest = divmod(minutes, 60)
        return f"{hours}h{rest}m" if hours else f"{minutes}m"
    return f"{minutes / 60:.3f}".rstrip("0").rstrip(".") + "h"
