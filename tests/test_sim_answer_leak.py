"""The sim suite's wrong answers say nothing about the gold (issue 11 item 3).

Node answers in the sim are the gold, the trap or a distractor, so any regularity between them
(wrong answers at fixed offsets from the gold, say) lets an orchestrator that compares answers
find the gold without solving anything. Over many records, predictors that see only the wrong
answers, or the set of all answers without knowing which is gold, must do no better than
chance beyond a binomial margin.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from functools import cache

import pytest

from evosteer_core.sim import make_sim_record

N_RECORDS = 2000
OFFSETS = (-100, -10, -2, -1, 1, 2, 10, 100)
MODULUS = {"aime": 1000, "mbpp_plus": 500}
QA_FAMILIES = ("hotpotqa", "nq_open", "medqa", "aime", "mbpp_plus")


@cache
def _records(family: str) -> list[tuple[str, list[str]]]:
    """(gold, wrong answers) of ``N_RECORDS`` records of ``family``."""
    out = []
    for i in range(N_RECORDS):
        r = make_sim_record(family, i, 7, "leakcheck")
        out.append((r.answers[0], [r.meta["trap_answer"], *r.meta["distractors"]]))
    return out


def _upper_bound(n: int, p: float, z: float = 5.0) -> float:
    """Hits a chance-level predictor stays under (mean + z sd, plus one for tiny p)."""
    return n * p + z * math.sqrt(n * p * (1 - p)) + 1


# ---------------------------------------------------------------- from the wrong answers only


def _offset_votes(wrong: Sequence[int], m: int) -> Counter:
    """Each value not among the wrong answers, voted for by every (wrong answer, offset)
    that lands on it: the gold under an "off by k" distractor scheme."""
    taken = set(wrong)
    votes = Counter((w - k) % m for w in wrong for k in OFFSETS)
    for w in taken:
        votes.pop(w, None)
    return votes


def _wrong_only_predictors(m: int) -> dict[str, Callable[[list[int]], int]]:
    preds: dict[str, Callable[[list[int]], int]] = {
        "most offset votes": lambda w: max(
            sorted(_offset_votes(w, m).items()), key=lambda kv: kv[1]
        )[0],
        "median": lambda w: sorted(w)[len(w) // 2],
        "mean": lambda w: round(sum(w) / len(w)) % m,
    }
    for rank in range(5):
        for k in OFFSETS:
            preds[f"rank {rank} {k:+d}"] = lambda w, r=rank, k=k: (sorted(w)[r] - k) % m
    return preds


def _fitted_rank_offset(train: list[tuple[int, list[int]]], m: int) -> tuple[int, int]:
    """The (rank, offset) rule gold = sorted(wrong)[rank] + offset that fits ``train`` best."""
    hits: Counter = Counter()
    for gold, wrong in train:
        for r, w in enumerate(sorted(wrong)):
            hits[(r, (gold - w) % m)] += 1
    return max(sorted(hits), key=lambda key: hits[key])


def _fitted_shape_lookup(train: list[tuple[int, list[int]]], m: int) -> dict:
    """A lookup table: the pattern of the wrong answers (their gaps) → the most frequent
    position of the gold relative to the smallest wrong answer."""
    table: dict[tuple, Counter] = {}
    for gold, wrong in train:
        s = sorted(wrong)
        shape = tuple(b - a for a, b in zip(s, s[1:], strict=False))
        table.setdefault(shape, Counter())[(gold - s[0]) % m] += 1
    return {k: max(sorted(c), key=lambda d: c[d]) for k, c in table.items()}


@pytest.mark.parametrize("family", sorted(MODULUS))
def test_gold_is_not_predictable_from_the_wrong_answers(family: str) -> None:
    m = MODULUS[family]
    data = [(int(g), [int(x) for x in w]) for g, w in _records(family)]
    chance = 1 / (m - 5)  # gold is uniform over the values that are not wrong answers
    bound = _upper_bound(len(data), chance)
    for name, predict in _wrong_only_predictors(m).items():
        hits = sum(predict(wrong) == gold for gold, wrong in data)
        assert hits <= bound, f"{family}: predictor '{name}' finds the gold {hits}/{len(data)}"
    # generic predictors fitted on one half and scored on the other
    half = len(data) // 2
    train, test = data[:half], data[half:]
    rank, offset = _fitted_rank_offset(train, m)
    hits = sum((sorted(w)[rank] + offset) % m == g for g, w in test)
    assert hits <= _upper_bound(len(test), chance), f"{family}: fitted rank/offset rule {hits}"
    table = _fitted_shape_lookup(train, m)
    hits = 0
    for g, w in test:
        s = sorted(w)
        shape = tuple(b - a for a, b in zip(s, s[1:], strict=False))
        hits += shape in table and (s[0] + table[shape]) % m == g
    assert hits <= _upper_bound(len(test), chance), f"{family}: fitted shape lookup {hits}"


# ---------------------------------------------------------------- picking gold among all answers


def _features(answer: str, others: list[str], numeric: int | None) -> tuple:
    """What a comparer can see of one answer among all answers: its rank (numeric or
    alphabetic), its length rank, and (numbers) how many others sit at a small offset."""
    pool = [answer, *others]
    key = (lambda a: int(a)) if numeric else (lambda a: a)
    rank = sorted(pool, key=key).index(answer)
    length_rank = sorted(len(a) for a in pool).index(len(answer))
    near = 0
    if numeric:
        near = sum(
            (int(o) - int(answer)) % numeric in {k % numeric for k in OFFSETS} for o in others
        )
    return rank, length_rank, near


@pytest.mark.parametrize("family", QA_FAMILIES)
def test_gold_is_not_singled_out_among_all_answers(family: str) -> None:
    """A comparer sees the six distinct answers (gold, trap, 4 distractors) in a random order;
    natural rules and a feature lookup fitted on half the records pick the gold at chance."""
    m = MODULUS.get(family)
    rows = []
    for gold, wrong in _records(family):
        answers = [gold, *wrong]
        rows.append([(_features(a, [o for o in answers if o != a], m), a == gold) for a in answers])
    chance = 1 / 6
    n = len(rows)

    def hits_of(score: Callable[[tuple], float], subset: list) -> int:
        # pick the answer with the highest score; ties broken by the answer's sorted rank
        return sum(max(row, key=lambda fa: (score(fa[0]), -fa[0][0]))[1] for row in subset)

    for name, score in {
        "most offset neighbours": lambda f: f[2],
        "median rank": lambda f: -abs(f[0] - 2.5),
        "smallest": lambda f: -f[0],
        "longest": lambda f: f[1],
    }.items():
        hits = hits_of(score, rows)
        assert hits <= _upper_bound(n, chance), f"{family}: '{name}' picks the gold {hits}/{n}"
    # a lookup fitted on half: feature tuple -> rate at which it is the gold; scored on the rest
    half = n // 2
    seen: dict[tuple, list[int]] = {}
    for row in rows[:half]:
        for feats, is_gold in row:
            seen.setdefault(feats, [0, 0])
            seen[feats][0] += is_gold
            seen[feats][1] += 1
    rate = {f: (g + 1) / (t + 6) for f, (g, t) in seen.items()}  # smoothed toward chance
    hits = hits_of(lambda f: rate.get(f, chance), rows[half:])
    assert hits <= _upper_bound(n - half, chance), f"{family}: fitted lookup picks {hits}"
