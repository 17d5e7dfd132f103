"""CollabFlow execution: local episodes through the executor protocol, revisions charged to
the execution budget, the output modes, and the single-writer rule of stateful teams
(docs/collabflow.md §2)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.collabflow.construction import execution_limits
from evosteer_core.collabflow.evidence import Candidate, EvidenceRecord, Holding
from evosteer_core.collabflow.execution import (
    FORMAT_NOTE,
    REVISION_NOTE,
    execute_team,
    integrate,
)
from evosteer_core.collabflow.team import BuildAction, decode, default_profiles, team_spec
from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.prompts import node_prompt
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.executors.base import EnvStep, Evidence, NodeRequest, NodeResult, SkillView
from evosteer_core.infra.config import CollabFlowConfig, default_config
from evosteer_core.sim import SimExecutor, make_sim_suite

CFG = CollabFlowConfig()
CAT = default_catalogue()


def qa_task(gold: str = "paris") -> TaskRecord:
    return TaskRecord("t1", "test", "hotpotqa", "Capital of France?", "qa_em", answers=(gold,))


def build(family: str, *actions: str, interactive: bool = False):
    spec = team_spec(family, interactive, default_profiles())
    return decode([BuildAction.parse(a) for a in (*actions, "stop")], spec), spec


class Scripted:
    """An executor whose reply is a function of the request; it records every request and,
    given an environment, steps it (as any acting agent would)."""

    name = "scripted"

    def __init__(self, reply: Callable[[NodeRequest], tuple[str, tuple[Evidence, ...]]]) -> None:
        self.reply = reply
        self.requests: list[NodeRequest] = []

    def run_node(self, request: NodeRequest) -> NodeResult:
        self.requests.append(request)
        steps = 0
        if request.environment is not None:
            request.environment.step(f"{request.node_id}: go")
            steps = 1
        answer, evidence = self.reply(request)
        text = f"Answer: {answer}" if answer is not None else "no answer"
        return NodeResult(text, answer, tokens_in=100, tokens_out=20, model_calls=1,
                          evidence=evidence, env_steps=steps)

    def make_environment(self, task, seed_key):
        return WriterLog() if task.metric == "interactive" else None


def ledger(total: int = 100_000) -> BudgetLedger:
    return BudgetLedger(BudgetLimits(total_tokens=total))


def by_agent(table: dict[tuple[str, int], tuple[str | None, tuple[Evidence, ...]]]):
    """Replies keyed by (agent, call index)."""
    return lambda req: table[(req.node_id, req.seed_key[3])]


PASS = (Evidence("exec_check", True),)
RET = (Evidence("retrieval", True),)


# ------------------------------------------------------------------------ local episodes
def test_local_episodes_are_node_executions_with_the_roles_tools_limits_and_prompts():
    team, spec = build("hotpotqa", "add_agent(researcher)", "add_agent(solver)",
                       "add_edge(researcher, solver, final_only)", "set_output(single, solver)")
    ex = Scripted(by_agent({("researcher", 0): ("paris", RET), ("solver", 0): ("paris", ())}))
    led = ledger()
    out = execute_team(team, spec, qa_task(), ex, led, (7, "ep"), CFG)
    r, s = ex.requests
    assert (r.node_id, s.node_id) == ("researcher", "solver")
    for req in (r, s):
        role = CAT.role(req.node_id)
        assert req.role == role and req.tools == CAT.tools_for(req.node_id, "hotpotqa")
        assert req.prompt == node_prompt(role, req.task, (), req.messages, None)
        assert req.limits.max_output_tokens == role.max_output_tokens
    assert r.messages == () and [m.source_id for m in s.messages] == ["researcher"]
    assert s.messages[0].protocol == "final_only" and s.messages[0].evidence == RET
    assert r.seed_key == (7, "ep", "researcher", 0)
    assert out.gates == () and out.deliveries == 1 and out.reward == 1.0
    assert led.tokens == 240 and led.model_calls == 2


def test_a_revision_is_one_tool_free_bounded_call_charged_to_the_execution_budget():
    team, spec = build("hotpotqa", "add_agent(researcher)", "add_agent(solver)",
                       "add_edge(researcher, solver, one_way)", "set_output(single, solver)")
    ex = Scripted(by_agent({("researcher", 0): ("paris", RET), ("solver", 0): ("lyon", ()),
                            ("solver", 1): ("Paris", ())}))
    led = ledger()
    cfg = replace(CFG, tau_rev=77)
    out = execute_team(team, spec, qa_task(), ex, led, (0, "ep"), cfg)
    rev = ex.requests[-1]
    assert rev.node_id == "solver" and rev.tools == () and rev.previous_output == "Answer: lyon"
    assert rev.limits.max_model_calls == 1 and rev.limits.max_tool_calls == 0
    assert rev.limits.max_output_tokens == 77 and rev.prompt.endswith(REVISION_NOTE)
    assert rev.messages[0].source_id == "researcher" and "retrieval passed" in rev.messages[0].text
    (g,) = out.gates
    assert (g.branch, g.delta, g.before_answer, g.after_answer) == ("revise", 1, "lyon", "Paris")
    assert (g.sender_correct, g.before_correct, g.after_correct) == (True, False, True)
    assert led.model_calls == 3 and led.tokens == 360
    assert out.holdings["solver"].candidate.version == "solver#1"
    assert out.holdings["solver"].evidence == ()  # the researcher's record stays with its version
    assert out.reward == 1.0


def test_adoption_carries_the_senders_records_and_the_budget_stops_revisions():
    team, spec = build("aime", "add_agent(verifier)", "add_agent(solver)",
                       "add_edge(verifier, solver, one_way)", "set_output(single, solver)")
    task = TaskRecord("t2", "test", "aime", "2+2?", "qa_em", answers=("4",))
    ex = Scripted(by_agent({("verifier", 0): ("4", PASS), ("solver", 0): ("5", ())}))
    out = execute_team(team, spec, task, ex, ledger(), (0, "ep"), CFG)
    assert out.gates[0].branch == "adopt" and out.holdings["solver"] == out.holdings["verifier"]
    assert out.output.version == "verifier#0"
    # both unchecked: a revision is due, but B_exec cannot reserve one more call
    ex = Scripted(by_agent({("verifier", 0): ("3", ()), ("solver", 0): ("5", ())}))
    # per-call reservations at scale 0.01: 204 + 122 tokens; two local calls spend 240
    small = BudgetLedger(BudgetLimits(total_tokens=500, token_scale=0.01))
    out = execute_team(team, spec, task, ex, small, (0, "ep"), CFG)
    assert len(ex.requests) == 2 and out.gates == ()
    assert out.stopped == "execution budget exhausted" and out.output.answer == "5"


def test_the_gate_rule_is_a_checked_config_key():
    assert CollabFlowConfig().gate == "evidence"
    with pytest.raises(ValueError, match="gate: expected one of"):
        CollabFlowConfig(gate="sometimes")


# --------------------------------------------------------------------------- output modes
def hold(agent: str, answer: str | None, kinds=(), version: str | None = None) -> Holding:
    v = version or f"{agent}#0"
    c = Candidate(v, agent, answer, f"Answer: {answer}")
    return Holding.of(c, [EvidenceRecord(f"{v}{k}", v, 0, agent, Evidence(k, True)) for k in kinds])


def test_integrator_best_evidence_class_wins_and_ties_follow_the_documented_rule():
    a, b, c = hold("a", "X"), hold("b", "y", ["retrieval"]), hold("c", "x")
    assert integrate([a, b, c]).answer == "y"  # evidence beats a larger unchecked class
    assert integrate([a, hold("b", "y"), c]).answer == "X"  # tie: more versions; rep = smallest id
    copy = hold("d", "y", version="b#0")  # a copy of b's version counts once
    assert integrate([hold("a", "x"), hold("b", "y"), copy, hold("e", "x")]).agent == "a"
    assert integrate([hold("b", "y"), hold("a", "z")]).agent == "a"  # full tie: smaller id
    assert integrate([hold("a", None)]) is None
    # a class pools its records: the representative earns a check another member ran on it
    checked = EvidenceRecord("e", "b#0", 0, "b", Evidence("exec_check", True, subject="z"))
    z2 = Holding.of(Candidate("b#0", "b", "z", ""), [checked])
    assert integrate([hold("a", "z"), z2, hold("c", "w", ["retrieval"])]).agent == "a"


def test_verifier_output_checks_every_candidate():
    team, spec = build("aime", "add_agent(solver)", "add_agent(tool_user)", "add_agent(verifier)",
                       "set_output(verifier, verifier)")
    task = TaskRecord("t2", "test", "aime", "2+2?", "qa_em", answers=("4",))
    ex = Scripted(by_agent({("solver", 0): ("5", ()), ("tool_user", 0): ("4", ()),
                            ("verifier", 0): ("6", ()), ("verifier", 1): ("4", PASS)}))
    out = execute_team(team, spec, task, ex, ledger(), (0, "ep"), CFG)
    check = ex.requests[-1]
    assert check.node_id == "verifier" and check.tools == ("python",)
    assert [m.answer for m in check.messages] == ["5", "4"]
    assert check.previous_output == "Answer: 6"
    assert out.output.answer == "4" and out.reward == 1.0 and out.calls[-1].kind == "output"


def test_formatter_output_changes_the_format_never_the_answer():
    team, spec = build("hotpotqa", "add_agent(solver)", "add_agent(finalizer)",
                       "add_edge(solver, finalizer, one_way)", "set_output(formatter, finalizer)")
    replies = {("solver", 0): ("paris", PASS), ("finalizer", 0): ("lyon", ()),
               ("finalizer", 1): ("  PARIS ", ())}
    ex = Scripted(by_agent(replies))
    out = execute_team(team, spec, qa_task(), ex, ledger(), (0, "ep"), CFG)
    fmt = ex.requests[-1]
    assert fmt.tools == () and fmt.prompt.endswith(FORMAT_NOTE) and fmt.limits.max_tool_calls == 0
    assert out.output.text == "Answer:   PARIS " and out.output.version == "finalizer#1"
    ex = Scripted(by_agent({**replies, ("finalizer", 1): ("rome", ())}))
    out = execute_team(team, spec, qa_task(), ex, ledger(), (0, "ep"), CFG)
    assert out.output.answer == "paris"  # the formatter tried to resolve: its input stands


# ------------------------------------------------------------------------ single writer
class WriterLog:
    """An interactive environment that records who wrote to it and refuses overlapping
    writes (serial completion)."""

    max_steps = 50

    def __init__(self) -> None:
        self.steps_done = 0
        self.done = False
        self.success = False
        self.writers: list[str] = []
        self._busy = False

    def observe(self) -> str:
        return f"step {self.steps_done}"

    def step(self, command: str) -> EnvStep:
        assert not self._busy, "overlapping writes"
        self._busy = True
        self.writers.append(command.split(":")[0])
        self.steps_done += 1
        self.done = self.success = self.steps_done >= 2
        self._busy = False
        return EnvStep("ok", True, self.done, self.success)

    def phase_fraction(self) -> float:
        return 0.0


def test_only_the_executor_writes_and_the_advisors_advice_reaches_it():
    team, spec = build("alfworld", "add_agent(actor)", "add_agent(planner)", "add_agent(checker)",
                       "add_edge(planner, actor, one_way)", "add_edge(checker, actor, one_way)",
                       "set_output(single, actor)", interactive=True)
    task = TaskRecord("g", "test", "alfworld", "Put the mug away.", "interactive")
    def reply(req: NodeRequest) -> tuple[str, tuple[Evidence, ...]]:
        if req.node_id == "actor":
            return "done", ()
        seen = re.search(r"Current observation:\n(step \d+)", req.prompt).group(1)
        return f"{req.node_id} saw {seen}", ()

    ex = Scripted(reply)
    out = execute_team(team, spec, task, ex, ledger(), (0, "ep"), replace(CFG, r_comm=3))
    env = out.environment
    assert env.writers == ["actor", "actor"] and out.reward == 1.0  # won after 2 of 3 rounds
    kinds = [(r.node_id, r.environment is not None) for r in ex.requests]
    assert kinds == [("checker", False), ("planner", False), ("actor", True)] * 2
    for i, req in enumerate(ex.requests):
        if req.node_id == "actor":
            # this round's handoffs, in the fixed agent order, are the writer's messages
            assert [m.source_id for m in req.messages] == ["checker", "planner"]
            assert [m.text for m in req.messages] == [
                f"Answer: {a} saw step {i // 3}" for a in ("checker", "planner")
            ]
        else:  # advisors: read-only and tool-free; they see the current observation
            assert req.tools == () and req.limits.max_tool_calls == 0
            assert f"Current observation:\nstep {i // 3}" in req.prompt
    assert [c.kind for c in out.calls] == ["handoff", "handoff", "act"] * 2


class Watch(SimExecutor):
    """The sim executor, noting for every call whether it carried the environment."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, bool, int]] = []

    def run_node(self, request: NodeRequest) -> NodeResult:
        result = super().run_node(request)
        self.seen.append((request.node_id, request.environment is not None, result.env_steps))
        return result


def test_two_agents_never_both_write_on_the_sim():
    team, spec = build("alfworld", "add_agent(actor)", "add_agent(planner)",
                       "add_edge(planner, actor, one_way)", "set_output(single, actor)",
                       interactive=True)
    for task in make_sim_suite(6, 0, "train"):
        if task.family != "alfworld":
            continue
        ex = Watch()
        seen = ex.seen
        out = execute_team(team, spec, task, ex, ledger(), (0, task.record_id), CFG)
        assert all(has_env == (agent == "actor") for agent, has_env, _ in seen)
        assert all(steps == 0 for agent, _, steps in seen if agent != "actor")
        assert out.environment.steps_done == sum(s for _, _, s in seen)
        assert out.reward == evaluate(task, out.output_text, out.environment)


# -------------------------------------------------------------------------------- on sim
def test_sim_team_runs_are_deterministic_and_stay_within_the_execution_budget():
    team, spec = build("aime", "add_agent(tool_user)", "add_agent(verifier)", "add_agent(solver)",
                       "add_edge(tool_user, verifier, final_only)",
                       "add_edge(verifier, solver, interactive)", "set_output(integrator)")
    cfg = replace(default_config(), method="collabflow", collabflow=CFG)  # tiny-sim's budget
    limits = execution_limits(cfg)
    assert limits.total_tokens == cfg.budget.total_tokens - CFG.construction_tokens
    for task in make_sim_suite(8, 1, "train"):
        if task.family != "aime":
            continue
        runs = [execute_team(team, spec, task, SimExecutor(), BudgetLedger(limits), (1, task.record_id), CFG)
                for _ in range(2)]
        a, b = runs
        assert (a.output, a.gates, a.calls) == (b.output, b.gates, b.calls)
        assert a.ledger.tokens <= limits.total_tokens
        assert a.ledger.tokens == sum(c.tokens_in + c.tokens_out for c in a.calls)
        assert a.reward == evaluate(task, a.output_text)


def test_bound_skills_reach_the_agents_prompt_and_a_missing_one_is_named():
    spec = replace(team_spec("hotpotqa", False, default_profiles()), skills=("s1",))
    team = decode([BuildAction.parse(a) for a in (
        "add_agent(solver)", "bind_skill(solver, s1)", "set_output(single, solver)", "stop")], spec)
    view = SkillView("s1", "check units", "Always check the units.")
    ex = Scripted(by_agent({("solver", 0): ("paris", ())}))
    execute_team(team, spec, qa_task(), ex, ledger(), (0, "ep"), CFG, skills={"s1": view})
    assert ex.requests[0].skills == (view,) and "Always check the units." in ex.requests[0].prompt
    with pytest.raises(ValueError, match=r"skills \['s1'\] are bound to 'solver'"):
        execute_team(team, spec, qa_task(), ex, ledger(), (0, "ep"), CFG)
