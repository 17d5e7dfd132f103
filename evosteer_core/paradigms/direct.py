"""Frozen executor direct: the executor answers the task alone (docs/paradigms.md, "direct").

One solver node, the output, then STOP: one execution of the executor on the solver prompt
(the task and the instruction to state a final answer), no tools (the solver has none), no
orchestrator decision and no repair. In the interactive family the game must end before STOP
is legal, so the same node keeps acting (it is re-run) until the game is over or its budget
is spent. On the ``openai`` executor this is one chat exchange per item (per game turn).
"""

from __future__ import annotations

from evosteer_core.episode.actions import Action
from evosteer_core.paradigms.base import ScriptedParadigm, TaskView, chain_script


def direct_script(view: TaskView) -> tuple[Action, ...]:
    return chain_script(["solver"])


DIRECT = ScriptedParadigm("direct", direct_script)
