"""Role catalogue and per-family tool availability, loaded from configuration (docs/method.md §1.1)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from evosteer_core.episode.records import FAMILIES

ANSWER_FORMS: tuple[str, ...] = ("explicit", "bare", "none")
"""How a role states an answer; see ``RoleSpec.answer_form`` and docs/runtime.md."""


@dataclass(frozen=True)
class RoleSpec:
    """One role: its prompt instruction, tools, and per-call limits.

    ``tools`` lists the tools the role may call; the tools a node actually gets are
    ``tools ∩ family.tools``. ``output_ok`` is False for roles (planner) that may be the output
    only when no other node can be. ``needs_tools`` roles are offered only in families with tools.
    ``answer_form`` is how the role states an answer (``answers.stated_answer``, the one rule
    of both executors): ``explicit`` (boxed, cue, code block in code tasks), ``bare`` (those,
    else the last line of a complete reply) or ``none`` (never: the planner).
    """

    role_id: str
    instruction: str
    tools: tuple[str, ...] = ()
    output_ok: bool = True
    needs_tools: bool = False
    answer_form: str = "explicit"
    max_model_calls: int = 1
    max_tool_calls: int = 0
    max_input_tokens: int = 20480
    max_output_tokens: int = 12288

    def __post_init__(self) -> None:
        if self.answer_form not in ANSWER_FORMS:
            raise ValueError(
                f"role {self.role_id!r}: answer_form must be one of {ANSWER_FORMS}, "
                f"got {self.answer_form!r}"
            )


@dataclass(frozen=True)
class FamilySpec:
    """One family: which tools exist there and whether it has an environment."""

    family: str
    tools: tuple[str, ...]
    interactive: bool = False


@dataclass(frozen=True)
class Catalogue:
    """Roles plus families; ``roles_for(family)`` gives the roles offered there, in order."""

    roles: tuple[RoleSpec, ...]
    families: tuple[FamilySpec, ...]

    def role(self, role_id: str) -> RoleSpec:
        for r in self.roles:
            if r.role_id == role_id:
                return r
        raise KeyError(f"unknown role {role_id!r}; known: {[r.role_id for r in self.roles]}")

    def family(self, family: str) -> FamilySpec:
        for f in self.families:
            if f.family == family:
                return f
        raise KeyError(f"unknown family {family!r}; known: {[f.family for f in self.families]}")

    def roles_for(self, family: str) -> tuple[RoleSpec, ...]:
        fam = self.family(family)
        return tuple(r for r in self.roles if not r.needs_tools or fam.tools)

    def tools_for(self, role_id: str, family: str) -> tuple[str, ...]:
        fam = self.family(family)
        return tuple(t for t in self.role(role_id).tools if t in fam.tools)


def catalogue_from_dict(data: dict[str, Any], where: str = "catalogue") -> Catalogue:
    """Build a catalogue from ``{"roles": [...], "families": [...]}``; errors name the bad key."""
    try:
        roles = tuple(RoleSpec(**{**r, "tools": tuple(r.get("tools", ()))}) for r in data["roles"])
        fams = tuple(
            FamilySpec(**{**f, "tools": tuple(f.get("tools", ()))}) for f in data["families"]
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{where}: malformed role catalogue: {exc}") from exc
    missing = set(FAMILIES) - {f.family for f in fams}
    if missing:
        raise ValueError(f"{where}: families missing from catalogue: {sorted(missing)}")
    return Catalogue(roles=roles, families=fams)


@lru_cache(maxsize=1)
def default_catalogue() -> Catalogue:
    """The reference catalogue shipped as ``evosteer_core/data/roles.yaml``, parsed once a
    process (it is frozen; every stage task's world asks for it)."""
    text = resources.files("evosteer_core.data").joinpath("roles.yaml").read_text()
    return catalogue_from_dict(yaml.safe_load(text), where="evosteer_core/data/roles.yaml")
