"""The execution feature vector (docs/method.md §1.4): one test per index on hand-built states."""

from __future__ import annotations

import numpy as np
import pytest

from evosteer_core.episode.actions import KINDS, Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.features import FEATURE_NAMES, N_FEATURES, execution_features
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.executors.base import (
    Environment,
    EnvStep,
    NodeRequest,
    NodeResult,
    SkillView,
    ToolUse,
)
from evosteer_core.infra.seeding import numpy_rng

CAT = default_catalogue()
MENU = (
    SkillView("sk-a", "A", "Skill: A\nUse when: a"),
    SkillView("sk-b", "B", "Skill: B\nUse when: b"),
)


class Env:
    """An environment whose counters the test sets by hand."""

    def __init__(self) -> None:
        self.max_steps, self.steps_done, self.done, self.success = 8, 0, False, False
        self.phase = 0.0

    def observe(self) -> str:
        return ""

    def step(self, command: str) -> EnvStep:
        self.steps_done += 1
        return EnvStep("", True, self.done, self.success)

    def phase_fraction(self) -> float:
        return self.phase


class Scripted:
    """Returns queued results in order (then a default answered result)."""

    name = "scripted"

    def __init__(self, *results: NodeResult) -> None:
        self.queue = list(results)
        self.calls = 0

    def run_node(self, request: NodeRequest) -> NodeResult:
        self.calls += 1
        if self.queue:
            return self.queue.pop(0)
        return NodeResult(f"out {self.calls}\nAnswer: 1", "1", tokens_in=10, model_calls=1)

    def make_environment(self, task: TaskRecord, seed_key: tuple[int, str]) -> Environment | None:
        return Env()


def res(text: str, answer: str | None = "x", **kw) -> NodeResult:
    return NodeResult(text, answer, **kw)


def make(
    *results: NodeResult, family: str = "hotpotqa", limits: BudgetLimits | None = None, menu=MENU
) -> Episode:
    metric = {"hotpotqa": "qa_em", "alfworld": "interactive"}[family]
    rec = TaskRecord("r1", "t", family, "Q?", metric)
    return Episode(
        rec, CAT, limits or BudgetLimits(), Scripted(*results), lambda *_: 0.0, menu=menu
    )


def run(ep: Episode, *actions: str | Action) -> Episode:
    for a in actions:
        ep.apply(a if isinstance(a, Action) else Action.from_json(a))
    return ep


def add(role: str, nid: str, skill: str | None = None) -> Action:
    return Action("ADD_AGENT", node_id=nid, role_id=role, skill_id=skill)


def edge(src: str, tgt: str, protocol: str) -> Action:
    return Action("ADD_EDGE", source_id=src, target_id=tgt, protocol=protocol)


def rerun(nid: str) -> Action:
    return Action("RERUN_AGENT", node_id=nid)


def f(ep: Episode) -> np.ndarray:
    return execution_features(ep)


def test_shape_dtype_and_names() -> None:
    vec = f(make())
    assert vec.shape == (30,) and vec.dtype == np.float32 and N_FEATURES == 30
    assert len(FEATURE_NAMES) == len(set(FEATURE_NAMES)) == 30
    assert FEATURE_NAMES[5:12] == tuple(f"last_action_{k.lower()}" for k in KINDS)
    assert not vec.any()


def test_f00_node_count() -> None:
    ep = run(make(), add("solver", "n0"), add("solver", "n1"), add("verifier", "n2"))
    assert f(ep)[0] == pytest.approx(3 / 4)
    run(ep, Action("DROP_AGENT", node_id="n1"))
    assert f(ep)[0] == pytest.approx(2 / 3)


def test_f01_edge_density() -> None:
    ep = run(make(), add("solver", "n0"))
    assert f(ep)[1] == 0.0  # n(n-1) = 0
    run(ep, add("solver", "n1"), add("verifier", "n2"), edge("n0", "n1", "feedback"))
    run(ep, edge("n2", "n0", "revise"))
    assert f(ep)[1] == pytest.approx(2 / 6)


def test_f02_role_diversity() -> None:
    ep = run(make(), add("solver", "n0"), add("solver", "n1"), add("verifier", "n2"))
    assert len(ep.roles) == 6
    assert f(ep)[2] == pytest.approx(2 / 6)
    inter = run(make(family="alfworld"), add("solver", "n0"), add("planner", "n1"))
    assert len(inter.roles) == 5  # no tool_user without tools
    assert f(inter)[2] == pytest.approx(2 / 5)


def test_f03_bound_skill_fraction() -> None:
    ep = run(make(), add("solver", "n0", "sk-a"), add("verifier", "n1"), add("solver", "n2"))
    run(ep, Action("BIND_SKILL", node_id="n1", skill_id="sk-a"))
    run(ep, Action("BIND_SKILL", node_id="n1", skill_id="sk-b"))
    assert f(ep)[3] == pytest.approx(3 / (3 * 2))
    bare = run(make(menu=()), add("solver", "n0"))
    assert f(bare)[3] == 0.0
    bare.graph.nodes["n0"].skills.append("retired-skill")  # hand-built: menu of size 0 → 1
    assert f(bare)[3] == 1.0


def test_f04_action_count() -> None:
    ep = run(make(), add("solver", "n0"), rerun("n0"), rerun("n0"))
    assert f(ep)[4] == pytest.approx(3 / 4)


LAST_OF_KIND = {
    "ADD_AGENT": [add("solver", "n0")],
    "ADD_EDGE": [add("solver", "n0"), add("solver", "n1"), edge("n0", "n1", "feedback")],
    "BIND_SKILL": [add("solver", "n0"), Action("BIND_SKILL", node_id="n0", skill_id="sk-a")],
    "SET_OUTPUT": [add("solver", "n0"), Action("SET_OUTPUT", node_id="n0")],
    "RERUN_AGENT": [add("solver", "n0"), rerun("n0")],
    "DROP_AGENT": [add("solver", "n0"), add("solver", "n1"), Action("DROP_AGENT", node_id="n1")],
    "STOP": [add("solver", "n0"), Action("SET_OUTPUT", node_id="n0"), Action("STOP")],
}


@pytest.mark.parametrize(("index", "kind"), [(5 + i, k) for i, k in enumerate(KINDS)])
def test_f05_to_f11_last_action_one_hot(index: int, kind: str) -> None:
    vec = f(run(make(), *LAST_OF_KIND[kind]))
    expected = np.zeros(7, dtype=np.float32)
    expected[index - 5] = 1.0
    np.testing.assert_array_equal(vec[5:12], expected)


def test_f12_repair_attempted() -> None:
    ep = run(make(), add("solver", "n0"), add("verifier", "n1"))
    assert f(ep)[12] == 0.0
    assert f(run(ep, edge("n0", "n1", "feedback")))[12] == 0.0
    assert f(run(ep, edge("n1", "n0", "revise")))[12] == 1.0
    assert f(run(ep, Action("SET_OUTPUT", node_id="n0")))[12] == 0.0
    assert f(run(ep, rerun("n1")))[12] == 1.0
    assert f(run(ep, Action("BIND_SKILL", node_id="n1", skill_id="sk-b")))[12] == 1.0


def test_f13_repair_changed_output() -> None:
    same = res("A\nAnswer: 3", "3")
    ep = run(make(same, same, res("B\nAnswer: 4", "4")), add("solver", "n0"), rerun("n0"))
    assert f(ep)[12] == 1.0 and f(ep)[13] == 0.0
    assert f(run(ep, rerun("n0")))[13] == 1.0
    fresh = run(make(), add("solver", "n0"))  # changed output, but not a repair
    assert f(fresh)[18] == 1.0 and f(fresh)[13] == 0.0


def test_f14_last_execution_failed() -> None:
    ep = make(res("ok"), res("", None, status="timeout"), res("fixed"))
    run(ep, add("solver", "n0"))
    assert f(ep)[14] == 0.0
    run(ep, add("verifier", "n1"))
    assert f(ep)[14] == 1.0
    # non-executing actions keep the last execution's outcome
    run(ep, Action("SET_OUTPUT", node_id="n0"), edge("n0", "n1", "feedback"))
    assert f(ep)[14] == 1.0
    run(ep, rerun("n1"))
    assert f(ep)[14] == 0.0


def test_f14_is_zero_without_any_execution() -> None:
    ep = make(limits=BudgetLimits(total_tokens=100))
    run(ep, Action("STOP"))  # finalized with no node: the history has no execution
    assert len(ep.history) == 1 and f(ep)[14] == 0.0


@pytest.mark.parametrize("status", ["failed", "parse_error", "schema_invalid", "truncated"])
def test_f14_every_non_ok_status_counts(status: str) -> None:
    ep = run(make(res("t", None, status=status)), add("solver", "n0"))
    assert f(ep)[14] == 1.0


def test_f15_answered_fraction() -> None:
    ep = make(res("a", "1"), res("thinking...", None), res("c", "2"))
    run(ep, add("solver", "n0"), add("planner", "n1"), add("solver", "n2"))
    assert f(ep)[15] == pytest.approx(2 / 3)
    run(ep, Action("DROP_AGENT", node_id="n1"))
    assert f(ep)[15] == 1.0


def test_f16_output_selected() -> None:
    ep = run(make(), add("solver", "n0"))
    assert f(ep)[16] == 0.0
    assert f(run(ep, Action("SET_OUTPUT", node_id="n0")))[16] == 1.0


def test_f17_answer_agreement() -> None:
    ep = make(
        res("so \\boxed{7}", "7"),
        res("Thus the answer is 7", "7"),
        res("Answer:   7 ", "7"),
        res("\\boxed{8}", "8"),
        res("7", None),  # unanswered: excluded
    )
    run(ep, *(add("solver", f"n{i}") for i in range(5)))
    assert f(ep)[17] == pytest.approx(3 / 6)


def test_f17_normalization_casefolds_and_collapses_whitespace() -> None:
    ep = make(res("Answer: Paris   France", "Paris France"), res("answer: PARIS france", "p"))
    run(ep, add("solver", "n0"))
    assert f(ep)[17] == 0.0  # fewer than two answers
    run(ep, add("solver", "n1"))
    assert f(ep)[17] == 1.0


def test_f18_last_output_changed() -> None:
    same = res("A", "a")
    ep = run(make(same, same), add("solver", "n0"))
    assert f(ep)[18] == 1.0
    assert f(run(ep, rerun("n0")))[18] == 0.0


def test_f19_communication_delivered() -> None:
    ep = run(make(), add("solver", "n0"), add("verifier", "n1"), edge("n0", "n1", "feedback"))
    assert f(ep)[19] == 0.0  # a feedback edge delivers at the next execution
    assert f(run(ep, rerun("n1")))[19] == 1.0
    assert f(run(ep, rerun("n0")))[19] == 0.0  # n0 has no inbound edge


def test_f20_communication_revised_an_output() -> None:
    ep = run(make(), add("solver", "n0"), add("verifier", "n1"), edge("n0", "n1", "revise"))
    assert f(ep)[19] == 1.0 and f(ep)[20] == 1.0
    same = res("S", "s")
    ep2 = run(make(res("x"), same, same), add("solver", "n0"), add("verifier", "n1"))
    run(ep2, edge("n0", "n1", "revise"))  # delivered, but the output did not change
    assert f(ep2)[19] == 1.0 and f(ep2)[20] == 0.0


def test_f20_needs_a_previous_output() -> None:
    ep = run(make(), add("solver", "n0"), add("verifier", "n1"))
    ep.graph.nodes["n1"].output = None  # hand-built: the target never produced an output
    run(ep, edge("n0", "n1", "revise"))
    assert f(ep)[19] == 1.0 and f(ep)[18] == 1.0 and f(ep)[20] == 0.0


def test_f21_env_step_fraction() -> None:
    ep = make(family="alfworld")
    ep.environment.steps_done = 3
    assert f(ep)[21] == pytest.approx(3 / 8)
    ep.environment.max_steps = 0
    assert f(ep)[21] == 0.0
    assert f(make())[21:24].tolist() == [0.0, 0.0, 0.0]  # no environment


def test_f22_env_phase_fraction() -> None:
    ep = make(family="alfworld")
    ep.environment.phase = 0.25
    assert f(ep)[22] == 0.25
    ep.environment.phase = 1.7
    assert f(ep)[22] == 1.0


def test_f23_env_terminal() -> None:
    ep = make(family="alfworld")
    assert f(ep)[23] == 0.0
    ep.environment.done = True
    assert f(ep)[23] == 1.0


def test_f24_last_call_succeeded() -> None:
    good, bad = ToolUse("search", "q", "r", True), ToolUse("search", "q", "", False)
    ep = make(res("a", tool_uses=(bad, good)), res("b"))
    run(ep, add("researcher", "n0"))
    assert f(ep)[24:26].tolist() == [1.0, 0.0]
    run(ep, Action("SET_OUTPUT", node_id="n0"))
    assert f(ep)[24:26].tolist() == [1.0, 0.0]  # still the last execution's call
    run(ep, add("solver", "n1"))  # an execution with no tool or environment call
    assert f(ep)[24:26].tolist() == [0.0, 0.0]


def test_f25_last_call_failed_environment_first() -> None:
    good, bad = ToolUse("search", "q", "r", True), ToolUse("python", "q", "", False)
    ep = make(res("a", tool_uses=(good, bad)))
    assert f(run(ep, add("researcher", "n0")))[24:26].tolist() == [0.0, 1.0]
    inter = make(res("e", env_steps=2, env_last_ok=False, tool_uses=(good,)), family="alfworld")
    assert f(run(inter, add("solver", "n0")))[24:26].tolist() == [0.0, 1.0]
    inter2 = make(res("e", env_steps=0, env_last_ok=None, tool_uses=(bad,)), family="alfworld")
    assert f(run(inter2, add("solver", "n0")))[24:26].tolist() == [0.0, 1.0]


LIMITS = BudgetLimits(
    total_tokens=2000, tool_calls=10, wall_time_s=10.0, model_calls=8, token_scale=0.001
)


def _ledger_episode() -> Episode:
    step = res("a", tokens_in=200, tokens_out=40, model_calls=3, tool_calls=2, latency_s=1.5)
    ep = run(make(step, step, limits=LIMITS), add("researcher", "n0"), rerun("n0"))
    ep.charge_orchestrator(100, 20)
    return ep


def test_f26_tokens_used() -> None:
    assert f(_ledger_episode())[26] == pytest.approx((2 * 240 + 120) / 2000)


def test_f27_tool_calls_used() -> None:
    assert f(_ledger_episode())[27] == pytest.approx(4 / 10)


def test_f28_wall_time_used() -> None:
    assert f(_ledger_episode())[28] == pytest.approx(3.0 / 10)


def test_f29_model_calls_used() -> None:
    ep = _ledger_episode()
    assert f(ep)[29] == pytest.approx(6 / 8)
    run(ep, rerun("n0"))  # default result: one more call (7/8), then 3 more would overflow
    ep.ledger.charge_node(res("z", model_calls=3), "n0")
    assert f(ep)[29] == 1.0


def test_random_states_stay_in_the_unit_box() -> None:
    rng = numpy_rng("test_features", "unit_box")
    for _ in range(5):
        ep = make(family=str(rng.choice(["hotpotqa", "alfworld"])), limits=LIMITS)
        while not ep.stopped:
            vec = f(ep)
            assert vec.shape == (30,) and ((vec >= 0) & (vec <= 1)).all()
            legal = ep.legal_actions()
            ep.apply(legal[rng.integers(len(legal))])
        assert f(ep)[11] == 1.0
