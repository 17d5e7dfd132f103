"""The interleaved runtime (docs/method.md §1.2, Eq. 3): every action is validated, applied, executed.

An :class:`Episode` owns one task's communication graph, budget ledger, history and
(for interactive families) environment. ``legal_actions()`` is the legal set A(s) of docs/method.md §1.2
(the single place legality is defined); ``apply(action)`` rejects anything outside it with an
:class:`IllegalActionError` naming the action and the rule it breaks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.graph import CommGraph, Node, node_index
from evosteer_core.episode.prompts import node_prompt
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import Catalogue, RoleSpec
from evosteer_core.executors.base import (
    Environment,
    Executor,
    Message,
    NodeRequest,
    NodeResult,
    SkillView,
)

Evaluator = Callable[[TaskRecord, "str | None", "Environment | None"], float]
"""Scores the output node's text at STOP (``benchmarks.rewards.evaluate`` in production)."""

REPAIR_KINDS = frozenset({"RERUN_AGENT", "BIND_SKILL"})


class IllegalActionError(ValueError):
    """An action outside the legal set; the message names the action and the broken rule."""

    def __init__(self, action: Action, reason: str) -> None:
        super().__init__(f"illegal action {action.to_json()}: {reason}")
        self.action = action
        self.reason = reason


@dataclass(frozen=True)
class DecisionCharge:
    """What the orchestrator's decision for an action cost: its prompt and action tokens and
    its time (all 0 for a forced decision, which makes no model call)."""

    tokens_in: int = 0
    tokens_out: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Observation:
    """o_t^exec: what one applied action did (appended to the history, read by features)."""

    action: Action
    node_id: str | None = None
    result: NodeResult | None = None
    messages: int = 0
    had_previous_output: bool = False
    output_changed: bool = False
    reward: float | None = None

    @property
    def repair(self) -> bool:
        """Feature 12: a rerun, a skill binding, or a ``revise`` edge."""
        return self.action.kind in REPAIR_KINDS or self.action.protocol == "revise"

    def summary(self) -> str:
        """One short line for the policy prompt's history, e.g.
        ``ADD_EDGE n0>n1 revise -> n1 ok ans=42`` (skill ids shown by their first 6 hex digits)."""
        a = self.action
        parts = [a.kind]
        if a.source_id is not None:
            parts.append(f"{a.source_id}>{a.target_id} {a.protocol}")
        parts += [x for x in (a.node_id, a.role_id) if x is not None]
        if a.skill_id is not None:
            parts.append(a.skill_id.removeprefix("evosteer-")[:6])
        text = " ".join(parts)
        if self.result is not None:
            ans = self.result.answer if self.result.answer is not None else "-"
            text += f" -> {self.node_id} {self.result.status} ans={ans[:24]}"
        if self.reward is not None:
            text += f" -> reward {self.reward:.3f}"
        return text


class Episode:
    """One task's orchestration episode under the interleaved semantics of docs/method.md §1.2."""

    def __init__(
        self,
        task: TaskRecord,
        catalogue: Catalogue,
        limits: BudgetLimits,
        executor: Executor,
        evaluator: Evaluator,
        menu: Iterable[SkillView] = (),
        run_seed: int = 0,
        episode_key: str = "",
        masked_skills: Iterable[str] = (),
        *,
        interleaved: bool = True,
        repair: bool = True,
    ) -> None:
        """``interleaved=False`` (ablation ``no_interleaving``): actions only build the
        graph, which runs once at STOP (:meth:`_run_graph`); ``repair=False`` (ablation
        ``no_repair``): RERUN_AGENT and DROP_AGENT are never legal (docs/ablations.md)."""
        self.task = task
        self.interleaved = interleaved
        self.repair = repair
        self.catalogue = catalogue
        self.family = catalogue.family(task.family)
        self.roles: tuple[RoleSpec, ...] = catalogue.roles_for(task.family)
        masked = set(masked_skills)
        self.menu: tuple[SkillView, ...] = tuple(s for s in menu if s.skill_id not in masked)
        self._skills = {s.skill_id: s for s in self.menu}
        self.executor = executor
        self.evaluator = evaluator
        self.run_seed = run_seed
        self.episode_key = episode_key
        self.graph = CommGraph()
        self.ledger = BudgetLedger(limits)
        self.history: list[Observation] = []
        self.stopped = False
        self.reward: float | None = None
        self.finalizing: str | None = None
        """Why the episode is being finalized before its budget ran out (``finalize``)."""
        self._calls: dict[str, int] = {}
        self._legal: list[Action] | None = None
        self.environment: Environment | None = (
            executor.make_environment(task, (run_seed, episode_key))
            if self.family.interactive
            else None
        )

    # --- state queries ---------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        """False once any node execution hit an infrastructure failure (the episode is then
        finalized at once: it makes no further executor call)."""
        return not any(
            o.result is not None and o.result.status == "infra_failure" for o in self.history
        )

    def affordable_roles(self) -> list[RoleSpec]:
        return [r for r in self.roles if self.ledger.can_reserve(r)]

    def exhausted(self) -> bool:
        """No node-executing action fits the budget, the action cap is reached, or the episode
        was put into finalization (``finalize``)."""
        return (
            self.finalizing is not None
            or len(self.history) >= self.ledger.limits.max_actions
            or not self.affordable_roles()
        )

    def finalize(self, reason: str) -> None:
        """From now on the legal set is the finalizing action only (docs/method.md §1.2), e.g. after the
        orchestrator missed its decision deadline or cannot afford its next decision."""
        self._legal = None
        self.finalizing = reason

    def _executable(self, node_id: str, affordable: set[str]) -> bool:
        """Whether node ``node_id`` can be executed again: its role is affordable and, in the
        interactive family, the node has model calls left under its per-node limit."""
        node = self.graph.nodes[node_id]
        return node.role_id in affordable and (
            not self.family.interactive or self.ledger.node_calls_left(node_id) > 0
        )

    def _step_affordable(self, affordable: set[str]) -> bool:
        """Whether a node-executing action can still take an environment step: the episode
        has steps left and a new node (ADD_AGENT of an affordable role, which starts with the
        full per-node allowance) could take one. A live node can step only if a new one can."""
        lim = self.ledger.limits
        return (
            bool(affordable)
            and self.ledger.env_steps < lim.env_steps
            and min(lim.node_env_steps, lim.node_model_calls_interactive) > 0
        )

    def _env_open(self) -> bool:
        env = self.environment
        return env is not None and not env.done and env.steps_done < env.max_steps

    def _selectable(self, include_non_output: bool) -> list[str]:
        ids = sorted(self.graph.nodes, key=node_index)
        if include_non_output:
            return ids
        return [n for n in ids if self.catalogue.role(self.graph.nodes[n].role_id).output_ok]

    def legal_actions(self) -> list[Action]:
        """A(s) of docs/method.md §1.2, sorted by canonical text; empty once stopped.

        Cached per state: ``apply`` and ``charge_orchestrator`` (the only mutators) reset it.
        """
        if self._legal is None:
            self._legal = self._enumerate_legal()
        return list(self._legal)

    def _enumerate_legal(self) -> list[Action]:
        if self.stopped:
            return []
        g = self.graph
        if self.exhausted():
            return [self._finalizing_action()]
        affordable = {r.role_id for r in self.affordable_roles()}
        acts: list[Action] = []
        env_wait = self.interleaved and self._env_open() and self._step_affordable(affordable)
        if g.output_id is not None and not env_wait:
            acts.append(Action("STOP"))
        for nid in self._selectable(not self._output_role_possible(affordable)):
            if nid != g.output_id:
                acts.append(Action("SET_OUTPUT", node_id=nid))
        new_id = g.next_node_id()
        for role in self.roles:
            if role.role_id in affordable:
                acts.append(Action("ADD_AGENT", node_id=new_id, role_id=role.role_id))
                for s in self.menu:
                    acts.append(
                        Action(
                            "ADD_AGENT", node_id=new_id, role_id=role.role_id, skill_id=s.skill_id
                        )
                    )
        for nid, node in g.nodes.items():
            if self.repair and nid != g.output_id:
                acts.append(Action("DROP_AGENT", node_id=nid))
            if self._executable(nid, affordable):
                if self.repair and self.interleaved:
                    acts.append(Action("RERUN_AGENT", node_id=nid))
                for s in self.menu:
                    if s.skill_id not in node.skills:
                        acts.append(Action("BIND_SKILL", node_id=nid, skill_id=s.skill_id))
            for tid in g.nodes:
                if tid == nid or (nid, tid) in g.edges:
                    continue
                acts.append(Action("ADD_EDGE", source_id=nid, target_id=tid, protocol="feedback"))
                if self._executable(tid, affordable):
                    acts.append(Action("ADD_EDGE", source_id=nid, target_id=tid, protocol="revise"))
        return sorted(acts, key=Action.to_json)

    def _output_role_possible(self, affordable: set[str]) -> bool:
        """Whether a node of an output role is live or can still be added: while one can,
        non-output roles (planner) are not selectable as the output (docs/method.md §1.1–1.2)."""
        return any(
            self.catalogue.role(n.role_id).output_ok for n in self.graph.nodes.values()
        ) or any(r.output_ok for r in self.roles if r.role_id in affordable)

    def _finalizing_action(self) -> Action:
        """When the budget covers nothing more: STOP with an output, else SET_OUTPUT on the
        lowest-index selectable node (any node if only non-output roles exist), else STOP."""
        if self.graph.output_id is not None or not self.graph.nodes:
            return Action("STOP")
        candidates = self._selectable(False) or self._selectable(True)
        return Action("SET_OUTPUT", node_id=candidates[0])

    # --- applying actions ---------------------------------------------------------------
    def apply(self, action: Action, decision: DecisionCharge | None = None) -> Observation:
        """Validate ``action`` against the current state, charge the ``decision`` that chose
        it, then apply and execute it (so the executed node gets what is left after the
        decision); append and return its observation."""
        if action not in self.legal_actions():
            raise IllegalActionError(action, self._why_illegal(action))
        self._legal = None
        if decision is not None:
            self.ledger.charge_orchestrator(
                decision.tokens_in, decision.tokens_out, decision.seconds
            )
        obs = getattr(self, f"_do_{action.kind.lower()}")(action)
        self.history.append(obs)
        return obs

    def charge_orchestrator(self, tokens_in: int, tokens_out: int, seconds: float = 0.0) -> None:
        """The orchestrator's own decision is charged to the same ledger (docs/method.md §1.3)."""
        self._legal = None
        self.ledger.charge_orchestrator(tokens_in, tokens_out, seconds)

    def _do_add_agent(self, a: Action) -> Observation:
        node = self.graph.add_node(a.role_id, a.skill_id)
        return self._execute(a, node)

    def _do_add_edge(self, a: Action) -> Observation:
        self.graph.add_edge(a.source_id, a.target_id, a.protocol)
        if a.protocol == "revise":
            return self._execute(a, self.graph.nodes[a.target_id])
        return Observation(a)

    def _do_bind_skill(self, a: Action) -> Observation:
        node = self.graph.nodes[a.node_id]
        node.skills.append(a.skill_id)
        return self._execute(a, node)

    def _do_rerun_agent(self, a: Action) -> Observation:
        return self._execute(a, self.graph.nodes[a.node_id])

    def _do_drop_agent(self, a: Action) -> Observation:
        self.graph.drop_node(a.node_id)
        return Observation(a)

    def _do_set_output(self, a: Action) -> Observation:
        self.graph.output_id = a.node_id
        return Observation(a)

    def _do_stop(self, a: Action) -> Observation:
        if not self.interleaved:
            self._run_graph()
        out = self.graph.nodes.get(self.graph.output_id) if self.graph.output_id else None
        self.reward = float(
            self.evaluator(self.task, out.output if out else None, self.environment)
        )
        self.stopped = True
        return Observation(a, reward=self.reward)

    def _run_graph(self) -> None:
        """Build-first execution (ablation ``no_interleaving``, docs/ablations.md): every live
        node runs once, in id order, with the outputs of its sources that ran before it; a
        node whose role the budget can no longer reserve (or, in the interactive family,
        that has no model calls left) is skipped, and an infrastructure failure ends the
        sweep. The executions update the nodes and the ledger but add no history entries:
        the history holds the orchestrator's actions only."""
        for nid in sorted(self.graph.nodes, key=node_index):
            if not self.healthy:
                return
            node = self.graph.nodes[nid]
            affordable = {r.role_id for r in self.affordable_roles()}
            if self._executable(nid, affordable):
                self._run(Action("RERUN_AGENT", node_id=nid), node)

    def _execute(self, a: Action, node: Node) -> Observation:
        """Run ``node`` as action ``a`` triggers it: now (interleaved), or at STOP."""
        return self._run(a, node) if self.interleaved else Observation(a)

    def _run(self, a: Action, node: Node) -> Observation:
        role = self.catalogue.role(node.role_id)
        messages = self._inbound_messages(node.node_id)
        call = self._calls.get(node.node_id, 0)
        self._calls[node.node_id] = call + 1
        skills = tuple(self._skills[s] for s in node.skills if s in self._skills)
        request = NodeRequest(
            task=self.task,
            node_id=node.node_id,
            role=role,
            tools=self.catalogue.tools_for(role.role_id, self.task.family),
            skills=skills,
            messages=messages,
            previous_output=node.output,
            prompt=node_prompt(role, self.task, skills, messages, node.output),
            limits=self.ledger.call_limits(role, self.family.interactive, node.node_id),
            seed_key=(self.run_seed, self.episode_key, node.node_id, call),
            environment=self.environment,
        )
        result = self.executor.run_node(request)
        self.ledger.charge_node(result, node.node_id)
        if result.status == "infra_failure":
            # the trajectory is unhealthy from here on: no further executor calls
            reason = f"node {node.node_id} hit an infrastructure failure ({result.failure_kind})"
            self.finalize(reason)
        previous = node.output
        node.output, node.last_result, node.version = result.text, result, node.version + 1
        return Observation(
            a,
            node_id=node.node_id,
            result=result,
            messages=len(messages),
            had_previous_output=previous is not None,
            output_changed=result.text != previous,
        )

    def _inbound_messages(self, node_id: str) -> tuple[Message, ...]:
        """Latest outputs of the sources of every edge into ``node_id`` (feedback and revise)."""
        msgs = []
        for e in self.graph.inbound(node_id):
            src = self.graph.nodes[e.source]
            if src.output is not None:
                ev = src.last_result.evidence if src.last_result else ()
                msgs.append(Message(e.source, e.protocol, src.output, src.answer, ev))
        return tuple(msgs)

    def _why_illegal(self, a: Action) -> str:
        """The first docs/method.md §1.2 rule that ``a`` breaks (for error messages only)."""
        g = self.graph
        if self.stopped:
            return "the episode has stopped"
        if self.exhausted():
            why = self.finalizing or "the budget is exhausted"
            return f"{why}; the only legal action is {self._finalizing_action().to_json()}"
        for field_name in ("node_id", "source_id", "target_id"):
            nid = getattr(a, field_name)
            if nid is not None and a.kind != "ADD_AGENT" and nid not in g.nodes:
                return f"{field_name} {nid!r} is not a live node"
        if a.kind in ("RERUN_AGENT", "DROP_AGENT") and not self.repair:
            return "repair actions are masked in this run (ablation.no_repair)"
        if a.kind == "RERUN_AGENT" and not self.interleaved:
            return "nodes run only at STOP in this run (ablation.no_interleaving)"
        roles = {r.role_id: r for r in self.roles}
        if a.kind == "STOP":
            return (
                "no output node is set"
                if g.output_id is None
                else "the environment episode is unfinished and a node can still take a step"
            )
        if a.kind == "ADD_AGENT":
            if a.node_id != g.next_node_id():
                return f"the next node id is {g.next_node_id()!r}"
            if a.role_id not in roles:
                return f"role {a.role_id!r} is not offered in family {self.task.family!r}"
        if a.skill_id is not None and a.skill_id not in self._skills:
            return f"skill {a.skill_id!r} is not in the visible menu"
        if a.kind == "BIND_SKILL" and a.skill_id in g.nodes[a.node_id].skills:
            return f"skill {a.skill_id!r} is already bound to {a.node_id}"
        if a.kind == "SET_OUTPUT":
            if a.node_id == g.output_id:
                return f"{a.node_id} is already the output node"
            return (
                f"role {g.nodes[a.node_id].role_id!r} cannot be the output while another node can"
            )
        if a.kind == "DROP_AGENT":
            return "the output node cannot be dropped"
        if a.kind == "ADD_EDGE":
            if a.source_id == a.target_id:
                return "self-edges are not allowed"
            if (a.source_id, a.target_id) in g.edges:
                return f"an edge {a.source_id}->{a.target_id} already exists"
        node_id = a.target_id if a.kind == "ADD_EDGE" else a.node_id
        if (
            a.kind != "ADD_AGENT"
            and self.family.interactive
            and self.ledger.node_calls_left(node_id) == 0
        ):
            return f"{node_id} has used its per-node model calls"
        return "the role's per-call budget can no longer be reserved"


def replay_open_loop(
    ep: Episode, actions: Sequence[str], charges: Sequence[DecisionCharge]
) -> float:
    """Reward of running the recorded ``actions`` (canonical JSON) open-loop in the fresh
    episode ``ep``, each decision charged as when it was recorded: an action that is illegal in
    this run is replaced by the first legal one, and once the sequence ends the first legal
    action is taken until the episode stops (the runtime's finalizing actions)."""
    for text, charge in zip(actions, charges, strict=True):
        if ep.stopped:
            break
        action = Action.from_json(text)
        legal = ep.legal_actions()
        ep.apply(action if action in legal else legal[0], charge)
    while not ep.stopped:
        ep.apply(ep.legal_actions()[0])
    return float(ep.reward or 0.0)
