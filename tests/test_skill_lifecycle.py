"""Lifecycle rows and admission-gain libraries from a hand-made library and ledger."""

from __future__ import annotations

import pytest

from evosteer_core.episode.records import FAMILIES
from evosteer_core.sim.skills import LATENT_SKILLS
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.skills.pairs import PairCounts
from evosteer_core.skills.sequential import TestLedger
from evosteer_core.skills.skill import Skill
from experiments.lifecycle import (
    admit_all,
    format_lifecycle,
    lifecycle_rows,
    validated_only,
)


def latent(i: int, family: str) -> Skill:
    return Skill.from_dict({**LATENT_SKILLS[i], "family": family})


def look_once(
    ledger: TestLedger, skill: Skill, kind: str, step: int, counts: PairCounts, status: str
) -> tuple[TestLedger, str]:
    """Register a comparison, add ``counts`` and take one look; returns (ledger, decision)."""
    ledger, j = ledger.register(skill.skill_id, skill.family, kind, f"{kind}@{step}", step)
    ledger = ledger.add_pairs(j, counts)
    return ledger.take_look(j, step, status, validated_full=False)


@pytest.fixture
def run() -> tuple[SkillLibrary, TestLedger, dict[str, Skill]]:
    """promoted (medqa), retired candidate (aime), still tested (hotpotqa), promoted then
    retired on re-evaluation (mbpp_plus), never paired (alfworld)."""
    sk = {
        "promoted": latent(4, "medqa"),
        "retired": latent(7, "aime"),
        "open": latent(0, "hotpotqa"),
        "fallen": latent(8, "mbpp_plus"),
        "unpaired": latent(10, "alfworld"),
    }
    lib = SkillLibrary()
    for name, step in (("promoted", 3), ("retired", 3), ("open", 4), ("fallen", 3)):
        lib = lib.add_candidate(sk[name], step)
    led = TestLedger(alpha=0.05)
    # j=1, look 1: level 0.05/4, half 0.00625; p+ = 2^-10 → promote
    led, d = look_once(led, sk["promoted"], "candidate", 5, PairCounts(10, 0, 4), "candidate")
    assert d == "promote"
    lib = lib.transition(sk["promoted"].skill_id, "validated", 5)
    # j=2: half level 0.05/24; p− = 2^-10 → retire
    led, d = look_once(led, sk["retired"], "candidate", 6, PairCounts(0, 10, 1), "candidate")
    assert d == "retire"
    lib = lib.transition(sk["retired"].skill_id, "retired", 6)
    # j=3: W=2, L=1 → keep
    led, d = look_once(led, sk["open"], "candidate", 6, PairCounts(2, 1, 3), "candidate")
    assert d == "keep"
    # j=4 promote, j=5 re-evaluation retires it
    led, d = look_once(led, sk["fallen"], "candidate", 4, PairCounts(12, 0, 0), "candidate")
    assert d == "promote"
    lib = lib.transition(sk["fallen"].skill_id, "validated", 4)
    led, d = look_once(led, sk["fallen"], "reevaluation", 9, PairCounts(0, 14, 2), "validated")
    assert d == "retire"
    lib = lib.transition(sk["fallen"].skill_id, "retired", 9)
    # a second, superseded comparison of the promoted skill (counts still belong to it)
    led, j = led.register(sk["promoted"].skill_id, "medqa", "reevaluation", "ctx-6", 10)
    led = led.add_pairs(j, PairCounts(1, 2, 3)).close(j, "superseded", 11)
    lib = lib.add_candidate(sk["unpaired"], 12)
    return lib, led, sk


def test_lifecycle_rows_match_hand_computed_history(run):
    lib, led, sk = run
    rows = {r.skill_id: r for r in lifecycle_rows(lib, led)}
    assert [r.skill_id for r in lifecycle_rows(lib, led)] == [e.skill_id for e in lib.entries]
    expected = {  # proposed, validated, retired, status, W, L, T
        "promoted": (3, 5, None, "validated", 11, 2, 7),
        "retired": (3, None, 6, "retired", 0, 10, 1),
        "open": (4, None, None, "candidate", 2, 1, 3),
        "fallen": (3, 4, 9, "retired", 12, 14, 2),
        "unpaired": (12, None, None, "candidate", 0, 0, 0),
    }
    for key, (prop, val, ret, status, w, l_, t) in expected.items():
        r = rows[sk[key].skill_id]
        assert (r.name, r.family) == (sk[key].name, sk[key].family)
        got = (r.proposed_step, r.validated_step, r.retired_step, r.status, r.wins, r.losses)
        assert got + (r.ties,) == (prop, val, ret, status, w, l_, t)
        assert r.effect == (None if w + l_ + t == 0 else (w - l_) / (w + l_ + t))
    assert rows[sk["promoted"].skill_id].effect == pytest.approx(9 / 20)


def test_status_the_ledger_cannot_explain_is_an_error(run):
    lib, led, sk = run
    lib = lib.transition(sk["open"].skill_id, "validated", 13)  # no promote look in the ledger
    with pytest.raises(ValueError, match="no promote decision"):
        lifecycle_rows(lib, led)
    bare = SkillLibrary().add_candidate(sk["open"], 1).transition(sk["open"].skill_id, "retired", 2)
    with pytest.raises(ValueError, match="retire decision"):  # retired without a retire look
        lifecycle_rows(bare, TestLedger())


def test_format_shows_steps_counts_effect_and_hidden_column(run):
    lib, led, sk = run
    rows = lifecycle_rows(lib, led)
    text = format_lifecycle(rows, lambda name, family: 0.75 if family == "medqa" else -0.5)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows) and "SIM effect" in lines[0]
    promoted = next(x for x in lines if sk["promoted"].name in x)
    assert promoted.split()[-6:] == ["validated", "11", "2", "7", "+0.450", "+0.75"]
    unpaired = next(x for x in lines if sk["unpaired"].name in x)
    assert unpaired.split()[-3:] == ["0", "n/a", "-0.50"]
    assert "SIM effect" not in format_lifecycle(rows)


def test_validated_only_and_admit_all_menus(run):
    lib, _, sk = run
    only = validated_only(lib)
    assert {f: [v.name for v in only.menu(f)] for f in FAMILIES if only.menu(f)} == {
        "medqa": [sk["promoted"].name]
    }
    everything = admit_all(lib)
    menus = {f: [v.name for v in everything.menu(f)] for f in FAMILIES}
    for e in lib.entries:  # retired and candidate skills alike
        assert e.skill.name in menus[e.skill.family]
    assert sum(len(m) for m in menus.values()) == len(lib.entries)
    assert SkillLibrary.from_dict(everything.to_dict()) == everything


def test_admit_all_raises_the_validated_limit_for_a_crowded_family():
    lib = SkillLibrary()
    for i in (0, 1, 2, 3, 12):
        lib = lib.add_candidate(latent(i, "hotpotqa"), 1)
        lib = lib.transition(lib.entries[-1].skill_id, "retired", 2)
    everything = admit_all(lib)
    assert len(everything.menu("hotpotqa")) == 5
    assert everything.limits.max_validated_per_family == 5
    assert SkillLibrary.from_dict(everything.to_dict()).menu("hotpotqa") == everything.menu(
        "hotpotqa"
    )
