"""Credentials out of URLs before anything is logged or stored.

A URL may carry a secret in its userinfo (``http://user:secret@host``) or in a query parameter
(``?token=…``). :func:`redact_url` replaces both with ``REDACTED``; :func:`redact_urls` does
it to every URL string inside a config's plain data. Connections keep using the real URLs;
what goes to MLflow, the run index and printed lines is redacted (docs/reliability.md,
"Credentials in URLs").
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "REDACTED"
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_QUERY_IN_TEXT = re.compile(r"(\?)([^\s'\"<>#]+)")
_SECRET_PARAM = re.compile(
    r"token|key|secret|passw|pwd|auth|credential|signature|session", re.IGNORECASE
)


def _redact_query(query: str) -> str:
    """The query with the value of every parameter named like a secret replaced."""
    parts = []
    for part in query.split("&"):
        name, eq, _ = part.partition("=")
        parts.append(f"{name}={REDACTED}" if eq and _SECRET_PARAM.search(name) else part)
    return "&".join(parts)


def redact_url(url: str) -> str:
    """``url`` without credentials: its userinfo and the values of query parameters named like
    a token, key, secret or password become ``REDACTED``; anything else (and any string
    that is not a ``scheme://`` URL) is kept byte for byte."""
    if not _URL.match(url):
        return url
    scheme, _, rest = url.partition("://")
    cut = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    if "@" in authority:
        authority = f"{REDACTED}@{authority.rpartition('@')[2]}"
    tail, hash_, fragment = tail.partition("#")
    path, question, query = tail.partition("?")
    if question:
        query = _redact_query(query)
    return f"{scheme}://{authority}{path}{question}{query}{hash_}{fragment}"


def redact_text(text: str) -> str:
    """``text`` (an error message) with :func:`redact_url` applied to each URL in it and the
    values of secret-named query parameters redacted where a bare ``path?query`` appears
    (as in urllib3's ``Max retries exceeded with url: /v1?key=…``)."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group()), text)
    return _QUERY_IN_TEXT.sub(lambda m: m.group(1) + _redact_query(m.group(2)), text)


def redact_urls(data: Any) -> Any:
    """A copy of plain data (dicts, lists, tuples, scalars) with :func:`redact_url` applied to
    every string."""
    if isinstance(data, str):
        return redact_url(data)
    if isinstance(data, dict):
        return {k: redact_urls(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return type(data)(redact_urls(v) for v in data)
    return data
