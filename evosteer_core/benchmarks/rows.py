"""JSONL rows with typed field access whose errors name the file, line, field and expectation.

Benchmark loaders read public files whose shape they do not control; every access goes
through :class:`Row` so that a bad row fails with ``path:line: field 'x': expected ...``
instead of a KeyError deep inside a converter. Nothing is skipped silently.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from evosteer_core.infra.configio import InputError


class BenchmarkDataError(InputError):
    """A benchmark file or row does not have the documented shape (``path:line: ...``)."""


class RowError(ValueError):
    """A field of one row is missing or malformed (the loader adds file and line)."""

    def __init__(self, field: str, expected: str, got: object = None, *, missing: bool = False):
        self.field = field
        shown = "missing" if missing else f"got {_preview(got)}"
        super().__init__(f"field {field!r}: expected {expected}; {shown}")


_INTEGER = re.compile(r"-?[0-9]+")


def _preview(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Row:
    """One parsed JSON object from a benchmark file, with checked accessors."""

    def __init__(self, data: dict[str, Any], path: Path, line: int, prefix: str = ""):
        self.data = data
        self.path = path
        self.line = line
        self.prefix = prefix

    def error(self, key: str, expected: str, got: object = None, missing: bool = False) -> RowError:
        """A :class:`RowError` for ``key`` of this row (for converters' own checks)."""
        return RowError(self.prefix + key, expected, got, missing=missing)

    def nested(self, key: str) -> Row:
        """The object under ``key`` as a row whose errors name ``key.field``."""
        return Row(self.mapping(key), self.path, self.line, f"{self.prefix}{key}.")

    def has(self, key: str) -> bool:
        """True when ``key`` is present and not null."""
        return self.data.get(key) is not None

    def first_key(self, *keys: str) -> str:
        """The first of ``keys`` present in the row (public exports differ in capitalization)."""
        for key in keys:
            if self.has(key):
                return key
        expected = "a value" if len(keys) == 1 else "one of these fields"
        raise self.error(" | ".join(keys), expected, missing=True)

    def raw(self, key: str) -> Any:
        if not self.has(key):
            raise self.error(key, "a value", missing=True)
        return self.data[key]

    def text(self, *keys: str, allow_empty: bool = False) -> str:
        """A string field (the first present of ``keys``); non-empty unless ``allow_empty``."""
        key = self.first_key(*keys)
        value = self.data[key]
        if not isinstance(value, str):
            raise self.error(key, "a string", value)
        if not allow_empty and not value.strip():
            raise self.error(key, "a non-empty string", value)
        return value

    def optional_text(self, key: str) -> str:
        """A string field that may be absent (then ``""``)."""
        return self.text(key, allow_empty=True) if self.has(key) else ""

    def text_list(self, key: str, *, allow_empty: bool = False) -> list[str]:
        """A list of non-empty strings; a JSON-encoded list in a string is accepted too."""
        value = self.raw(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise self.error(key, "a list of strings (or its JSON text)", value) from exc
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.error(key, "a list of non-empty strings", value)
        if not value and not allow_empty:
            raise self.error(key, "a non-empty list of strings", value)
        return value

    def mapping(self, key: str) -> dict[str, Any]:
        value = self.raw(key)
        if not isinstance(value, dict):
            raise self.error(key, "an object", value)
        return value

    def integer_text(self, *keys: str) -> str:
        """An integer field (int or digit string, leading zeros allowed) as canonical text."""
        key = self.first_key(*keys)
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise self.error(key, "an integer or a string of digits", value)
        text = str(value).strip()
        if not _INTEGER.fullmatch(text):
            raise self.error(key, "an integer or a string of digits", value)
        return str(int(text))

    def record_id(self, *keys: str) -> str:
        """The row's own id from the first present of ``keys``, else ``line<N>``."""
        for key in keys:
            if self.has(key):
                value = self.data[key]
                if isinstance(value, bool) or not isinstance(value, str | int):
                    raise self.error(key, "a string or integer id", value)
                return str(value)
        return f"line{self.line}"

    def extras(self, *keys: str) -> dict[str, Any]:
        """The present ones of ``keys`` copied as JSON-able metadata."""
        return {key: self.data[key] for key in keys if self.has(key)}


def read_jsonl(path: str | Path) -> Iterator[Row]:
    """Yield the rows of a UTF-8 JSONL file (``.gz`` allowed); blank lines are skipped.

    Every failure raises :class:`BenchmarkDataError` naming the file and the line: a line that
    is not UTF-8 or not a JSON object, a compressed stream that is corrupt or cut short, a file
    that cannot be read.
    """
    path = Path(path)
    if not path.is_file():
        raise BenchmarkDataError(f"{path}: benchmark file not found")
    number = 0
    try:
        with _open_binary(path) as handle:
            for number, raw in enumerate(handle, start=1):
                row = _parse_line(path, number, raw)
                if row is not None:
                    yield row
    except (OSError, EOFError, zlib.error) as exc:
        what = "corrupt or truncated gzip data" if path.suffix == ".gz" else "cannot read the file"
        raise BenchmarkDataError(f"{path}:{number + 1}: {what} ({exc})") from None


def _open_binary(path: Path) -> IO[bytes]:
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _parse_line(path: Path, number: int, raw: bytes) -> Row | None:
    """One line as a :class:`Row` (None when blank); errors name ``path:number``."""
    try:
        line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise BenchmarkDataError(
            f"{path}:{number}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
            f"{exc.start + 1}); benchmark files must be UTF-8 JSONL"
        ) from None
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BenchmarkDataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # an over-long integer, too deep nesting
        raise BenchmarkDataError(f"{path}:{number}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise BenchmarkDataError(
            f"{path}:{number}: expected a JSON object, got {type(data).__name__}"
        )
    return Row(data, path, number)
