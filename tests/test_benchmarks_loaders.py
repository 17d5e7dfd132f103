"""Benchmark loaders on small JSONL fixtures in the public field layouts (tests/data/benchmarks)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from evosteer_core.benchmarks import BenchmarkDataError, load_benchmark
from evosteer_core.benchmarks.loaders import CONVERTERS, gpqa_record
from evosteer_core.benchmarks.rows import Row
from evosteer_core.benchmarks.taskmap import BENCHMARK_FAMILY

DATA = Path(__file__).parent / "data" / "benchmarks"


def fixture(name: str) -> Path:
    return DATA / f"{name}.jsonl"


def test_every_benchmark_has_a_converter_and_family() -> None:
    assert set(CONVERTERS) == set(BENCHMARK_FAMILY)


@pytest.mark.parametrize("name", sorted(set(CONVERTERS) - {"humaneval"}))
def test_fixture_loads_with_family_and_unique_ids(name: str) -> None:
    records = load_benchmark(name, fixture(name))
    n_rows = sum(1 for line in fixture(name).read_text().splitlines() if line.strip())
    assert len(records) == n_rows
    assert {r.source for r in records} == {name}
    assert {r.family for r in records} == {BENCHMARK_FAMILY[name]}
    assert len({r.record_id for r in records}) == len(records)
    assert all(r.record_id.startswith(f"{name}/") for r in records)


def test_hotpotqa_fields() -> None:
    first, second = load_benchmark("hotpotqa", fixture("hotpotqa"))
    assert first.record_id == "hotpotqa/5a8b57f25542995d1e6f1371"
    assert first.prompt.startswith("Were Scott Derrickson")
    assert (first.metric, first.answers) == ("qa_em", ("yes",))
    assert first.meta["type"] == "comparison"
    assert first.meta["context"][0][0] == "Scott Derrickson"
    assert second.answers == ("Chief of Protocol",)


def test_nq_open_and_triviaqa_aliases() -> None:
    nq = load_benchmark("nq_open", fixture("nq_open"))
    assert nq[2].answers == ("14 December 1972 UTC", "December 1972")
    assert nq[0].record_id == "nq_open/line1"  # NQ-Open rows carry no id
    tqa = load_benchmark("triviaqa", fixture("triviaqa"))
    # value first, aliases de-duplicated in order
    assert tqa[0].answers == ("Sunset Boulevard", "Sunset Blvd", "West Sunset Boulevard")
    assert tqa[0].record_id == "triviaqa/tc_33"


def test_musique_answer_and_aliases() -> None:
    first, second = load_benchmark("musique", fixture("musique"))
    assert first.answers == ("Miquette Giraudy", "Miquette")
    assert first.meta["paragraphs"][0]["is_supporting"] is True
    assert second.answers == ("Ted Turner",)


def test_medqa_options_and_letter() -> None:
    first, second = load_benchmark("medqa", fixture("medqa"))
    assert first.metric == "mcq"
    assert first.choices[4] == "Nitrofurantoin" and first.answers == ("E",)
    assert second.answers == ("B",) and second.choices[1] == "Vitamin C"
    assert "E. Nitrofurantoin" in first.public_prompt


def test_medxpertqa_drops_inline_choices() -> None:
    (record,) = load_benchmark("medxpertqa", fixture("medxpertqa"))
    assert "Answer Choices" not in record.prompt
    assert record.choices == ("ECG", "Chest CT", "Troponin", "Echocardiogram", "D-dimer")
    assert record.answers == ("A",) and record.family == "medqa"


def test_gpqa_shuffle_keeps_gold_and_is_seeded_by_record() -> None:
    records = load_benchmark("gpqa", fixture("gpqa"))
    for record, correct in zip(records, ["10^-4 eV", "11"], strict=True):
        gold_index = "ABCD".index(record.answers[0])
        assert record.choices[gold_index] == correct
        assert len(set(record.choices)) == 4
        assert all(c == c.strip() for c in record.choices)
    assert load_benchmark("gpqa", fixture("gpqa")) == records  # same letters on every load
    # the order depends on the record id: over many ids every gold position occurs
    positions = set()
    for i in range(40):
        data = {
            "Record ID": f"rec{i}",
            "Question": "Q?",
            "Correct Answer": "right",
            "Incorrect Answer 1": "w1",
            "Incorrect Answer 2": "w2",
            "Incorrect Answer 3": "w3",
        }
        positions.add(gpqa_record(Row(data, Path("mem.jsonl"), i + 1)).answers[0])
    assert positions == {"A", "B", "C", "D"}


def test_aime_answers_and_capitalized_fields() -> None:
    records = load_benchmark("aime", fixture("aime"))
    assert [r.answers for r in records] == [("70",), ("33",), ("480",)]
    assert records[1].record_id == "aime/2024-II-4" and records[1].prompt.startswith("Let $x,y$")
    assert all(r.metric == "aime" for r in records)


def test_math_hard_gold_from_boxed_solution_or_answer() -> None:
    records = load_benchmark("math_hard", fixture("math_hard"))
    assert [r.answers for r in records] == [("5",), ("\\dfrac{5}{6}",), ("\\frac{1}{2}",)]
    assert records[2].record_id == "math_hard/test/algebra/2700.json"
    assert records[0].meta == {"level": "Level 5", "type": "Algebra"}


def test_mbpp_plus_entry_point_tests_and_prompt() -> None:
    first, second = load_benchmark("mbpp_plus", fixture("mbpp_plus"))
    assert first.entry_point == "similar_elements"  # found in test_list (set() is a builtin)
    assert "similar_elements((3, 4, 5, 6)" in first.prompt
    assert first.tests.startswith("inputs = ")
    assert second.entry_point == "is_not_prime"
    assert second.tests.startswith("import math\n")
    assert first.metric == second.metric == "code"


def test_swe_bench_record_is_harness_scored() -> None:
    (record,) = load_benchmark("swe_bench_verified", fixture("swe_bench_verified"))
    assert record.metric == "interactive" and record.family == "mbpp_plus"
    assert record.meta["harness"] == "swebench"
    assert record.meta["FAIL_TO_PASS"] == [
        "astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"
    ]
    assert record.meta["base_commit"].startswith("d16bfe05")
    assert record.answers[0].startswith("diff --git")
    assert "separability_matrix" in record.prompt and "astropy/astropy" in record.prompt


def test_alfworld_and_webshop_records() -> None:
    first, second = load_benchmark("alfworld", fixture("alfworld"))
    assert first.prompt.endswith("Your task is to: put a clean egg in microwave.")
    assert first.prompt.startswith("You are in the middle of a room.")
    assert second.prompt == "Your task is to: examine the book with the desklamp."
    assert first.meta["max_steps"] == 50 and first.metric == "interactive"
    shop = load_benchmark("webshop", fixture("webshop"))
    assert shop[1].prompt.startswith("i want a noise cancelling")
    assert shop[0].meta["price_upper"] == 40.0 and shop[0].meta["harness"] == "webshop"


def test_limit_reads_only_first_rows() -> None:
    assert len(load_benchmark("nq_open", fixture("nq_open"), limit=2)) == 2
    # a bad row after the limit is never read
    assert len(load_benchmark("aime", DATA / "bad" / "aime_out_of_range.jsonl", limit=1)) == 1
    with pytest.raises(ValueError, match="limit must be a positive integer"):
        load_benchmark("nq_open", fixture("nq_open"), limit=0)


def test_unknown_benchmark_and_missing_path() -> None:
    with pytest.raises(KeyError, match="unknown benchmark 'squad'"):
        load_benchmark("squad", fixture("nq_open"))
    with pytest.raises(ValueError, match="needs a path"):
        load_benchmark("nq_open")
    with pytest.raises(BenchmarkDataError, match="not found"):
        load_benchmark("nq_open", DATA / "missing.jsonl")


def test_empty_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(BenchmarkDataError, match="holds no rows"):
        load_benchmark("hotpotqa", empty)


@pytest.mark.parametrize(
    ("benchmark", "file", "line", "message"),
    [
        ("nq_open", "nq_open_answer_string", 2, "field 'answer': expected a list of strings"),
        ("medqa", "medqa_bad_letter", 1, "field 'answer_idx': expected one of the option letters"),
        ("medqa", "medqa_answer_mismatch", 1, "field 'answer': expected the text of option A"),
        ("medqa", "medqa_gap_letters", 1, "field 'options': expected an object keyed by contig"),
        ("aime", "aime_out_of_range", 2, "field 'answer': expected an AIME answer"),
        ("aime", "aime_not_integer", 1, "field 'answer': expected an integer"),
        ("gpqa", "gpqa_missing_incorrect", 1, "field 'Incorrect Answer 3': expected a value"),
        ("hotpotqa", "hotpotqa_broken_json", 3, "not valid JSON"),
        ("hotpotqa", "hotpotqa_empty_question", 1, "field 'question': expected a non-empty"),
        (
            "hotpotqa",
            "hotpotqa_duplicate_id",
            3,
            "duplicate record id 'hotpotqa/a' .first on line 1",
        ),
        (
            "triviaqa",
            "triviaqa_missing_value",
            1,
            "field 'answer.value': expected a value; missing",
        ),
        ("math_hard", "math_hard_no_boxed", 1, "field 'solution': expected a solution ending in"),
        ("mbpp_plus", "mbpp_plus_no_entry_point", 1, "field 'entry_point': expected a function"),
        ("musique", "musique_unanswerable", 1, "field 'answerable': expected true"),
        (
            "swe_bench_verified",
            "swe_bench_fail_to_pass",
            1,
            "field 'FAIL_TO_PASS': expected a list",
        ),
        ("alfworld", "alfworld_task_type", 1, "field 'task_type': expected one of"),
        ("textworld", "textworld_rooms", 2, "field 'rooms': expected an integer in .1, 50.; got 0"),
        ("webshop", "not_an_object", 1, "expected a JSON object, got list"),
    ],
)
def test_bad_row_names_file_line_field(benchmark: str, file: str, line: int, message: str) -> None:
    path = DATA / "bad" / f"{file}.jsonl"
    with pytest.raises(BenchmarkDataError) as info:
        load_benchmark(benchmark, path)
    text = str(info.value)
    assert text.startswith(f"{path}:{line}: ")
    assert re.search(message, text), text
