"""Plan-then-execute (docs/paradigms.md, "plan_execute"): a planner writes the whole graph
once, from the task's type, and the graph then runs with no replanning.

The planner is a fixed rule over what the task type offers:

- a *decomposable* type (multi-hop QA, competition math, code, the household game:
  :data:`DECOMPOSABLE`) starts with a ``planner`` node whose plan is sent to the worker;
- the worker is a ``researcher`` where the search tool exists, else a ``solver``;
- a ``verifier`` checks the worker's answer and is the output, except in the interactive
  family, where the worker (which acts in the game) is the output.

Every node after the first is re-run over a ``revise`` edge from its predecessor (a chain;
``base.chain_script``). After the script only the finishing rule acts (STOP, or re-running
the output while the game runs).
"""

from __future__ import annotations

from evosteer_core.episode.actions import Action
from evosteer_core.paradigms.base import ScriptedParadigm, TaskView, chain_script

DECOMPOSABLE = frozenset({"hotpotqa", "aime", "mbpp_plus", "alfworld"})
"""Task types whose solution is a sequence of steps a plan can name (the planner's table)."""


def planned_roles(view: TaskView) -> tuple[str, ...]:
    """The planner's rule: the chain of roles for a task of this type."""
    roles: list[str] = ["planner"] if view.family in DECOMPOSABLE else []
    roles.append("researcher" if "search" in view.tools else "solver")
    if not view.interactive:
        roles.append("verifier")
    return tuple(roles)


def plan_execute_script(view: TaskView) -> tuple[Action, ...]:
    return chain_script(planned_roles(view))


PLAN_EXECUTE = ScriptedParadigm("plan_execute", plan_execute_script)
