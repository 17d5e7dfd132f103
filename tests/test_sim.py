"""SIMULATED executor and suite: determinism, limits, tokens, environment, suite, skills."""

from __future__ import annotations

import math
from importlib import resources

import pytest
import yaml

from evosteer_core.benchmarks.metrics import normalize_squad
from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.episode.actions import Action
from evosteer_core.episode.answers import cued_span
from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.prompts import node_prompt
from evosteer_core.episode.records import FAMILIES
from evosteer_core.episode.roles import catalogue_from_dict, default_catalogue
from evosteer_core.episode.runtime import Episode
from evosteer_core.executors.base import (
    CallLimits,
    Environment,
    Executor,
    Message,
    NodeRequest,
    SkillView,
)
from evosteer_core.infra.config import load_config
from evosteer_core.sim import (
    DEFAULT_MODEL,
    LATENT_SKILLS,
    SKILL_EFFECTS,
    SimEnvironment,
    SimExecutor,
    make_sim_record,
    make_sim_suite,
    skill_effect,
)

CAT = default_catalogue()


def request(
    task,
    role_id: str = "solver",
    *,
    call: int = 0,
    key: str | None = None,
    seed: int = 0,
    skills: tuple[SkillView, ...] = (),
    messages: tuple[Message, ...] = (),
    previous: str | None = None,
    limits: CallLimits | None = None,
    environment: Environment | None = None,
    node: str = "n0",
) -> NodeRequest:
    """A NodeRequest as the runtime builds it (reference limits unless given)."""
    role = CAT.role(role_id)
    interactive = CAT.family(task.family).interactive
    lim = limits or BudgetLedger(BudgetLimits()).call_limits(role, interactive, node)
    return NodeRequest(
        task=task,
        node_id=node,
        role=role,
        tools=CAT.tools_for(role_id, task.family),
        skills=skills,
        messages=messages,
        previous_output=previous,
        prompt=node_prompt(role, task, skills, messages, previous),
        limits=lim,
        seed_key=(seed, key or task.record_id, node, call),
        environment=environment,
    )


def test_sim_executor_satisfies_protocol():
    ex = SimExecutor()
    assert isinstance(ex, Executor) and ex.name == "sim"
    qa = make_sim_record("aime", 0, 0, "train")
    alf = make_sim_record("alfworld", 0, 0, "train")
    assert ex.make_environment(qa, (0, "k")) is None
    env = ex.make_environment(alf, (0, "k"))
    assert isinstance(env, Environment) and env.max_steps == 50 and env.steps_done == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_same_seed_key_gives_identical_results(family):
    ex = SimExecutor()
    task = make_sim_record(family, 3, 7, "train")
    for role in [r.role_id for r in CAT.roles_for(family)]:
        if family == "alfworld":
            results = []
            for _ in range(2):
                env = ex.make_environment(task, (0, "ep"))
                results.append((ex.run_node(request(task, role, environment=env)), env.phase))
            assert results[0] == results[1]
        else:
            assert ex.run_node(request(task, role)) == ex.run_node(request(task, role))


def test_rerun_call_index_resamples():
    ex = SimExecutor()
    tasks = make_sim_suite(40, 0, "train")
    aime = [t for t in tasks if t.family == "aime"]
    changed = sum(
        ex.run_node(request(t, call=0)).answer != ex.run_node(request(t, call=1)).answer
        for t in aime
    )
    assert changed >= 8  # independent draws at p ~ 0.4 disagree on about half the tasks


def test_answer_text_format_and_extraction():
    ex = SimExecutor()
    for t in make_sim_suite(5, 1, "train"):
        if t.family == "alfworld":
            continue
        res = ex.run_node(request(t))
        if res.status == "ok":
            assert res.text.rstrip().splitlines()[-1] == f"Answer: {res.answer}"
            assert cued_span(res.text) == res.answer
        else:
            assert res.answer is None


def test_planner_states_no_answer_and_names_key_step_sometimes():
    ex = SimExecutor()
    tasks = [t for t in make_sim_suite(100, 0, "train") if t.family == "hotpotqa"]
    plans = [ex.run_node(request(t, "planner")) for t in tasks]
    assert all(p.answer is None and p.text.startswith("Plan:") for p in plans)
    named = sum(t.meta["key_step"] in p.text for t, p in zip(tasks, plans, strict=True))
    q = DEFAULT_MODEL.families["hotpotqa"].plan_quality
    assert abs(named / len(tasks) - q) < 0.15


def test_limits_respected_and_failures_reported():
    ex = SimExecutor()
    task = make_sim_record("aime", 1, 0, "train")
    no_calls = CallLimits(0, 3, 20480, 12288)
    res = ex.run_node(request(task, "verifier", limits=no_calls))
    assert res.status == "failed" and res.model_calls == 0 and res.tokens_in == 0
    tiny_in = CallLimits(4, 3, 10, 12288)
    res = ex.run_node(request(task, limits=tiny_in))
    assert res.status == "failed" and res.failure_kind == "context_overflow"
    tiny_out = CallLimits(1, 0, 20480, 50)
    res = ex.run_node(request(task, limits=tiny_out))
    assert res.status == "truncated" and res.answer is None and res.tokens_out <= 50
    # tool calls never exceed the limit, and each needs a model call to read its result
    msg = (Message("n9", "revise", "Answer: 1", "1"),)
    for cap_tools, cap_calls in [(0, 4), (1, 4), (3, 2), (3, 4)]:
        lim = CallLimits(cap_calls, cap_tools, 20480, 12288)
        res = ex.run_node(request(task, "verifier", messages=msg, limits=lim))
        assert res.tool_calls <= min(cap_tools, cap_calls - 1)
        assert res.model_calls <= cap_calls


def test_token_accounting_matches_formula_and_grows_with_messages():
    ex = SimExecutor()
    m = DEFAULT_MODEL
    task = make_sim_record("medqa", 2, 0, "train")
    req = request(task)
    res = ex.run_node(req)
    prompt_tokens = math.ceil(len(req.prompt) / m.chars_per_token)
    assert res.model_calls == 1 and res.tokens_in == prompt_tokens
    mean_out = m.out_tokens["solver"] * m.families["medqa"].out_tokens
    assert 0.5 * mean_out - 1 <= res.tokens_out <= 1.5 * mean_out + 1
    long_msg = (Message("n1", "feedback", "x " * 2000, "abc"),)
    assert ex.run_node(request(task, messages=long_msg)).tokens_in > res.tokens_in + 900
    # a verifier's tool results grow the input of its later model calls
    msgs = (Message("n0", "revise", "Answer: 5", "5"),)
    vreq = request(make_sim_record("aime", 2, 0, "train"), "verifier", messages=msgs)
    v = ex.run_node(vreq)
    p = math.ceil(len(vreq.prompt) / m.chars_per_token)
    k = v.model_calls
    assert v.tokens_in == k * p + m.tool_result_tokens * k * (k - 1) // 2
    assert v.latency_s > 0


def test_statuses_occur_at_small_rates():
    ex = SimExecutor()
    tasks = [t for t in make_sim_suite(200, 0, "train") if t.family != "alfworld"]
    statuses = [ex.run_node(request(t)).status for t in tasks]
    bad = sum(s != "ok" for s in statuses) / len(statuses)
    assert 0.0 < bad < 0.06


def test_environment_dynamics():
    task = make_sim_record("alfworld", 4, 0, "train")
    env = SimEnvironment(task, (0, "k"), slip=0.0)
    goals = list(task.meta["subgoals"])
    assert env.step("fly to the moon").ok is False and env.phase == 0
    assert env.step("look").ok is True and env.phase == 0
    for i, g in enumerate(goals[: env.carry_phase]):
        env.step(g)
        assert env.phase_fraction() == pytest.approx((i + 1) / len(goals))
    before = env.phase
    env.step(f"put {env.obj} 1 in/on nowhere 9")  # misplacing the carried object undoes a step
    assert env.phase == before - 1
    for g in goals[env.phase :]:
        last = env.step(g)
    assert last.done and last.success and env.done and env.success
    assert env.step("look").ok is False  # no more steps once done
    timeout = SimEnvironment(task, (0, "k"), slip=0.0)
    for _ in range(timeout.max_steps):
        timeout.step("look")
    assert timeout.done and not timeout.success and timeout.steps_done == timeout.max_steps


def test_interactive_node_respects_step_limits_and_reports_steps():
    ex = SimExecutor()
    for i in range(20):
        task = make_sim_record("alfworld", i, 0, "train")
        env = ex.make_environment(task, (0, "ep"))
        lim = CallLimits(35, 0, 20480, 12288, max_env_steps=7)
        res = ex.run_node(request(task, limits=lim, environment=env))
        assert res.env_steps == env.steps_done <= 7
        assert res.model_calls == max(1, res.env_steps)
        assert res.env_last_ok in (True, False)
        assert (res.answer == "done") == env.success or res.status != "ok"
    # a verifier with nothing to check takes no steps
    env = ex.make_environment(task, (0, "ep"))
    res = ex.run_node(request(task, "verifier", environment=env))
    assert res.env_steps == 0 and env.steps_done == 0


def test_suite_shape_determinism_and_split_disjointness():
    train = make_sim_suite(30, 5, "train")
    held = make_sim_suite(30, 5, "heldout")
    assert len(train) == 6 * 30 and {t.family for t in train} == set(FAMILIES)
    assert train == make_sim_suite(30, 5, "train")
    assert [t.meta for t in train] == [t.meta for t in make_sim_suite(30, 5, "train")]
    assert not {t.record_id for t in train} & {t.record_id for t in held}
    assert not {t.prompt for t in train} & {t.prompt for t in held}
    for t in train + held:
        assert t.source == "sim" and t.prompt.startswith(f"[sim {t.family} ")
        assert t.metric == ("interactive" if t.family == "alfworld" else "qa_em")
        assert 0.0 <= t.meta["difficulty"] <= 1.0
        for a in t.answers:
            assert normalize_squad(a) == a  # answers survive SQuAD normalization unchanged
        if t.family == "medqa":
            assert t.answers[0] in t.choices and len(t.choices) == 6
        if t.metric == "qa_em":
            wrong = [t.meta["trap_answer"], *t.meta["distractors"]]
            assert t.answers[0] not in wrong and len(set(wrong)) == len(wrong)
    with pytest.raises(ValueError, match="split"):
        make_sim_suite(1, 0, "")
    with pytest.raises(ValueError, match="family"):
        make_sim_record("chess", 0, 0, "train")


def test_rewards_score_sim_records_by_em_and_environment_success():
    task = make_sim_record("nq_open", 0, 0, "train")
    gold = task.answers[0]
    assert evaluate(task, f"reasoning\nAnswer: {gold.upper()}.", None) == 1.0
    assert evaluate(task, f"The answer is the {gold}", None) == 1.0
    assert evaluate(task, f"no cue\n{gold}", None) == 1.0
    assert evaluate(task, "Answer: something else", None) == 0.0
    assert evaluate(task, None, None) == 0.0
    alf = make_sim_record("alfworld", 0, 0, "train")
    env = SimEnvironment(alf, (0, "k"), slip=0.0)
    assert evaluate(alf, "Answer: done", env) == 0.0
    for g in alf.meta["subgoals"]:
        env.step(g)
    assert evaluate(alf, None, env) == 1.0


def test_latent_skills_are_admissible_and_have_signed_effects():
    from evosteer_core.skills.filters import check_claims, check_style
    from evosteer_core.skills.skill import Skill

    names = [s["name"] for s in LATENT_SKILLS]
    assert len(set(names)) == len(names) and set(names) == set(SKILL_EFFECTS)
    for data in LATENT_SKILLS:
        skill = Skill.from_dict({**data, "family": "aime"})
        assert check_style(skill) is None, data["name"]
        assert check_claims(skill) is None, data["name"]
    for fam in FAMILIES:
        effects = [skill_effect(n, fam) for n in names]
        assert max(effects) >= 0.8 and min(effects) <= -0.6 and 0.0 in effects, fam
    assert skill_effect("an unknown skill", "aime") == 0.0
    with pytest.raises(ValueError, match="family"):
        skill_effect(names[0], "chess")


def test_draws_equal_derive_seed_of_seed_key_record_and_purpose():
    from evosteer_core.infra.seeding import derive_seed
    from evosteer_core.sim.executor import _Call

    task = make_sim_record("aime", 0, 0, "train")
    req = request(task, call=2)
    call = _Call(req, DEFAULT_MODEL.families["aime"])
    expected = derive_seed(*req.seed_key, task.record_id, "own", "correct") / 2**63
    assert call.u("own", "correct") == expected


def test_interactive_episodes_can_stop_when_their_steps_are_spent():
    """Under tiny-sim's limits (12 steps per episode, 6 and 9 model calls per node) no node
    takes more than its per-node allowance over all its executions, and STOP becomes legal as
    soon as no node can take a step, instead of after a run of zero-step reruns."""
    limits = load_config(None).budget
    stopped_early = 0
    for i in range(12):
        task = make_sim_record("alfworld", i, 0, "train")
        ep = Episode(task, CAT, limits, SimExecutor(), lambda t, x, e: 0.0, episode_key=f"k{i}")
        ep.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"))
        ep.apply(Action("SET_OUTPUT", node_id="n0"))
        while Action("STOP") not in ep.legal_actions() and not ep.exhausted():
            rerun = Action("RERUN_AGENT", node_id="n0")
            if rerun in ep.legal_actions():
                ep.apply(rerun)
            else:
                ep.apply(Action("ADD_AGENT", node_id=ep.graph.next_node_id(), role_id="solver"))
        steps: dict[str, int] = {}
        for o in ep.history:
            if o.result is not None:
                steps[o.node_id] = steps.get(o.node_id, 0) + o.result.env_steps
        assert max(steps.values()) <= limits.node_env_steps
        if not ep.environment.done:
            assert ep.ledger.env_steps == limits.env_steps
            stopped_early += not ep.exhausted()
    assert stopped_early >= 1


def test_a_suite_is_built_once_a_process_and_each_caller_gets_its_own_list():
    """Every stage task's world asks for the same suite: it is built once and shared (the
    records are frozen), and a caller changing its list changes no other caller's."""
    expected = [make_sim_record(f, i, 5, "memo") for f in FAMILIES for i in range(3)]
    first, second = make_sim_suite(3, 5, "memo"), make_sim_suite(3, 5, "memo")
    assert first == second == expected
    assert first is not second and all(a is b for a, b in zip(first, second, strict=True))
    first.reverse()
    first.pop()
    assert make_sim_suite(3, 5, "memo") == expected
    assert make_sim_suite(3, 5, "other")[0].record_id == "sim-hotpotqa-other-00000"


def test_the_default_catalogue_is_parsed_once_and_is_the_shipped_file():
    text = resources.files("evosteer_core.data").joinpath("roles.yaml").read_text()
    assert default_catalogue() is default_catalogue()
    assert default_catalogue() == catalogue_from_dict(yaml.safe_load(text))
