"""Skill format, admission filters and the library (docs/method.md §1.8)."""

from __future__ import annotations

import hashlib
import json

import pytest

from evosteer_core.episode.records import FAMILIES
from evosteer_core.executors.base import SkillView
from evosteer_core.skills.filters import (
    CLAIM_PATTERNS,
    REJECTION_CODES,
    check_claims,
    check_duplicates,
    check_leakage,
    check_style,
    screen,
)
from evosteer_core.skills.library import (
    LibraryError,
    LibraryLimits,
    SkillLibrary,
    diff,
)
from evosteer_core.skills.skill import Skill


def make_skill(name: str = "option elimination", family: str = "medqa", **over) -> Skill:
    fields = {
        "name": name,
        "description": "Rule out answer options one by one against the stated findings.",
        "trigger": "a multiple-choice question with clinical findings",
        "plan": ("List the key findings.", "Strike each contradicted option."),
        "pitfall": ("Choosing before checking the others.",),
        "constraint": ("Name the finding that excludes each option.",),
        "family": family,
    }
    fields.update(over)
    return Skill(**fields)


# ------------------------------------------------------------------------------ skill


def test_skill_id_is_prefix_plus_sha256_of_canonical_content_json():
    s = make_skill()
    content = {
        "constraint": list(s.constraint),
        "description": s.description,
        "name": s.name,
        "pitfall": list(s.pitfall),
        "plan": list(s.plan),
        "trigger": s.trigger,
    }
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert s.content_json() == text
    assert s.skill_id == "evosteer-" + hashlib.sha256(text.encode()).hexdigest()[:20]
    assert len(s.skill_id) == len("evosteer-") + 20


def test_skill_id_ignores_family_and_sees_every_content_change():
    s = make_skill()
    assert make_skill(family="aime").skill_id == s.skill_id
    assert make_skill(trigger="other trigger").skill_id != s.skill_id
    assert make_skill(plan=("a step", "b step", "c")).skill_id != s.skill_id


def test_non_ascii_content_is_kept_verbatim_in_canonical_json():
    s = make_skill(description="Prüfe die Befunde – α zuerst.")
    assert "Prüfe" in s.content_json() and "\\u" not in s.content_json()


def test_render_shows_every_part_and_view_carries_it():
    s = make_skill(plan=("First step.", "Second step.", "Third step."))
    text = s.render()
    for part in (s.name, s.description, s.trigger, *s.plan, *s.pitfall, *s.constraint):
        assert part in text
    assert "Use when: " + s.trigger in text
    assert "3. Third step." in text
    view = s.view()
    assert view == SkillView(skill_id=s.skill_id, name=s.name, rendered=text)


def test_skill_dict_round_trip_and_errors_name_the_key():
    s = make_skill()
    assert Skill.from_dict(s.to_dict()) == s
    bad = s.to_dict()
    del bad["trigger"]
    with pytest.raises(ValueError, match="trigger"):
        Skill.from_dict(bad, where="row 3")
    with pytest.raises(ValueError, match="family"):
        make_skill(family="chess")
    with pytest.raises(TypeError, match="plan"):
        make_skill(plan=["not", "a tuple"])


# ------------------------------------------------------------------------------ filters


def test_a_well_formed_skill_passes_every_filter():
    assert (
        screen(make_skill(), [], ["What is the capital of France, given this long prompt?"]) is None
    )


def test_reject_empty_field():
    assert check_style(make_skill(trigger="  ")).code == "empty_field"
    assert check_style(make_skill(pitfall=("",))).code == "empty_field"


@pytest.mark.parametrize(
    "field,items",
    [
        ("plan", ("only one",)),
        ("plan", tuple("abcdef")),
        ("pitfall", ()),
        ("pitfall", tuple("abcde")),
        ("constraint", ()),
        ("constraint", tuple("abcd")),
    ],
)
def test_reject_list_length(field, items):
    rej = check_style(make_skill(**{field: items}))
    assert rej.code == "list_length" and field in rej.message


def test_list_length_bounds_are_inclusive():
    assert (
        check_style(make_skill(plan=tuple("abcde"), pitfall=tuple("abcd"), constraint=tuple("abc")))
        is None
    )


def test_reject_name_too_long():
    assert check_style(make_skill(name="n" * 60)) is None
    assert check_style(make_skill(name="n" * 61)).code == "name_too_long"


def test_reject_item_too_long():
    assert check_style(make_skill(description="d" * 240)) is None
    rej = check_style(make_skill(plan=("ok", "p" * 241)))
    assert rej.code == "item_too_long" and "plan[1]" in rej.message


def test_reject_total_too_long():
    # five plan items of 230 chars: each item is legal, the total is not
    s = make_skill(plan=tuple("x" * 230 for _ in range(5)))
    assert check_style(s).code == "total_too_long"
    total = sum(len(t) for t in s.text_items())
    assert total > 1100


@pytest.mark.parametrize(
    "text",
    [
        "This step improves accuracy on hard cases.",
        "It boosts the pass rate.",
        "Guarantees a correct answer.",
        "Solves 90% of the tasks.",
        "I will check every option.",
        "This skill helps the solver.",
        "This approach never fails.",
        "In our experience it works.",
    ],
)
def test_reject_efficacy_claims_and_narration(text):
    rej = check_claims(make_skill(description=text))
    assert rej is not None and rej.code == "efficacy_claim"


def test_plain_procedures_and_modulo_are_not_claims():
    s = make_skill(
        description="Reduce the count with n % 1000 after checking small cases.",
        plan=("Increase the search depth by one.", "Check the result."),
    )
    assert check_claims(s) is None
    assert len(CLAIM_PATTERNS) >= 8


def test_reject_duplicate_name_normalized():
    existing = [make_skill()]
    rej = check_duplicates(make_skill(name="Option  ELIMINATION", trigger="x"), existing)
    assert rej.code == "duplicate_name"


def test_reject_duplicate_content_hash():
    rej = check_duplicates(make_skill(family="aime"), [make_skill()])
    assert rej.code == "duplicate_content"


def test_reject_verbatim_prompt_leakage_after_normalization():
    prompt = "Which  drug is first-line for\nacute angle-closure glaucoma?"
    s = make_skill(
        pitfall=("Remember: which drug is first-line for acute angle-closure GLAUCOMA? check.",)
    )
    assert check_leakage(s, [prompt]).code == "prompt_leakage"
    # prompts shorter than 32 normalized chars are never treated as leakage
    assert (
        check_leakage(make_skill(pitfall=("list the key findings.",)), ["list the key findings."])
        is None
    )
    assert check_leakage(s, ["an unrelated prompt that is long enough to count"]) is None


def test_screen_reports_first_failure_in_fixed_order_and_codes_are_known():
    s = make_skill(name="n" * 61, description="Boosts everything.")
    assert screen(s, [], []).code == "name_too_long"
    assert {"efficacy_claim", "prompt_leakage", "duplicate_name"} <= set(REJECTION_CODES)


# ------------------------------------------------------------------------------ library


def numbered(i: int, family: str = "medqa") -> Skill:
    return make_skill(name=f"procedure {i}", trigger=f"trigger {i}", family=family)


def test_candidate_promotion_and_retirement_transitions():
    lib = SkillLibrary().add_candidate(numbered(1), step=9)
    sid = numbered(1).skill_id
    assert lib.get(sid).status == "candidate" and lib.version == 1
    promoted = lib.transition(sid, "validated", step=12)
    assert promoted.get(sid).status == "validated" and promoted.get(sid).changed_step == 12
    retired = promoted.transition(sid, "retired", step=20)
    assert retired.get(sid).status == "retired" and retired.version == 3
    assert lib.transition(sid, "retired", 10).get(sid).status == "retired"


@pytest.mark.parametrize(
    "path", [("validated", "candidate"), ("retired", "validated"), ("retired", "candidate")]
)
def test_forbidden_transitions_raise_clear_errors(path):
    lib = SkillLibrary().add_candidate(numbered(1), 9)
    sid = numbered(1).skill_id
    start, target = path
    lib = lib.transition(sid, start, 10)
    with pytest.raises(LibraryError, match=f"{start} → {target}"):
        lib.transition(sid, target, 11)


def test_unknown_skill_raises():
    with pytest.raises(LibraryError, match="no skill"):
        SkillLibrary().get("evosteer-0000")


def test_at_most_one_candidate_per_family():
    lib = SkillLibrary().add_candidate(numbered(1), 9)
    assert lib.admission_block("medqa").code == "family_full"
    with pytest.raises(LibraryError, match="candidate"):
        lib.add_candidate(numbered(2), 10)
    assert lib.admission_block("aime") is None


def test_at_most_three_validated_per_family():
    lib = SkillLibrary()
    for i in range(3):
        lib = lib.add_candidate(numbered(i), 9 + i).transition(
            numbered(i).skill_id, "validated", 9 + i
        )
    lib = lib.add_candidate(numbered(3), 20)
    with pytest.raises(LibraryError, match="3 validated"):
        lib.transition(numbered(3).skill_id, "validated", 21)


def test_at_most_twelve_per_family_counting_retired():
    lib = SkillLibrary()
    for i in range(12):
        lib = lib.add_candidate(numbered(i), i).transition(numbered(i).skill_id, "retired", i)
    assert lib.count("medqa") == 12 and lib.count("medqa", "candidate") == 0
    assert lib.admission_block("medqa").code == "family_full"
    with pytest.raises(LibraryError, match="12"):
        lib.add_candidate(numbered(12), 30)


def test_at_most_sixty_in_total():
    lib = SkillLibrary(limits=LibraryLimits(max_total=60, max_per_family=12))
    n = 0
    for family in FAMILIES:
        for _ in range(10):
            s = numbered(n, family)
            lib = lib.add_candidate(s, n).transition(s.skill_id, "retired", n)
            n += 1
    assert len(lib.entries) == 60
    block = lib.admission_block("aime")
    assert block.code == "family_full" and "60" in block.message


def test_menu_holds_validated_then_candidate_as_views():
    lib = SkillLibrary()
    for i in range(2):
        lib = lib.add_candidate(numbered(i), i).transition(numbered(i).skill_id, "validated", i)
    lib = lib.add_candidate(numbered(5), 5).transition(numbered(5).skill_id, "retired", 6)
    lib = lib.add_candidate(numbered(6), 7)
    menu = lib.menu("medqa")
    assert [v.skill_id for v in menu] == [numbered(i).skill_id for i in (0, 1, 6)]
    assert all(isinstance(v, SkillView) for v in menu) and isinstance(menu, tuple)
    assert lib.menu("aime") == ()


def test_admit_screens_then_checks_slots():
    lib, rej = SkillLibrary().admit(numbered(1), 9, [])
    assert rej is None and lib.count("medqa", "candidate") == 1
    same, rej = lib.admit(numbered(2), 10, [])
    assert rej.code == "family_full" and same is lib
    _, rej = lib.admit(make_skill(name="procedure 1", trigger="x", family="aime"), 10, [])
    assert rej.code == "duplicate_name"


def test_version_hash_serialization_and_diff():
    lib0 = SkillLibrary()
    lib1 = lib0.add_candidate(numbered(1), 9).add_candidate(numbered(2, "aime"), 9)
    lib2 = lib1.transition(numbered(1).skill_id, "validated", 11).transition(
        numbered(2, "aime").skill_id, "retired", 11
    )
    assert len({lib0.content_hash, lib1.content_hash, lib2.content_hash}) == 3
    data = lib2.to_dict()
    text = json.dumps(data, sort_keys=True)
    back = SkillLibrary.from_dict(json.loads(text))
    assert back == lib2 and back.content_hash == lib2.content_hash
    assert json.dumps(back.to_dict(), sort_keys=True) == text
    d = diff(lib1, lib2)
    assert d.added == ()
    assert set(d.changed) == {
        (numbered(1).skill_id, "candidate", "validated"),
        (numbered(2, "aime").skill_id, "candidate", "retired"),
    }
    assert d.retired == (numbered(2, "aime").skill_id,)
    assert diff(lib0, lib1).added == (numbered(1).skill_id, numbered(2, "aime").skill_id)


def test_from_dict_rejects_tampering():
    data = SkillLibrary().add_candidate(numbered(1), 9).to_dict()
    data["entries"][0]["status"] = "validated"
    with pytest.raises(LibraryError, match="hash"):
        SkillLibrary.from_dict(data)
    data = SkillLibrary().add_candidate(numbered(1), 9).to_dict()
    data["entries"][0]["skill"]["name"] = "renamed"
    with pytest.raises(LibraryError, match="id"):
        SkillLibrary.from_dict(data)
