"""The Table 2 ablations (docs/ablations.md): each switch removes what it names and nothing else.

Every switch has a fast test here that compares the ablated computation with the full one on
the same inputs; ``test_each_switch_trains_and_evaluates_end_to_end`` (slow) runs one tiny
step and an evaluation per switch from ``--set``-style overrides.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
import torch
from skill_examples import skill
from test_runtime import CAT, MASKED, MENU, Evaluator, FakeExecutor, act, task

from evosteer_core.anchors import StateKeys
from evosteer_core.episode.actions import Action
from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.episode.records import TaskRecord
from evosteer_core.episode.runtime import Episode
from evosteer_core.infra.config import AblationConfig, RunConfig, load_config
from evosteer_core.infra.configio import ConfigError, parse_override
from evosteer_core.infra.runs import config_hash
from evosteer_core.objectives.anchortb import AnchorTB, implemented_flows, trajectory_losses
from evosteer_core.objectives.base import TrajectoryBatch
from evosteer_core.policy.render import public_state, render
from evosteer_core.skills.admission import SkillState
from evosteer_core.skills.pairs import PairOutcome
from evosteer_core.skills.validation import admit_by_count
from evosteer_core.training.session import (
    Session,
    admit_after,
    build_objective,
    init_state,
    open_session,
    record_slots,
    skills_config,
)
from evosteer_core.training.stages import rescore_stage, rollout_stage
from evosteer_core.training.update import ScoredBatch, update_stage

SWITCHES = tuple(f.name for f in dataclasses.fields(AblationConfig) if f.type in (bool, "bool"))
TINY = {
    "train.batch_size": 6,
    "train.rollouts_theta": 1,
    "train.rollouts_rho": 1,
    "train.value_fit_steps": 2,
    "sim.n_train_per_family": 2,
    "sim.n_heldout_per_family": 1,
    "skills.warmup_steps": 0,
    "budget.max_actions": 4,
}


def tiny(**ablation: bool) -> RunConfig:
    return load_config(None, {**TINY, **{f"ablation.{k}": v for k, v in ablation.items()}})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- the config section ---------------------------------------------------------------------
def test_the_section_has_the_eight_switches_off_by_default_and_set_sets_each():
    assert SWITCHES == (
        "no_interleaving",
        "no_execution_features",
        "no_repair",
        "no_value_head",
        "no_measured_flows",
        "no_flow_corrections",
        "no_skill_evolution",
        "no_sequential_validation",
    )
    default = load_config(None)
    assert not any(getattr(default.ablation, k) for k in SWITCHES)
    assert default.ablation.validation_successes == 5
    hashes = {config_hash(default)}
    for key in SWITCHES:
        name, value = parse_override(f"ablation.{key}=true")  # what --set does
        cfg = load_config(None, {name: value})
        assert getattr(cfg.ablation, key) is True
        assert [k for k in SWITCHES if getattr(cfg.ablation, k)] == [key]
        hashes.add(config_hash(cfg))
    assert len(hashes) == 1 + len(SWITCHES)


def test_a_run_without_ablations_hashes_as_before_the_section_existed():
    from evosteer_core.infra.runs import run_id_for

    # the default preset's run id at 9491cde, the last revision without an ablation section
    assert run_id_for(load_config(None)) == "tiny-sim-aae405868dc8"
    assert run_id_for(load_config(None, {"ablation.no_repair": True})) != "tiny-sim-aae405868dc8"


def test_bad_ablation_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="validation_successes: must be >= 1"):
        load_config(None, {"ablation.validation_successes": 0})
    with pytest.raises(ConfigError, match="no_repairs.*did you mean 'no_repair'"):
        load_config(None, {"ablation.no_repairs": True})
    for key in ("no_measured_flows", "no_flow_corrections"):
        with pytest.raises(ConfigError, match=f"ablation: {key} .*use train.objective anchortb"):
            load_config(None, {f"ablation.{key}": True, "train.objective": "tb"})


def test_set_from_the_cli_sets_a_switch_and_the_config_yaml_carries_it(capsys):
    from evosteer_core.infra.config import config_from_dict
    from evosteer_core.infra.configio import parse_yaml
    from evosteer_flyte.cli import _config, build_parser, main

    for key in SWITCHES:
        args = build_parser().parse_args(["train", "--set", f"ablation.{key}=true"])
        cfg = _config(args)
        assert getattr(cfg.ablation, key) is True
        # the workflow receives the config as YAML text: the switch survives the trip
        assert config_from_dict(parse_yaml(cfg.to_yaml(), "<yaml>")) == cfg
    capsys.readouterr()
    argv = ["train", "--set", "ablation.no_flow_corrections=true", "--set", "train.objective=tb"]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert line == (
        "evosteer train: evosteer_core/data/tiny-sim.yaml with --set "
        "ablation.no_flow_corrections=true: ablation: no_flow_corrections removes a part of "
        "AnchorTB's flows, but train.objective is 'tb'; use train.objective anchortb"
    )


# --- episodes: −learnable repair, −interleaved execution -----------------------------------------
def _episode(executor: FakeExecutor, **kwargs: bool) -> Episode:
    return Episode(
        task("hotpotqa"),
        CAT,
        BudgetLimits(),
        executor,
        Evaluator(),
        menu=(*MENU, MASKED),
        run_seed=7,
        episode_key="ep",
        masked_skills=("sk-masked",),
        **kwargs,
    )


BUILD = [
    '{"kind":"ADD_AGENT","node_id":"n0","role_id":"researcher"}',
    '{"kind":"ADD_AGENT","node_id":"n1","role_id":"solver","skill_id":"sk-a"}',
    '{"kind":"ADD_EDGE","protocol":"feedback","source_id":"n0","target_id":"n1"}',
    '{"kind":"ADD_AGENT","node_id":"n2","role_id":"verifier"}',
    '{"kind":"ADD_EDGE","protocol":"revise","source_id":"n1","target_id":"n2"}',
    '{"kind":"BIND_SKILL","node_id":"n2","skill_id":"sk-b"}',
    '{"kind":"SET_OUTPUT","node_id":"n2"}',
]


def test_no_repair_removes_rerun_and_drop_and_nothing_else():
    full, ablated = _episode(FakeExecutor()), _episode(FakeExecutor(), repair=False)
    for text in BUILD:
        legal_full = set(full.legal_actions())
        legal = set(ablated.legal_actions())
        assert legal == {a for a in legal_full if a.kind not in ("RERUN_AGENT", "DROP_AGENT")}
        assert any(a.kind == "RERUN_AGENT" for a in legal_full) or not full.graph.nodes
        full.apply(act(text))
        ablated.apply(act(text))
        assert [n.output for n in ablated.graph.nodes.values()] == [
            n.output for n in full.graph.nodes.values()
        ]
    for kind in ("DROP_AGENT", "RERUN_AGENT"):
        with pytest.raises(ValueError, match=r"repair actions are masked .*ablation.no_repair"):
            ablated.apply(Action(kind, node_id="n0"))


def test_no_interleaving_builds_the_whole_graph_and_runs_it_once_at_stop():
    ex_full, ex = FakeExecutor(), FakeExecutor()
    full, ablated = _episode(ex_full), _episode(ex, interleaved=False)
    for text in BUILD:
        legal_full = set(full.legal_actions())
        assert set(ablated.legal_actions()) == {a for a in legal_full if a.kind != "RERUN_AGENT"}
        full.apply(act(text))
        obs = ablated.apply(act(text))
        assert obs.result is None and obs.node_id is None
    assert ex.requests == [] and all(n.output is None for n in ablated.graph.nodes.values())
    with pytest.raises(ValueError, match=r"nodes run only at STOP .*ablation.no_interleaving"):
        ablated.apply(Action("RERUN_AGENT", node_id="n0"))
    assert ablated.ledger.model_calls == 0
    ablated.apply(Action("STOP"))
    # each live node once, in id order, with what its already-run sources produced
    assert [(r.node_id, r.seed_key[3]) for r in ex.requests] == [("n0", 0), ("n1", 0), ("n2", 0)]
    assert [m.source_id for m in ex.requests[1].messages] == ["n0"]
    assert [(m.source_id, m.protocol) for m in ex.requests[2].messages] == [("n1", "revise")]
    assert [s.skill_id for s in ex.requests[2].skills] == ["sk-b"]
    assert ablated.reward == 1.0 and len(ablated.history) == len(BUILD) + 1
    assert ablated.ledger.model_calls == 3
    # the interleaved episode ran a node on every executing action (n2 three times)
    assert len(ex_full.requests) == 5


def test_no_interleaving_stops_once_an_output_is_set_even_with_an_open_environment():
    ablated = Episode(
        task("alfworld"), CAT, BudgetLimits(), FakeExecutor(), Evaluator(), interleaved=False
    )
    ablated.apply(Action("ADD_AGENT", node_id="n0", role_id="solver"))
    ablated.apply(Action("SET_OUTPUT", node_id="n0"))
    assert Action("STOP") in ablated.legal_actions()
    ablated.apply(Action("STOP"))
    assert ablated.environment is not None and ablated.environment.steps_done == 2


# --- prompts: −execution features, −reference value head ------------------------------------------
WITHHELD = {
    "no_execution_features": ("features",),
    "no_value_head": ("value", "value_change"),
}


@pytest.mark.parametrize("switch", sorted(WITHHELD))
def test_the_prompt_withholds_exactly_the_named_block(switch):
    assert AblationConfig(**{switch: True}).withheld_state() == WITHHELD[switch]
    ep = _episode(FakeExecutor())
    for text in BUILD[:3]:
        ep.apply(act(text))
    state = public_state(ep, value=0.25, value_change=-0.5)
    cut = public_state(ep, value=0.25, value_change=-0.5, withhold=WITHHELD[switch])
    assert cut == {k: v for k, v in state.items() if k not in WITHHELD[switch]}
    compact = render(state, "compact").splitlines()
    gone = "f " if switch == "no_execution_features" else "v 0.25 dv -0.50"
    assert render(cut, "compact").splitlines() == [x for x in compact if not x.startswith(gone)]
    full = render(cut, "full")
    for key in WITHHELD[switch]:
        assert f'"{key}":' not in full
    assert '"legal_actions":' in full and '"budget":' in full


def _first_decisions(cfg: RunConfig) -> pd.DataFrame:
    s = open_session(cfg, init_state(cfg))
    d = rollout_stage(s, 1).decisions
    return d[d["t"] == 0].set_index("traj_id")


@pytest.mark.parametrize("switch", sorted(WITHHELD))
def test_rollouts_record_f_and_v_unchanged_while_the_prompt_lacks_them(switch):
    """Same first states: the value head's and b_ψ's inputs (the recorded f, v̂) are the full
    run's, the prompt differs by the withheld line only."""
    full, cut = _first_decisions(tiny()), _first_decisions(tiny(**{switch: True}))
    assert list(cut.index) == list(full.index)
    assert cut["features"].tolist() == full["features"].tolist()
    assert cut["value"].tolist() == full["value"].tolist()
    gone = "f " if switch == "no_execution_features" else "v "
    for a, b in zip(full["prompt"], cut["prompt"], strict=True):
        assert (
            b.splitlines()
            == [x for x in a.splitlines() if not x.startswith(gone)]
            != (a.splitlines())
        )


# --- the update: −flow corrections, −measured flows -------------------------------------------
@pytest.fixture(scope="module")
def stepped() -> tuple[Session, object, object]:
    """A session after one rollout and re-scoring, with a non-zero b_ψ and committed buckets
    (so c(g) and b_ψ would both be non-zero in the full method)."""
    cfg = tiny()
    s = open_session(cfg, init_state(cfg))
    rollouts = rollout_stage(s, 1)
    rescored = rescore_stage(s, rollouts.decisions)
    with torch.no_grad():
        for p in s.flow_head.parameters():
            p.add_(0.05)
    for exact, coarse in zip(
        rollouts.decisions["exact_key"], rollouts.decisions["coarse_key"], strict=True
    ):
        for _ in range(8):
            s.buckets.add_trajectory([StateKeys(exact, coarse)], 2.0, 0.5)
    s.buckets.commit()
    return s, rollouts, rescored


def _scored_batch(s: Session, rollouts, rescored) -> tuple[ScoredBatch, TrajectoryBatch]:
    traj = rollouts.trajectories.set_index("traj_id")
    scored = traj[traj["healthy"] & traj["complete"]]
    u = {tid: 0.3 + 0.01 * i for i, tid in enumerate(scored.index)}
    source = ScoredBatch(s, scored, rollouts.decisions, rescored.table, u)
    return source, source.batch()


def test_no_flow_corrections_zeroes_c_and_b_and_keeps_the_rest(stepped):
    s, rollouts, rescored = stepped
    _, full = _scored_batch(s, rollouts, rescored)
    nonterminal = full.state_mask() & ~full.terminal_mask()
    assert full.c[nonterminal].abs().sum() > 0 and full.b[nonterminal].abs().sum() > 0
    s_ablated = dataclasses.replace(s, cfg=tiny(no_flow_corrections=True))
    source, cut = _scored_batch(s_ablated, rollouts, rescored)
    assert torch.equal(cut.c, torch.zeros_like(full.c))
    assert torch.equal(cut.b, torch.zeros_like(full.b))
    for name in ("delta_logp", "u", "log_reward", "lengths", "action_mask", "rewards"):
        assert torch.equal(getattr(cut, name).detach(), getattr(full, name).detach()), name
    # flows are the clipped anchor alone; ψ gets no gradient
    flows = implemented_flows(cut, 2.0)
    want = cut.u[:, None].clamp(0, 2.0).expand_as(flows)
    assert torch.equal(flows[nonterminal], want[nonterminal])
    loss = s_ablated.objective(cut).loss
    loss.backward()
    assert all(p.grad is None for p in s.flow_head.parameters())


def test_no_flow_corrections_update_leaves_psi_as_it_was():
    cfg = tiny(no_flow_corrections=True)
    state = init_state(cfg)
    s = open_session(cfg, state)
    rollouts = rollout_stage(s, 1)
    update = update_stage(s, rollouts, rescore_stage(s, rollouts.decisions), state.actor_optimizer)
    assert update.metrics["mean_b"] == 0.0 and update.metrics["mean_abs_c"] == 0.0
    for k, v in state.flow_head.items():
        assert torch.equal(update.flow_head[k], v), k
    assert any(not torch.equal(update.adapter[k], v) for k, v in state.adapter.items())


def test_learned_record_flows_replace_the_measured_u_in_the_loss():
    """An independent computation of the flows with u_q from the learned table."""
    beta = 2.0
    objective = AnchorTB(beta)
    objective.learn_record_flows(3)
    assert objective.record_flows is not None
    assert torch.allclose(objective.record_flows, torch.full((3,), math.log((1 + math.e**2) / 2)))
    with torch.no_grad():
        objective.record_flows.copy_(torch.tensor([0.4, 1.5, 2.5]))
    batch = TrajectoryBatch(
        delta_logp=torch.tensor([[0.1, -0.2], [0.3, 0.0]]),
        action_mask=torch.tensor([[True, True], [True, False]]),
        lengths=torch.tensor([2, 1]),
        u=torch.tensor([9.0, 9.0]),  # the measured anchor: must not be read
        c=torch.tensor([[0.1, -0.2, 0.0], [0.2, 0.0, 0.0]]),
        b=torch.tensor([[0.05, 0.01, 0.0], [-0.1, 0.0, 0.0]]),
        log_reward=torch.tensor([0.0, 2.0]),
        record_index=torch.tensor([2, 1]),
    )
    out = objective(batch)
    # by hand: trajectory 0 is record 2 (u = 2.5), trajectory 1 record 1 (u = 1.5)
    f0 = [min(2.5 + 0.1, beta) + 0.05, min(2.5 - 0.2, beta) + 0.01, 0.0]
    f1 = [min(1.5 + 0.2, beta) - 0.1, 2.0]
    spans0 = [(0, 1, 0.1), (1, 2, -0.2), (0, 2, -0.1)]
    spans1 = [(0, 1, 0.3)]
    loss0 = sum((f0[i] + dl - f0[j]) ** 2 for i, j, dl in spans0) / 3
    loss1 = sum((f1[i] + dl - f1[j]) ** 2 for i, j, dl in spans1) / 1
    assert out.loss.item() == pytest.approx((loss0 + loss1) / 2, rel=1e-6)
    out.loss.backward()
    grad = objective.record_flows.grad
    assert grad is not None and grad[0] == 0 and grad[1] != 0
    assert grad[2] == 0  # 2.5 + c is clipped at β at both states: no gradient through the clip
    with pytest.raises(ValueError, match="needs batch fields"):
        objective(dataclasses.replace(batch, record_index=None))
    plain = AnchorTB(beta)
    flows = implemented_flows(batch, beta)
    assert plain(batch).loss.item() == pytest.approx(
        trajectory_losses(flows, batch.delta_logp, batch.lengths).mean().item()
    )


def test_no_measured_flows_learns_u_per_record_with_the_optimizer():
    cfg = tiny(no_measured_flows=True)
    state = init_state(cfg)
    s = open_session(cfg, state)
    n = len(s.world.train_records)
    start = math.log((1 + math.e**2) / 2)
    assert state.objective["record_flows"].shape == (n,)
    assert torch.allclose(state.objective["record_flows"], torch.full((n,), start))
    assert record_slots(s.world.train_records) == {
        r: i for i, r in enumerate(sorted(r.record_id for r in s.world.train_records))
    }
    assert isinstance(build_objective(tiny(), 8, s.world.train_records), AnchorTB)
    assert dict(build_objective(tiny(), 8, s.world.train_records).named_parameters()) == {}
    rollouts = rollout_stage(s, 1)
    update = update_stage(s, rollouts, rescore_stage(s, rollouts.decisions), state.actor_optimizer)
    assert update.metrics["mean_u"] == pytest.approx(start)  # not the pool's measured anchor
    learned = update.objective["record_flows"]
    slots = record_slots(s.world.train_records)
    used = sorted({slots[r] for r in rollouts.trajectories["record_id"]})
    moved = (learned - start).abs()
    assert (moved[used] > 1e-4).all()  # one AdamW step at the heads' lr
    # the measured pool still fills (anchor AUC, buckets), the flow head is b_ψ as usual
    assert update.pool != state.pool
    assert open_session(cfg, state).objective.record_flows is not None


# --- skills: −skill evolution, −sequential validation ---------------------------------------------
def _with_candidate(state: SkillState, family: str = "hotpotqa") -> SkillState:
    state.library, _ = state.library.admit(skill(1, family), 0, [])
    return state


def test_no_skill_evolution_has_no_menu_no_pairs_and_no_author(monkeypatch):
    cfg = tiny(no_skill_evolution=True)
    assert skills_config(cfg) == dataclasses.replace(cfg.skills, enabled=False)
    assert skills_config(tiny()) == tiny().skills
    s = open_session(cfg, init_state(cfg))
    assert s.skills.enabled is False and s.skills.library.entries == ()
    _with_candidate(s.skills)  # even a library with a candidate is not shown or tested
    assert s.skills.menus() == {}
    monkeypatch.setattr(SkillState, "author", lambda *a: pytest.fail("author called"))
    rollouts = rollout_stage(s, 3)
    assert set(rollouts.trajectories["arm"]) == {"theta", "rho"}
    prompts = {r.record_id: r.prompt for r in s.world.train_records}
    metrics = s.skills.validation_round(
        rollouts.trajectories, rollouts.decisions, prompts, 3, s.world.executor, 42
    )
    assert metrics == {} and len(s.skills.library.entries) == 1
    full = open_session(tiny(), init_state(tiny()))
    _with_candidate(full.skills)
    assert full.skills.menus()["hotpotqa"] and full.skills.pair_plans(
        [r for r in full.world.train_records if r.family == "hotpotqa"], 3
    )


def _pairs(skill_id: str, plus: float, minus: float, n: int) -> list[PairOutcome]:
    return [PairOutcome(f"r{i}", "hotpotqa", skill_id, "candidate", plus, minus) for i in range(n)]


def test_fixed_count_admission_admits_after_exactly_k_successes():
    state = _with_candidate(SkillState.initial(tiny().skills))
    sid = state.library.entries[0].skill_id
    lib, successes = state.library, {}
    # ties (both arms pass) count as successes: the sign test would never promote on them
    for i in range(4):
        lib, successes, promoted = admit_by_count(lib, successes, _pairs(sid, 1, 1, 1), i + 1, 5)
        assert promoted == () and lib.get(sid).status == "candidate"
    lib, successes, promoted = admit_by_count(lib, successes, _pairs(sid, 0, 1, 3), 5, 5)
    assert promoted == () and successes == {sid: 4}  # failed skill arms are not successes
    unusable = [dataclasses.replace(p, complete=False) for p in _pairs(sid, 1, 1, 2)]
    lib, successes, promoted = admit_by_count(lib, successes, unusable, 6, 5)
    assert promoted == () and successes == {sid: 4}
    lib, successes, promoted = admit_by_count(lib, successes, _pairs(sid, 1, 1, 1), 7, 5)
    assert promoted == (sid,) and lib.get(sid).status == "validated" and successes == {sid: 5}


def _pair_rows(skill_id: str, rewards: list[tuple[float, float]]) -> pd.DataFrame:
    rows = []
    for k, (plus, minus) in enumerate(rewards):
        for arm, r in (("pair_treat", plus), ("pair_control", minus)):
            rows.append(
                {
                    "traj_id": f"hq/{arm}/{k}",
                    "record_id": "hq",
                    "family": "hotpotqa",
                    "arm": arm,
                    "rollout_index": k,
                    "pair_skill": skill_id,
                    "pair_kind": "candidate",
                    "reward": r,
                    "complete": True,
                    "healthy": True,
                }
            )
    return pd.DataFrame(rows)


def test_no_sequential_validation_replaces_the_tests_by_the_count_in_the_round():
    cfg = tiny(no_sequential_validation=True)
    assert admit_after(cfg) == 5 and admit_after(tiny()) is None
    skills_cfg = dataclasses.replace(cfg.skills, warmup_steps=100)  # no author windows
    decisions = pd.DataFrame({"traj_id": [], "action": []})
    for k, expect in ((admit_after(cfg), "validated"), (None, "candidate")):
        state = _with_candidate(SkillState.initial(skills_cfg, k))
        sid = state.library.entries[0].skill_id
        rows = _pair_rows(sid, [(1.0, 1.0)] * 4 + [(1.0, 0.0)])
        metrics = state.validation_round(rows, decisions, {}, 3, FakeExecutor(), 42)
        assert state.library.get(sid).status == expect
        if k is None:  # one discordant pair: a sequential look, α spent, no decision
            assert metrics["alpha_spent"] > 0 and state.ledger.records
            assert "successes" not in state.to_dict()
        else:
            assert metrics["alpha_spent"] == 0 and state.ledger.comparisons == ()
            assert state.to_dict()["successes"] == {sid: 5}
            again = SkillState.from_dict(state.to_dict(), skills_cfg)
            assert again.admit_after == 5 and again.successes == {sid: 5}


def test_fixed_count_admission_draws_no_reevaluation_pairs():
    records = [(f"hq{i}", "hotpotqa") for i in range(3)]
    for k, n_reeval in ((5, 0), (None, 1)):
        state = _with_candidate(SkillState.initial(tiny().skills, k))
        sid = state.library.entries[0].skill_id
        state.library = state.library.transition(sid, "validated", 1)
        step = state.reeval_every
        batch = [TaskRecord(r, "t", f, "q?", "qa_em") for r, f in records]
        kinds = [p.kind for p in state.pair_plans(batch, step)]
        assert kinds.count("reevaluation") == n_reeval


# --- end to end ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("switch", SWITCHES)
def test_each_switch_trains_and_evaluates_end_to_end(switch, tmp_path):
    from evosteer_core.evaluation.rollouts import evaluate_policy
    from evosteer_core.training.loop import train

    cfg = load_config(None, {**TINY, "store.root": str(tmp_path), f"ablation.{switch}": True})
    state, history = train(cfg, steps=1)
    assert state.step == 1 and math.isfinite(history[0]["loss"])
    s = open_session(cfg, state)
    score = evaluate_policy(s, s.world.heldout_records[:3], use_adapter=True)
    assert 0.0 <= score <= 1.0
