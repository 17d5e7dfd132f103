"""The backward kernel b_φ of Collaborative Trajectory Balance (docs/collabflow.md §3).

Construction states carry their history, so every interior state has exactly one parent and
its backward probability is 1; only the canonical terminal of a team G has many parents, one
per construction order. b_φ picks an order by *unbuilding* G: it removes one removable
component at a time (``team.removable``: an edge, a binding, the output selection, or an
agent nothing left references) with a softmax over the removable set, until the team is
empty. Each choice is normalized, so b_φ(·|G) sums to one over the orders O(G) of G. The
order a forward trajectory chose is unbuilt along its reverse, so its Σ_t log b_φ(e_t) is

    log b_φ(u_1 … u_n | G) = Σ_{s=n..1} log softmax_{O(G_s)}(g_φ(x(c; G_s)))[u_s],

with G_s the team after the first s additions. The uniform ablation (``collabflow.backward:
uniform``) gives every order 1/|O(G)|, counted exactly over subsets of G's components.

Component features x(c; G_s) ∈ R^13 (``N_FEATURES``): the kind one-hot (agent, edge, binding,
output; 4), the edge protocol one-hot (``PROTOCOLS``; 3), the output mode one-hot
(``OUTPUT_MODES``; 4), 1 if the edge's reverse edge is also in G_s (1), and the progress
|G_s|/|G| of the unbuilding (1). g_φ is R^13 → 16 → tanh → R^1 with its last layer zero at
init, so an untrained b_φ is uniform over the removable set at every step (not over orders).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import torch
from torch import Tensor, nn

from evosteer_core.collabflow.team import (
    OUTPUT_MODES,
    PROTOCOLS,
    BuildAction,
    IllegalBuildError,
    Team,
    removable,
    remove,
)

COMPONENT_KINDS: tuple[str, ...] = ("add_agent", "add_edge", "bind_skill", "set_output")
N_FEATURES = len(COMPONENT_KINDS) + len(PROTOCOLS) + len(OUTPUT_MODES) + 2
HIDDEN = 16


def component_features(component: BuildAction, team: Team, full_size: int) -> list[float]:
    """x(c; G_s): the features of removable ``component`` of the current ``team``."""
    x = [float(component.kind == k) for k in COMPONENT_KINDS]
    args = component.args
    is_edge = component.kind == "add_edge"
    x += [float(is_edge and args[2] == p) for p in PROTOCOLS]
    x += [float(component.kind == "set_output" and args[0] == m) for m in OUTPUT_MODES]
    reverse = is_edge and any((e.source, e.target) == (args[1], args[0]) for e in team.edges)
    x.append(float(reverse))
    x.append(team.size() / full_size)
    return x


def unbuilding(team: Team, order: Sequence[BuildAction]) -> tuple[list[list[list[float]]], list[int]]:
    """The backward choices that unbuild ``team`` along the reverse of ``order`` (its
    construction actions without ``stop``): per step, the features of every removable
    component (in ``removable``'s order) and the index of the one removed.

    Raises :class:`IllegalBuildError` when ``order`` is not a construction order of ``team``.
    """
    if len(order) != team.size():
        raise IllegalBuildError(
            f"an order of this team has {team.size()} actions, got {len(order)}"
        )
    features, choices, current, full = [], [], team, team.size()
    for action in reversed(order):
        options = removable(current)
        if action not in options:
            raise IllegalBuildError(f"{action.text()} cannot be the last addition here")
        features.append([component_features(c, current, full) for c in options])
        choices.append(options.index(action))
        current = remove(current, action)
    return features, choices


@lru_cache(maxsize=1024)
def order_count(team: Team) -> int:
    """|O(G)|: the number of construction orders of ``team``, by the unbuilding recursion
    over its sub-teams with each sub-team counted once (at most 2^|G| of them)."""
    memo: dict[Team, int] = {Team(): 1}

    def count(sub: Team) -> int:
        if sub not in memo:
            memo[sub] = sum(count(remove(sub, c)) for c in removable(sub))
        return memo[sub]

    return count(team)


def uniform_log_prob(team: Team) -> float:
    """log of the uniform ablation's backward probability of any order: −log |O(G)|."""
    return -math.log(order_count(team))


class BackwardPolicy(nn.Module):
    """g_φ: a removable component's logit from its features (softmax over the removable set)."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(N_FEATURES, HIDDEN)
        self.out = nn.Linear(HIDDEN, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, features: Tensor, mask: Tensor, choice: Tensor) -> Tensor:
        """Σ_s log b_φ per trajectory [B] from padded features [B, S, K, N_FEATURES], the
        removable mask [B, S, K] and the removed index [B, S]; steps with no removable entry
        (padding) contribute 0."""
        logits = self.out(torch.tanh(self.hidden(features))).squeeze(-1)
        very_negative = torch.finfo(logits.dtype).min / 4
        logits = torch.where(mask, logits, torch.full_like(logits, very_negative))
        log_b = torch.log_softmax(logits, dim=-1)
        chosen = log_b.gather(-1, choice.clamp_min(0).unsqueeze(-1)).squeeze(-1)
        step_valid = mask.any(dim=-1)
        return torch.where(step_valid, chosen, torch.zeros_like(chosen)).sum(dim=-1)
