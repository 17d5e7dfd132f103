"""experiments/collab_gate_sim.py at a tiny scale: the rules are paired (same local episodes),
κ = 1 makes the gate revise wherever scores are only 0/1, and the report prints its tables."""

from __future__ import annotations

from experiments import collab_gate_sim as sim


def test_rules_are_paired_and_retrieval_alone_never_decides_a_gate():
    cfg = sim.collab_config()
    comp = sim.comparison(cfg, 3, [0])
    qa = comp["researcher>solver"]
    # researcher (retrieval, ℓ ≤ 1) → solver (ℓ = 0): |Δ| ≤ κ always, so the gate revises
    # exactly where always_revise does, and the local episodes are the same draws
    assert qa["evidence"]["rewards"] == qa["always_revise"]["rewards"]
    assert [g.branch for g in qa["evidence"]["gates"]] == [
        g.branch for g in qa["always_revise"]["gates"]
    ]
    for team, rules in comp.items():
        assert {g.branch for g in rules["verbatim"]["gates"]} <= {"equal", "no_answer", "adopt"}
        assert not {g.branch for g in rules["always_revise"]["gates"]} & {"adopt", "keep"}, team
    cal = sim.calibration(cfg, 3, [0])
    assert {row[1] for row in cal} >= {"solver", "researcher", "verifier+input"}
    text = sim.report(cal, comp, 3, [0])
    assert "| tool_user>verifier>solver | evidence |" in text and "SIMULATED" in text
