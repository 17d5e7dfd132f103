"""The per-episode budget ledger (docs/method.md §1.3)."""

from __future__ import annotations

import pytest

from evosteer_core.episode.budget import BudgetLedger, BudgetLimits
from evosteer_core.episode.roles import default_catalogue
from evosteer_core.executors.base import NodeResult

CAT = default_catalogue()
SOLVER, PLANNER, VERIFIER = CAT.role("solver"), CAT.role("planner"), CAT.role("verifier")


def _result(t_in: int = 0, t_out: int = 0, calls: int = 0, tools: int = 0, **kw) -> NodeResult:
    return NodeResult(
        "x", None, tokens_in=t_in, tokens_out=t_out, model_calls=calls, tool_calls=tools, **kw
    )


def test_reference_limits() -> None:
    lim = BudgetLimits()
    assert (lim.total_tokens, lim.tool_calls, lim.wall_time_s) == (98_304, 50, 600.0)
    assert (lim.env_steps, lim.node_env_steps, lim.node_model_calls_interactive) == (50, 25, 35)
    assert lim.decision_deadline_s == 5.0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("total_tokens", -1),
        ("tool_calls", -2),
        ("model_calls", -1),
        ("max_actions", -1),
        ("node_env_steps", -1),
        ("node_model_calls_interactive", -3),
    ],
)
def test_negative_limits_are_rejected_naming_the_field(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        BudgetLimits(**{field: value})


@pytest.mark.parametrize("field", ["wall_time_s", "decision_deadline_s", "token_scale"])
def test_non_positive_time_or_scale_rejected(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BudgetLimits(**{field: 0})


def test_node_and_orchestrator_charges_accumulate() -> None:
    ledger = BudgetLedger(BudgetLimits())
    ledger.charge_node(_result(100, 20, calls=2, tools=1, env_steps=3, latency_s=1.5), "n0")
    ledger.charge_node(_result(50, 5, calls=1, latency_s=0.25), "n0")
    ledger.charge_orchestrator(300, 7)
    ledger.charge_orchestrator(10, 1, seconds=0.5)
    assert (ledger.tokens_in, ledger.tokens_out, ledger.tokens) == (460, 33, 493)
    assert (ledger.model_calls, ledger.tool_calls, ledger.env_steps) == (3, 1, 3)
    assert ledger.wall_s == pytest.approx(2.25)
    assert ledger.snapshot() == {
        "tokens_in": 460,
        "tokens_out": 33,
        "model_calls": 3,
        "tool_calls": 1,
        "env_steps": 3,
        "wall_s": 2.25,
    }


def test_call_tokens_scale_with_the_preset() -> None:
    assert BudgetLedger(BudgetLimits()).call_tokens(SOLVER) == (20480, 12288)
    assert BudgetLedger(BudgetLimits()).call_tokens(PLANNER) == (20480, 2048)
    assert BudgetLedger(BudgetLimits(token_scale=0.125)).call_tokens(PLANNER) == (2560, 256)
    assert BudgetLedger(BudgetLimits(token_scale=1e-9)).call_tokens(SOLVER) == (1, 1)


def test_an_output_cap_bounds_each_call_after_the_scale_and_leaves_the_input() -> None:
    """At 1/16 the planner may write 2048/16 = 128 tokens and the solver 12288/16 = 768; a
    cap of 256 shortens the solver's reply only, and every execution's limits carry it."""
    capped = BudgetLedger(BudgetLimits(token_scale=0.0625, max_output_tokens=256))
    assert capped.call_tokens(SOLVER) == (1280, 256)
    assert capped.call_tokens(PLANNER) == (1280, 128)
    assert capped.call_limits(SOLVER, interactive=False, node_id="n0").max_output_tokens == 256
    total = 1280 + 256
    tight = BudgetLedger(BudgetLimits(total_tokens=total, token_scale=0.0625, max_output_tokens=256))
    assert tight.can_reserve(SOLVER)  # uncapped the solver would need 1280 + 768 tokens
    assert not BudgetLedger(BudgetLimits(total_tokens=total, token_scale=0.0625)).can_reserve(SOLVER)


@pytest.mark.parametrize("value", [0, -5])
def test_a_non_positive_output_cap_is_rejected(value: int) -> None:
    with pytest.raises(ValueError, match="budget.max_output_tokens"):
        BudgetLimits(max_output_tokens=value)


def test_reservation_needs_the_full_per_call_tokens() -> None:
    ledger = BudgetLedger(BudgetLimits(total_tokens=40_000))
    assert ledger.can_reserve(SOLVER) and ledger.can_reserve(PLANNER)
    ledger.charge_orchestrator(40_000 - 32_768, 0)  # exactly one solver call left
    assert ledger.can_reserve(SOLVER)
    ledger.charge_orchestrator(1, 0)
    assert not ledger.can_reserve(SOLVER)
    assert ledger.can_reserve(PLANNER)  # 22,528 still fits
    ledger.charge_orchestrator(32_767 - 22_528 + 1, 0)
    assert not ledger.can_reserve(PLANNER)


def test_reservation_needs_a_model_call_and_wall_time() -> None:
    ledger = BudgetLedger(BudgetLimits(model_calls=2, wall_time_s=10.0))
    ledger.charge_node(_result(calls=1), "n0")
    assert ledger.can_reserve(SOLVER)
    ledger.charge_node(_result(calls=1), "n0")
    assert not ledger.can_reserve(SOLVER)
    ledger = BudgetLedger(BudgetLimits(wall_time_s=10.0))
    ledger.charge_node(_result(latency_s=9.99), "n0")
    assert ledger.can_reserve(SOLVER)
    ledger.charge_node(_result(latency_s=0.01), "n0")
    assert not ledger.can_reserve(SOLVER)


def test_call_limits_are_clipped_to_what_is_left() -> None:
    lim = BudgetLimits(model_calls=6, tool_calls=4, env_steps=30, node_env_steps=25)
    ledger = BudgetLedger(lim)
    fresh = ledger.call_limits(VERIFIER, interactive=False, node_id="n1")
    assert (fresh.max_model_calls, fresh.max_tool_calls, fresh.max_env_steps) == (4, 3, 0)
    assert (fresh.max_input_tokens, fresh.max_output_tokens) == (20480, 12288)
    ledger.charge_node(_result(calls=3, tools=2, env_steps=10), "n0")
    clipped = ledger.call_limits(VERIFIER, interactive=False, node_id="n1")
    assert (clipped.max_model_calls, clipped.max_tool_calls) == (3, 2)
    inter = ledger.call_limits(SOLVER, interactive=True, node_id="n1")
    assert inter.max_model_calls == 3  # min(35 per interactive node, 3 left)
    assert inter.max_env_steps == 20  # min(25 per node, 30 - 10 left)
    assert inter.max_tool_calls == 0  # solver has no tools
    ledger.charge_node(_result(calls=5, tools=5, env_steps=25), "n0")
    spent = ledger.call_limits(VERIFIER, interactive=True, node_id="n1")
    assert (spent.max_model_calls, spent.max_tool_calls, spent.max_env_steps) == (0, 0, 0)


def test_interactive_node_model_call_cap() -> None:
    ledger = BudgetLedger(BudgetLimits(model_calls=100))
    assert ledger.call_limits(SOLVER, interactive=True, node_id="n1").max_model_calls == 35
    assert ledger.call_limits(SOLVER, interactive=False, node_id="n1").max_model_calls == 1


def test_used_fractions_are_clipped_ratios() -> None:
    lim = BudgetLimits(total_tokens=1000, tool_calls=10, wall_time_s=20.0, model_calls=8)
    ledger = BudgetLedger(lim)
    assert ledger.used_fractions() == (0.0, 0.0, 0.0, 0.0)
    ledger.charge_node(_result(200, 50, calls=2, tools=3, latency_s=5.0), "n0")
    assert ledger.used_fractions() == pytest.approx((0.25, 0.3, 0.25, 0.25))
    ledger.charge_node(_result(5000, 0, calls=20, tools=30, latency_s=100.0), "n0")
    assert ledger.used_fractions() == (1.0, 1.0, 1.0, 1.0)


def test_used_fractions_with_zero_caps_are_zero() -> None:
    ledger = BudgetLedger(BudgetLimits(total_tokens=0, tool_calls=0, model_calls=0))
    ledger.charge_node(_result(10, 10, calls=1, tools=1), "n0")
    assert ledger.used_fractions()[0] == 0.0
    assert ledger.used_fractions()[1] == 0.0
    assert ledger.used_fractions()[3] == 0.0


def test_the_token_total_is_a_hard_limit_and_the_excess_is_recorded() -> None:
    ledger = BudgetLedger(BudgetLimits(total_tokens=1000))
    assert ledger.call_limits(SOLVER, interactive=False, node_id="n0").max_total_tokens == 1000
    ledger.charge_node(_result(600, 100, calls=1), "n0")
    assert ledger.tokens_left == 300
    assert ledger.call_limits(VERIFIER, interactive=False, node_id="n1").max_total_tokens == 300
    ledger.charge_node(_result(250, 80, calls=1), "n1")  # the server reported 30 too many
    assert (ledger.tokens_in, ledger.tokens_out, ledger.tokens) == (850, 150, 1000)
    assert ledger.tokens_over == 30 and ledger.tokens_left == 0
    ledger.charge_orchestrator(40, 2)
    assert ledger.tokens == 1000 and ledger.tokens_over == 72
    assert ledger.call_limits(SOLVER, interactive=False, node_id="n2").max_total_tokens == 0


def test_interactive_limits_hold_per_node_across_its_executions() -> None:
    lim = BudgetLimits(model_calls=200, env_steps=50, node_env_steps=25)
    ledger = BudgetLedger(lim)
    ledger.charge_node(_result(calls=20, env_steps=15), "n0")
    ledger.charge_node(_result(calls=12, env_steps=8), "n0")
    again = ledger.call_limits(SOLVER, interactive=True, node_id="n0")
    assert (again.max_model_calls, again.max_env_steps) == (35 - 32, 25 - 23)
    assert (ledger.node_calls_left("n0"), ledger.node_steps_left("n0")) == (3, 2)
    fresh = ledger.call_limits(SOLVER, interactive=True, node_id="n1")
    assert (fresh.max_model_calls, fresh.max_env_steps) == (35, 25)
    ledger.charge_node(_result(calls=20, env_steps=20), "n1")
    assert ledger.call_limits(SOLVER, interactive=True, node_id="n2").max_env_steps == 50 - 43
    ledger.charge_node(_result(calls=3, env_steps=2), "n0")
    spent = ledger.call_limits(SOLVER, interactive=True, node_id="n0")
    assert (spent.max_model_calls, spent.max_env_steps) == (0, 0)
