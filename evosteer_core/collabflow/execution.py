"""Running one constructed team on one task (docs/collabflow.md §2): every agent's local
episode, the evidence-gated communication, then the team's output rule.

Every call is a node execution through the executor protocol (``executors/base.py``) with
the agent's role, tools and limits from the role catalogue, the node prompt of
``episode/prompts.py`` and one budget ledger holding the execution budget B_exec
(``budget.total_tokens − collabflow.construction_tokens``); revisions, output operations and
advisor handoffs are charged to it like local episodes. Stateful (interactive) teams have one
writer: only the executor agent's requests carry the environment; advisors see the current
observation in their prompt and reach the environment only through the executor's next
decision (their handoff is one of its messages).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.collabflow.communication import (
    BudgetExhausted,
    GateRow,
    agent_order,
    communicate,
    message_of,
)
from evosteer_core.collabflow.evidence import Candidate, Holding, records_of
from evosteer_core.collabflow.team import Team, TeamSpec
from evosteer_core.episode.answers import normalize_answer
from evosteer_core.episode.budget import BudgetLedger
from evosteer_core.episode.prompts import node_prompt
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import Catalogue, RoleSpec, default_catalogue
from evosteer_core.episode.runtime import Evaluator
from evosteer_core.executors.base import (
    CallLimits,
    Environment,
    Executor,
    Message,
    NodeRequest,
    NodeResult,
    SkillView,
)
from evosteer_core.infra.config import CollabFlowConfig

CALL_KINDS: tuple[str, ...] = ("local", "revision", "output", "handoff", "act")

REVISION_NOTE = (
    "Revise your previous output once, without tools: keep your answer if the input is wrong, "
    "change it if the input is right. End with 'Answer: <answer>'."
)
FORMAT_NOTE = (
    "Rewrite the candidate above in the task's submission format. Do not solve the task again "
    "and do not change the answer. End with 'Answer: <answer>'."
)
HANDOFF_NOTE = (
    "You advise the executor, the only agent that acts in the environment; you cannot act. "
    "Reply with a handoff: State, Evidence, Next subgoal, Completion check, Recovery."
)


@dataclass(frozen=True)
class CallRecord:
    """One executor call of the team's execution (the execution trace)."""

    agent: str
    kind: str
    status: str
    tokens_in: int
    tokens_out: int
    answer: str | None


@dataclass
class TeamOutcome:
    """What a team's execution produced: the output candidate (None: ⊥), its text, the
    reward, every agent's final holding, the gate log, the call trace, FinalOnly deliveries,
    the ledger (token usage) and why execution stopped early (None: it did not)."""

    output: Candidate | None
    reward: float
    holdings: dict[str, Holding]
    gates: tuple[GateRow, ...]
    calls: tuple[CallRecord, ...]
    deliveries: int
    ledger: BudgetLedger
    stopped: str | None = None
    environment: Environment | None = field(default=None, repr=False)

    @property
    def output_text(self) -> str | None:
        return None if self.output is None else self.output.text


class _TeamRun:
    """The mutable state of one execution: call counters, the trace and the environment."""

    def __init__(
        self,
        team: Team,
        spec: TeamSpec,
        task: TaskRecord,
        executor: Executor,
        ledger: BudgetLedger,
        seed_key: tuple[int, str],
        cfg: CollabFlowConfig,
        catalogue: Catalogue,
        skills: Mapping[str, SkillView],
        evaluator: Evaluator,
    ) -> None:
        self.team, self.spec, self.task, self.executor = team, spec, task, executor
        self.ledger, self.seed_key, self.cfg = ledger, seed_key, cfg
        self.catalogue, self.skills, self.evaluator = catalogue, skills, evaluator
        self.calls: dict[str, int] = {}
        self.trace: list[CallRecord] = []
        self.stopped: str | None = None
        self.environment: Environment | None = None
        self._correct: dict[tuple[str, str], bool] = {}

    # --- calls --------------------------------------------------------------------------
    def role(self, agent: str) -> RoleSpec:
        return self.catalogue.role(self.spec.profile(agent).role_id)

    def bound(self, agent: str) -> tuple[SkillView, ...]:
        """The skills bound to ``agent``, in id order; a binding without its skill text is an
        error naming it."""
        ids = [k for a, k in sorted(self.team.bindings) if a == agent]
        missing = [k for k in ids if k not in self.skills]
        if missing:
            raise ValueError(
                f"execute_team: skills {missing} are bound to {agent!r} but not given (skills=)"
            )
        return tuple(self.skills[k] for k in ids)

    def call(
        self,
        agent: str,
        kind: str,
        messages: tuple[Message, ...],
        previous: str | None,
        *,
        tool_free: bool = False,
        output_tokens: int | None = None,
        note: str = "",
        environment: Environment | None = None,
    ) -> tuple[NodeResult, str] | None:
        """One node execution of ``agent`` (charged to the ledger): its result and version id,
        or None when the budget cannot reserve it (which stops the execution) or an earlier
        infrastructure failure did. ``tool_free`` calls make one model call and no tool call,
        with at most ``output_tokens`` output tokens."""
        if self.stopped is not None:
            return None
        role = self.role(agent)
        interactive = environment is not None
        t_in, t_out = self.ledger.call_tokens(role)
        if output_tokens is not None:
            t_out = min(t_out, output_tokens)
        affordable = self.ledger.can_afford(t_in + t_out) and (
            not interactive
            or (self.ledger.node_calls_left(agent) > 0 and self.ledger.node_steps_left(agent) > 0)
        )
        if not affordable:
            self.stopped = "execution budget exhausted"
            return None
        limits = self.ledger.call_limits(role, interactive, agent)
        if tool_free:
            limits = CallLimits(
                max_model_calls=min(1, limits.max_model_calls),
                max_tool_calls=0,
                max_input_tokens=t_in,
                max_output_tokens=t_out,
                max_total_tokens=limits.max_total_tokens,
            )
        tools = () if tool_free else self.catalogue.tools_for(role.role_id, self.task.family)
        skills = self.bound(agent)
        prompt = node_prompt(role, self.task, skills, messages, previous)
        if note:
            prompt += f"\n\n{note}"
        index = self.calls.get(agent, 0)
        self.calls[agent] = index + 1
        request = NodeRequest(
            task=self.task,
            node_id=agent,
            role=role,
            tools=tools,
            skills=skills,
            messages=messages,
            previous_output=previous,
            prompt=prompt,
            limits=limits,
            seed_key=(*self.seed_key, agent, index),
            environment=environment,
        )
        result = self.executor.run_node(request)
        self.ledger.charge_node(result, agent)
        self.trace.append(
            CallRecord(agent, kind, result.status, result.tokens_in, result.tokens_out, result.answer)
        )
        if result.status == "infra_failure":
            self.stopped = f"{agent} hit an infrastructure failure ({result.failure_kind})"
        return result, f"{agent}#{index}"

    def holding(self, agent: str, result: NodeResult, version: str, pool=()) -> Holding:
        """The candidate a call produced, with its own records and those of ``pool`` that
        apply to it."""
        env_version = self.environment.steps_done if self.environment is not None else 0
        cand = Candidate(version, agent, result.answer, result.text, env_version)
        index = int(version.rsplit("#", 1)[1])
        own = records_of(result.evidence, cand, (*self.seed_key, agent, index))
        return Holding.of(cand, (*pool, *own))

    def correct(self, cand: Candidate) -> bool:
        """Whether a candidate earns full reward (logged only; never shown to an agent)."""
        key = (cand.version, cand.text)
        if key not in self._correct:
            self._correct[key] = self.evaluator(self.task, cand.text or None, None) >= 1.0
        return self._correct[key]

    # --- communication ------------------------------------------------------------------
    def revise(self, agent: str, receiver: Holding, sender: Holding, protocol: str) -> Holding | None:
        """One bounded tool-free revision of ``agent``'s candidate given the sender's; the new
        version keeps only the pooled records that still apply to it."""
        ran = self.call(
            agent,
            "revision",
            (message_of(sender.candidate.agent, protocol, sender),),
            receiver.candidate.text,
            tool_free=True,
            output_tokens=self.cfg.tau_rev,
            note=REVISION_NOTE,
        )
        if ran is None:
            raise BudgetExhausted(self.stopped)
        result, version = ran
        if result.failed or result.answer is None:
            return None
        return self.holding(agent, result, version, (*receiver.evidence, *sender.evidence))


def empty_holding(agent: str) -> Holding:
    """The holding of an agent that produced nothing (no call could run): no answer."""
    return Holding(Candidate(f"{agent}#none", agent, None, ""))


def execute_team(
    team: Team,
    spec: TeamSpec,
    task: TaskRecord,
    executor: Executor,
    ledger: BudgetLedger,
    seed_key: tuple[int, str],
    cfg: CollabFlowConfig,
    *,
    catalogue: Catalogue | None = None,
    skills: Mapping[str, SkillView] | None = None,
    evaluator: Evaluator = evaluate,
) -> TeamOutcome:
    """Run ``team`` on ``task``: local episodes in the fixed agent order, communication, the
    output rule; ``ledger`` holds the execution budget (``construction.execution_limits``) and
    ``seed_key`` = (run seed, episode key) keys every call. ``evaluator`` scores the output
    (and, in the gate log only, each candidate). With ``collabflow.communication`` off the
    team runs without its edges: no message, no gate, the same agents and output rule."""
    if team.output is None:
        raise ValueError("execute_team needs a complete team (its output rule is not set)")
    if not cfg.communication:  # the −communication ablation (docs/collabflow.md §5)
        team = replace(team, edges=frozenset())
    run = _TeamRun(
        team, spec, task, executor, ledger, seed_key, cfg,
        catalogue or default_catalogue(), skills or {}, evaluator,
    )  # fmt: skip
    if spec.interactive:
        return _execute_stateful(run)
    return _execute_stateless(run)


def _execute_stateless(run: _TeamRun) -> TeamOutcome:
    team, cfg = run.team, run.cfg
    holdings: dict[str, Holding] = {}
    deliveries = 0
    for agent in agent_order(team):
        inbound = [
            e.source
            for e in sorted(team.edges, key=lambda e: agent_order(team).index(e.source))
            if e.target == agent and e.protocol == "final_only" and e.source in holdings
        ]
        messages = tuple(message_of(s, "final_only", holdings[s]) for s in inbound)
        deliveries += len(messages)
        ran = run.call(agent, "local", messages, None)
        holdings[agent] = empty_holding(agent) if ran is None else run.holding(agent, *ran)
    comm = communicate(
        team, holdings, run.revise, run.correct,
        kappa=cfg.kappa, r_max=cfg.r_max, r_comm=cfg.r_comm, rule=cfg.gate,
    )  # fmt: skip
    holdings = comm.holdings
    run.stopped = run.stopped or comm.stopped
    output = _output(run, holdings)
    reward = float(run.evaluator(run.task, output.text if output else None, None))
    return TeamOutcome(
        output, reward, holdings, comm.gates, tuple(run.trace), deliveries, run.ledger, run.stopped
    )


def _output(run: _TeamRun, holdings: dict[str, Holding]) -> Candidate | None:
    """The team's answer under its output rule (docs/collabflow.md §2)."""
    rule = run.team.output
    assert rule is not None
    if rule.mode == "integrator":
        return integrate(holdings.values())
    agent = rule.agent
    assert agent is not None
    own = holdings[agent]
    if rule.mode == "verifier":
        others = tuple(
            message_of(a, "candidate", holdings[a])
            for a in agent_order(run.team)
            if a != agent and holdings[a].candidate.answer is not None
        )
        ran = run.call(agent, "output", others, own.candidate.text or None)
        if ran is None:
            return own.candidate
        pool = [r for h in holdings.values() for r in h.evidence]
        return run.holding(agent, *ran, pool).candidate
    if rule.mode == "formatter" and own.candidate.answer is not None:
        ran = run.call(
            agent, "output", (message_of(agent, "candidate", own),), None,
            tool_free=True, note=FORMAT_NOTE,
        )  # fmt: skip
        if ran is None or ran[0].failed or ran[0].answer is None:
            return own.candidate
        formatted = run.holding(agent, *ran, own.evidence).candidate
        same = normalize_answer(formatted.answer or "") == own.candidate.key()
        return formatted if same else own.candidate  # a formatter never changes the answer
    return own.candidate


def integrate(holdings: Iterable[Holding]) -> Candidate | None:
    """The Integrator (docs/collabflow.md §2): group the candidates by normalized answer, take
    each class's representative (its smallest agent id), pool and deduplicate the class's
    records and filter them for the representative; the best score wins, ties go to the
    class with more distinct versions (copies count once), then to the smaller
    representative agent id. No stated answer: None (⊥)."""
    classes: dict[str, list[Holding]] = {}
    for h in holdings:
        if h.candidate.answer is not None:
            classes.setdefault(h.candidate.key(), []).append(h)
    if not classes:
        return None

    def rank(members: list[Holding]) -> tuple[int, int, str]:
        rep = min(members, key=lambda h: h.candidate.agent)
        pooled = Holding.of(rep.candidate, [r for h in members for r in h.evidence])
        versions = len({h.candidate.version for h in members})
        return (-pooled.score, -versions, rep.candidate.agent)

    best = min(classes.values(), key=rank)
    return min(best, key=lambda h: h.candidate.agent).candidate


def _execute_stateful(run: _TeamRun) -> TeamOutcome:
    """The single-writer schedule: at each decision boundary (at most ``r_comm``) the
    advisors with an edge to the executor write tool-free handoffs, then the executor runs
    one execution with them as its messages; it alone holds the environment."""
    team, task = run.team, run.task
    writer = next(a for a in agent_order(team) if run.spec.profile(a).mode == "executor")
    advisors = [
        a for a in agent_order(team) if any(e.source == a and e.target == writer for e in team.edges)
    ]
    env = run.executor.make_environment(task, run.seed_key)
    run.environment = env
    holdings = {a: empty_holding(a) for a in team.agents}
    previous: dict[str, str | None] = dict.fromkeys(team.agents)
    deliveries = 0
    for _ in range(run.cfg.r_comm):
        if env is None or env.done or run.stopped is not None:
            break
        observation = f"Current observation:\n{env.observe()}"
        handoffs = []
        for adv in advisors:
            ran = run.call(
                adv, "handoff", (), previous[adv], tool_free=True,
                note=f"{observation}\n\n{HANDOFF_NOTE}",
            )  # fmt: skip
            if ran is not None:
                previous[adv] = ran[0].text
                handoffs.append(Message(adv, "one_way", ran[0].text))
        deliveries += len(handoffs)
        ran = run.call(writer, "act", tuple(handoffs), previous[writer], environment=env)
        if ran is None:
            break
        result, version = ran
        previous[writer] = result.text
        holdings[writer] = run.holding(writer, result, version)
        if result.env_steps == 0:
            break
    output = holdings[writer].candidate
    reward = float(run.evaluator(task, output.text or None, env))
    return TeamOutcome(
        output, reward, holdings, (), tuple(run.trace), deliveries, run.ledger, run.stopped, env
    )
