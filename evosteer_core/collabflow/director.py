"""The Collab-Director: its prompt and legal-set sampling (docs/collabflow.md §1).

The director sees the director state v_t — the task (family and text, never a record id, a
split or a reference answer), the profiles compatible with it (role, tools, mode, the outputs
each may serve), the permitted protocols and output modes, the partial team, the remaining
construction budget and the accepted history — and picks one legal construction action.

Legal-set sampling: every legal action string u (its tokens followed by EOS) is scored by its
summed token log-probability under the backbone, log p(u|v) = Σ_j log softmax_V(z_j)[y_j] over
the full vocabulary, and the policy is that score renormalized over the legal set,
π̄(u|v) = softmax_{u ∈ U(v)} log p(u|v). All legal strings of one state run in one forward
pass on top of the prompt, whose tokens run once (a shared KV prefix). θ is the adapter on,
ρ the adapter off (``Policy.adapter_context``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evosteer_core.collabflow.team import BuildAction, Team, TeamSpec
from evosteer_core.episode.roles import Catalogue
from evosteer_core.policy.backbone import Policy
from evosteer_core.policy.render import COMPACT_TASK_CHARS, SYSTEM_SEPARATOR
from evosteer_core.policy.scoring import hidden_after_prefix

SYSTEM_DIRECTOR = (
    "Build an agent team for the task from the listed profiles. Reply with one legal "
    "construction action; stop only when the team is valid."
)
"""The director's system text (no ``SYSTEM_SEPARATOR`` inside: truncation keeps it)."""

TASK_CHARS = {"full": None, "compact": COMPACT_TASK_CHARS, "compact_no_task": 0}
"""How much of the task text each ``policy.renderer`` shows (None: all of it), as the
orchestrator's renderers do."""


@dataclass(frozen=True)
class DirectorView:
    """The director state v_t = (partial team, task, remaining budget, accepted history)."""

    family: str
    task: str
    """The task as an orchestrator sees it (``TaskRecord.orchestrator_text``)."""
    spec: TeamSpec
    team: Team
    history: tuple[BuildAction, ...]
    budget_left: int
    """Construction tokens left (B_con minus what the decisions so far were charged)."""


def _profile_line(spec: TeamSpec, catalogue: Catalogue, profile_id: str) -> str:
    p = spec.profile(profile_id)
    tools = ",".join(catalogue.tools_for(p.role_id, spec.family)) or "-"
    outputs = ",".join(p.outputs) or "-"
    return f"profile {p.profile_id} role={p.role_id} mode={p.mode} tools={tools} out={outputs}"


def _team_lines(team: Team) -> list[str]:
    edges = " ".join(f"{e.source}>{e.target}:{e.protocol}" for e in sorted(team.edges)) or "-"
    skills = " ".join(f"{a}+{k}" for a, k in sorted(team.bindings)) or "-"
    out = (
        "-"
        if team.output is None
        else " ".join(x for x in (team.output.mode, team.output.agent) if x)
    )
    return [
        f"agents {' '.join(sorted(team.agents)) or '-'}",
        f"edges {edges}",
        f"bound {skills}",
        f"output {out}",
    ]


def director_prompt(view: DirectorView, catalogue: Catalogue, renderer: str = "compact") -> str:
    """The director's prompt: system text, then the fixed context (family, task, profiles,
    protocols, output modes, skills: the same for every decision of a construction, so the
    prompts of one construction share their head), then the partial team, the budget left
    and the accepted history. ``renderer`` (``policy.renderer``) sets how much task text
    shows."""
    if renderer not in TASK_CHARS:
        raise ValueError(f"unknown renderer {renderer!r}; expected one of {sorted(TASK_CHARS)}")
    spec, chars = view.spec, TASK_CHARS[renderer]
    task = view.task if chars is None else view.task[:chars]
    lines = [
        f"family {view.family}",
        *([f"task {task}"] if chars != 0 else []),
        *(_profile_line(spec, catalogue, p.profile_id) for p in spec.profiles),
        f"protocols {' '.join(spec.protocols)}",
        f"outputs {' '.join(spec.output_modes)}",
        f"skills {' '.join(spec.skills) or '-'}",
        *_team_lines(view.team),
        f"budget {view.budget_left}",
        f"history {'; '.join(a.text() for a in view.history) or '-'}",
        "action:",
    ]
    return SYSTEM_DIRECTOR + SYSTEM_SEPARATOR + "\n".join(lines)


def scoring_tokens(policy: Policy, prompt: str, legal: Sequence[str]) -> int:
    """Tokens one decision's scoring pass reads: the prompt and every legal string (with its
    EOS) — what a construction decision is charged (docs/collabflow.md §1)."""
    tok = policy.tokenizer
    return len(tok.encode_prompt(prompt)) + sum(len(tok.encode_action(a)) for a in legal)


def action_logprobs(
    policy: Policy,
    prompt: str,
    legal: Sequence[str],
    use_adapter: bool,
    requires_grad: bool = False,
) -> torch.Tensor:
    """log p(u|prompt) of every legal string u: Σ_j log softmax over the full vocabulary at
    position j of u's tokens (EOS included), float32 [len(legal)].

    One pass: the prompt's tokens but its last run once; each row is the last prompt token
    followed by the string's tokens but its EOS, on top of that cached prefix."""
    if not legal:
        raise ValueError("action_logprobs: the legal set is empty")
    tok = policy.tokenizer
    prompt_ids = tok.encode_prompt(prompt)
    actions = [tok.encode_action(a) for a in legal]
    shared = len(prompt_ids) - 1
    grad = torch.enable_grad() if requires_grad else torch.no_grad()
    with grad, policy.adapter_context(use_adapter):
        hidden = hidden_after_prefix(policy, [prompt_ids + list(a[:-1]) for a in actions], shared)
        rows = torch.tensor([r for r, a in enumerate(actions) for _ in a])
        cols = torch.tensor([j for a in actions for j in range(len(a))])
        targets = torch.tensor([y for a in actions for y in a], device=hidden.device)
        logp = torch.log_softmax(policy.logits(hidden[rows, cols]), dim=-1)
        picked = logp.gather(1, targets[:, None])[:, 0]
        return torch.zeros(len(actions), device=picked.device).index_add(
            0, rows.to(picked.device), picked
        )


def legal_logprobs(
    policy: Policy,
    prompt: str,
    legal: Sequence[str],
    use_adapter: bool,
    requires_grad: bool = False,
) -> torch.Tensor:
    """log π̄(u|v) over the legal set: the summed string log-probabilities renormalized
    (a log-softmax over the legal strings), float32 [len(legal)]; exp sums to 1."""
    return torch.log_softmax(action_logprobs(policy, prompt, legal, use_adapter, requires_grad), 0)


def sample_index(logp: torch.Tensor, generator: torch.Generator) -> int:
    """Draw a legal index from π̄ (``logp`` = :func:`legal_logprobs`) with ``generator``; a
    single legal action is returned undrawn."""
    if len(logp) == 1:
        return 0
    probs = torch.softmax(logp.detach().double().cpu(), 0)
    return int(torch.multinomial(probs, 1, generator=generator))
