"""The interleaved runtime (docs/method.md §1.1–1.3): legal mask, rejection reasons, execution semantics.

The legal set is checked against ``spec_legal_set``, an independent brute-force reading of the
rules of docs/method.md §1.2 over every candidate action, on a few hundred seeded random states.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest

from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.graph import node_index
from evosteer_core.episode.prompts import node_prompt
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode, IllegalActionError
from evosteer_core.executors.base import (
    Environment,
    EnvStep,
    NodeRequest,
    NodeResult,
    SkillView,
    ToolUse,
)
from evosteer_core.infra.seeding import numpy_rng
from evosteer_core.policy.render import public_state

CAT = default_catalogue()
METRIC = {"hotpotqa": "qa_em", "aime": "aime", "mbpp_plus": "code", "alfworld": "interactive"}
MENU = (
    SkillView("sk-a", "Check units", "Skill: Check units\nUse when: numbers\nSteps: ..."),
    SkillView("sk-b", "Cite ünï", "Skill: Cite\nUse when: facts are needed\nSteps: ..."),
)
MASKED = SkillView("sk-masked", "Masked", "Skill: Masked\nUse when: never")


class FakeEnv:
    """A counter world: each step advances; ``done`` after ``finish_at`` steps."""

    def __init__(self, max_steps: int, finish_at: int) -> None:
        self.max_steps, self.finish_at = max_steps, finish_at
        self.steps_done, self.done, self.success = 0, False, False

    def observe(self) -> str:
        return f"room {self.steps_done}"

    def step(self, command: str) -> EnvStep:
        self.steps_done += 1
        self.done = self.steps_done >= self.finish_at
        self.success = self.done
        return EnvStep(self.observe(), ok=command != "bad", done=self.done, success=self.success)

    def phase_fraction(self) -> float:
        return self.steps_done / self.finish_at


class FakeExecutor:
    """Deterministic executor that records every request.

    The text names the node, its call index and the messages it saw, so every execution
    changes the output unless ``constant`` is set. ``answers`` maps node ids to answers.
    """

    name = "fake"

    def __init__(
        self,
        tokens: tuple[int, int] = (100, 20),
        answers: dict[str, str | None] | None = None,
        constant: bool = False,
        env_steps: int = 2,
        finish_at: int = 4,
        status: str = "ok",
    ) -> None:
        self.tokens, self.answers, self.constant = tokens, answers or {}, constant
        self.env_steps, self.finish_at, self.status = env_steps, finish_at, status
        self.requests: list[NodeRequest] = []

    def run_node(self, request: NodeRequest) -> NodeResult:
        self.requests.append(request)
        answer = self.answers.get(request.node_id, "42")
        seen = ",".join(f"{m.source_id}:{m.protocol}" for m in request.messages)
        body = "same" if self.constant else f"{request.node_id}#{request.seed_key[3]} [{seen}]"
        text = body + (f"\nAnswer: {answer}" if answer is not None else "")
        steps, env_ok = 0, None
        env = request.environment
        if env is not None:
            for _ in range(min(self.env_steps, request.limits.max_env_steps)):
                if env.done:
                    break
                env_ok = env.step("go").ok
                steps += 1
        return NodeResult(
            text,
            answer,
            status=self.status,
            tokens_in=self.tokens[0],
            tokens_out=self.tokens[1],
            model_calls=1,
            tool_calls=len(request.tools) > 0,
            latency_s=0.5,
            tool_uses=(ToolUse(request.tools[0], "q", "r", True),) if request.tools else (),
            env_steps=steps,
            env_last_ok=env_ok,
        )

    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        return FakeEnv(max_steps=6, finish_at=self.finish_at)


class Evaluator:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []

    def __call__(self, task: TaskRecord, text: str | None, env: Environment | None) -> float:
        self.calls.append((task.record_id, text))
        return 1.0 if text is not None and "Answer: 42" in text else 0.0


def task(family: str = "hotpotqa") -> TaskRecord:
    return TaskRecord(f"{family}-1", "test", family, f"A {family} question?", METRIC[family])


def episode(
    family: str = "hotpotqa",
    limits: BudgetLimits | None = None,
    executor: FakeExecutor | None = None,
    evaluator: Evaluator | None = None,
) -> Episode:
    return Episode(
        task(family),
        CAT,
        limits or BudgetLimits(),
        executor or FakeExecutor(),
        evaluator or Evaluator(),
        menu=(*MENU, MASKED),
        run_seed=7,
        episode_key="ep",
        masked_skills=("sk-masked",),
    )


def act(text: str) -> Action:
    return Action.from_json(text)


def add(ep: Episode, role: str, skill: str | None = None) -> str:
    nid = ep.graph.next_node_id()
    ep.apply(Action("ADD_AGENT", node_id=nid, role_id=role, skill_id=skill))
    return nid


# --- an independent reading of docs/method.md §1.2 ---------------------------------------------------
def spec_affordable(ep: Episode, role_id: str) -> bool:
    """One call of the role (its scaled per-call input+output tokens, one model call) fits."""
    lim, led, role = ep.ledger.limits, ep.ledger, CAT.role(role_id)
    need = max(1, int(role.max_input_tokens * lim.token_scale)) + max(
        1, int(role.max_output_tokens * lim.token_scale)
    )
    return (
        lim.total_tokens - led.tokens_in - led.tokens_out >= need
        and led.model_calls < lim.model_calls
        and led.wall_s < lim.wall_time_s
    )


def spec_legal_set(ep: Episode, universe: list[Action]) -> set[Action]:
    """The members of ``universe`` that docs/method.md §1.2 allows in the episode's current state."""
    if ep.stopped:
        return set()
    offered = {r.role_id: r for r in CAT.roles_for(ep.task.family)}
    nodes, out = ep.graph.nodes, ep.graph.output_id
    afford = {r for r in offered if spec_affordable(ep, r)}
    by_index = sorted(nodes, key=lambda nid: int(nid[1:]))
    output_capable = [nid for nid in by_index if offered[nodes[nid].role_id].output_ok]
    if len(ep.history) >= ep.ledger.limits.max_actions or not afford:
        if out is not None or not nodes:
            return {Action("STOP")} & set(universe)
        return {Action("SET_OUTPUT", node_id=(output_capable or by_index)[0])} & set(universe)
    env = ep.environment
    env_unfinished = env is not None and not env.done and env.steps_done < env.max_steps
    lim = ep.ledger.limits
    # a new node (ADD_AGENT of an affordable role) could still take an environment step
    step_possible = (
        bool(afford)
        and sum(o.result.env_steps for o in ep.history if o.result) < lim.env_steps
        and lim.node_env_steps > 0
        and lim.node_model_calls_interactive > 0
    )
    interactive = CAT.family(ep.task.family).interactive

    def runs(nid: str) -> bool:
        """Node ``nid`` can execute: its role is affordable and (interactive) it has model
        calls left under the per-node limit, counted over all its executions."""
        used = sum(o.result.model_calls for o in ep.history if o.result and o.node_id == nid)
        return nodes[nid].role_id in afford and (
            not interactive or used < lim.node_model_calls_interactive
        )

    next_id = f"n{max([int(n[1:]) for n in ep._calls] + [-1]) + 1}"
    visible = {s.skill_id for s in MENU}
    output_role_affordable = any(offered[r].output_ok for r in afford)

    def legal(a: Action) -> bool:
        if a.kind == "STOP":
            return out is not None and not (env_unfinished and step_possible)
        if a.kind == "ADD_AGENT":
            return (
                a.node_id == next_id
                and a.role_id in afford
                and (a.skill_id is None or a.skill_id in visible)
            )
        if a.kind == "ADD_EDGE":
            src, tgt = a.source_id, a.target_id
            return (
                src in nodes
                and tgt in nodes
                and src != tgt
                and (src, tgt) not in ep.graph.edges
                and (a.protocol == "feedback" or runs(tgt))
            )
        if a.node_id not in nodes:
            return False
        role = nodes[a.node_id].role_id
        if a.kind == "SET_OUTPUT":
            another_can = output_role_affordable or any(n != a.node_id for n in output_capable)
            return a.node_id != out and (offered[role].output_ok or not another_can)
        if a.kind == "DROP_AGENT":
            return a.node_id != out
        if a.kind == "RERUN_AGENT":
            return runs(a.node_id)
        assert a.kind == "BIND_SKILL"
        skills = nodes[a.node_id].skills
        return runs(a.node_id) and a.skill_id in visible and a.skill_id not in skills

    return {a for a in universe if legal(a)}


def candidates(ep: Episode) -> list[Action]:
    """Every action over live, dropped, next and unused ids, all roles, all skills."""
    top = ep.graph.next_index
    ids = [f"n{i}" for i in range(top + 2)]
    roles = [r.role_id for r in CAT.roles] + ["wizard"]
    skills = [s.skill_id for s in (*MENU, MASKED)] + ["sk-unknown"]
    out = [Action("STOP")]
    for nid in ids:
        out += [Action(k, node_id=nid) for k in ("SET_OUTPUT", "RERUN_AGENT", "DROP_AGENT")]
        out += [Action("BIND_SKILL", node_id=nid, skill_id=s) for s in skills]
        for role in roles:
            out += [Action("ADD_AGENT", node_id=nid, role_id=role, skill_id=s) for s in skills]
            out.append(Action("ADD_AGENT", node_id=nid, role_id=role))
    for src, tgt in itertools.product(ids, ids):
        out += [
            Action("ADD_EDGE", source_id=src, target_id=tgt, protocol=p)
            for p in ("feedback", "revise")
        ]
    return out


def _snapshot(ep: Episode) -> tuple:
    g = ep.graph
    return (
        len(ep.history),
        g.structure_keys(ep.stopped),
        g.next_index,
        ep.ledger.snapshot(),
        tuple(n.output for n in g.nodes.values()),
    )


SMALL = BudgetLimits(total_tokens=4000, model_calls=14, max_actions=16, token_scale=0.01)
FEW_STEPS = BudgetLimits(
    total_tokens=4000,
    model_calls=14,
    max_actions=16,
    token_scale=0.01,
    env_steps=4,
    node_env_steps=3,
    node_model_calls_interactive=2,
)
"""Interactive limits that bind before the game ends: the episode's steps run out first."""


@pytest.mark.parametrize(
    ("family", "limits", "finish"),
    [
        ("hotpotqa", SMALL, 3),
        ("aime", SMALL, 3),
        ("mbpp_plus", SMALL, 3),
        ("alfworld", SMALL, 3),
        ("alfworld", FEW_STEPS, 100),
    ],
    ids=["hotpotqa", "aime", "mbpp_plus", "alfworld", "alfworld-few-steps"],
)
def test_random_states_match_the_spec_and_every_legal_action_applies(
    family: str, limits: BudgetLimits, finish: int
) -> None:
    rng = numpy_rng("test_runtime", "random_states", family, finish)
    states, finalizing = 0, 0
    for ep_index in range(6):
        tokens = (int(rng.integers(50, 200)), int(rng.integers(10, 150)))
        ex = FakeExecutor(tokens=tokens, finish_at=finish + ep_index)
        ep = episode(family, limits, ex)
        while not ep.stopped:
            legal = ep.legal_actions()
            texts = [a.to_json() for a in legal]
            assert texts == sorted(texts) and len(set(texts)) == len(texts)
            universe, legal_set = candidates(ep), set(legal)
            assert spec_legal_set(ep, universe) == legal_set
            assert not any(a.skill_id == "sk-masked" for a in legal)
            illegal = [a for a in universe if a not in legal_set]
            for i in rng.choice(len(illegal), size=min(4, len(illegal)), replace=False):
                before = _snapshot(ep)
                with pytest.raises(IllegalActionError) as err:
                    ep.apply(illegal[i])
                assert illegal[i].to_json() in str(err.value) and err.value.reason
                assert _snapshot(ep) == before
            for i in rng.choice(len(legal), size=min(3, len(legal)), replace=False):
                shared = (CAT, ep.task, ep.executor, ep.evaluator)
                trial = copy.deepcopy(ep, memo={id(x): x for x in shared})
                obs = trial.apply(legal[i])
                assert trial.history[-1] is obs and obs.action == legal[i]
            # bias towards growth so that states get rich before the budget runs out
            weights = np.array([3.0 if a.kind in ("ADD_AGENT", "ADD_EDGE") else 1.0 for a in legal])
            weights[[a.kind == "STOP" for a in legal]] = 0.3
            choice = legal[rng.choice(len(legal), p=weights / weights.sum())]
            ep.apply(choice)
            states += 1
            finalizing += len(legal) == 1
        assert ep.legal_actions() == []
    assert states >= 40 and finalizing >= 3


# --- rejections, one per rule ------------------------------------------------------------
def _rejected(ep: Episode, action: Action, reason: str) -> None:
    with pytest.raises(IllegalActionError, match=reason) as err:
        ep.apply(action)
    assert action.to_json() in str(err.value)


def test_stop_without_output_is_rejected() -> None:
    ep = episode()
    add(ep, "solver")
    _rejected(ep, Action("STOP"), "no output node")


def test_set_output_on_current_output_is_rejected() -> None:
    ep = episode()
    add(ep, "solver")
    ep.apply(act('{"kind":"SET_OUTPUT","node_id":"n0"}'))
    _rejected(ep, act('{"kind":"SET_OUTPUT","node_id":"n0"}'), "already the output")


def test_set_output_on_planner_while_another_node_can_be_output() -> None:
    ep = episode()
    add(ep, "planner")
    # no output-capable node yet, but a solver can still be added
    _rejected(ep, Action("SET_OUTPUT", node_id="n0"), "cannot be the output")
    add(ep, "solver")
    _rejected(ep, Action("SET_OUTPUT", node_id="n0"), "cannot be the output")
    assert Action("SET_OUTPUT", node_id="n1") in ep.legal_actions()


def test_planner_can_be_output_when_no_other_node_can() -> None:
    """Only the planner's (smaller) per-call budget is left and no output role is live."""
    ep = episode(limits=BudgetLimits(total_tokens=22_528 + 10_000 + 120))
    add(ep, "planner")
    assert [r.role_id for r in ep.affordable_roles()] == ["planner"]
    assert Action("SET_OUTPUT", node_id="n0") in ep.legal_actions()
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    ep.apply(Action("STOP"))
    assert ep.stopped


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"kind":"ADD_AGENT","node_id":"n0","role_id":"solver"}', "next node id is 'n1'"),
        ('{"kind":"ADD_AGENT","node_id":"n2","role_id":"solver"}', "next node id is 'n1'"),
        ('{"kind":"ADD_AGENT","node_id":"n1","role_id":"wizard"}', "'wizard' is not offered"),
        (
            '{"kind":"ADD_AGENT","node_id":"n1","role_id":"solver","skill_id":"sk-zzz"}',
            "not in the visible menu",
        ),
        (
            '{"kind":"ADD_AGENT","node_id":"n1","role_id":"solver","skill_id":"sk-masked"}',
            "not in the visible menu",
        ),
    ],
)
def test_add_agent_rejections(text: str, reason: str) -> None:
    ep = episode()
    add(ep, "solver")
    _rejected(ep, act(text), reason)


def test_tool_roles_are_not_offered_without_tools() -> None:
    ep = episode("alfworld")
    _rejected(ep, Action("ADD_AGENT", node_id="n0", role_id="tool_user"), "not offered")
    assert "tool_user" not in {a.role_id for a in ep.legal_actions()}
    assert "tool_user" in {a.role_id for a in episode("aime").legal_actions()}


def test_unaffordable_role_is_rejected() -> None:
    ep = episode(limits=BudgetLimits(total_tokens=30_000))
    _rejected(ep, Action("ADD_AGENT", node_id="n0", role_id="solver"), "per-call budget")
    add(ep, "planner")  # 22,528 tokens fit
    assert {a.role_id for a in ep.legal_actions() if a.kind == "ADD_AGENT"} == {"planner"}


def test_drop_output_is_rejected() -> None:
    ep = episode()
    add(ep, "solver")
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    _rejected(ep, Action("DROP_AGENT", node_id="n0"), "output node cannot be dropped")


def test_edge_rejections() -> None:
    ep = episode()
    add(ep, "solver")
    add(ep, "verifier")
    ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="feedback"))
    _rejected(
        ep, Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"), "already exists"
    )
    _rejected(
        ep, Action("ADD_EDGE", source_id="n0", target_id="n0", protocol="feedback"), "self-edge"
    )
    _rejected(
        ep, Action("ADD_EDGE", source_id="n0", target_id="n5", protocol="feedback"), "not a live"
    )
    # the reverse direction is a different ordered pair
    ep.apply(Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="revise"))


def test_bind_of_bound_skill_is_rejected() -> None:
    ep = episode()
    add(ep, "solver", "sk-a")
    _rejected(ep, Action("BIND_SKILL", node_id="n0", skill_id="sk-a"), "already bound")
    _rejected(ep, Action("BIND_SKILL", node_id="n0", skill_id="sk-masked"), "visible menu")
    ep.apply(Action("BIND_SKILL", node_id="n0", skill_id="sk-b"))


def test_actions_after_stop_are_rejected() -> None:
    ep = episode()
    add(ep, "solver")
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    ep.apply(Action("STOP"))
    assert ep.legal_actions() == []
    for a in (Action("STOP"), Action("RERUN_AGENT", node_id="n0")):
        _rejected(ep, a, "stopped")


def test_masked_skills_never_appear() -> None:
    ep = episode()
    assert [s.skill_id for s in ep.menu] == ["sk-a", "sk-b"]
    add(ep, "solver")
    assert all(a.skill_id != "sk-masked" for a in ep.legal_actions())
    assert "sk-masked" not in str(public_state(ep))


def test_revise_needs_an_affordable_target_role() -> None:
    ep = episode()
    add(ep, "solver")
    add(ep, "planner")
    ep.charge_orchestrator(ep.ledger.limits.total_tokens - ep.ledger.tokens - 30_000, 0)
    legal = set(ep.legal_actions())
    assert Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="feedback") in legal
    assert Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="revise") not in legal
    assert Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise") in legal
    _rejected(ep, Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="revise"), "per-call")


# --- budget exhaustion, action cap, interactive STOP -----------------------------------
def _exhaust(ep: Episode) -> None:
    left = ep.ledger.limits.total_tokens - ep.ledger.tokens
    ep.charge_orchestrator(left - 100, 0)
    assert ep.exhausted()


def test_exhaustion_with_output_leaves_only_stop() -> None:
    ev = Evaluator()
    ep = episode(evaluator=ev)
    add(ep, "solver")
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    _exhaust(ep)
    assert ep.legal_actions() == [Action("STOP")]
    _rejected(ep, Action("RERUN_AGENT", node_id="n0"), "budget is exhausted")
    ep.apply(Action("STOP"))
    assert ep.reward == 1.0 and len(ev.calls) == 1


def test_exhaustion_without_output_sets_the_lowest_selectable_node() -> None:
    ep = episode()
    for role in ("planner", "verifier", "solver"):
        add(ep, role)
    ep.apply(Action("DROP_AGENT", node_id="n1"))
    _exhaust(ep)
    assert ep.legal_actions() == [Action("SET_OUTPUT", node_id="n2")]
    ep.apply(Action("SET_OUTPUT", node_id="n2"))
    assert ep.legal_actions() == [Action("STOP")]


def test_exhaustion_with_only_planners_selects_the_lowest_planner() -> None:
    ep = episode()
    add(ep, "planner")
    add(ep, "planner")
    ep.apply(Action("DROP_AGENT", node_id="n0"))
    _exhaust(ep)
    assert ep.legal_actions() == [Action("SET_OUTPUT", node_id="n1")]


def test_exhaustion_without_nodes_stops_with_no_output() -> None:
    ev = Evaluator()
    ep = episode(limits=BudgetLimits(total_tokens=1000), evaluator=ev)
    assert ep.legal_actions() == [Action("STOP")]
    ep.apply(Action("STOP"))
    assert ev.calls == [("hotpotqa-1", None)] and ep.reward == 0.0


@pytest.mark.parametrize("field", ["model_calls", "wall_time_s"])
def test_model_call_and_wall_caps_exhaust(field: str) -> None:
    limits = BudgetLimits(**{field: 2 if field == "model_calls" else 1.0})
    ep = episode(limits=limits)
    add(ep, "solver")
    add(ep, "solver")
    assert ep.legal_actions() == [Action("SET_OUTPUT", node_id="n0")]


def test_max_actions_cap() -> None:
    ep = episode(limits=BudgetLimits(max_actions=3))
    add(ep, "solver")
    add(ep, "verifier")
    assert len(ep.legal_actions()) > 1
    ep.apply(Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="feedback"))
    assert ep.legal_actions() == [Action("SET_OUTPUT", node_id="n0")]
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    assert ep.legal_actions() == [Action("STOP")]


def test_interactive_stop_waits_for_the_environment() -> None:
    ep = episode("alfworld", executor=FakeExecutor(env_steps=2, finish_at=4))
    add(ep, "solver")
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    assert ep.environment.steps_done == 2 and not ep.environment.done
    assert Action("STOP") not in ep.legal_actions()
    _rejected(ep, Action("STOP"), "environment episode is unfinished")
    ep.apply(Action("RERUN_AGENT", node_id="n0"))
    assert ep.environment.done
    assert Action("STOP") in ep.legal_actions()


def test_interactive_stop_when_steps_run_out_or_budget_is_gone() -> None:
    ep = episode("alfworld", executor=FakeExecutor(env_steps=3, finish_at=100))
    add(ep, "solver")
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    assert Action("STOP") not in ep.legal_actions()
    ep.apply(Action("RERUN_AGENT", node_id="n0"))
    assert ep.environment.steps_done == ep.environment.max_steps == 6
    assert Action("STOP") in ep.legal_actions()
    ep2 = episode("alfworld", executor=FakeExecutor(env_steps=1, finish_at=100))
    add(ep2, "solver")
    ep2.apply(Action("SET_OUTPUT", node_id="n0"))
    _exhaust(ep2)
    assert ep2.legal_actions() == [Action("STOP")]


def test_environment_steps_are_clipped_per_node_and_episode() -> None:
    lim = BudgetLimits(env_steps=3, node_env_steps=2)
    ex = FakeExecutor(env_steps=10, finish_at=100)
    ep = episode("alfworld", lim, ex)
    add(ep, "solver")
    add(ep, "solver")
    assert [r.limits.max_env_steps for r in ex.requests] == [2, 1]
    assert ep.ledger.env_steps == 3 and ep.environment.steps_done == 3


def test_stop_is_legal_once_no_node_can_take_an_environment_step() -> None:
    """The game is not over, but the episode's steps are spent: STOP instead of reruns that
    can take no step (docs/method.md §1.2: "... and a node-executing action is still affordable")."""
    lim = BudgetLimits(env_steps=3, node_env_steps=2)
    ex = FakeExecutor(env_steps=2, finish_at=100)
    ep = episode("alfworld", lim, ex)
    add(ep, "solver")
    ep.apply(Action("SET_OUTPUT", node_id="n0"))
    assert Action("STOP") not in ep.legal_actions()  # one step is left for a new node
    ep.apply(Action("RERUN_AGENT", node_id="n0"))
    assert ex.requests[-1].limits.max_env_steps == 0  # n0 spent its two steps
    assert Action("STOP") not in ep.legal_actions()
    add(ep, "verifier")
    assert ep.ledger.env_steps == 3 and not ep.environment.done
    assert ep.environment.steps_done < ep.environment.max_steps and not ep.exhausted()
    assert Action("STOP") in ep.legal_actions()


def test_interactive_per_node_model_calls_hold_across_executions() -> None:
    lim = BudgetLimits(node_model_calls_interactive=2)
    ex = FakeExecutor(env_steps=1, finish_at=100)
    ep = episode("alfworld", lim, ex)
    add(ep, "solver")
    add(ep, "verifier")
    ep.apply(Action("RERUN_AGENT", node_id="n0"))
    assert [r.limits.max_model_calls for r in ex.requests] == [2, 2, 1]
    legal = ep.legal_actions()
    assert Action("RERUN_AGENT", node_id="n0") not in legal
    assert not any(a.kind == "BIND_SKILL" and a.node_id == "n0" for a in legal)
    assert Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="revise") not in legal
    assert Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="feedback") in legal
    assert Action("RERUN_AGENT", node_id="n1") in legal
    _rejected(ep, Action("RERUN_AGENT", node_id="n0"), "n0 has used its per-node model calls")


# --- execution semantics -----------------------------------------------------------------
def test_add_agent_runs_the_new_node_once() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    obs = ep.apply(Action("ADD_AGENT", node_id="n0", role_id="researcher", skill_id="sk-b"))
    (req,) = ex.requests
    assert (req.node_id, req.role.role_id, req.messages, req.previous_output) == (
        "n0",
        "researcher",
        (),
        None,
    )
    assert [s.skill_id for s in req.skills] == ["sk-b"] and req.tools == ("search",)
    assert obs.node_id == "n0" and obs.output_changed and not obs.had_previous_output
    node = ep.graph.nodes["n0"]
    assert node.output == obs.result.text and node.version == 1 and node.answer == "42"


def test_feedback_delivers_at_the_targets_next_execution() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    add(ep, "solver")
    add(ep, "verifier")
    obs = ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="feedback"))
    assert len(ex.requests) == 2 and obs.result is None and obs.messages == 0
    ep.apply(Action("RERUN_AGENT", node_id="n1"))
    (msg,) = ex.requests[-1].messages
    assert (msg.source_id, msg.protocol, msg.text) == (
        "n0",
        "feedback",
        ep.graph.nodes["n0"].output,
    )
    assert msg.answer == "42"
    assert ep.history[-1].messages == 1


def test_revise_reexecutes_the_target_at_once_with_the_source_output() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    add(ep, "solver")
    add(ep, "verifier")
    before = ep.graph.nodes["n1"].output
    obs = ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"))
    req = ex.requests[-1]
    assert req.node_id == "n1" and req.previous_output == before
    assert [(m.source_id, m.protocol) for m in req.messages] == [("n0", "revise")]
    assert req.messages[0].text == ep.graph.nodes["n0"].output
    assert "Input from agent n0 (revise): " + ep.graph.nodes["n0"].output in req.prompt
    assert obs.repair and obs.messages == 1 and obs.had_previous_output and obs.output_changed
    assert ep.graph.nodes["n1"].version == 2


def test_bind_skill_reexecutes_with_the_skill_in_the_prompt() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    add(ep, "solver", "sk-a")
    ep.apply(Action("BIND_SKILL", node_id="n0", skill_id="sk-b"))
    req = ex.requests[-1]
    assert [s.skill_id for s in req.skills] == ["sk-a", "sk-b"]
    assert MENU[0].rendered in req.prompt and MENU[1].rendered in req.prompt
    assert ep.graph.nodes["n0"].skills == ["sk-a", "sk-b"] and ep.history[-1].repair


def test_rerun_uses_current_inbound_messages() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    for role in ("solver", "researcher", "verifier"):
        add(ep, role)
    ep.apply(Action("ADD_EDGE", source_id="n1", target_id="n2", protocol="feedback"))
    ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n2", protocol="feedback"))
    ep.apply(Action("RERUN_AGENT", node_id="n0"))  # n0's output changes before n2 reruns
    ep.apply(Action("RERUN_AGENT", node_id="n2"))
    req = ex.requests[-1]
    assert [m.source_id for m in req.messages] == ["n0", "n1"]
    assert req.messages[0].text == ep.graph.nodes["n0"].output
    assert "n0#1" in req.messages[0].text
    ep.apply(Action("DROP_AGENT", node_id="n1"))
    ep.apply(Action("RERUN_AGENT", node_id="n2"))
    assert [m.source_id for m in ex.requests[-1].messages] == ["n0"]


def test_unchanged_output_is_reported() -> None:
    ep = episode(executor=FakeExecutor(constant=True))
    add(ep, "solver")
    obs = ep.apply(Action("RERUN_AGENT", node_id="n0"))
    assert obs.had_previous_output and not obs.output_changed and obs.repair


def test_drop_removes_the_node_and_its_edges() -> None:
    ep = episode()
    for role in ("solver", "verifier", "finalizer"):
        add(ep, role)
    ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="feedback"))
    ep.apply(Action("ADD_EDGE", source_id="n1", target_id="n2", protocol="feedback"))
    ep.apply(Action("ADD_EDGE", source_id="n2", target_id="n0", protocol="feedback"))
    obs = ep.apply(Action("DROP_AGENT", node_id="n1"))
    assert obs.result is None
    assert list(ep.graph.nodes) == ["n0", "n2"]
    assert list(ep.graph.edges) == [("n2", "n0")]
    assert not any(a.node_id == "n1" for a in ep.legal_actions())
    assert ep.graph.next_node_id() == "n3"


def test_stop_calls_the_evaluator_once_on_the_output_text() -> None:
    ev = Evaluator()
    ep = episode(executor=FakeExecutor(answers={"n0": "7"}), evaluator=ev)
    add(ep, "solver")
    add(ep, "finalizer")
    ep.apply(Action("SET_OUTPUT", node_id="n1"))
    obs = ep.apply(Action("STOP"))
    assert ev.calls == [("hotpotqa-1", ep.graph.nodes["n1"].output)]
    assert obs.reward == ep.reward == 1.0 and ep.stopped
    with pytest.raises(IllegalActionError):
        ep.apply(Action("STOP"))
    assert len(ev.calls) == 1


def test_seed_key_call_index_counts_per_node() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    add(ep, "solver")
    add(ep, "verifier")
    ep.apply(Action("RERUN_AGENT", node_id="n0"))
    ep.apply(Action("ADD_EDGE", source_id="n1", target_id="n0", protocol="revise"))
    ep.apply(Action("BIND_SKILL", node_id="n1", skill_id="sk-a"))
    assert [r.seed_key for r in ex.requests] == [
        (7, "ep", "n0", 0),
        (7, "ep", "n1", 0),
        (7, "ep", "n0", 1),
        (7, "ep", "n0", 2),
        (7, "ep", "n1", 1),
    ]


def test_node_prompt_follows_the_spec_order() -> None:
    ex = FakeExecutor()
    ep = episode(executor=ex)
    add(ep, "solver")
    add(ep, "researcher", "sk-b")
    ep.apply(Action("ADD_EDGE", source_id="n0", target_id="n1", protocol="revise"))
    req = ex.requests[-1]
    role = CAT.role("researcher")
    parts = [
        role.instruction,
        "A hotpotqa question?",
        MENU[1].rendered,
        f"Input from agent n0 (revise): {ep.graph.nodes['n0'].output}",
        f"{ex.requests[1].previous_output or ''}",
        "Perform your role.",
    ]
    parts[4] = ep.history[1].result.text  # the target's previous output
    positions = [req.prompt.index(p) for p in parts]
    assert positions == sorted(positions)
    assert req.prompt.endswith("Perform your role.")
    assert req.prompt == node_prompt(
        role, task(), req.skills, req.messages, ep.history[1].result.text
    )


def test_mcq_choices_reach_the_prompt() -> None:
    rec = TaskRecord("m1", "t", "medqa", "Which?", "mcq", answers=("B",), choices=("x", "y"))
    prompt = node_prompt(CAT.role("solver"), rec, (), (), None)
    assert "Which?\nA. x\nB. y" in prompt and "previous output" not in prompt


def test_orchestrator_charge_reaches_the_ledger() -> None:
    ep = episode(limits=BudgetLimits(total_tokens=40_000))
    add(ep, "solver")
    before = ep.ledger.tokens
    ep.charge_orchestrator(900, 30)
    assert ep.ledger.tokens == before + 930
    assert ep.ledger.used_fractions()[0] == pytest.approx((before + 930) / 40_000)
    assert public_state(ep)["budget"]["tokens_used_frac"] == pytest.approx((before + 930) / 40_000)
    ep.charge_orchestrator(40_000 - ep.ledger.tokens - 5_000, 0)
    assert ep.legal_actions() == [Action("SET_OUTPUT", node_id="n0")]


def test_node_charges_reach_the_ledger_and_ids_order_the_state() -> None:
    ep = episode(executor=FakeExecutor(tokens=(300, 45)))
    add(ep, "researcher")
    add(ep, "verifier")  # python is not a hotpotqa tool: no tool call
    snap = ep.ledger.snapshot()
    assert (snap["tokens_in"], snap["tokens_out"], snap["model_calls"]) == (600, 90, 2)
    assert snap["tool_calls"] == 1 and snap["wall_s"] == 1.0
    assert sorted(ep.graph.nodes, key=node_index) == list(ep.graph.nodes)


def test_infra_failure_marks_the_episode_unhealthy() -> None:
    ep = episode(executor=FakeExecutor(status="infra_failure"))
    assert ep.healthy
    add(ep, "solver")
    assert not ep.healthy and ep.graph.nodes["n0"].status == "infra_failure"


def test_public_state_lists_the_legal_actions_and_features() -> None:
    ep = episode()
    add(ep, "solver", "sk-a")
    state = public_state(ep, value=0.4, value_change=0.1)
    assert state["legal_actions"] == [a.to_json() for a in ep.legal_actions()]
    assert len(state["features"]) == 30 and state["value"] == 0.4
    assert state["skill_menu"][0] == {"id": "sk-a", "name": "Check units", "trigger": "numbers"}
    assert state["graph"]["nodes"][0]["skills"] == ["sk-a"]
