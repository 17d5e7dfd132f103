"""Collaborative Trajectory Balance (objectives/ctb.py) against computations written here:
the balance property by exact enumeration of a tiny construction space where several orders
reach the same team, the gradient against finite differences, the KL term against a
brute-force sum, and the reduction to TB when every state has one parent."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from evosteer_core.collabflow.construction import Construction, ConstructionStep
from evosteer_core.collabflow.ctb_batch import (
    CTBTrajectory,
    ScoredDecision,
    ctb_batch,
    ctb_trajectory,
)
from evosteer_core.collabflow.reward import CLUSTERS
from evosteer_core.collabflow.team import (
    STOP,
    Profile,
    Team,
    TeamSpec,
    apply,
    legal_actions,
)
from evosteer_core.objectives import CollaborativeTB, TrajectoryBalance, build_objective
from evosteer_core.objectives.base import TrajectoryBatch

# A stateful space: one executor, one advisor, at most one (advisor → executor) edge. Its
# complete teams are {actor}, {actor, planner} and {actor, planner, planner→actor}, reached by
# 1, 3 and 5 construction orders.
TEAM_SPEC = TeamSpec(
    "alfworld", True,
    (Profile("actor", "solver", "executor", ("alfworld",), ("single",)),
     Profile("planner", "planner", "advisor", ("alfworld",))),
    output_modes=("single",), max_agents=2, max_edges=1, max_skills_per_agent=0,
)
REWARD = {2: 0.6, 3: 0.4, 4: 0.2}  # by team size: the three teams
TARGET = {2: 1 / 2, 3: 1 / 3, 4: 1 / 6}


def _paths():
    """Every complete construction path: (states visited, actions, team)."""
    out = []

    def walk(team, history):
        for a in legal_actions(team, TEAM_SPEC):
            if a == STOP:
                out.append((history + (a,), team))
            else:
                walk(apply(team, a, TEAM_SPEC), history + (a,))

    walk(Team(), ())
    return out


PATHS = _paths()
STATES = sorted({h[:t] for h, _ in PATHS for t in range(len(h))}, key=lambda s: (len(s), str(s)))


@functools.cache
def _legal(state):
    team = Team()
    for a in state:
        team = apply(team, a, TEAM_SPEC)
    return legal_actions(team, TEAM_SPEC)


def _logits(seed: int, scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        s: (scale * torch.randn(len(_legal(s)), generator=g, dtype=torch.float64)).requires_grad_()
        for s in STATES
    }


def _batch(logits: dict, ref: dict, backward: str, paths=PATHS):
    trajs = []
    for history, team in paths:
        steps = []
        for t, action in enumerate(history):
            state = history[:t]
            steps.append(ScoredDecision.from_scores(
                logits[state], ref[state], _legal(state).index(action)
            ))
        trajs.append(CTBTrajectory(steps, history, team, "alfworld", REWARD[team.size()]))
    return ctb_batch(trajs, backward)


def _team_law(logits: dict) -> dict[int, float]:
    """μ(G): the probability of the paths that reach each team (plain floats)."""
    law: dict[int, float] = {}
    for history, team in PATHS:
        p = 1.0
        for t, action in enumerate(history):
            state = history[:t]
            z = [math.exp(x) for x in logits[state].tolist()]
            p *= z[_legal(state).index(action)] / sum(z)
        law[team.size()] = law.get(team.size(), 0.0) + p
    return law


def test_the_space_merges_several_orders_at_each_team():
    sizes = sorted(team.size() for _, team in PATHS)
    assert sizes == [2] + [3] * 3 + [4] * 5


@pytest.mark.parametrize("backward", ["uniform", "learned"])
def test_zero_ctb_loss_samples_teams_in_proportion_to_reward(backward):
    logits = _logits(0)
    ctb = CollaborativeTB(beta=1.0, alpha_kl=0.0, backward=backward).double()
    params = list(logits.values()) + list(ctb.parameters())
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=500, tolerance_grad=1e-12,
                            tolerance_change=1e-15, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = ctb(_batch(logits, logits, backward)).loss
        loss.backward()
        return loss

    for _ in range(2):
        opt.step(closure)
    with torch.no_grad():
        out = ctb(_batch(logits, logits, backward))
    assert out.metrics["balance"] < 1e-12
    law = _team_law(logits)
    for size, target in TARGET.items():
        assert law[size] == pytest.approx(target, abs=1e-5)
    # Z = Σ_G r_G^β = 1.2 at balance (no abort in this space)
    assert float(ctb.log_z.detach()[CLUSTERS.index("alfworld")]) == pytest.approx(math.log(1.2), abs=1e-5)


def _loss_function(seed: int):
    """A CTB loss with every term active (learned b_φ, KL) as a function of flat parameters."""
    logits, ref = _logits(seed), _logits(seed + 1)
    ctb = CollaborativeTB(beta=1.3, alpha_kl=0.7, backward="learned").double()
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in ctb.parameters():
            p.normal_(0.0, 0.5)
    tensors = list(logits.values()) + list(ctb.parameters())
    return logits, ref, ctb, tensors


def test_ctb_gradient_matches_finite_differences():
    logits, ref, ctb, tensors = _loss_function(5)

    def loss() -> torch.Tensor:
        return ctb(_batch(logits, ref, "learned")).loss

    value = loss()
    grads = torch.autograd.grad(value, tensors)
    h = 1e-6
    checked = 0
    for tensor, grad in zip(tensors, grads, strict=True):
        flat, gflat = tensor.data.view(-1), grad.reshape(-1)
        for i in range(0, flat.numel(), max(1, flat.numel() // 3)):
            old = float(flat[i])
            with torch.no_grad():
                flat[i] = old + h
                up = float(loss())
                flat[i] = old - h
                down = float(loss())
                flat[i] = old
            assert float(gflat[i]) == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-8)
            checked += 1
    assert checked > 20


def test_kl_term_is_the_mean_over_visited_states_of_the_legal_set_kl():
    logits, ref, ctb, _ = _loss_function(9)
    batch = _batch(logits, ref, "learned")
    kls = []
    for history, _ in PATHS:
        for t in range(len(history)):
            p = torch.softmax(logits[history[:t]].detach(), 0).tolist()
            q = torch.softmax(ref[history[:t]], 0).tolist()
            kls.append(sum(a * math.log(a / b) for a, b in zip(p, q, strict=True)))
    expected = sum(kls) / len(kls)
    with torch.no_grad():
        assert float(ctb.kl(batch)) == pytest.approx(expected, rel=1e-12)
        out = ctb(batch)
        rho = ctb.residuals(batch)
    balance = sum((float(r) / len(h)) ** 2 for r, (h, _) in zip(rho, PATHS, strict=True)) / len(PATHS)
    assert out.metrics["loss"] == pytest.approx(balance + 0.7 * expected, rel=1e-12)


def test_uniform_residual_by_hand():
    logits = _logits(2)
    ctb = CollaborativeTB(beta=2.0, alpha_kl=0.0, backward="uniform").double()
    with torch.no_grad():
        ctb.log_z[CLUSTERS.index("alfworld")] = 0.3
        rho = ctb.residuals(_batch(logits, logits, "uniform"))
    orders = {2: 1, 3: 3, 4: 5}
    for value, (history, team) in zip(rho.tolist(), PATHS, strict=True):
        log_pf = 0.0
        for t, action in enumerate(history):
            z = torch.log_softmax(logits[history[:t]].detach(), 0)
            log_pf += float(z[_legal(history[:t]).index(action)])
        expected = 0.3 + log_pf - 2.0 * math.log(REWARD[team.size()]) + math.log(orders[team.size()])
        assert value == pytest.approx(expected, abs=1e-12)


def test_with_one_parent_per_state_ctb_is_tb_on_the_team_reward():
    """EvoSteer's interleaved histories: b ≡ 1 (log b = 0); for one-decision paths the 1/T
    scaling is 1 and CTB's loss is TB's with log R = β log R̃."""
    g = torch.Generator().manual_seed(0)
    n = 5
    logp = torch.randn(n, 1, generator=g, dtype=torch.float64)
    reward = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
    beta = 1.7
    batch = TrajectoryBatch(
        delta_logp=logp, action_mask=torch.ones(n, 1, dtype=torch.bool),
        lengths=torch.ones(n, dtype=torch.long), u=torch.zeros(n, dtype=torch.float64),
        c=torch.zeros(n, 2, dtype=torch.float64), b=torch.zeros(n, 2, dtype=torch.float64),
        log_reward=reward.log(), logp=logp, context_index=torch.zeros(n, dtype=torch.long),
        log_backward=torch.zeros(n, dtype=torch.float64),
    )
    ctb = CollaborativeTB(beta=beta, alpha_kl=0.0, backward="uniform").double()
    tb = TrajectoryBalance().double()
    with torch.no_grad():
        ctb.log_z[0] = tb.log_z.fill_(0.4)
    tb_batch = TrajectoryBatch(**{**batch.__dict__, "log_reward": beta * reward.log()})
    assert float(ctb(batch).loss) == pytest.approx(float(tb(tb_batch).loss), rel=1e-12)


def test_ctb_is_registered_and_names_its_missing_fields():
    ctb = build_objective("ctb", alpha_kl=0.1)
    assert isinstance(ctb, CollaborativeTB)
    assert {"legal_logp", "backward_features", "context_index"} <= set(ctb.requires)
    batch = _batch(_logits(1), _logits(1), "uniform")
    with pytest.raises(ValueError, match=r"objective 'ctb' needs batch fields \['backward_"):
        ctb(batch)
    with pytest.raises(ValueError, match="backward must be one of"):
        CollaborativeTB(backward="greedy")


def test_a_construction_episode_enters_as_the_director_recorded_it():
    logits, ref = _logits(4), _logits(6)
    history, team = PATHS[-1]
    steps, theta = [], []
    for t, action in enumerate(history):
        legal = _legal(history[:t])
        lp = torch.log_softmax(ref[history[:t]].detach(), 0)
        i = legal.index(action)
        texts = tuple(a.text() for a in legal)
        steps.append(ConstructionStep(t, "prompt", texts, i, float(lp[i]), tuple(lp.tolist()), 0, 0.0))
        theta.append(torch.log_softmax(logits[history[:t]], 0))
    episode = Construction(tuple(steps), team)
    got = ctb_batch([ctb_trajectory(episode, theta, "alfworld", REWARD[team.size()])], "learned")
    want = _batch(logits, ref, "learned", paths=[PATHS[-1]])
    for name in ("logp", "legal_logp", "ref_legal_logp", "legal_mask", "backward_features",
                 "backward_choice", "log_reward", "context_index"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    with pytest.raises(ValueError, match="aborted construction never enters"):
        ctb_trajectory(Construction(tuple(steps), None, "budget"), theta, "alfworld", 0.2)
