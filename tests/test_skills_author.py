"""Pair bookkeeping, author windows, evidence selection and the two authors (docs/method.md §1.8)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from skill_examples import skill

from evosteer_core.episode.records import FAMILIES
from evosteer_core.executors.base import NodeRequest, NodeResult
from evosteer_core.sim.skills import LATENT_SKILLS, skill_effect
from evosteer_core.skills.author import (
    AUTHOR_ROLE,
    AuthorError,
    FamilyStats,
    LLMAuthor,
    SeededSimAuthor,
    TrajectorySummary,
    family_stats,
    library_view,
    parse_proposal,
    rank_families,
    select_evidence,
    window_families,
)
from evosteer_core.skills.library import LibraryLimits, SkillLibrary
from evosteer_core.skills.pairs import (
    PairCounts,
    PairOutcome,
    candidate_for_family,
    passes,
    plan_pairs,
    reevaluation_skill,
    tally,
)
from evosteer_core.skills.sequential import TestLedger
from evosteer_core.skills.skill import Skill
from evosteer_core.skills.validation import validation_round


def traj(record: str, family: str, reward: float | None, **kw) -> TrajectorySummary:
    fields = {
        "record_id": record,
        "family": family,
        "prompt": f"Task {record}: compute the requested quantity for the given inputs.",
        "reward": reward,
        "healthy": True,
        "side_effect_free": True,
        "summary": f"run on {record} with reward {reward}",
    }
    fields.update(kw)
    return TrajectorySummary(**fields)


# ------------------------------------------------------------------------------ pairs


def test_pass_threshold_and_tally_with_exclusions():
    assert passes(0.5) == 1 and passes(0.49) == 0
    outcomes = [
        PairOutcome("r1", "aime", "s", "candidate", 1.0, 0.0),
        PairOutcome("r2", "aime", "s", "candidate", 0.6, 0.2),
        PairOutcome("r3", "aime", "s", "candidate", 0.2, 0.7),
        PairOutcome("r4", "aime", "s", "candidate", 0.9, 0.5),
        PairOutcome("r5", "aime", "s", "candidate", 1.0, None, complete=False),
        PairOutcome("r6", "aime", "s", "candidate", 1.0, 0.0, side_effect_free=False),
        PairOutcome("r7", "aime", "t", "candidate", 0.0, 0.0),
    ]
    counts = tally(outcomes)
    assert counts["s"] == PairCounts(wins=2, losses=1, ties=1, excluded=2)
    assert counts["t"] == PairCounts(ties=1)
    assert counts["s"].discordant == 3 and counts["s"].observations == 4


def test_candidate_choice_fewest_observations_then_admission_order():
    lib = SkillLibrary().add_candidate(skill(0, "aime"), 9)
    assert candidate_for_family(lib, "aime", {}) == skill(0, "aime").skill_id
    assert candidate_for_family(lib, "medqa", {}) is None
    # with a larger candidate slot, the one with fewer paired observations is chosen
    wide = SkillLibrary(limits=LibraryLimits(max_candidates_per_family=2))
    wide = wide.add_candidate(skill(0, "aime"), 9).add_candidate(skill(1, "aime"), 9)
    a, b = skill(0, "aime").skill_id, skill(1, "aime").skill_id
    assert candidate_for_family(wide, "aime", {a: 5, b: 3}) == b
    assert candidate_for_family(wide, "aime", {a: 3, b: 3}) == a


def validated_library() -> SkillLibrary:
    lib = SkillLibrary()
    for fam, i in (("medqa", 0), ("hotpotqa", 0), ("medqa", 1)):
        s = skill(i, fam)
        lib = lib.add_candidate(s, 1).transition(s.skill_id, "validated", 2)
    return lib


def test_reevaluation_rotation_every_tenth_step():
    lib = validated_library()
    order = [skill(0, "hotpotqa"), skill(0, "medqa"), skill(1, "medqa")]  # FAMILIES order
    assert [reevaluation_skill(lib, k) for k in (1, 9, 11, 0)] == [None] * 4
    got = [reevaluation_skill(lib, k) for k in (10, 20, 30, 40)]
    assert got == [s.skill_id for s in order] + [order[0].skill_id]
    assert reevaluation_skill(SkillLibrary(), 10) is None
    with pytest.raises(ValueError, match="positive"):
        reevaluation_skill(lib, 10, every=0)


def test_plan_pairs_candidates_per_record_and_one_reevaluation():
    lib = validated_library().add_candidate(skill(5, "aime"), 9)
    batch = [("a1", "aime"), ("m1", "medqa"), ("a2", "aime"), ("h1", "hotpotqa")]
    plans = plan_pairs(batch, lib, {}, step=11)
    assert [(p.record_id, p.kind) for p in plans] == [("a1", "candidate"), ("a2", "candidate")]
    plans = plan_pairs(batch, lib, {}, step=10)
    assert plans[-1].kind == "reevaluation" and plans[-1].record_id == "h1"
    assert plans[-1].skill_id == skill(0, "hotpotqa").skill_id


# ------------------------------------------------------------------------------ windows


def test_family_stats_counts_contrasts_failures_and_mean():
    lib = SkillLibrary().add_candidate(skill(0, "aime"), 9)
    pool = [
        traj("q1", "aime", 1.0),
        traj("q1", "aime", 0.0),
        traj("q2", "aime", 0.0),
        traj("q3", "aime", 1.0, side_effect_free=False),
        traj("q4", "medqa", 1.0),
    ]
    st = family_stats("aime", lib, pool)
    assert (st.active_skills, st.contrasts, st.failures, st.trajectories) == (1, 1, 2, 3)
    assert st.mean_reward == pytest.approx(1 / 3)
    assert family_stats("nq_open", lib, pool).mean_reward is None


def test_rank_families_by_the_four_keys_in_order():
    def fs(fam, skills, contrasts, mean, fails):
        return FamilyStats(fam, skills, contrasts, mean, fails, 10)

    stats = [
        fs("hotpotqa", 1, 9, 0.0, 9),  # more skills: last
        fs("nq_open", 0, 1, 0.2, 1),
        fs("medqa", 0, 2, 0.9, 0),  # most contrasts among 0-skill families: first
        fs("aime", 0, 1, 0.1, 1),  # ties nq_open on contrasts, lower mean: before it
        fs("mbpp_plus", 0, 1, 0.1, 5),  # same mean as aime, more failures: before aime
    ]
    assert rank_families(stats) == ("medqa", "mbpp_plus", "aime", "nq_open", "hotpotqa")


def test_window_families_warmup_first_window_and_later_windows():
    lib = SkillLibrary().add_candidate(skill(0, "aime"), 9)
    pool = [traj("q1", "medqa", 1.0), traj("q1", "medqa", 0.0)]
    assert window_families(8, lib, pool) == ()
    assert window_families(9, lib, pool) == tuple(f for f in FAMILIES if f != "aime")
    assert window_families(10, lib, pool) == ("medqa",)
    assert window_families(3, lib, pool, warmup_steps=2) == tuple(
        f for f in FAMILIES if f != "aime"
    )


def test_select_evidence_contrasts_first_and_limit():
    pool = [traj(f"o{i}", "aime", 1.0) for i in range(10)]
    pool += [traj("c1", "aime", 0.2), traj("c1", "aime", 0.9), traj("c1", "aime", 0.6)]
    pool += [
        traj("c2", "aime", 0.0),
        traj("c2", "aime", 1.0, healthy=False),
        traj("c2", "aime", 0.7),
    ]
    pool += [traj("x", "medqa", 1.0), traj("u", "aime", None)]
    ev = select_evidence(pool, "aime")
    assert len(ev) == 12
    assert [(t.record_id, t.reward) for t in ev[:4]] == [
        ("c1", 0.9),
        ("c1", 0.2),
        ("c2", 0.7),
        ("c2", 0.0),
    ]
    assert all(t.family == "aime" and t.eligible for t in ev)
    assert len({id(t) for t in ev}) == 12


# ------------------------------------------------------------------------------ LLM author


class CannedExecutor:
    """A fake executor returning fixed text and recording the requests it saw."""

    name = "canned"

    def __init__(self, text: str, status: str = "ok"):
        self.text = text
        self.status = status
        self.requests: list[NodeRequest] = []

    def run_node(self, request: NodeRequest) -> NodeResult:
        self.requests.append(request)
        return NodeResult(text=self.text, answer=None, status=self.status, model_calls=1)

    def make_environment(self, task, seed_key):
        return None


GOOD = {
    "name": "carry-safe reduction",
    "description": "Reduce large counts modulo small factors before combining.",
    "trigger": "a counting problem that asks for a remainder",
    "plan": ["Factor the modulus.", "Reduce modulo each factor.", "Combine the residues."],
    "pitfall": ["Reducing too early."],
    "constraint": ["Report an integer from 0 to 999."],
}


def propose_with(text: str, status: str = "ok"):
    ex = CannedExecutor(text, status)
    lib = SkillLibrary().add_candidate(skill(0, "medqa"), 9)
    stats = family_stats("aime", lib, [])
    ev = (traj("q1", "aime", 1.0), traj("q1", "aime", 0.0))
    out = LLMAuthor(ex, run_seed=7).propose("aime", library_view(lib), stats, ev, step=12)
    return out, ex


def test_llm_author_parses_a_json_skill_and_builds_the_request():
    out, ex = propose_with(json.dumps(GOOD))
    assert isinstance(out, Skill) and out.family == "aime" and out.plan == tuple(GOOD["plan"])
    (req,) = ex.requests
    assert req.role == AUTHOR_ROLE and req.role.role_id == "author" and req.tools == ()
    assert req.seed_key == (7, "author/12/aime", "author", 0)
    for part in (
        "Task family: aime",
        "[candidate] (medqa) procedure medqa 0",
        "reward 1.00",
        "success",
        "failure",
    ):
        assert part in req.prompt
    fenced, _ = propose_with("```json\n" + json.dumps(GOOD) + "\n```")
    assert fenced == out


def test_llm_author_null_means_no_proposal():
    out, _ = propose_with(" null ")
    assert out is None


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("Here is a skill: carry-safe", "not JSON"),
        ("[1, 2]", "expected an object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "trigger"}), "missing keys ['trigger']"),
        (json.dumps({**GOOD, "effect": "big"}), "unexpected keys ['effect']"),
        (json.dumps({**GOOD, "plan": "one string"}), "'plan' must be a list"),
        (json.dumps({**GOOD, "name": 3}), "'name' must be a string"),
    ],
)
def test_llm_author_rejects_malformed_output_with_reason(text, fragment):
    out, _ = propose_with(text)
    assert isinstance(out, AuthorError) and fragment in out.message and out.raw == text


def test_llm_author_failed_call_is_an_author_error():
    out, _ = propose_with("", status="timeout")
    assert isinstance(out, AuthorError) and "timeout" in out.message
    assert parse_proposal("null", "aime") is None


# ------------------------------------------------------------------------------ sim author


def test_sim_author_is_seeded_and_never_reuses_a_library_name():
    pool = (traj("q1", "aime", 1.0), traj("q1", "aime", 0.0))
    stats = family_stats("aime", SkillLibrary(), pool)
    author = SeededSimAuthor(run_seed=3)
    a = author.propose("aime", (), stats, pool, step=9)
    assert a == author.propose("aime", (), stats, pool, step=9)
    assert isinstance(a, Skill) and a.family == "aime"
    assert a.name in {s["name"] for s in LATENT_SKILLS}
    lib = SkillLibrary(limits=LibraryLimits(max_per_family=len(LATENT_SKILLS)))
    names = set()
    for step in range(9, 9 + len(LATENT_SKILLS)):
        s = author.propose("aime", library_view(lib), stats, pool, step)
        assert s.name not in names
        names.add(s.name)
        lib = lib.add_candidate(s, step).transition(s.skill_id, "retired", step)
    assert author.propose("aime", library_view(lib), stats, pool, 99) is None
    assert author.propose("aime", (), stats, (), 9) is None


def test_sim_author_prefers_helpful_skills_when_evidence_has_contrasts():
    author = SeededSimAuthor(run_seed=1)
    contrast = (traj("q1", "aime", 1.0), traj("q1", "aime", 0.0))
    flat = (traj("q1", "aime", 0.0), traj("q2", "aime", 0.0))
    stats = family_stats("aime", SkillLibrary(), contrast)

    def helpful_share(evidence):
        picks = [author.propose("aime", (), stats, evidence, step) for step in range(400)]
        return sum(skill_effect(s.name, "aime") > 0 for s in picks) / len(picks)

    with_contrast, without = helpful_share(contrast), helpful_share(flat)
    # weights: helpful skills (effect > 0) get 1 + 3 * share; computed independently below
    rows = [(s["name"], skill_effect(s["name"], "aime")) for s in LATENT_SKILLS]
    w = [0.25 if e == 0 else (4.0 if e > 0 else 1.0) for _, e in rows]
    expected = sum(x for x, (_, e) in zip(w, rows, strict=True) if e > 0) / sum(w)
    assert with_contrast == pytest.approx(expected, abs=0.08)
    assert without < with_contrast < 1.0


# ------------------------------------------------------------------------------ round with author


def test_first_window_covers_every_family_and_admits_candidates():
    pool = [traj(f"{f}-q", f, r) for f in FAMILIES for r in (1.0, 0.0)]
    lib, ledger, rep = validation_round(
        SkillLibrary(), TestLedger(), [], 9, author=SeededSimAuthor(42), evidence_pool=pool
    )
    assert [w.family for w in rep.windows] == list(FAMILIES)
    admitted = [w for w in rep.windows if w.result == "admitted"]
    assert len(admitted) == len(lib.entries) >= 5  # latent names may collide across families
    assert all(lib.count(f, "candidate") <= 1 for f in FAMILIES)
    assert rep.library_diff.added == tuple(w.skill_id for w in admitted)
    # a later step: one window, for the best-ranked family with a free slot
    _, _, rep = validation_round(
        lib, ledger, [], 10, author=SeededSimAuthor(42), evidence_pool=pool
    )
    assert len(rep.windows) <= 1


def test_warmup_has_no_window_and_author_error_consumes_the_window():
    pool = [traj("q", "aime", 1.0)]
    bad = LLMAuthor(CannedExecutor("not json"))
    _, _, rep = validation_round(
        SkillLibrary(), TestLedger(), [], 5, author=bad, evidence_pool=pool
    )
    assert rep.windows == ()
    lib, _, rep = validation_round(
        SkillLibrary(), TestLedger(), [], 9, author=bad, evidence_pool=pool
    )
    assert Counter(w.rejection.code for w in rep.windows) == Counter(
        {"malformed_output": len(FAMILIES)}
    )
    assert lib.entries == ()


def test_window_rejects_leaked_prompt_and_claims():
    leaked = {**GOOD, "pitfall": ["Task q: compute the requested quantity for the given inputs."]}
    pool = [traj("q", "aime", 1.0)]
    author = LLMAuthor(CannedExecutor(json.dumps(leaked)))
    lib, _, rep = validation_round(
        SkillLibrary(), TestLedger(), [], 9, author=author, evidence_pool=pool
    )
    assert {w.rejection.code for w in rep.windows} == {"prompt_leakage"}
    assert lib.entries == ()
    claim = LLMAuthor(
        CannedExecutor(json.dumps({**GOOD, "description": "Boosts accuracy by 20%."}))
    )
    _, _, rep = validation_round(
        SkillLibrary(), TestLedger(), [], 9, author=claim, evidence_pool=pool
    )
    assert {w.rejection.code for w in rep.windows} == {"efficacy_claim"}
