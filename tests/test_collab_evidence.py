"""CollabFlow evidence: version-bound records, Filter, the score ℓ and the gate, table-driven
over every branch and every gate rule (docs/collabflow.md §2)."""

from __future__ import annotations

import itertools

import pytest

from evosteer_core.collabflow.evidence import (
    BRANCHES,
    GATE_RULES,
    Candidate,
    EvidenceRecord,
    Holding,
    applies,
    filter_evidence,
    gate,
    provenance_id,
    records_of,
    score,
)
from evosteer_core.executors.base import Evidence


def cand(version: str, answer: str | None, agent: str = "a", env: int = 0) -> Candidate:
    return Candidate(version, agent, answer, f"Answer: {answer}", env)


def rec(rid: str, version: str, kind: str, passed: bool, subject: str | None = None, env: int = 0):
    return EvidenceRecord(rid, version, env, "src", Evidence(kind, passed, "", subject))


def holding_with(version: str, answer: str | None, level: int, agent: str = "a") -> Holding:
    """A holding whose score is ``level`` (0: no record, 1: retrieval, 2: exec check)."""
    c = cand(version, answer, agent)
    kinds = {0: [], 1: ["retrieval"], 2: ["exec_check"]}[level]
    return Holding.of(c, [rec(f"{version}-{k}", version, k, True) for k in kinds])


# --------------------------------------------------------------------- applicability, score
APPLIES = [
    # (record, candidate, applies?)
    (rec("r", "v1", "exec_check", True), cand("v1", "42"), True),
    (rec("r", "v0", "exec_check", True), cand("v1", "42"), False),  # another version
    (rec("r", "v1", "exec_check", True, env=1), cand("v1", "42"), False),  # another env version
    (rec("r", "v0", "exec_check", True, subject="42"), cand("v1", " 42 "), True),  # transfer
    (rec("r", "v1", "exec_check", True, subject="41"), cand("v1", "42"), False),  # other artifact
    (rec("r", "v0", "exec_check", True, subject="42", env=1), cand("v1", "42"), False),
    (rec("r", "v1", "retrieval", True), cand("v1", None), False),  # nothing to check
]


@pytest.mark.parametrize(("record", "candidate", "expected"), APPLIES)
def test_applicability_binds_records_to_their_version_or_checked_artifact(record, candidate, expected):
    assert applies(record, candidate) is expected


def test_filter_keeps_applicable_records_once_per_event_in_order():
    c = cand("v1", "x")
    r1, r2 = rec("e1", "v1", "retrieval", True), rec("e2", "v0", "exec_check", True)
    r3 = rec("e3", "v9", "exec_check", False, subject="X")
    assert filter_evidence([r1, r2, r1, r3, r1], c) == (r1, r3)
    assert filter_evidence(filter_evidence([r1, r2, r3], c), c) == filter_evidence([r1, r2, r3], c)


WEIGHT = {("exec_check", True): 2, ("retrieval", True): 1}


KINDS = [None, ("exec_check", True), ("exec_check", False), ("retrieval", True),
         ("retrieval", False), ("note", True)]


def test_score_is_the_max_applicable_weight():
    c = cand("v1", "y")
    for kinds in itertools.product(KINDS, repeat=3):
        records = [rec(f"e{i}", "v1", *k) for i, k in enumerate(kinds) if k is not None]
        records.append(rec("stale", "v0", "exec_check", True))  # never applies
        expected = max([WEIGHT.get(k, 0) for k in kinds if k is not None], default=0)
        assert score(c, records) == expected == Holding.of(c, records).score, kinds


def test_provenance_ids_are_stable_and_distinct_and_bind_to_the_produced_version():
    assert provenance_id(0, "k", "a", 1, 0) == provenance_id(0, "k", "a", 1, 0)
    ids = {provenance_id(0, "k", a, c, i) for a in "ab" for c in range(3) for i in range(3)}
    assert len(ids) == 18
    c = cand("a#0", "5")
    out = records_of([Evidence("exec_check", True), Evidence("retrieval", False)], c, (0, "k", "a", 0))
    assert [r.version for r in out] == ["a#0", "a#0"] and len({r.record_id for r in out}) == 2
    with pytest.raises(AttributeError):
        out[0].version = "other"  # records are immutable


# ------------------------------------------------------------------------------ the gate
def expected_branch(ls: int, lr: int, same: bool, sender_answers: bool, kappa: float, rule: str):
    """The branch written out independently of ``gate``."""
    if same:
        return "equal"
    if not sender_answers:
        return "no_answer"
    if rule == "verbatim":
        return "adopt"
    if rule == "always_revise":
        return "revise"
    d = ls - lr
    return "adopt" if d > kappa else "keep" if d < -kappa else "revise"


CASES = [
    (ls, lr, same, answers, kappa, rule)
    for ls in (0, 1, 2)
    for lr in (0, 1, 2)
    for same in (False, True)
    for answers in (True, False)
    for kappa in (0.0, 1.0, 2.0)
    for rule in GATE_RULES
    if not (same and not answers)
]


def test_gate_branches_over_every_score_pair_margin_and_rule():
    for case in CASES:
        _check_gate(*case)


def _check_gate(ls, lr, same, answers, kappa, rule):
    sender = holding_with("s#0", ("B" if not same else "a") if answers else None, ls, agent="s")
    receiver = holding_with("r#0", "A", lr, agent="r")
    revised = holding_with("r#1", "C", 0, agent="r")
    calls = []

    def revise(rec_h, sen_h):
        calls.append((rec_h, sen_h))
        return revised

    out = gate(sender, receiver, kappa, revise, rule)
    branch = expected_branch(ls, lr, same, answers, kappa, rule)
    case = (ls, lr, same, answers, kappa, rule)
    assert out.branch == branch in BRANCHES, case
    assert out.delta == sender.score - receiver.score
    if branch == "adopt":  # the sender's version and its records, copied unchanged
        assert out.after is sender and out.after.evidence == sender.evidence
    elif branch == "revise":
        assert calls == [(receiver, sender)] and out.after is revised and out.revised
    else:
        assert out.after is receiver, case
    assert len(calls) == (branch == "revise"), case


def test_every_branch_occurs_under_every_rule_it_can():
    seen = {(expected_branch(*c), c[-1]) for c in CASES}
    assert {b for b, r in seen if r == "evidence"} == set(BRANCHES)
    assert {b for b, r in seen if r == "verbatim"} == {"equal", "no_answer", "adopt"}
    assert {b for b, r in seen if r == "always_revise"} == {"equal", "no_answer", "revise"}


def test_kappa_one_adopts_only_a_two_level_gap():
    r = holding_with("r#0", "A", 0)
    branches = {ls: gate(holding_with("s#0", "B", ls), r, 1.0, lambda *_: None).branch for ls in (0, 1, 2)}
    assert branches == {0: "revise", 1: "revise", 2: "adopt"}


def test_a_failed_revision_keeps_the_receiver():
    r, s = holding_with("r#0", "A", 1), holding_with("s#0", "B", 0)
    out = gate(s, r, 1.0, lambda *_: None)
    assert (out.branch, out.after, out.revised) == ("revise", r, False)


def test_a_revision_keeps_only_the_pooled_evidence_that_still_applies():
    """The new version loses version-bound records of both parents; a check of the artifact
    it now states transfers; duplicates (a record both parents hold) are removed."""
    shared = rec("shared", "s#0", "exec_check", True, subject="B")
    sender = Holding.of(cand("s#0", "B", "s"), [shared, rec("s-ret", "s#0", "retrieval", True)])
    receiver = Holding.of(cand("r#0", "A", "r"), [rec("r-ret", "r#0", "retrieval", True)])
    assert sender.score == 2 and receiver.score == 1
    pooled = [*receiver.evidence, *sender.evidence, shared]
    to_b = Holding.of(cand("r#1", "b", "r"), pooled)
    assert to_b.evidence == (shared,) and to_b.score == 2
    to_c = Holding.of(cand("r#1", "C", "r"), pooled)
    assert to_c.evidence == () and to_c.score == 0
    with pytest.raises(ValueError, match="gate rule"):
        gate(sender, receiver, 1.0, lambda *_: None, "sometimes")
