"""The paradigms by name (docs/paradigms.md): ``paradigm(name, searched)``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evosteer_core.paradigms.base import Paradigm
from evosteer_core.paradigms.direct import DIRECT
from evosteer_core.paradigms.plan_execute import PLAN_EXECUTE
from evosteer_core.paradigms.random_legal import RANDOM
from evosteer_core.paradigms.react import REACT
from evosteer_core.paradigms.searched import searched_paradigm
from evosteer_core.paradigms.template import TEMPLATE

FIXED: dict[str, Paradigm] = {p.name: p for p in (DIRECT, REACT, TEMPLATE, PLAN_EXECUTE, RANDOM)}
"""Paradigms that need nothing but the task."""

NAMES: tuple[str, ...] = ("react", "template", "plan_execute", "searched", "random", "direct")
"""Every paradigm name (``searched`` needs the artifact of an offline search)."""


def paradigm(name: str, searched: Mapping[str, Any] | None = None) -> Paradigm:
    """The paradigm ``name``; ``searched`` is the search result ``searched`` runs."""
    if name == "searched":
        if searched is None:
            raise ValueError("paradigm 'searched' needs the result of search_workflows")
        return searched_paradigm(searched)
    if name not in FIXED:
        raise ValueError(f"unknown paradigm {name!r}; known: {', '.join(NAMES)}")
    return FIXED[name]
