"""Tempered TB on tiny enumerable DAGs: the exact loss's minimizer samples terminal states in
proportion to (r + ε)^β (with per-token normalization and n tokens on every edge where each
state has one parent: (r + ε)^{nβ}); the closed-form optimal log Z; the backward policy."""

from __future__ import annotations

import math

import pytest
import torch

from evosteer_core.episode.actions import KINDS
from evosteer_core.objectives import TemperedTB, TrajectoryBatch
from evosteer_core.objectives.tempered_tb import N_ACTION_KINDS, backward_log_probs

STOP = KINDS.index("STOP")


def test_kind_count_matches_the_action_kinds():
    assert len(KINDS) == N_ACTION_KINDS


def enumerate_dag(items: tuple[int, ...]):
    """Every trajectory: add items (kinds) one at a time in any order, then STOP; the state is
    the set of added items, so several orders reach one state. Returns [(the state before each action, action kinds)]; the last state is
    the one the trajectory stops in (its terminal)."""
    out = []

    def walk(state: frozenset, path: list[int], states: list[frozenset]):
        out.append((states + [state], path + [STOP]))
        for item in items:
            if item in state:
                continue
            walk(state | {item}, path + [item], states + [state])

    walk(frozenset(), [], [])
    return out


def batch_for(trajs, fwd_logits: dict, counts: int, rewards: dict) -> TrajectoryBatch:
    """A padded batch: ℓ_F from a tabular forward policy over each state's legal actions."""
    n_b, n_t = len(trajs), max(len(k) for _, k in trajs)
    logp = torch.zeros(n_b, n_t, dtype=torch.float64)
    kinds = torch.zeros(n_b, n_t, dtype=torch.long)
    rows = []
    for b, (states, ks) in enumerate(trajs):
        for t, k in enumerate(ks):
            legal, logits = fwd_logits[states[t]]
            logp[b, t] = torch.log_softmax(logits, 0)[legal.index(k)]
            kinds[b, t] = k
        rows.append(rewards[states[-1]])
    lengths = torch.tensor([len(k) for _, k in trajs])
    return TrajectoryBatch(
        delta_logp=torch.zeros(n_b, n_t, dtype=torch.float64),
        action_mask=torch.arange(n_t)[None, :] < lengths[:, None],
        lengths=lengths,
        u=torch.zeros(n_b, dtype=torch.float64),
        c=torch.zeros(n_b, n_t + 1, dtype=torch.float64),
        b=torch.zeros(n_b, n_t + 1, dtype=torch.float64),
        log_reward=torch.zeros(n_b, dtype=torch.float64),
        logp=logp,
        rewards=torch.tensor(rows, dtype=torch.float64),
        token_counts=torch.full((n_b, n_t), counts),
        action_kinds=kinds,
    )


def fit(trajs, counts, rewards, beta, eps):
    states = sorted({s for st, _ in trajs for s in st}, key=sorted)
    legal = {}
    for s in states:
        nxt = [k for st, ks in trajs for t, k in enumerate(ks[:-1]) if st[t] == s]
        legal[s] = sorted(set(nxt)) + [STOP]
    params = {
        s: torch.zeros(len(legal[s]), dtype=torch.float64, requires_grad=True) for s in states
    }
    objective = TemperedTB(beta=beta, epsilon=eps).double()
    uniform = batch_for(
        trajs, {s: (legal[s], torch.zeros(len(legal[s]))) for s in states}, 1, rewards
    )
    q = uniform.logp.sum(1).exp()  # the fixed sampling law: uniform forward choices
    opt = torch.optim.LBFGS(
        [*params.values(), *objective.parameters()],
        lr=0.5,
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-15,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        batch = batch_for(trajs, {s: (legal[s], params[s]) for s in states}, counts, rewards)
        loss = (q * objective.residuals(batch).pow(2)).sum()
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    final = batch_for(trajs, {s: (legal[s], params[s]) for s in states}, 1, rewards)
    marginal: dict = {}
    for (st, _), lp in zip(trajs, final.logp.sum(1).exp().tolist(), strict=True):
        marginal[st[-1]] = marginal.get(st[-1], 0.0) + lp
    return objective, float(closure().detach()), marginal


REWARDS = {frozenset(): 0.0, frozenset({0}): 0.3, frozenset({1}): 0.6, frozenset({0, 1}): 1.0}


def test_several_orders_reach_one_state_and_the_minimizer_samples_proportional_to_tempered_reward():
    beta, eps = 2.0, 0.05
    trajs = enumerate_dag((0, 1))
    assert sum(1 for st, _ in trajs if st[-1] == frozenset({0, 1})) == 2  # two orders
    objective, loss, marginal = fit(trajs, 1, REWARDS, beta, eps)
    weights = {x: (r + eps) ** beta for x, r in REWARDS.items()}
    total = sum(weights.values())
    assert loss < 1e-10
    for x, w in weights.items():
        assert marginal[x] == pytest.approx(w / total, abs=1e-6)
    assert float(objective.log_z) == pytest.approx(math.log(total), abs=1e-5)


def test_token_normalization_on_a_tree_raises_the_temperature_to_n_beta():
    """One edit then STOP: every state has one parent, so P_B = 1 and with n sampled tokens on
    every edge Σ_t ℓ_t/n = (log P_F)/n: the balance holds at temperature nβ."""
    beta, eps, n = 1.0, 0.05, 2
    empty = frozenset()
    trajs = [([empty], [STOP])] + [([empty, frozenset({i})], [i, STOP]) for i in (0, 1, 2)]
    rewards = {empty: 0.0, frozenset({0}): 0.3, frozenset({1}): 0.6, frozenset({2}): 1.0}
    _, loss, marginal = fit(trajs, n, rewards, beta, eps)
    weights = {x: (r + eps) ** (n * beta) for x, r in rewards.items()}
    total = sum(weights.values())
    assert loss < 1e-10
    for x, w in weights.items():
        assert marginal[x] == pytest.approx(w / total, abs=1e-6)


def test_closed_form_optimal_log_z():
    g = torch.Generator().manual_seed(4)
    trajs = enumerate_dag((0, 1, 2))
    states = {s for st, _ in trajs for s in st}
    legal = {s: sorted({0, 1, 2} - s) + [STOP] for s in states}
    tables = {
        s: (legal[s], torch.randn(len(legal[s]), generator=g, dtype=torch.float64)) for s in states
    }
    rewards = {st[-1]: float(torch.rand(1, generator=g)) for st, _ in trajs}
    batch = batch_for(trajs, tables, 3, rewards)
    q = torch.rand(len(trajs), generator=g, dtype=torch.float64)
    objective = TemperedTB(beta=1.5, epsilon=0.1).double()
    with torch.no_grad():
        objective.kind_logits.copy_(torch.randn(N_ACTION_KINDS, generator=g))
        objective.log_z.zero_()
    # residual at log Z = 0, written out: Σ ℓ/n − β log(r + ε) − Σ log P_B
    c = []
    for b, (st, ks) in enumerate(trajs):
        fwd = float(batch.logp[b, : len(ks)].sum()) / 3
        pb = 0.0
        for t in range(len(ks) - 1):
            w = [float(objective.kind_logits[k]) for k in ks[: t + 1]]
            pb += w[t] - math.log(sum(math.exp(x) for x in w))
        c.append(fwd - 1.5 * math.log(rewards[st[-1]] + 0.1) - pb)
    best = -sum(qi * ci for qi, ci in zip(q.tolist(), c, strict=True)) / float(q.sum())

    def loss_at(z: float) -> torch.Tensor:
        with torch.no_grad():
            objective.log_z.fill_(z)
        objective.zero_grad()
        value = (q * objective.residuals(batch).pow(2)).sum()
        value.backward()
        return value

    at_best = loss_at(best)
    assert abs(float(objective.log_z.grad)) < 1e-9
    assert float(at_best) < float(loss_at(best + 0.1)) and float(at_best) < float(
        loss_at(best - 0.1)
    )


def test_backward_policy_is_uniform_at_init_and_one_on_the_last_action():
    kinds = torch.tensor([[0, 1, 1, STOP], [2, STOP, 0, 0]])
    lengths = torch.tensor([4, 2])
    got = backward_log_probs(torch.zeros(N_ACTION_KINDS), kinds, lengths)
    want = [[0.0, math.log(1 / 2), math.log(1 / 3), 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert torch.allclose(got, torch.tensor(want), atol=1e-6)
