"""One hand-designed multi-agent template for every task (docs/paradigms.md, "template").

Solve, check, aggregate: a solver answers (n0); a verifier checks that answer over a
``revise`` edge (n1: with python it runs executable checks, otherwise it judges); a
finalizer (n2) reads both, over a ``feedback`` edge from the solver and a ``revise`` edge
from the verifier, and gives the final answer; the finalizer is the output. The same graph
for every family and task; nothing observed changes it.
"""

from __future__ import annotations

from evosteer_core.episode.actions import Action
from evosteer_core.paradigms.base import ScriptedParadigm, TaskView, chain_script

TEMPLATE_ROLES = ("solver", "verifier", "finalizer")


def template_script(view: TaskView) -> tuple[Action, ...]:
    return chain_script(TEMPLATE_ROLES, fan_in=True)


TEMPLATE = ScriptedParadigm("template", template_script)
