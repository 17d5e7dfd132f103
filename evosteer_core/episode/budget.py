"""The per-episode budget ledger (docs/method.md §1.3): one shared account for every call in an episode."""

from __future__ import annotations

from dataclasses import dataclass, fields

from evosteer_core.episode.roles import RoleSpec
from evosteer_core.executors.base import CallLimits, NodeResult


@dataclass(frozen=True)
class BudgetLimits:
    """Episode limits. Reference values are docs/method.md §1.3; small presets scale them down.

    ``model_calls`` and ``max_actions`` are project choices (docs/runtime.md): the method gives no
    episode-level model-call cap but feature 29 needs one, and ``max_actions`` bounds the
    number of orchestration decisions so that non-executing actions cannot loop forever.
    ``token_scale`` multiplies every role's per-call token limits (1.0 = reference).
    ``max_output_tokens`` caps each call's output tokens after that scaling (None = no cap
    beyond the roles' scaled limits): a slow local model spends its time generating, and a
    shorter reply is what makes a step of it short, without shrinking what a call may read.
    ``run_cost`` is not an episode limit but the whole run's hard budget in the currency of
    the ``prices`` section (None = none; docs/costs.md): training stops at the step boundary
    where the next step would exceed it. It is not part of the run's identity.
    """

    total_tokens: int = 98_304
    tool_calls: int = 50
    wall_time_s: float = 600.0
    model_calls: int = 64
    max_actions: int = 32
    env_steps: int = 50
    node_env_steps: int = 25
    node_model_calls_interactive: int = 35
    decision_deadline_s: float = 5.0
    token_scale: float = 1.0
    max_output_tokens: int | None = None
    run_cost: float | None = None

    def __post_init__(self) -> None:
        counts = (
            "total_tokens",
            "tool_calls",
            "model_calls",
            "max_actions",
            "env_steps",
            "node_env_steps",
            "node_model_calls_interactive",
        )
        for name in counts:
            if getattr(self, name) < 0:
                raise ValueError(f"budget.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("wall_time_s", "decision_deadline_s", "token_scale"):
            if getattr(self, name) <= 0:
                raise ValueError(f"budget.{name} must be > 0, got {getattr(self, name)}")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise ValueError(
                "budget.max_output_tokens must be >= 1 (or null: no cap), "
                f"got {self.max_output_tokens}"
            )
        if self.run_cost is not None and self.run_cost <= 0:
            raise ValueError(f"run_cost: must be > 0 (or null: no run budget), got {self.run_cost}")


@dataclass
class TokenUsage:
    """Tokens used as a provider bills them: prompt and completion tokens of the orchestrator's
    decisions and of the executor's calls, counted in full (the ledger's hard limit books at
    most the total; what a server reported beyond it was still used)."""

    orchestrator_prompt: int = 0
    orchestrator_completion: int = 0
    executor_prompt: int = 0
    executor_completion: int = 0

    def add(self, other: TokenUsage) -> None:
        """Add ``other``'s counts to these."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class BudgetLedger:
    """Spent tokens, calls, environment steps and (simulated or measured) wall time.

    The token total is a hard limit (docs/method.md §1.3): a charge is booked up to what is left and any
    excess (a server that reported more than the executor estimated) goes to ``tokens_over``.
    Per-node usage is kept for the interactive family's per-node limits, which hold across all
    of a node's executions. The orchestrator's own booked tokens are also kept apart
    (``orchestrator_tokens_in``/``_out``), so that a cost table can split a trajectory's tokens
    into the orchestrator's and the executor's (the rest of ``tokens_in``/``tokens_out``).
    """

    def __init__(self, limits: BudgetLimits) -> None:
        self.limits = limits
        self.tokens_in = 0
        self.tokens_out = 0
        self.tokens_over = 0
        self.orchestrator_tokens_in = 0
        self.orchestrator_tokens_out = 0
        self.model_calls = 0
        self.tool_calls = 0
        self.env_steps = 0
        self.wall_s = 0.0
        self.node_model_calls: dict[str, int] = {}
        self.node_env_steps: dict[str, int] = {}
        self.usage = TokenUsage()

    # --- accounting -------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return self.tokens_in + self.tokens_out

    @property
    def tokens_left(self) -> int:
        return max(0, self.limits.total_tokens - self.tokens)

    def _charge_tokens(self, tokens_in: int, tokens_out: int) -> tuple[int, int]:
        """Book input, then output tokens, up to the total; the rest is ``tokens_over``.
        Returns the (input, output) tokens booked."""
        booked_in = min(tokens_in, self.tokens_left)
        self.tokens_in += booked_in
        booked_out = min(tokens_out, self.tokens_left)
        self.tokens_out += booked_out
        self.tokens_over += tokens_in + tokens_out - booked_in - booked_out
        return booked_in, booked_out

    def charge_node(self, result: NodeResult, node_id: str) -> None:
        """Charge one execution of node ``node_id`` (all of its model calls, tool calls and
        time); its model calls and environment steps also count against the node."""
        self._charge_tokens(result.tokens_in, result.tokens_out)
        self.usage.executor_prompt += result.tokens_in
        self.usage.executor_completion += result.tokens_out
        self.model_calls += result.model_calls
        self.tool_calls += result.tool_calls
        self.env_steps += result.env_steps
        self.wall_s += result.latency_s
        calls, steps = self.node_model_calls, self.node_env_steps
        calls[node_id] = calls.get(node_id, 0) + result.model_calls
        steps[node_id] = steps.get(node_id, 0) + result.env_steps

    def charge_orchestrator(self, tokens_in: int, tokens_out: int, seconds: float = 0.0) -> None:
        """Charge the orchestrator's own decision (prompt and action tokens, its time)."""
        booked_in, booked_out = self._charge_tokens(tokens_in, tokens_out)
        self.orchestrator_tokens_in += booked_in
        self.orchestrator_tokens_out += booked_out
        self.usage.orchestrator_prompt += tokens_in
        self.usage.orchestrator_completion += tokens_out
        self.wall_s += seconds

    # --- reservations -----------------------------------------------------------------
    def call_tokens(self, role: RoleSpec) -> tuple[int, int]:
        """The role's per-call (input, output) token limits under this preset's scale and
        output cap."""
        s, cap = self.limits.token_scale, self.limits.max_output_tokens
        t_out = max(1, int(role.max_output_tokens * s))
        return max(1, int(role.max_input_tokens * s)), t_out if cap is None else min(t_out, cap)

    def can_reserve(self, role: RoleSpec) -> bool:
        """Whether one call of ``role`` (its full per-call token limits) still fits."""
        t_in, t_out = self.call_tokens(role)
        return self.can_afford(t_in + t_out)

    def can_afford(self, tokens: int) -> bool:
        """Whether one more model call reserving ``tokens`` (input + output) still fits."""
        return (
            self.limits.total_tokens - self.tokens >= tokens
            and self.limits.model_calls - self.model_calls >= 1
            and self.wall_s < self.limits.wall_time_s
        )

    def node_calls_left(self, node_id: str) -> int:
        """Model calls node ``node_id`` has left under the interactive per-node limit."""
        used = self.node_model_calls.get(node_id, 0)
        return max(0, self.limits.node_model_calls_interactive - used)

    def node_steps_left(self, node_id: str) -> int:
        """Environment steps node ``node_id`` has left (per node and in the episode)."""
        node = self.limits.node_env_steps - self.node_env_steps.get(node_id, 0)
        return max(0, min(node, self.limits.env_steps - self.env_steps))

    def call_limits(self, role: RoleSpec, interactive: bool, node_id: str) -> CallLimits:
        """Limits for one execution of ``role`` (as node ``node_id``), clipped to what the
        episode has left: tokens (all calls together), model calls, tool calls, and in the
        interactive family what is left of the node's own model calls and environment steps."""
        t_in, t_out = self.call_tokens(role)
        calls = self.node_calls_left(node_id) if interactive else role.max_model_calls
        return CallLimits(
            max_model_calls=max(0, min(calls, self.limits.model_calls - self.model_calls)),
            max_tool_calls=max(
                0, min(role.max_tool_calls, self.limits.tool_calls - self.tool_calls)
            ),
            max_input_tokens=t_in,
            max_output_tokens=t_out,
            max_env_steps=self.node_steps_left(node_id) if interactive else 0,
            max_total_tokens=self.tokens_left,
        )

    # --- features 26-29 ---------------------------------------------------------------
    def used_fractions(self) -> tuple[float, float, float, float]:
        """(tokens, tool calls, wall time, model calls) used, each clipped to [0, 1]."""

        def frac(used: float, cap: float) -> float:
            return 0.0 if cap <= 0 else min(1.0, max(0.0, used / cap))

        lim = self.limits
        return (
            frac(self.tokens, lim.total_tokens),
            frac(self.tool_calls, lim.tool_calls),
            frac(self.wall_s, lim.wall_time_s),
            frac(self.model_calls, lim.model_calls),
        )

    def snapshot(self) -> dict[str, float]:
        """JSON-able view of the ledger (for prompts and records)."""
        return {
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "model_calls": self.model_calls,
            "tool_calls": self.tool_calls,
            "env_steps": self.env_steps,
            "wall_s": round(self.wall_s, 6),
        }
