"""Fixed orchestration paradigms (docs/paradigms.md): each builds the team it says, acts only
as it says, is deterministic under the episode's seeds, and the searched workflow is found on
training records only."""

from __future__ import annotations

import pytest

from evosteer_core.episode import world as world_module
from evosteer_core.episode.actions import Action
from evosteer_core.episode.records import FAMILIES
from evosteer_core.episode.rollout import EpisodePlan
from evosteer_core.episode.world import build_world
from evosteer_core.infra.config import load_config
from evosteer_core.paradigms import searched as searched_module
from evosteer_core.paradigms.base import chain_script, task_view
from evosteer_core.paradigms.direct import DIRECT
from evosteer_core.paradigms.plan_execute import PLAN_EXECUTE, planned_roles
from evosteer_core.paradigms.react import REACT, ReactParadigm
from evosteer_core.paradigms.registry import paradigm
from evosteer_core.paradigms.runner import paradigm_context, run_paradigm
from evosteer_core.paradigms.searched import (
    SearchSettings,
    candidate_pool,
    search_space,
    search_workflows,
    searched_paradigm,
)
from evosteer_core.paradigms.template import TEMPLATE, TEMPLATE_ROLES

CFG = load_config(None, {"sim.n_train_per_family": 6, "sim.n_heldout_per_family": 3})
WORLD = build_world(CFG)
HELDOUT = WORLD.heldout_records


def _episodes(p, records=HELDOUT, seed=7):
    plans = [EpisodePlan(r, "rho", 0, evaluation=True) for r in records]
    return run_paradigm(p, plans, paradigm_context(CFG, WORLD, seed))


def _kinds(ep):
    return [o.action.kind for o in ep.history]


def _tail_is_finish(ep, start):
    """Everything from history index ``start`` on is the finishing rule: one STOP at the
    end, before it (interactive only) re-runs of the output, successors of the output's role
    taking over as the output, or the finalizing SET_OUTPUT."""
    tail = [o.action for o in ep.history[start:]]
    assert tail and tail[-1] == Action("STOP")
    if not ep.family.interactive:
        assert all(a.kind == "SET_OUTPUT" for a in tail[:-1]), tail
        return
    output_role = None
    for o in ep.history[:start]:
        if o.action.kind == "SET_OUTPUT":
            output_role = ep.graph.nodes[o.action.node_id].role_id
    for a in tail[:-1]:
        assert a.kind in ("RERUN_AGENT", "SET_OUTPUT", "ADD_AGENT"), a
        if a.kind == "ADD_AGENT":
            assert a.role_id == output_role and a.skill_id is None


def _applied_script_prefix(ep, script):
    """How many history entries are script actions in script order (a subsequence)."""
    i = 0
    for a in script:
        if i < len(ep.history) and ep.history[i].action == a:
            i += 1
    return i


def test_direct_is_one_solver_without_orchestration():
    for ep in _episodes(DIRECT):
        assert ep.history[0].action == Action("ADD_AGENT", node_id="n0", role_id="solver")
        assert ep.history[1].action == Action("SET_OUTPUT", node_id="n0")
        assert {n.role_id for n in ep.graph.nodes.values()} == {"solver"}
        assert not ep.graph.edges
        _tail_is_finish(ep, 2)
        if not ep.family.interactive:
            assert _kinds(ep) == ["ADD_AGENT", "SET_OUTPUT", "STOP"]
        assert ep.ledger.orchestrator_tokens_in == ep.ledger.orchestrator_tokens_out == 0


def test_react_is_one_agent_with_all_tools_rerun_until_it_answers():
    eps = _episodes(REACT)
    for ep in eps:
        adds = [o.action for o in ep.history if o.action.kind == "ADD_AGENT"]
        want = "solver" if ep.task.family == "alfworld" else "tool_user"
        assert {a.role_id for a in adds} == {want} and not ep.graph.edges
        if not ep.family.interactive:  # in the game, successors continue the same agent
            assert len(adds) == 1 and set(ep.graph.nodes) == {"n0"}
        if want == "tool_user":
            assert set(WORLD.catalogue.tools_for("tool_user", ep.task.family)) == set(
                ep.family.tools
            )
        if not ep.family.interactive:
            reruns = [o for o in ep.history if o.action.kind == "RERUN_AGENT"]
            assert all(o.action.node_id == "n0" for o in reruns)
            executions = [o for o in ep.history if o.result is not None]
            assert len(executions) <= REACT.max_iterations
            # every execution but the last stated no answer (a ReAct loop ends at its answer)
            assert all(o.result.answer is None for o in executions[:-1])
    with pytest.raises(ValueError, match="max_iterations"):
        ReactParadigm(max_iterations=0)


def test_react_reruns_an_agent_that_stated_no_answer():
    class NoAnswerFirst:
        name = "sim"

        def __init__(self, inner):
            self.inner = inner

        def make_environment(self, task, key):
            return self.inner.make_environment(task, key)

        def run_node(self, req):
            res = self.inner.run_node(req)
            if req.seed_key[3] == 0:
                return type(res)("(garbled)", None, status="parse_error", model_calls=1)
            return res

    world = build_world(CFG)
    world.executor = NoAnswerFirst(world.executor)
    records = [r for r in HELDOUT if r.family == "nq_open"]
    plans = [EpisodePlan(r, "rho", 0, evaluation=True) for r in records]
    for ep in run_paradigm(REACT, plans, paradigm_context(CFG, world, 1)):
        assert _kinds(ep) == ["ADD_AGENT", "SET_OUTPUT", "RERUN_AGENT", "STOP"]


def test_template_is_the_same_graph_for_every_task():
    script = chain_script(TEMPLATE_ROLES, fan_in=True)
    assert [a.kind for a in script] == [
        "ADD_AGENT", "ADD_AGENT", "ADD_EDGE", "ADD_AGENT", "ADD_EDGE", "ADD_EDGE", "SET_OUTPUT",
    ]  # fmt: skip
    assert (script[4].protocol, script[5].protocol) == ("feedback", "revise")
    big = load_config(None, {"budget.total_tokens": 98304, "budget.token_scale": 1.0})
    plans = [EpisodePlan(r, "rho", 0, evaluation=True) for r in HELDOUT]
    for ep in run_paradigm(TEMPLATE, plans, paradigm_context(big, WORLD, 3)):
        assert TEMPLATE.script(task_view(ep)) == script
        n = _applied_script_prefix(ep, script)
        assert n == len(script)  # the reference budget affords the whole template
        roles = {nid: node.role_id for nid, node in ep.graph.nodes.items()}
        assert roles == {"n0": "solver", "n1": "verifier", "n2": "finalizer"}
        assert ep.graph.output_id == "n2"
        _tail_is_finish(ep, n)


def test_plan_execute_writes_the_graph_once_then_only_finishes():
    rules = {f: planned_roles(task_view(_episodes(DIRECT, [r])[0])) for f, r in _first()}
    assert rules == {
        "hotpotqa": ("planner", "researcher", "verifier"),
        "nq_open": ("researcher", "verifier"),
        "medqa": ("researcher", "verifier"),
        "aime": ("planner", "solver", "verifier"),
        "mbpp_plus": ("planner", "solver", "verifier"),
        "alfworld": ("planner", "solver"),
    }
    for ep in _episodes(PLAN_EXECUTE):
        script = PLAN_EXECUTE.script(task_view(ep))
        n = _applied_script_prefix(ep, script)
        assert n >= 1
        _tail_is_finish(ep, n)  # nothing but the finishing rule after the written graph


def _first():
    seen = {}
    for r in HELDOUT:
        seen.setdefault(r.family, r)
    return seen.items()


def test_scripts_skip_what_the_budget_cannot_afford():
    """A budget that reserves one call of a role (4,096 tokens at tiny-sim's scale) but not
    two: the solver runs, the rest of the template is skipped, the finalizing action sets
    the solver as the output."""
    tight = load_config(None, {"budget.total_tokens": 4200})
    plans = [EpisodePlan(r, "rho", 0, evaluation=True) for r in HELDOUT if r.family != "alfworld"]
    for ep in run_paradigm(TEMPLATE, plans, paradigm_context(tight, WORLD, 3)):
        assert ep.stopped and ep.ledger.tokens <= 4200
        assert _kinds(ep) == ["ADD_AGENT", "SET_OUTPUT", "STOP"]
        assert ep.graph.output_id == "n0"


@pytest.mark.parametrize("name", ["direct", "react", "template", "plan_execute", "random"])
def test_paradigms_are_deterministic_under_the_episode_seeds(name):
    p = paradigm(name)
    a, b, c = _episodes(p, seed=5), _episodes(p, seed=5), _episodes(p, seed=6)
    assert [[o.summary() for o in ep.history] for ep in a] == [
        [o.summary() for o in ep.history] for ep in b
    ]
    assert [ep.reward for ep in a] == [ep.reward for ep in b]
    assert [[o.summary() for o in ep.history] for ep in a] != [
        [o.summary() for o in ep.history] for ep in c
    ]


def test_shared_first_node_is_the_same_draw_in_every_paradigm():
    """Common random numbers: n0 (a solver in direct and template) runs under the same seed
    key in both, so its first execution is identical."""
    for d, t in zip(_episodes(DIRECT), _episodes(TEMPLATE), strict=True):
        assert d.history[0].result == t.history[0].result


def test_unknown_paradigm_and_missing_search_fail_with_one_line():
    with pytest.raises(ValueError, match="unknown paradigm 'nope'; known: react"):
        paradigm("nope")
    with pytest.raises(ValueError, match="needs the result of search_workflows"):
        paradigm("searched")


# ------------------------------------------------------------------------ offline search


def test_search_space_and_pool():
    view = task_view(_episodes(DIRECT, HELDOUT[:1])[0])  # hotpotqa
    space = search_space(view, WORLD.catalogue, 2)
    outputs = [r for r in view.roles if r != "planner"]
    assert len(space) == 2 * len(outputs) + 2 * len(view.roles) * len(outputs)
    assert all(c.roles[-1] != "planner" for c in space)
    pool = candidate_pool(view, WORLD.catalogue, SearchSettings(candidates=5))
    assert [c.name for c in pool[:3]] == [
        "solver",
        "solver>verifier>finalizer+fan_in",
        "planner>researcher>verifier",
    ]
    assert len(pool) == 8 and len({c.name for c in pool}) == 8
    assert pool == candidate_pool(view, WORLD.catalogue, SearchSettings(candidates=5))


def test_search_sees_only_the_training_records(monkeypatch):
    """Sentinel: loading the run's records (where the held-out split lives) fails, and every
    node the search executes belongs to a training record."""
    seen: set[str] = set()
    original = world_module.build_executor

    def recording_executor(cfg):
        inner = original(cfg)
        run_node = inner.run_node

        def run(req):
            seen.add(req.task.record_id)
            return run_node(req)

        inner.run_node = run
        return inner

    def sentinel(*args, **kwargs):
        raise AssertionError("the search loaded the run's records (held-out included)")

    monkeypatch.setattr(world_module, "build_executor", recording_executor)
    monkeypatch.setattr(world_module, "load_records", sentinel)
    monkeypatch.setattr(searched_module, "load_records", sentinel)
    settings = SearchSettings(candidates=2, tasks_per_family=2)
    result = search_workflows(CFG, WORLD.train_records, settings)
    train_ids = {r.record_id for r in WORLD.train_records}
    assert seen and seen <= train_ids
    assert not seen & {r.record_id for r in HELDOUT}
    assert set(result["families"]) == set(FAMILIES)
    for entry in result["families"].values():
        assert entry["tasks"] == 2 and len(entry["scores"]) == 5
        best = max(s[0] for s in entry["scores"].values())
        assert entry["train_reward"] == best
    assert search_workflows(CFG, WORLD.train_records, settings) == result  # deterministic


def test_searched_paradigm_runs_the_frozen_scripts():
    result = search_workflows(
        CFG, WORLD.train_records, SearchSettings(candidates=1, tasks_per_family=2)
    )
    p = searched_paradigm(result)
    for ep in _episodes(p):
        entry = result["families"][ep.task.family]
        script = tuple(Action.from_json(a) for a in entry["actions"])
        assert p.script(task_view(ep)) == script
        _tail_is_finish(ep, _applied_script_prefix(ep, script))
    only_qa = {**result, "families": {"hotpotqa": result["families"]["hotpotqa"]}}
    with pytest.raises(ValueError, match="no team for family 'nq_open'"):
        _episodes(searched_paradigm(only_qa), [r for r in HELDOUT if r.family == "nq_open"])
    with pytest.raises(ValueError, match="not a searched-workflow artifact"):
        searched_paradigm({"families": {}})
