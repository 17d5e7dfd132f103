"""Benchmark → task type (family) and benchmark → evaluation group (IID / OOD) per method.

EvoSteer (docs/method.md §1.10): the six IID benchmarks are the families themselves; each OOD
benchmark runs under its matched IID task type (MuSiQue as HotpotQA, SWE-Bench Verified as
MBPP+, ...). CollabFlow (docs/method.md §2.4) splits the benchmarks differently (TriviaQA is IID and
NQ-Open OOD; MedXpertQA and HumanEval join), but a benchmark's task type is the same for
both methods.
"""

from __future__ import annotations

from evosteer_core.episode.records import FAMILIES

BENCHMARK_FAMILY: dict[str, str] = {
    # the IID benchmarks are their own task types
    **{family: family for family in FAMILIES},
    "musique": "hotpotqa",
    "triviaqa": "nq_open",
    "gpqa": "medqa",
    "math_hard": "aime",
    "swe_bench_verified": "mbpp_plus",
    "webshop": "alfworld",
    "medxpertqa": "medqa",
    "humaneval": "mbpp_plus",
    "textworld": "alfworld",
}
"""Every known benchmark name → the IID task type whose family it is run as."""

GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "evosteer": {
        "iid": ("hotpotqa", "nq_open", "medqa", "aime", "mbpp_plus", "alfworld"),
        "ood": ("triviaqa", "musique", "gpqa", "math_hard", "swe_bench_verified", "webshop"),
    },
    "collabflow": {
        "iid": ("hotpotqa", "triviaqa", "aime", "medxpertqa", "alfworld", "mbpp_plus"),
        "ood": ("musique", "nq_open", "math_hard", "gpqa", "humaneval", "webshop"),
    },
}
"""Per method, the benchmarks averaged in each evaluation group (paper table order)."""


def family_of(benchmark: str) -> str:
    """The IID task type a benchmark runs as (an IID benchmark maps to itself)."""
    try:
        return BENCHMARK_FAMILY[benchmark]
    except KeyError:
        raise KeyError(
            f"unknown benchmark {benchmark!r}; known: {sorted(BENCHMARK_FAMILY)}"
        ) from None


def group_of(benchmark: str, method: str = "evosteer") -> str:
    """``"iid"`` or ``"ood"``: the group whose average ``benchmark`` enters for ``method``."""
    groups = _groups(method)
    for group, members in groups.items():
        if benchmark in members:
            return group
    raise KeyError(f"benchmark {benchmark!r} is in no evaluation group of method {method!r}")


def benchmarks_in(group: str, method: str = "evosteer") -> tuple[str, ...]:
    """The benchmarks of one evaluation group, in the paper's table order."""
    groups = _groups(method)
    if group not in groups:
        raise KeyError(f"group {group!r} not in {sorted(groups)}")
    return groups[group]


def _groups(method: str) -> dict[str, tuple[str, ...]]:
    if method not in GROUPS:
        raise KeyError(f"method {method!r} not in {sorted(GROUPS)}")
    return GROUPS[method]
