"""Typed loading of nested frozen dataclasses from YAML dicts, with errors that name the key.

``build(cls, data, source)`` walks ``cls``'s type hints and converts ``data`` (what
``yaml.safe_load`` returns) into an instance. Supported annotations: ``int``, ``float``,
``str``, ``bool``, ``Any``, ``Literal[...]``, ``X | None`` (and other unions), ``tuple[X, ...]``,
``tuple[X, Y]``, ``list[X]``, ``dict[str, X]`` and nested dataclasses. Every error is a
:class:`ConfigError` whose message reads ``<file>: <dotted.key>: expected ..., found ...``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

T = TypeVar("T")


class InputError(ValueError):
    """Invalid input from the user, a config value or a data file; the message names where
    (``file: key: problem`` or ``file:line: field: problem``). The CLI prints it as one line."""


class ConfigError(InputError):
    """A config value or key is invalid; the message names the file and the dotted key path."""

    def __init__(self, source: str, path: str, message: str) -> None:
        self.source = source
        self.path = path or "<root>"
        self.problem = message
        super().__init__(f"{source}: {self.path}: {message}")


_FLOAT = re.compile(
    r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+"
    r"|\.[0-9_]+(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
"""YAML 1.1 floats plus ``1e-3`` / ``5e-6`` (YAML 1.1 requires a dot)."""


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-3`` / ``5e-6`` as floats."""


class _FastLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The same loader on libyaml's parser where PyYAML has it (~4x faster: every task parses
    the run's config); its syntax errors say less, so they are reported by :class:`_Loader`."""


for _loader in (_Loader, _FastLoader):
    _loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML text (floats in exponent form included); syntax errors become ConfigError."""
    try:
        try:
            return yaml.load(text, Loader=_FastLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError:
            return yaml.load(text, Loader=_Loader)  # noqa: S506 - the error with its context
    except yaml.YAMLError as exc:
        raise ConfigError(source, "", f"invalid YAML: {exc}") from exc
    except RecursionError:
        raise ConfigError(source, "", "invalid YAML: nested too deeply") from None


def read_yaml(path: str | Path) -> Any:
    """Read and parse a YAML file; the error names the file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(p), "", f"cannot read config file: {exc}") from exc
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"{p}:{line}", "", f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})"
        ) from None
    return parse_yaml(text, str(p))


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _describe(tp: Any) -> str:
    """A short human name for an annotation (``int``, ``tuple[float, ...]``, ``'a' | 'b'``)."""
    origin = typing.get_origin(tp)
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return f"a mapping ({tp.__name__})"
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_describe(a) for a in typing.get_args(tp))
    if origin is not None:
        args = ", ".join("..." if a is Ellipsis else _describe(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{args}]"
    return getattr(tp, "__name__", repr(tp))


def _found(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _convert(tp: Any, value: Any, path: str, source: str) -> Any:
    """Convert ``value`` to annotation ``tp`` or raise ConfigError naming ``path``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    def fail() -> ConfigError:
        return ConfigError(source, path, f"expected {_describe(tp)}, found {_found(value)}")

    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, source, path)
    if origin is Literal:
        if any(type(value) is type(a) and value == a for a in args):
            return value
        raise fail()
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        candidates = [a for a in args if a is not type(None)]
        for cand in candidates:
            try:
                return _convert(cand, value, path, source)
            except ConfigError as exc:
                if len(candidates) == 1 and (exc.path != path or dataclasses.is_dataclass(cand)):
                    raise  # the error lies deeper, or is an optional section's own check
        raise fail()
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise fail()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise fail()
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:
                raise ConfigError(source, path, "expected a float, found a larger int") from None
            if math.isfinite(number):
                return number
            raise ConfigError(source, path, f"expected a finite float, found {value!r}")
        raise fail()
    if tp is str:
        if isinstance(value, str):
            return value
        raise fail()
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise fail()
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], v, f"{path}[{i}]", source) for i, v in enumerate(value))
        if len(value) != len(args):
            raise ConfigError(
                source,
                path,
                f"expected {_describe(tp)} ({len(args)} items), found {len(value)} items {value!r}",
            )
        return tuple(
            _convert(a, v, f"{path}[{i}]", source)
            for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if origin is list:
        if not isinstance(value, list | tuple):
            raise fail()
        return [_convert(args[0], v, f"{path}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise fail()
        key_tp, val_tp = args
        return {
            _convert(key_tp, k, _join(path, k), source): _convert(val_tp, v, _join(path, k), source)
            for k, v in value.items()
        }
    raise ConfigError(source, path, f"unsupported annotation {tp!r} in the config schema")


def build(cls: type[T], data: Any, source: str = "<config>", path: str = "") -> T:
    """Build dataclass ``cls`` from mapping ``data``; unknown, missing or mistyped keys raise."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            source, path, f"expected a mapping ({cls.__name__}), found {_found(data)}"
        )
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(sorted(fields))
            raise ConfigError(source, _join(path, key), f"unknown key (known keys: {known}){hint}")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], _join(path, name), source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(
                source, _join(path, name), f"missing required value ({_describe(hints[name])})"
            )
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        # a check's "field: problem" message is located at that field's key
        name, sep, problem = str(exc).partition(": ")
        if sep and name in fields:
            raise ConfigError(source, _join(path, name), problem) from exc
        raise ConfigError(source, path, str(exc)) from exc


def to_plain(obj: Any) -> Any:
    """Dataclasses, tuples and mappings as plain JSON-able dicts and lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_plain(v) for v in obj]
    return obj


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one level of dotted keys (lists kept as values)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = _join(prefix, key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``dotted = "a.b.c"``, creating mappings as needed."""
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError("<override>", dotted, f"{part!r} is not a section")
        node = child
    node[last] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.steps=5"`` -> ``("train.steps", 5)``; the value is parsed as a YAML scalar."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError("<override>", text, "expected KEY=VALUE (e.g. train.steps=5)")
    return key.strip(), parse_yaml(raw, "<override>")
