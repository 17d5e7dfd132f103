"""A well-formed example skill for tests of the skill library, validation and authoring."""

from __future__ import annotations

from evosteer_core.skills.skill import Skill


def skill(i: int, family: str) -> Skill:
    """The ``i``-th distinct, admissible skill for ``family``."""
    return Skill(
        name=f"procedure {family} {i}",
        description="Check each intermediate result before the next step.",
        trigger=f"a {family} task with several steps ({i})",
        plan=("Write the intermediate result.", "Check it against the task."),
        pitfall=("Skipping the check.",),
        constraint=("Keep the answer format.",),
        family=family,
    )
