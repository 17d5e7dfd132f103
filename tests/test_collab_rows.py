"""CollabFlow's comparison rows (docs/collabflow.md §5): the baselines are legal fixed teams of
the shapes their names promise, each ablation switch changes exactly what it names, and the
rows of configs/collabflow-table-sim.yaml resolve to the runs they name on table2-sim's
testbed."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from itertools import combinations

import pytest
import torch

from evosteer_core.collabflow.baselines import BASELINES, baseline_actions, baseline_team
from evosteer_core.collabflow.construction import ConstructionBudget, construct
from evosteer_core.collabflow.context import task_spec
from evosteer_core.collabflow.execution import execute_team
from evosteer_core.collabflow.team import (
    PROTOCOLS,
    STOP,
    BuildAction,
    IllegalBuildError,
    Team,
    apply,
    legal_actions,
)
from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.records import FAMILIES
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.experiment.cells import experiment_cells
from evosteer_core.infra.config import CollabFlowConfig, load_config
from evosteer_core.infra.configio import ConfigError
from evosteer_core.infra.runs import run_id_for
from evosteer_core.sim import SimExecutor, make_sim_suite

CAT = default_catalogue()
CFG = CollabFlowConfig()
STATELESS = [f for f in FAMILIES if not CAT.family(f).interactive]
STATEFUL = [f for f in FAMILIES if CAT.family(f).interactive]


def spec_of(family: str, collab: CollabFlowConfig = CFG):
    return task_spec(collab, family, CAT)


# --------------------------------------------------------------------------- baselines


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", BASELINES)
def test_every_baseline_is_a_legal_team_built_by_construction_actions(name, family):
    spec = spec_of(family)
    team, history = Team(), baseline_actions(name, spec)
    for action in history[:-1]:
        assert action in legal_actions(team, spec)  # each step is in the director's legal set
        team = apply(team, action, spec)
    assert history[-1] == STOP and STOP in legal_actions(team, spec)
    assert team == baseline_team(name, spec)


@pytest.mark.parametrize("family", STATELESS)
def test_the_stateless_baselines_have_the_shapes_their_names_promise(family):
    spec = spec_of(family)
    offered = {p.profile_id for p in spec.profiles}
    single = baseline_team("single_agent", spec)
    assert single.agents == {"tool_user"} and not single.edges
    assert single.output.mode == "single" and single.output.agent == "tool_user"

    vote = baseline_team("parallel_vote", spec)
    assert len(vote.agents) == 3 and not vote.edges and vote.output.mode == "integrator"

    chain = baseline_team("chain", spec)
    first = "researcher" if "researcher" in offered else "tool_user"
    assert {(e.source, e.target, e.protocol) for e in chain.edges} == {
        (first, "solver", "final_only"),
        ("solver", "verifier", "final_only"),
    }
    assert chain.output.mode == "verifier" and chain.output.agent == "verifier"

    debate = baseline_team("debate", spec)
    pairs = {frozenset((e.source, e.target)) for e in debate.edges}
    assert pairs == {frozenset(p) for p in combinations(sorted(debate.agents), 2)}
    assert len(debate.agents) == 3 and {e.protocol for e in debate.edges} == {"interactive"}
    assert debate.output.mode == "integrator"


@pytest.mark.parametrize("family", STATEFUL)
def test_a_stateful_task_gets_the_single_writer_form_of_each_baseline(family):
    spec = spec_of(family)
    executor = next(p.profile_id for p in spec.profiles if p.mode == "executor")
    advisors = {p.profile_id for p in spec.profiles if p.mode == "advisor"}
    for name in BASELINES:
        team = baseline_team(name, spec)
        writers = [a for a in team.agents if spec.profile(a).mode == "executor"]
        assert writers == [executor] and team.output.agent == executor
        assert all(e.target == executor and e.protocol == "one_way" for e in team.edges)
    assert baseline_team("chain", spec).agents == {executor, *advisors}
    assert baseline_team("parallel_vote", spec).agents == {executor}


# --------------------------------------------------------------------------- switches


def test_protocols_restrict_the_edges_construction_may_add_and_nothing_else():
    spec, one_way = spec_of("hotpotqa"), spec_of("hotpotqa", replace(CFG, protocols=("one_way",)))
    team = Team()
    for a in ("solver", "verifier"):
        team = apply(team, BuildAction("add_agent", (a,)), spec)
    full, restricted = set(legal_actions(team, spec)), set(legal_actions(team, one_way))
    edges = {a for a in full if a.kind == "add_edge"}
    assert {a.args[2] for a in edges} == set(PROTOCOLS)
    assert full - restricted == {a for a in edges if a.args[2] != "one_way"}
    assert restricted <= full
    with pytest.raises(IllegalBuildError, match="not permitted"):
        baseline_team("debate", one_way)  # a fixed team outside the permitted set is refused


class Unscored:
    """A director that must not be consulted: the uniform construction scores nothing."""

    def __getattr__(self, name):
        raise AssertionError(f"the uniform construction touched the policy ({name})")


def test_the_random_legal_graph_draws_uniformly_over_the_legal_set_and_scores_nothing():
    spec = spec_of("aime")
    budget = ConstructionBudget(tokens=0, deadline_s=1.0, wall_s=1.0)
    firsts: Counter[str] = Counter()
    for seed in range(300):
        con = construct(
            Unscored(), spec, CAT, "task", budget,
            use_adapter=False, seed_parts=(seed, "k"), uniform=True,
        )  # fmt: skip
        assert not con.aborted and con.tokens == 0 and con.actions[-1] == STOP
        team = Team()
        for step in con.steps:  # every decision is uniform over that state's legal set
            legal = [a.text() for a in legal_actions(team, spec)]
            assert list(step.legal) == legal
            assert step.legal_logp == pytest.approx([-math.log(len(legal))] * len(legal))
            if step.action != STOP:
                team = apply(team, step.action, spec)
        assert team == con.team
        firsts[con.steps[0].legal[con.steps[0].index]] += 1
    first_legal = [a.text() for a in legal_actions(Team(), spec)]
    assert set(firsts) == set(first_legal)
    expected = 300 / len(first_legal)
    chi2 = sum((firsts[a] - expected) ** 2 / expected for a in first_legal)
    assert chi2 < 20.5  # df = 4 (five profiles), p ≈ 0.0004


def _sim_run(family: str, collab: CollabFlowConfig, team: Team, seed: int = 3):
    record = next(r for r in make_sim_suite(2, 0, "heldout") if r.family == family)
    limits = BudgetLimits(total_tokens=60_000)
    return execute_team(
        team, spec_of(family, collab), record, SimExecutor(), BudgetLedger(limits),
        (seed, f"eval/{record.record_id}"), collab,
    )  # fmt: skip


@pytest.mark.parametrize("family", ["hotpotqa", "aime", "mbpp_plus"])
def test_without_communication_a_team_runs_as_its_agents_alone_with_its_output_rule(family):
    spec = spec_of(family)
    for name in ("debate", "chain"):
        team = baseline_team(name, spec)
        assert team.edges
        silent = _sim_run(family, replace(CFG, communication=False), team)
        assert not silent.gates and silent.deliveries == 0
        alone = _sim_run(family, CFG, replace(team, edges=frozenset()))  # independently built
        assert [(c.agent, c.kind, c.answer) for c in silent.calls] == [
            (c.agent, c.kind, c.answer) for c in alone.calls
        ]
        assert silent.reward == alone.reward and silent.output == alone.output
        talking = _sim_run(family, CFG, team)
        assert talking.gates or talking.deliveries  # the switch is what removed them


def test_a_bad_switch_value_fails_in_one_line_naming_the_key():
    for key, value, words in [
        ("collabflow.construction", "greedy", "director or uniform"),
        ("collabflow.fixed_team", "committee", "parallel_vote"),
        ("collabflow.protocols", ["one_way", "one_way"], "distinct"),
        ("collabflow.protocols", ["email"], "distinct protocols"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(None, {"method": "collabflow", key: value})
        assert err.value.path == key and words in str(err.value)
        assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- the experiment

TABLE = "configs/collabflow-table-sim.yaml"


def test_the_table_runs_on_table2_sims_testbed_and_seeds():
    ours, theirs = load_config(TABLE), load_config("configs/table2-sim.yaml")
    a, b = ours.to_dict(), theirs.to_dict()
    for data in (a, b):
        for key in ("name", "experiment", "tracking"):
            data.pop(key)
    assert a == b
    assert ours.experiment.seeds == theirs.experiment.seeds
    assert ours.experiment.runs == theirs.experiment.runs


ROW_RUNS = {
    "EvoSteer untrained": ("evosteer", "untrained", {}),
    "EvoSteer AnchorTB": ("evosteer", "checkpoint", {}),
    "Single agent with tools": ("collabflow", "untrained", {"fixed_team": "single_agent"}),
    "Parallel vote": ("collabflow", "untrained", {"fixed_team": "parallel_vote"}),
    "Fixed chain": ("collabflow", "untrained", {"fixed_team": "chain"}),
    "Fully connected debate": ("collabflow", "untrained", {"fixed_team": "debate"}),
    "CollabFlow (full)": ("collabflow", "checkpoint", {}),
    "−director training": ("collabflow", "untrained", {}),
    "−recursion": ("collabflow", "checkpoint", {"recursion": False}),
    "Fixed team": ("collabflow", "untrained", {"fixed_team": "best"}),
    "Random legal graph": ("collabflow", "untrained", {"construction": "uniform"}),
    "−communication": ("collabflow", "checkpoint", {"communication": False}),
    "−evidence gate": ("collabflow", "checkpoint", {"gate": "verbatim"}),
    "All OneWay": ("collabflow", "checkpoint", {"protocols": ("one_way",)}),
    "Always revise": ("collabflow", "checkpoint", {"gate": "always_revise"}),
}


def test_each_row_resolves_to_the_run_it_names():
    cfg = load_config(TABLE)
    cells = experiment_cells(cfg, TABLE)
    assert [r.name for r in cfg.experiment.rows] == list(ROW_RUNS)
    assert cfg.experiment.reference == "CollabFlow (full)"
    for cell in cells:
        method, evaluation, changed = ROW_RUNS[cell.row.name]
        c = cell.config
        assert (c.method, cell.row.eval, c.train.seed) == (method, evaluation, cell.seed)
        if method == "evosteer":
            assert c.collabflow is None
            continue
        defaults = CollabFlowConfig()
        differs = {
            k: getattr(c.collabflow, k)
            for k in defaults.__dataclass_fields__
            if getattr(c.collabflow, k) != getattr(defaults, k)
        }
        assert differs == changed  # the row switches exactly what its name says
    by_row = {(c.row.name, c.seed): run_id_for(c.config) for c in cells}
    for seed in cfg.experiment.seeds:  # ρ rows are the step-0 of their trained counterpart
        assert by_row[("−director training", seed)] == by_row[("CollabFlow (full)", seed)]
        assert by_row[("EvoSteer untrained", seed)] == by_row[("EvoSteer AnchorTB", seed)]


def test_a_collabflow_row_evaluates_the_director_or_a_fixed_team_only():
    rows = [{"name": "x", "eval": "direct", "set": {"method": "collabflow"}}]
    cfg = load_config(None, {"experiment": {"rows": rows, "seeds": [1]}})
    with pytest.raises(ConfigError) as err:
        experiment_cells(cfg)
    assert err.value.path == "experiment.rows[0] (x).eval" and "fixed_team" in str(err.value)


def test_a_tiny_experiment_puts_evosteer_and_collabflow_side_by_side(tmp_path, monkeypatch, capsys):
    from evosteer_flyte import cli
    from tests.pipeline_support import SMALL, isolate_flyte_cache

    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    rows = [
        {"name": "AnchorTB"},
        {"name": "Parallel vote", "eval": "untrained",
         "set": {"method": "collabflow", "collabflow.fixed_team": "parallel_vote"}},
    ]  # fmt: skip
    cfg = load_config(
        None,
        {
            **SMALL,
            "store.root": str(tmp_path / "runs"),
            "train.steps": 1,
            "train.batch_size": 2,
            "sim.n_heldout_per_family": 1,
            "skills.enabled": False,
            "experiment": {"rows": rows, "seeds": [7], "runs": 1},
        },
    )
    path = tmp_path / "exp.yaml"
    path.write_text(cfg.to_yaml())
    assert cli.main(["experiment", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| AnchorTB |" in out and "| Parallel vote |" in out
    table = out[out.index("Tokens per item") :]
    for name in ("AnchorTB", "Parallel vote"):
        (line,) = [x for x in table.splitlines() if x.startswith(f"| {name} |")]
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == str(len(FAMILIES))  # one held-out task per family, one run
        total, t_in, t_out = map(float, cells[2:5])
        assert total == pytest.approx(t_in + t_out, abs=0.15) and total > 0


def test_without_recursion_the_director_is_trained_once_and_never_again(tmp_path):
    """−recursion (the paper's ablation): round 1 updates the director; a later round
    collects and counts but leaves the adapter, log Z, b_φ and the optimizer as they were;
    with recursion the later round trains too."""
    from evosteer_core.collabflow.rounds import (
        init_round_state,
        open_round,
        round_rollout,
        round_update,
    )
    from tests.test_collab_rounds import small

    for recursion in (True, False):
        cfg = small(tmp_path / str(recursion), **{"collabflow.recursion": recursion})
        state = init_round_state(cfg)
        s = open_round(cfg, state)
        first = round_update(s, round_rollout(s, 1), state.actor_optimizer)
        assert first.metrics["retrained"] == 1.0
        assert first.actor_optimizer is not state.actor_optimizer  # round 1 always trains
        adapter = {k: v.clone() for k, v in s.director.adapter_state().items()}
        objective = {k: v.clone() for k, v in s.objective.state_dict().items()}
        second = round_update(s, round_rollout(s, 2), first.actor_optimizer)
        assert second.metrics["new_outcomes"] > 0  # outcomes are counted either way
        same = all(torch.equal(adapter[k], v) for k, v in second.adapter.items()) and all(
            torch.equal(objective[k], v) for k, v in second.objective.items()
        )
        assert same == (not recursion)
        assert (second.actor_optimizer is first.actor_optimizer) == (not recursion)
        assert second.metrics["retrained"] == float(recursion)


def test_a_trained_collabflow_cells_costs_come_from_its_round_artifact(tmp_path):
    """A trained CollabFlow cell keeps its update metrics in the ``round`` artifact (EvoSteer:
    ``update``); the experiment's cost figures read the one the method writes (before, a
    CollabFlow row failed with 'no artifact update at step 1')."""
    from evosteer_core.experiment.cells import training_costs
    from evosteer_core.infra.artifacts import RunIndex, open_store
    from evosteer_core.pipeline.stage_io import StepStore
    from tests.test_collab_rounds import small

    cfg = small(tmp_path, **{"train.steps": 2})
    io_ = StepStore(open_store(cfg.store.root))
    index = RunIndex(io_.store, "cell")
    per_step = [{"tokens_per_problem": 100.0 * k, "update_ms_per_episode": 3.0} for k in (1, 2)]
    for k, m in enumerate(per_step, start=1):
        index.record(k, "round", io_.put_object({"metrics": m}, "round"))
    assert training_costs(io_, cfg, "cell") == {
        "update_ms_per_episode": 3.0,
        "train_tokens_per_problem": 150.0,
    }
