"""What every fixed paradigm shares: the task view it decides from, the scripted team it
builds, and the finishing rule (docs/paradigms.md, "Common rules").

A paradigm acts through :meth:`Episode.apply` only, so the runtime enforces legality and
budgets exactly as for the learned orchestrator (docs/method.md §1.2–1.3). A fixed paradigm
makes no model call to decide, so it charges no orchestrator tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from evosteer_core.episode.actions import Action
from evosteer_core.episode.graph import node_index
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import Catalogue
from evosteer_core.episode.runtime import Episode

STOP = Action("STOP")


class Paradigm(Protocol):
    """A fixed orchestration policy: drives one episode from its first action to STOP."""

    name: str

    def run(self, ep: Episode) -> None: ...


@dataclass(frozen=True)
class TaskView:
    """What a fixed paradigm may read of a task: what a real orchestrator is shown (the task
    type, its public text, the tools and roles it offers), never the record id or split."""

    family: str
    text: str
    tools: tuple[str, ...]
    interactive: bool
    roles: tuple[str, ...]


def view_of(task: TaskRecord, catalogue: Catalogue) -> TaskView:
    """The view of ``task`` under the role catalogue (the family's tools and roles)."""
    family = catalogue.family(task.family)
    return TaskView(
        family=task.family,
        text=task.public_prompt,
        tools=family.tools,
        interactive=family.interactive,
        roles=tuple(r.role_id for r in catalogue.roles_for(task.family)),
    )


def task_view(ep: Episode) -> TaskView:
    return view_of(ep.task, ep.catalogue)


def node_id(i: int) -> str:
    """The id of the ``i``-th node a script adds (ids count up from n0, never reused)."""
    return f"n{i}"


def chain_script(
    roles: Sequence[str], *, fan_in: bool = False, rerun_output: bool = False
) -> tuple[Action, ...]:
    """A chain team: nodes n0..n(k−1) of ``roles`` in order, each one after the first re-run
    over a ``revise`` edge from its predecessor (the first execution of a node never has
    inputs: an edge needs both ends live), the last one the output.

    ``fan_in``: the last node also gets ``feedback`` edges from every earlier node (added
    before its ``revise`` edge, so its re-run reads them all). ``rerun_output``: one more
    execution of the output node at the end.
    """
    if not roles:
        raise ValueError("a chain needs at least one role")
    last = len(roles) - 1
    acts: list[Action] = []
    for i, role in enumerate(roles):
        acts.append(Action("ADD_AGENT", node_id=node_id(i), role_id=role))
        if i == 0:
            continue
        if fan_in and i == last:
            for j in range(i - 1):
                acts.append(
                    Action(
                        "ADD_EDGE", source_id=node_id(j), target_id=node_id(i), protocol="feedback"
                    )
                )
        acts.append(
            Action("ADD_EDGE", source_id=node_id(i - 1), target_id=node_id(i), protocol="revise")
        )
    acts.append(Action("SET_OUTPUT", node_id=node_id(last)))
    if rerun_output:
        acts.append(Action("RERUN_AGENT", node_id=node_id(last)))
    return tuple(acts)


def apply_script(ep: Episode, script: Sequence[Action]) -> int:
    """Apply ``script`` in order as far as the budget allows: an action outside the legal set
    is skipped (for instance a node whose role can no longer be reserved, and then every
    action that names it), and the script ends once the episode is exhausted (its legal set
    is the finalizing action only). Returns how many actions were applied."""
    applied = 0
    for action in script:
        if ep.stopped or ep.exhausted():
            break
        if action in ep.legal_actions():
            ep.apply(action)
            applied += 1
    return applied


def finish(ep: Episode) -> None:
    """End the episode: STOP as soon as it is legal. While it is not (the interactive game is
    still running and a node can still act), the output node keeps acting: it is re-run while
    it has environment steps left, and once it has none a fresh node of the same role takes
    over as the output (the game's state carries over). With no output set, the
    lowest-index node that may be the output is set; otherwise the first legal action is
    taken (in finalization that is the runtime's finalizing action)."""
    while not ep.stopped:
        ep.apply(_finishing_action(ep))


def _finishing_action(ep: Episode) -> Action:
    legal = ep.legal_actions()
    output = ep.graph.output_id
    if STOP in legal:
        return STOP
    if output is None:
        outs = [a for a in legal if a.kind == "SET_OUTPUT"]
        return min(outs, key=lambda a: node_index(a.node_id)) if outs else legal[0]
    rerun = Action("RERUN_AGENT", node_id=output)
    if rerun in legal and (not ep.family.interactive or ep.ledger.node_steps_left(output) > 0):
        return rerun
    newest = max(ep.graph.nodes, key=node_index)
    take_over = Action("SET_OUTPUT", node_id=newest)
    if newest != output and take_over in legal:
        return take_over
    role = ep.graph.nodes[output].role_id
    successor = Action("ADD_AGENT", node_id=ep.graph.next_node_id(), role_id=role)
    return successor if successor in legal else legal[0]


@dataclass(frozen=True)
class ScriptedParadigm:
    """A paradigm whose whole team is written before execution: ``planner`` maps the task
    view to an action script, which is applied (:func:`apply_script`) and then finished
    (:func:`finish`); nothing it observes changes the script."""

    name: str
    planner: Callable[[TaskView], tuple[Action, ...]]

    def script(self, view: TaskView) -> tuple[Action, ...]:
        return self.planner(view)

    def run(self, ep: Episode) -> None:
        apply_script(ep, self.script(task_view(ep)))
        finish(ep)
