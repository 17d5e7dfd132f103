"""The seven orchestration actions and their canonical JSON (docs/method.md §1.2, Def. 2)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

KINDS: tuple[str, ...] = (
    "ADD_AGENT",
    "ADD_EDGE",
    "BIND_SKILL",
    "SET_OUTPUT",
    "RERUN_AGENT",
    "DROP_AGENT",
    "STOP",
)
PROTOCOLS: tuple[str, ...] = ("feedback", "revise")

_REQUIRED: dict[str, tuple[str, ...]] = {
    "ADD_AGENT": ("node_id", "role_id"),
    "ADD_EDGE": ("protocol", "source_id", "target_id"),
    "BIND_SKILL": ("node_id", "skill_id"),
    "SET_OUTPUT": ("node_id",),
    "RERUN_AGENT": ("node_id",),
    "DROP_AGENT": ("node_id",),
    "STOP": (),
}
_OPTIONAL: dict[str, tuple[str, ...]] = {"ADD_AGENT": ("skill_id",)}
_FIELDS = ("node_id", "role_id", "skill_id", "source_id", "target_id", "protocol")
ACTION_JSON_MEMO = 65536
"""How many actions' canonical JSON texts :meth:`Action.to_json` keeps (least recently used
go first)."""


class ActionFormatError(ValueError):
    """An action text or object that is not a well-formed action (names what is wrong)."""


@dataclass(frozen=True, order=True)
class Action:
    """One orchestration action; only the fields of its kind are set."""

    kind: str
    node_id: str | None = None
    role_id: str | None = None
    skill_id: str | None = None
    source_id: str | None = None
    target_id: str | None = None
    protocol: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ActionFormatError(f"unknown action kind {self.kind!r}; expected one of {KINDS}")
        allowed = set(_REQUIRED[self.kind]) | set(_OPTIONAL.get(self.kind, ()))
        for name in _FIELDS:
            value = getattr(self, name)
            if name in _REQUIRED[self.kind] and not value:
                raise ActionFormatError(f"{self.kind} requires field {name!r}")
            if value is not None and name not in allowed:
                raise ActionFormatError(f"{self.kind} does not take field {name!r}")
            if value is not None and not isinstance(value, str):
                raise ActionFormatError(f"{self.kind}.{name} must be a string, got {value!r}")
        if self.protocol is not None and self.protocol not in PROTOCOLS:
            raise ActionFormatError(f"unknown protocol {self.protocol!r}; expected {PROTOCOLS}")

    def to_dict(self) -> dict[str, str]:
        out = {"kind": self.kind}
        for name in _FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, compact separators, no ASCII escaping."""
        return _action_json(self)

    @classmethod
    def from_json(cls, text: str) -> Action:
        """Parse canonical (or any) action JSON; errors name the offending field."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ActionFormatError(f"action is not JSON: {text!r} ({exc})") from exc
        if not isinstance(data, dict) or "kind" not in data:
            raise ActionFormatError(f"action must be a JSON object with 'kind': {text!r}")
        unknown = set(data) - {"kind", *_FIELDS}
        if unknown:
            raise ActionFormatError(f"action has unknown fields {sorted(unknown)}: {text!r}")
        return cls(**data)


@lru_cache(maxsize=ACTION_JSON_MEMO)
def _action_json(action: Action) -> str:
    """An action's canonical JSON, memoized by its value: a rollout writes every legal action
    of every decision twice (the legal list's sort key and the prompt's legal list), and the
    same actions recur from decision to decision."""
    return canonical_json(action.to_dict())


def canonical_json(obj: object) -> str:
    """JSON with sorted keys, separators ``,``/``:`` and non-ASCII kept (docs/method.md §1.2)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
