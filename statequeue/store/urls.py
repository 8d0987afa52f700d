"""Telling a store URL apart, and keeping its password out of messages.

Free of psycopg on purpose: the CLI and ``Queue`` decide which store to open
(and mask what they print) without importing the PostgreSQL driver.
"""

from __future__ import annotations

import re

ENV_STORE = "STATEQUEUE_STORE"

_URL_PASSWORD = re.compile(r"(?P<keep>://[^/@:?#]*:)[^@/?#]*@")
_PARAM_PASSWORD = re.compile(r"(?P<keep>[?&]password=)[^&#]*", re.IGNORECASE)
_CONNINFO_PASSWORD = re.compile(
    r"(?P<keep>\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE
)


def is_store_url(spec: str) -> bool:
    """True when ``spec`` names a PostgreSQL store (a URL or a libpq conninfo)."""
    return spec.startswith(("postgresql://", "postgres://")) or "=" in spec


def mask(text: str, password: str = "") -> str:
    """``text`` with any password (URL, query or conninfo form, or ``password``
    itself wherever it appears) shown as ***."""
    text = _URL_PASSWORD.sub(r"\g<keep>***@", text)
    text = _PARAM_PASSWORD.sub(r"\g<keep>***", text)
    text = _CONNINFO_PASSWORD.sub(r"\g<keep>***", text)
    return text.replace(password, "***") if password else text
