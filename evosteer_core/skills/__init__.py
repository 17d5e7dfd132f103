"""Validated skill admission (docs/method.md §1.8): skill format and filters, library and slots, paired
trials, sequential sign tests with an alpha-spending ledger, author windows and authors."""

from evosteer_core.skills.author import (
    AuthorError,
    FamilyStats,
    LLMAuthor,
    TrajectorySummary,
    rank_families,
    select_evidence,
    window_families,
)
from evosteer_core.skills.filters import Rejection, StyleLimits, screen
from evosteer_core.skills.library import LibraryError, LibraryLimits, SkillLibrary, diff
from evosteer_core.skills.pairs import PairCounts, PairOutcome, PairPlan, plan_pairs, tally
from evosteer_core.skills.sequential import TestLedger, effect, look_level, sign_test
from evosteer_core.skills.skill import Skill
from evosteer_core.skills.validation import RoundConfig, RoundReport, validation_round

__all__ = [
    "AuthorError",
    "FamilyStats",
    "LLMAuthor",
    "LibraryError",
    "LibraryLimits",
    "PairCounts",
    "PairOutcome",
    "PairPlan",
    "Rejection",
    "RoundConfig",
    "RoundReport",
    "Skill",
    "SkillLibrary",
    "StyleLimits",
    "TestLedger",
    "TrajectorySummary",
    "diff",
    "effect",
    "look_level",
    "plan_pairs",
    "rank_families",
    "screen",
    "select_evidence",
    "sign_test",
    "tally",
    "validation_round",
    "window_families",
]
