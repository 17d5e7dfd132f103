"""The SIMULATED task suite: seeded synthetic records for the six IID families.

Prompts are short and readable (``[sim hotpotqa train #17] ...``); gold answers are short
lowercase words or numbers so that SQuAD normalization leaves them unchanged. The latent
parameters the sim executor reads live in ``TaskRecord.meta``:

- ``difficulty`` in [0, 1]: lowers every agent's chance of a correct attempt;
- ``trap``: probability that a wrong attempt lands on ``trap_answer`` (a plausible wrong
  answer that several agents share, so agreement alone does not reveal it);
- ``distractors``: other wrong answers (independent mistakes, which disagree);
- ``key_step``: the step a useful plan must name;
- interactive family: ``subgoals`` (the commands that win the game, in order),
  ``receptacles`` and ``max_steps``.

Gold, trap and distractors are distinct draws from one distribution (uniform integers for
aime and mbpp_plus, pseudo-words otherwise) with the gold drawn first: the wrong answers are
exchangeable with the gold (exactly for the integers; for words up to the rejection of
repeats, which almost never happen), so no function of the answers nodes state (offsets,
median, pattern) singles out the gold; only the simulated verifiers and checks do.
"""

from __future__ import annotations

from functools import lru_cache

from evosteer_core.episode.records import FAMILIES, TaskRecord, sim_tag
from evosteer_core.infra.seeding import numpy_rng

SIM_SOURCE = "sim"
N_DISTRACTORS = 4

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "st")
_NUCLEI = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "l", "s", "m", "th")

_RECEPTACLES = (
    "cabinet",
    "drawer",
    "countertop",
    "shelf",
    "fridge",
    "microwave",
    "sinkbasin",
    "desk",
    "sidetable",
    "garbagecan",
)
_OBJECTS = ("mug", "apple", "book", "pencil", "kettle", "plate", "cd", "towel", "lettuce", "vase")
_TREATMENTS = (("heat", "microwave"), ("cool", "fridge"), ("clean", "sinkbasin"), ("", ""))


def _word(rng, syllables: int) -> str:
    """A pronounceable lowercase pseudo-word (never an English article)."""
    parts = []
    for _ in range(syllables):
        parts.append(
            _ONSETS[rng.integers(len(_ONSETS))]
            + _NUCLEI[rng.integers(len(_NUCLEI))]
            + _CODAS[rng.integers(len(_CODAS))]
        )
    return "".join(parts)


def _distinct_words(rng, n: int, syllables: int = 2) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        w = _word(rng, syllables)
        if w not in out and len(w) >= 3:
            out.append(w)
    return out


def _distinct_numbers(rng, n: int, low: int, high: int) -> list[str]:
    """``n`` distinct integers drawn uniformly from [low, high), as strings."""
    out: list[str] = []
    while len(out) < n:
        v = str(int(rng.integers(low, high)))
        if v not in out:
            out.append(v)
    return out


def _qa_texts(family: str, rng, tag: str) -> tuple[str, list[str], str, tuple[str, ...]]:
    """(prompt, [gold, trap, distractors...], key step, MCQ choices) for a non-interactive task."""
    e1, e2, e3 = (w.capitalize() for w in _distinct_words(rng, 3))
    if family == "hotpotqa":
        answers = _distinct_words(rng, 2 + N_DISTRACTORS)
        prompt = f"{tag} Which river flows through the birthplace of the founder of {e1} {e2}?"
        return prompt, answers, f"identify the founder of {e1} {e2} first", ()
    if family == "nq_open":
        answers = _distinct_words(rng, 2 + N_DISTRACTORS)
        prompt = f"{tag} Who first described the {e1.lower()} effect in {e2} physics?"
        return prompt, answers, f"recall the original {e1.lower()} paper", ()
    if family == "medqa":
        answers = _distinct_words(rng, 2 + N_DISTRACTORS, syllables=3)
        choices = list(answers)
        rng.shuffle(choices)
        prompt = (
            f"{tag} A patient presents with {e1.lower()} fever after travel to {e2}. Best drug?"
        )
        return prompt, answers, f"rule out {e3.lower()} syndrome", tuple(choices)
    if family == "aime":
        answers = _distinct_numbers(rng, 2 + N_DISTRACTORS, 0, 1000)
        a, b, m = int(rng.integers(3, 40)), int(rng.integers(5, 60)), int(rng.integers(2, 9))
        prompt = (
            f"{tag} Find the remainder when the number of {m}-term sequences with sum {a * b} "
            f"and no two adjacent terms equal is divided by 1000."
        )
        return prompt, answers, f"count by the last term modulo {m}", ()
    if family == "mbpp_plus":
        answers = _distinct_numbers(rng, 2 + N_DISTRACTORS, 0, 500)
        fname = f"{e1.lower()}_{e2.lower()}"
        prompt = (
            f"{tag} Write {fname}(xs) that counts pairs of equal adjacent runs in xs; "
            f"state what it returns on the hidden check input."
        )
        return prompt, answers, "handle the empty list and single-element runs", ()
    raise ValueError(f"_qa_texts: family {family!r} is interactive or unknown")


def _alfworld_task(rng, tag: str) -> tuple[str, dict]:
    """A small household game: find an object, optionally treat it, place it."""
    obj = _OBJECTS[rng.integers(len(_OBJECTS))]
    recs = [f"{r} {int(rng.integers(1, 5))}" for r in _RECEPTACLES]
    source, target = recs[int(rng.integers(0, 4))], recs[int(rng.integers(4, 10))]
    verb, tool = _TREATMENTS[rng.integers(len(_TREATMENTS))]
    n_search = int(rng.integers(1, 3))
    wrong_spots = [r for r in recs if r not in (source, target)]
    subgoals = [f"go to {wrong_spots[i]}" for i in range(n_search - 1)]
    subgoals += [f"go to {source}", f"take {obj} 1 from {source}"]
    if verb:
        tool_rec = next(r for r in recs if r.startswith(tool))
        subgoals += [f"go to {tool_rec}", f"{verb} {obj} 1 with {tool_rec}"]
    subgoals += [f"go to {target}", f"put {obj} 1 in/on {target}"]
    goal = (
        f"{verb} some {obj} and put it in {target.split()[0]}"
        if verb
        else (f"put some {obj} in {target.split()[0]}")
    )
    prompt = f"{tag} You are in a room with {', '.join(recs[:6])}, ... Your task is to: {goal}."
    meta = {
        "subgoals": subgoals,
        "receptacles": recs,
        "object": obj,
        "max_steps": 50,
        "key_step": f"look for the {obj} in {source.split()[0]}s first",
    }
    return prompt, meta


def make_sim_record(family: str, index: int, seed: int, split: str) -> TaskRecord:
    """One simulated record; a pure function of (family, index, seed, split)."""
    if family not in FAMILIES:
        raise ValueError(f"make_sim_record: family {family!r} not in {FAMILIES}")
    if not split or not split.replace("_", "").isalnum():
        raise ValueError(f"make_sim_record: split must be a non-empty identifier, got {split!r}")
    rng = numpy_rng(seed, "sim-suite", split, family, index)
    tag = sim_tag(family, split, index)
    difficulty = round(float(rng.random()), 4)
    record_id = f"sim-{family}-{split}-{index:05d}"
    if family == "alfworld":
        prompt, meta = _alfworld_task(rng, tag)
        meta["difficulty"] = difficulty
        return TaskRecord(
            record_id, SIM_SOURCE, family, prompt, "interactive", answers=("done",), meta=meta
        )
    prompt, answers, key_step, choices = _qa_texts(family, rng, tag)
    meta = {
        "difficulty": difficulty,
        "trap": round(float(rng.uniform(0.3, 0.8)), 4),
        "trap_answer": answers[1],
        "distractors": answers[2:],
        "key_step": key_step,
    }
    return TaskRecord(
        record_id,
        SIM_SOURCE,
        family,
        prompt,
        "qa_em",
        answers=(answers[0],),
        choices=choices,
        meta=meta,
    )


def make_sim_suite(n_per_family: int, seed: int, split: str) -> list[TaskRecord]:
    """``n_per_family`` records of each family (family-major order). Different ``split`` names
    give disjoint record ids and prompts (the split is part of both and of every seed).

    Each suite is built once a process (:func:`_sim_suite`) and handed out as a new list of the
    same frozen records: every stage task of a run opens its world from them (a build took
    ~30 ms of tiny-sim's 240 records, five times a step)."""
    if n_per_family < 0:
        raise ValueError(f"make_sim_suite: n_per_family must be >= 0, got {n_per_family}")
    return list(_sim_suite(n_per_family, seed, split))


@lru_cache(maxsize=32)
def _sim_suite(n_per_family: int, seed: int, split: str) -> tuple[TaskRecord, ...]:
    return tuple(
        make_sim_record(family, i, seed, split) for family in FAMILIES for i in range(n_per_family)
    )
