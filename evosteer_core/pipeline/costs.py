"""What a run costs: the price of measured usage, the estimate before a run, the run budget.

Three uses of one price table (the config's ``prices`` section) over the usage records of
:mod:`evosteer_core.pipeline.usage` (docs/costs.md):

* :func:`run_spend` — what the steps of a run recorded so far cost (the per-step MLflow
  metrics ``cost_step`` and ``cost_total``, the progress bar);
* :func:`estimate` — tokens, stage hours and cost of a whole run before it runs, each figure
  with its basis: the mean of the measured steps of the same run (same config hash, same
  store) when there are any, else the budget caps (tokens only: stage time has no cap);
* :func:`check_run_budget` — at a step boundary, stop the run when the spend so far plus the
  predicted next step (the mean measured step) would exceed ``budget.run_cost``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from evosteer_core.episode.budget import TokenUsage
from evosteer_core.infra.artifacts import ArtifactStore
from evosteer_core.infra.config import RunConfig
from evosteer_core.infra.configio import ConfigError
from evosteer_core.pipeline.usage import StageUsage, UsageLog

TOKEN_KINDS: tuple[str, ...] = tuple(f.name for f in fields(TokenUsage))
"""``orchestrator_prompt``, ``orchestrator_completion``, ``executor_prompt``,
``executor_completion``: each priced at its model's prompt or completion price."""

PER_TOKENS = 1_000_000
"""The price table quotes prices per 1M tokens."""

SECONDS_PER_HOUR = 3600.0


def model_names(cfg: RunConfig) -> dict[str, str]:
    """The model each role's tokens are priced as: the orchestrator's ``policy.backbone`` and
    the executor's ``executor.model`` (``sim`` for the simulated executor)."""
    executor = cfg.executor.model if cfg.executor.kind == "openai" else "sim"
    return {"orchestrator": cfg.policy.backbone, "executor": str(executor)}


def _role_and_side(kind: str) -> tuple[str, str]:
    role, _, side = kind.partition("_")
    return role, side


def token_prices(cfg: RunConfig) -> dict[str, float | None]:
    """The price of one token of each kind (None: the model has no entry in
    ``prices.models``)."""
    names = model_names(cfg)
    out: dict[str, float | None] = {}
    for kind in TOKEN_KINDS:
        role, side = _role_and_side(kind)
        price = cfg.prices.models.get(names[role])
        out[kind] = None if price is None else getattr(price, side) / PER_TOKENS
    return out


def unpriced_models(cfg: RunConfig) -> list[str]:
    """The models in use that the price table does not list (their tokens count 0)."""
    return sorted({n for n in model_names(cfg).values() if n not in cfg.prices.models})


def require_priced(cfg: RunConfig, source: str = "<config>") -> None:
    """With ``budget.run_cost`` set, every model in use must have a price: an unpriced model
    would count 0 and the budget could never stop the run. One line naming the key to add."""
    if cfg.budget.run_cost is None:
        return
    missing = unpriced_models(cfg)
    if missing:
        name = missing[0]
        raise ConfigError(
            source,
            "prices.models",
            f"no price for model {name!r}, which this run uses; budget.run_cost needs one "
            f"(add prices.models.{name}: {{prompt: <per 1M>, completion: <per 1M>}}, 0 if free)",
        )


def pod_kind(cfg: RunConfig, device: str) -> str:
    """What an hour of a stage is priced as: a GPU stage on a GPU (``policy.device`` other
    than ``cpu``) is a GPU hour; every other stage, and a GPU stage run on CPU, a CPU hour."""
    return "gpu" if device == "gpu" and cfg.policy.device != "cpu" else "cpu"


def hour_price(cfg: RunConfig, kind: str) -> float:
    return cfg.prices.gpu_hour if kind == "gpu" else cfg.prices.cpu_hour


def tokens_cost(cfg: RunConfig, tokens: TokenUsage) -> float:
    """The price of ``tokens`` (unpriced models count 0)."""
    prices = token_prices(cfg)
    return sum(getattr(tokens, k) * (prices[k] or 0.0) for k in TOKEN_KINDS)


@dataclass(frozen=True)
class StepUsage:
    """One step's usage summed over its stage records: tokens, seconds per stage and per pod
    kind, and what they cost."""

    tokens: TokenUsage
    stage_seconds: dict[str, float]
    kind_seconds: dict[str, float]
    cost: float


def step_usage(cfg: RunConfig, records: list[StageUsage]) -> StepUsage:
    """Sum one step's stage records (rollout shards add up) and price them."""
    tokens = TokenUsage()
    stage_seconds: dict[str, float] = {}
    kind_seconds = {"gpu": 0.0, "cpu": 0.0}
    for r in records:
        tokens.add(r.tokens)
        stage_seconds[r.stage] = stage_seconds.get(r.stage, 0.0) + r.seconds
        kind_seconds[pod_kind(cfg, r.device)] += r.seconds
    hours_cost = sum(hour_price(cfg, k) * s / SECONDS_PER_HOUR for k, s in kind_seconds.items())
    return StepUsage(tokens, stage_seconds, kind_seconds, tokens_cost(cfg, tokens) + hours_cost)


@dataclass(frozen=True)
class RunSpend:
    """The measured steps of a run (``through`` a step, if given) and what they cost."""

    steps: dict[int, StepUsage]

    @property
    def total(self) -> float:
        return sum(u.cost for u in self.steps.values())

    def mean_step_cost(self) -> float | None:
        """The mean cost of a measured step (None: none measured)."""
        return self.total / len(self.steps) if self.steps else None

    def metrics(self, step: int) -> dict[str, float]:
        """The MLflow metrics of ``step``: its cost and the run's spend through it."""
        return {
            "cost_step": self.steps[step].cost if step in self.steps else 0.0,
            "cost_total": sum(u.cost for k, u in self.steps.items() if k <= step),
        }


def run_spend(
    cfg: RunConfig, store: ArtifactStore, run_id: str, through: int | None = None
) -> RunSpend:
    """The priced usage of every step of ``run_id`` recorded in ``store`` (up to ``through``);
    a stage with no record (run before usage was recorded) counts nothing."""
    recorded = UsageLog(store, run_id).steps()
    return RunSpend(
        {
            k: step_usage(cfg, records)
            for k, records in recorded.items()
            if k >= 1 and (through is None or k <= through)
        }
    )


class RunBudgetReached(RuntimeError):
    """The next step would take the run past ``budget.run_cost``: stopped at a step boundary,
    resumable with a larger budget (``budget.run_cost`` is not in the run's identity)."""


def money(cfg: RunConfig, value: float) -> str:
    return f"{value:.4g} {cfg.prices.currency}"


def check_run_budget(cfg: RunConfig, spend: RunSpend, done: int) -> None:
    """Before step ``done + 1``: raise :class:`RunBudgetReached` when the spend of steps
    1..``done`` plus the mean measured step would exceed ``budget.run_cost``. Nothing measured
    yet (the first step): nothing to predict from, the step runs."""
    budget = cfg.budget.run_cost
    mean = spend.mean_step_cost()
    if budget is None or mean is None or done >= cfg.train.steps:
        return
    spent = spend.total
    if spent + mean <= budget:
        return
    need = spent + mean * (cfg.train.steps - done)
    raise RunBudgetReached(
        f"budget.run_cost {money(cfg, budget)} reached: stopped after step {done} of "
        f"{cfg.train.steps} (spent {money(cfg, spent)}; the next step would cost about "
        f"{money(cfg, mean)}); to continue, run the same command with a larger budget, e.g. "
        f"--set budget.run_cost={need:.4g} (about what all {cfg.train.steps} steps need)"
    )


# --- the estimate --------------------------------------------------------------------------
@dataclass(frozen=True)
class Figure:
    """One estimated figure per step and the basis it rests on (``measured`` or ``cap``)."""

    value: float
    basis: str


@dataclass(frozen=True)
class Estimate:
    """Tokens by kind, hours by stage (None: no basis) and cost, per step, for ``steps``
    steps of run ``run_id``; ``spent`` is what its measured steps cost already."""

    run_id: str
    steps: int
    measured_steps: tuple[int, ...]
    tokens: dict[str, Figure]
    stage_hours: dict[str, tuple[str, Figure | None]]
    step_cost: Figure
    spent: float
    unpriced: list[str] = field(default_factory=list)

    @property
    def run_cost(self) -> float:
        """The whole run: the measured steps at their cost, the rest at the step estimate."""
        remaining = max(0, self.steps - len(self.measured_steps))
        return self.spent + self.step_cost.value * remaining


def episodes_cap(cfg: RunConfig) -> int:
    """The most episodes a step runs: the natural rollouts, plus, with skills on, one pair
    (two episodes) per batch record and one re-evaluation pair (``skills/pairs.plan_pairs``)."""
    t = cfg.train
    pairs = 2 * (t.batch_size + 1) if cfg.skills.enabled else 0
    return t.batch_size * (t.rollouts_theta + t.rollouts_rho) + pairs


def episode_token_caps(cfg: RunConfig) -> dict[str, int]:
    """Per episode, the most tokens of each kind the budget lets it book: the orchestrator's
    ``max_actions`` decisions of at most ``context_tokens − max_action_tokens`` prompt and
    ``max_action_tokens`` action tokens, the executor's whatever the episode total leaves;
    each at most ``budget.total_tokens``, which also caps them together."""
    b, p = cfg.budget, cfg.policy
    total = b.total_tokens
    return {
        "orchestrator_prompt": min(total, b.max_actions * (p.context_tokens - p.max_action_tokens)),
        "orchestrator_completion": min(total, b.max_actions * p.max_action_tokens),
        "executor_prompt": total,
        "executor_completion": total,
    }


def capped_episode_cost(cfg: RunConfig) -> float:
    """The dearest an episode can be under the caps: the episode's ``total_tokens`` spent on
    the dearest kinds first, each up to its own cap (the maximum of the linear cost under
    these limits)."""
    prices, caps = token_prices(cfg), episode_token_caps(cfg)
    left, cost = cfg.budget.total_tokens, 0.0
    for kind in sorted(TOKEN_KINDS, key=lambda k: prices[k] or 0.0, reverse=True):
        take = min(left, caps[kind])
        cost += take * (prices[kind] or 0.0)
        left -= take
    return cost


def estimate(cfg: RunConfig, store: ArtifactStore, run_id: str) -> Estimate:
    """The estimate of ``cfg``'s run ``run_id``: from the run's measured steps in ``store``
    when it has any, else from the caps (:func:`episode_token_caps`; stage hours unknown)."""
    from evosteer_core.pipeline.stage_io import method_of  # tables and torch: when estimating

    stages = method_of(cfg).stages

    spend = run_spend(cfg, store, run_id)
    measured = tuple(spend.steps)
    n = len(measured)
    if n:
        basis = f"measured: mean of {n} recorded step{'s' * (n != 1)} of {run_id}"
        usages = list(spend.steps.values())
        tokens = {
            k: Figure(sum(getattr(u.tokens, k) for u in usages) / n, basis) for k in TOKEN_KINDS
        }
        stage_hours: dict[str, tuple[str, Figure | None]] = {}
        for stage in stages:
            seen = [u.stage_seconds[stage.name] for u in usages if stage.name in u.stage_seconds]
            hours = Figure(sum(seen) / len(seen) / SECONDS_PER_HOUR, basis) if seen else None
            stage_hours[stage.name] = (pod_kind(cfg, stage.device), hours)
        step_cost = Figure(spend.total / n, basis)
    else:
        episodes = episodes_cap(cfg)
        basis = (
            f"cap: at most {episodes} episodes × budget caps (no recorded step of {run_id}; "
            "stage hours have no cap)"
        )
        caps = episode_token_caps(cfg)
        tokens = {k: Figure(float(episodes * caps[k]), basis) for k in TOKEN_KINDS}
        stage_hours = {s.name: (pod_kind(cfg, s.device), None) for s in stages}
        step_cost = Figure(episodes * capped_episode_cost(cfg), basis)
    return Estimate(
        run_id=run_id,
        steps=cfg.train.steps,
        measured_steps=measured,
        tokens=tokens,
        stage_hours=stage_hours,
        step_cost=step_cost,
        spent=spend.total,
        unpriced=unpriced_models(cfg),
    )


def estimate_lines(cfg: RunConfig, est: Estimate) -> list[str]:
    """The estimate as the lines ``evosteer estimate`` prints."""
    names = model_names(cfg)
    steps = est.steps
    cap = not est.measured_steps
    sign = "≤ " if cap else ""
    lines = [
        f"Estimate for run {est.run_id}: {steps} steps, prices in {cfg.prices.currency}",
        f"Basis: {est.step_cost.basis}",
        f"Tokens per step{' (caps)' if cap else ''}:",
    ]
    for role in ("orchestrator", "executor"):
        p, c = (est.tokens[f"{role}_{side}"].value for side in ("prompt", "completion"))
        lines.append(
            f"  {role:<12} {names[role]:<24} prompt {sign}{p:,.0f}  completion {sign}{c:,.0f}"
        )
    if cap:
        total = episodes_cap(cfg) * cfg.budget.total_tokens
        lines.append(f"  all kinds together ≤ {total:,} (budget.total_tokens per episode)")
    lines.append(
        "Tokens for the run: "
        + ", ".join(f"{k} {sign}{est.tokens[k].value * steps:,.0f}" for k in TOKEN_KINDS)
    )
    lines.append("Stage hours per step (pod kind; GPU-hours where the kind is gpu):")
    for stage, (kind, hours) in est.stage_hours.items():
        shown = "not measured yet" if hours is None else f"{hours.value:.6f} h"
        lines.append(f"  {stage:<12} {kind}  {shown}")
    if not cap:
        for kind in ("gpu", "cpu"):
            hours = sum(h.value for k, h in est.stage_hours.values() if k == kind and h)
            lines.append(f"{kind.upper()}-hours for the run: {hours * steps:.6f}")
    what = "tokens at the caps, stage hours not included" if cap else "tokens and stage hours"
    lines.append(f"Cost per step: {sign}{money(cfg, est.step_cost.value)} ({what})")
    done = len(est.measured_steps)
    spent = f" (spent so far on {done} steps: {money(cfg, est.spent)})" if done else ""
    lines.append(f"Cost of the run: {sign}{money(cfg, est.run_cost)}{spent}")
    if est.unpriced:
        lines.append(f"Unpriced (counted 0): {', '.join(est.unpriced)}; add them to prices.models")
    if cfg.budget.run_cost is not None:
        fits = est.run_cost <= cfg.budget.run_cost
        verdict = "fits" if fits else "does not fit: training stops at a step boundary before it"
        lines.append(f"Run budget: budget.run_cost {money(cfg, cfg.budget.run_cost)} {verdict}")
    return lines
