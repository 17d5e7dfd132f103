"""ReAct-style single agent with all tools (docs/paradigms.md, "react").

One node of the role that holds every tool (``tool_user``: search and python, each as far as
the family offers it; the ``solver`` where a family has no tools, e.g. the interactive one),
the output from the start. Within one execution the agent already alternates reasoning and
tool calls (the executor's tool loop, up to the role's model- and tool-call limits). Across
executions it iterates like a ReAct loop that has not yet reached its finish step: while its
latest execution stated no answer (a failed, truncated or unparsable turn) it is re-run, with
its previous output in its prompt, up to ``max_iterations`` executions in all and as far as
the budget allows. In the interactive family it keeps acting until the game ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from evosteer_core.episode.actions import Action
from evosteer_core.episode.runtime import Episode
from evosteer_core.paradigms.base import apply_script, chain_script, finish, task_view

ALL_TOOLS_ROLE = "tool_user"
NO_TOOLS_ROLE = "solver"


@dataclass(frozen=True)
class ReactParadigm:
    """``max_iterations``: executions of the agent at most (outside the interactive family)."""

    max_iterations: int = 3
    name: str = "react"

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise ValueError(f"react: max_iterations must be >= 1, got {self.max_iterations}")

    def run(self, ep: Episode) -> None:
        view = task_view(ep)
        role = ALL_TOOLS_ROLE if ALL_TOOLS_ROLE in view.roles else NO_TOOLS_ROLE
        apply_script(ep, chain_script([role]))
        agent = ep.graph.nodes.get("n0")
        rerun = Action("RERUN_AGENT", node_id="n0")
        iterations = 1
        while (
            agent is not None
            and not view.interactive
            and agent.answer is None
            and iterations < self.max_iterations
            and rerun in ep.legal_actions()
        ):
            ep.apply(rerun)
            iterations += 1
        finish(ep)


REACT = ReactParadigm()
