"""Test time deploys validated skills only (docs/method.md, test-time protocol): a candidate
under test is on the training menus, where its paired test runs, and never on an evaluation's."""

from __future__ import annotations

from skill_examples import skill

from evosteer_core.evaluation.rows import row_rollouts
from evosteer_core.infra.config import load_config
from evosteer_core.skills.library import SkillLibrary
from evosteer_core.training.session import init_state, open_session

TINY = {"sim.n_train_per_family": 2, "sim.n_heldout_per_family": 2}


def _library() -> SkillLibrary:
    """hotpotqa: one validated skill and one candidate; medqa: a candidate only."""
    lib = SkillLibrary()
    validated = skill(1, "hotpotqa")
    lib = lib.add_candidate(validated, 0).transition(validated.skill_id, "validated", 1)
    lib = lib.add_candidate(skill(2, "hotpotqa"), 2)
    return lib.add_candidate(skill(3, "medqa"), 2)


def _session(library: SkillLibrary):
    cfg = load_config(None, TINY)
    s = open_session(cfg, init_state(cfg))
    s.skills.library = library
    return s


def test_evaluation_menus_hold_the_validated_skills_and_training_menus_the_candidates_too():
    s = _session(_library())
    ids = {
        f: [v.skill_id for v in m]
        for f, m in s.rollout_context(1, 0, evaluation=True).menus.items()
    }
    assert ids["hotpotqa"] == [skill(1, "hotpotqa").skill_id]
    assert ids["medqa"] == [] and sum(map(len, ids.values())) == 1
    train = s.rollout_context(1, 0, evaluation=False).menus
    assert [v.skill_id for v in train["hotpotqa"]] == [
        skill(i, "hotpotqa").skill_id for i in (1, 2)
    ]
    assert [v.skill_id for v in train["medqa"]] == [skill(3, "medqa").skill_id]
    # given menus are used as they are, in either context
    assert s.rollout_context(1, 0, train, evaluation=True).menus is train


def test_a_checkpoint_with_candidates_is_evaluated_as_with_its_validated_skills_alone():
    with_candidates = _session(_library())
    records = with_candidates.world.heldout_records
    validated = SkillLibrary()
    one = skill(1, "hotpotqa")
    validated = validated.add_candidate(one, 0).transition(one.skill_id, "validated", 1)
    a = row_rollouts(with_candidates, "checkpoint", records, 2, "eval/menus")
    b = row_rollouts(_session(validated), "checkpoint", records, 2, "eval/menus")
    cols = ["record_id", "run", "reward", "n_actions", "tokens"]
    assert a[cols].equals(b[cols])
    # and the training menus do reach an evaluation when asked for (the diagnostic arm)
    menus = with_candidates.skills.menus()
    c = row_rollouts(with_candidates, "checkpoint", records, 2, "eval/menus", menus=menus)
    assert not c[cols].equals(a[cols])
