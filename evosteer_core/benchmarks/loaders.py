"""Benchmark loaders: public JSONL exports → :class:`TaskRecord` (field maps in
docs/benchmarks.md).

Each converter reads one row in its benchmark's usual public field names and builds one
record: ``record_id`` is ``<benchmark>/<the row's own id>`` (``line<N>`` when the export has
none), ``family`` is the benchmark's IID task type (``taskmap``). A bad row raises
:class:`BenchmarkDataError` naming file, line, field and expectation; no row is skipped.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Callable, Iterator
from pathlib import Path

from evosteer_core.benchmarks.humaneval import HUMANEVAL_FILE, humaneval_record
from evosteer_core.benchmarks.rows import BenchmarkDataError, Row, RowError, read_jsonl
from evosteer_core.benchmarks.schema import CHOICE_LETTERS, TaskTableError, records_to_frame
from evosteer_core.benchmarks.taskmap import family_of
from evosteer_core.benchmarks.textworld_suite import suite_rows, textworld_record
from evosteer_core.episode.answers import last_boxed
from evosteer_core.episode.records import TaskRecord
from evosteer_core.infra.seeding import numpy_rng

ALFWORLD_MAX_STEPS = 50
"""ALFWorld success counts only within 50 environment steps (paper App. D)."""

ALFWORLD_TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
"""The six ALFWorld task types (the prefix of each game folder's name)."""


def _record(name: str, row: Row, id_keys: tuple[str, ...], **fields: object) -> TaskRecord:
    return TaskRecord(
        record_id=f"{name}/{row.record_id(*id_keys)}",
        source=name,
        family=family_of(name),
        **fields,  # type: ignore[arg-type]
    )


def _unique(texts: list[str]) -> tuple[str, ...]:
    """Strip and de-duplicate aliases, keeping first-seen order."""
    return tuple(dict.fromkeys(t.strip() for t in texts if t.strip()))


# ---------------------------------------------------------------- open-domain QA


def hotpotqa_record(row: Row) -> TaskRecord:
    """HotpotQA (distractor/fullwiki JSON as lines): ``_id``, ``question``, ``answer``."""
    return _record(
        "hotpotqa",
        row,
        ("_id", "id"),
        prompt=row.text("question"),
        metric="qa_em",
        answers=_unique([row.text("answer")]),
        meta=row.extras("type", "level", "supporting_facts", "context"),
    )


def nq_open_record(row: Row) -> TaskRecord:
    """NQ-Open: ``question`` and ``answer`` (a list of aliases)."""
    return _record(
        "nq_open",
        row,
        ("id",),
        prompt=row.text("question"),
        metric="qa_em",
        answers=_unique(row.text_list(row.first_key("answer", "answers"))),
    )


def triviaqa_record(row: Row) -> TaskRecord:
    """TriviaQA (rc/unfiltered, HF layout): ``question``, ``answer.value``/``answer.aliases``."""
    answer = row.nested("answer")
    aliases = answer.text_list("aliases", allow_empty=True) if answer.has("aliases") else []
    return _record(
        "triviaqa",
        row,
        ("question_id", "id"),
        prompt=row.text("question"),
        metric="qa_em",
        answers=_unique([answer.text("value"), *aliases]),
    )


def musique_record(row: Row) -> TaskRecord:
    """MuSiQue (answerable split): ``question``, ``answer``, ``answer_aliases``, paragraphs."""
    if row.has("answerable") and row.raw("answerable") is not True:
        raise row.error("answerable", "true (use the musique_ans split)", row.raw("answerable"))
    aliases = row.text_list("answer_aliases", allow_empty=True) if row.has("answer_aliases") else []
    return _record(
        "musique",
        row,
        ("id",),
        prompt=row.text("question"),
        metric="qa_em",
        answers=_unique([row.text("answer"), *aliases]),
        meta=row.extras("paragraphs", "question_decomposition"),
    )


# ---------------------------------------------------------------- multiple choice


def _lettered_options(row: Row, key: str) -> tuple[str, ...]:
    """Options keyed "A", "B", ... (contiguous from A) as texts in letter order."""
    options = row.nested(key)
    letters = sorted(options.data)
    if len(letters) < 2 or "".join(letters) != CHOICE_LETTERS[: len(letters)]:
        raise row.error(key, "an object keyed by contiguous letters A, B, ...", row.raw(key))
    return tuple(options.text(letter).strip() for letter in letters)


def _gold_letter(row: Row, key: str, choices: tuple[str, ...]) -> str:
    letter = row.text(key).strip().strip("()").upper()
    if letter not in CHOICE_LETTERS[: len(choices)]:
        raise row.error(key, f"one of the option letters {CHOICE_LETTERS[: len(choices)]}", letter)
    return letter


def medqa_record(row: Row) -> TaskRecord:
    """MedQA (USMLE JSONL): ``question``, ``options`` {letter: text}, ``answer_idx``; the
    ``answer`` text, when present, must be the text of that option."""
    choices = _lettered_options(row, "options")
    letter = _gold_letter(row, "answer_idx", choices)
    if row.has("answer") and row.text("answer").strip() != choices[ord(letter) - ord("A")]:
        raise row.error("answer", f"the text of option {letter}", row.raw("answer"))
    return _record(
        "medqa",
        row,
        ("id",),
        prompt=row.text("question"),
        metric="mcq",
        answers=(letter,),
        choices=choices,
        meta=row.extras("meta_info"),
    )


def medxpertqa_record(row: Row) -> TaskRecord:
    """MedXpertQA (Text): ``question`` (its inline "Answer Choices:" block is dropped, the
    record lists the options), ``options`` {letter: text}, ``label``."""
    choices = _lettered_options(row, "options")
    question = row.text("question").split("Answer Choices:")[0].strip()
    if not question:
        raise row.error("question", "a question before 'Answer Choices:'", row.raw("question"))
    return _record(
        "medxpertqa",
        row,
        ("id",),
        prompt=question,
        metric="mcq",
        answers=(_gold_letter(row, "label", choices),),
        choices=choices,
        meta=row.extras("medical_task", "body_system", "question_type"),
    )


def gpqa_record(row: Row) -> TaskRecord:
    """GPQA (CSV columns as JSON keys): ``Question``, ``Correct Answer``, ``Incorrect Answer
    1..3``. Options are shuffled by a generator seeded with the record id, so an item's
    letters are the same in every run and on every machine."""
    record_id = row.record_id("Record ID", "id")
    correct = row.text("Correct Answer").strip()
    options = [correct] + [row.text(f"Incorrect Answer {i}").strip() for i in (1, 2, 3)]
    if len(set(options)) != len(options):
        raise row.error("Incorrect Answer 1..3", "four distinct answers", options)
    order = numpy_rng("benchmark-choices", "gpqa", record_id).permutation(len(options))
    choices = tuple(options[i] for i in order)
    return _record(
        "gpqa",
        row,
        ("Record ID", "id"),
        prompt=row.text("Question").strip(),
        metric="mcq",
        answers=(CHOICE_LETTERS[choices.index(correct)],),
        choices=choices,
        meta=row.extras("Subdomain", "High-level domain"),
    )


# ---------------------------------------------------------------- mathematics


def aime_record(row: Row) -> TaskRecord:
    """AIME: ``problem``/``Problem`` and ``answer``/``Answer``, an integer 0..999."""
    key = row.first_key("answer", "Answer")
    answer = row.integer_text(key)
    if not 0 <= int(answer) <= 999:
        raise row.error(key, "an AIME answer, an integer in 0..999", row.raw(key))
    return _record(
        "aime",
        row,
        ("id", "ID"),
        prompt=row.text("problem", "Problem"),
        metric="aime",
        answers=(answer,),
        meta=row.extras("year", "url"),
    )


def math_hard_record(row: Row) -> TaskRecord:
    """MATH-Hard (level-5 MATH): ``problem``; the gold is ``answer`` when the export has it,
    else the last ``\\boxed{}`` of ``solution``."""
    if row.has("answer"):
        answer = row.text("answer").strip()
    else:
        boxed = last_boxed(row.text("solution"))
        if not boxed:
            raise row.error("solution", "a solution ending in \\boxed{...}", row.raw("solution"))
        answer = boxed
    return _record(
        "math_hard",
        row,
        ("unique_id", "id"),
        prompt=row.text("problem"),
        metric="math",
        answers=(answer,),
        meta=row.extras("level", "type"),
    )


# ---------------------------------------------------------------- code


def _called_function(assertion: str) -> str | None:
    """The first non-builtin function called in an ``assert`` line (MBPP's test_list)."""
    try:
        tree = ast.parse(assertion)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and not hasattr(builtins, node.func.id)
        ):
            return node.func.id
    return None


def mbpp_plus_record(row: Row) -> TaskRecord:
    """MBPP+ (EvalPlus): ``prompt``, ``test`` (the hidden test script, run after the program;
    ``test_imports`` prepended), ``entry_point`` (else the function called by the first of
    ``test_list``). The first ``test_list`` assertion is shown as the usual MBPP example."""
    examples = row.text_list("test_list") if row.has("test_list") else []
    if row.has("entry_point"):
        entry_point = row.text("entry_point").strip()
    elif examples:
        entry_point = _called_function(examples[0]) or ""
    else:
        raise row.error("entry_point", "a function name (or a test_list to find it)", missing=True)
    if not entry_point.isidentifier():
        raise row.error("entry_point", "a Python identifier", entry_point)
    imports = row.text_list("test_imports", allow_empty=True) if row.has("test_imports") else []
    prompt = row.text("prompt").strip() + f"\nWrite a Python function named `{entry_point}`."
    if examples:
        prompt += f"\nYour code should pass this test:\n{examples[0]}"
    return _record(
        "mbpp_plus",
        row,
        ("task_id", "id"),
        prompt=prompt,
        metric="code",
        tests="\n".join([*imports, row.text("test")]),
        entry_point=entry_point,
    )


def swe_bench_verified_record(row: Row) -> TaskRecord:
    """SWE-bench Verified instance → an interactive record scored by the SWE-bench harness.

    The reward is whether the agent's patch resolves the issue (every FAIL_TO_PASS and
    PASS_TO_PASS test passes in the instance's container); no sandboxed unit test can decide
    that, so the record is ``interactive`` and the instance fields travel in ``meta`` for the
    harness environment. The gold ``patch`` is kept as the reference answer.
    """
    repo, commit = row.text("repo").strip(), row.text("base_commit").strip()
    meta = {
        "harness": "swebench",
        "repo": repo,
        "base_commit": commit,
        "FAIL_TO_PASS": row.text_list("FAIL_TO_PASS"),
        "PASS_TO_PASS": row.text_list("PASS_TO_PASS", allow_empty=True),
        "test_patch": row.text("test_patch"),
        **row.extras("version", "environment_setup_commit", "hints_text", "difficulty"),
    }
    prompt = (
        f"Repository {repo} at commit {commit}. Resolve the following issue by editing the "
        f"repository:\n\n{row.text('problem_statement').strip()}"
    )
    return _record(
        "swe_bench_verified",
        row,
        ("instance_id",),
        prompt=prompt,
        metric="interactive",
        answers=(row.text("patch"),),
        meta=meta,
    )


# ---------------------------------------------------------------- interactive


def alfworld_record(row: Row) -> TaskRecord:
    """ALFWorld: ``task`` (the goal, e.g. "put a clean egg in microwave"), optional
    ``observation`` (the opening room description), ``task_type``, ``game_file``."""
    goal = row.text("task").strip()
    if not goal.lower().startswith("your task is to"):
        goal = f"Your task is to: {goal}"
    observation = row.optional_text("observation").strip()
    task_type = row.optional_text("task_type")
    if task_type and task_type not in ALFWORLD_TASK_TYPES:
        raise row.error("task_type", f"one of {ALFWORLD_TASK_TYPES}", task_type)
    return _record(
        "alfworld",
        row,
        ("id", "task_id"),
        prompt=f"{observation}\n\n{goal}" if observation else goal,
        metric="interactive",
        meta={
            "harness": "alfworld",
            "max_steps": ALFWORLD_MAX_STEPS,
            **row.extras("task_type", "game_file"),
        },
    )


def webshop_record(row: Row) -> TaskRecord:
    """WebShop goal: ``instruction``/``instruction_text`` plus the goal fields the official
    reward compares against (``asin``, ``attributes``, ``goal_options``, ``price_upper``)."""
    return _record(
        "webshop",
        row,
        ("session_id", "id"),
        prompt=row.text("instruction", "instruction_text").strip(),
        metric="interactive",
        meta={
            "harness": "webshop",
            **row.extras(
                "asin", "attributes", "goal_options", "price_upper", "product_category", "query"
            ),
        },
    )


# ---------------------------------------------------------------- registry

CONVERTERS: dict[str, Callable[[Row], TaskRecord]] = {
    "hotpotqa": hotpotqa_record,
    "nq_open": nq_open_record,
    "medqa": medqa_record,
    "aime": aime_record,
    "mbpp_plus": mbpp_plus_record,
    "alfworld": alfworld_record,
    "musique": musique_record,
    "triviaqa": triviaqa_record,
    "gpqa": gpqa_record,
    "math_hard": math_hard_record,
    "swe_bench_verified": swe_bench_verified_record,
    "webshop": webshop_record,
    "medxpertqa": medxpertqa_record,
    "humaneval": humaneval_record,
    "textworld": textworld_record,
}
"""Benchmark name → row converter."""

DEFAULT_FILES: dict[str, Path] = {"humaneval": HUMANEVAL_FILE}
"""Benchmarks whose data ships with an installed package (loadable without a path)."""

GENERATED: dict[str, Callable[[], Iterator[Row]]] = {"textworld": suite_rows}
"""Benchmarks with a built-in generated suite (its rows are used when no path is given)."""


def load_benchmark(
    name: str, path: str | Path | None = None, limit: int | None = None
) -> list[TaskRecord]:
    """Load the first ``limit`` (all when None) rows of a benchmark's JSONL file as records.

    ``path`` may be omitted for benchmarks in :data:`DEFAULT_FILES` and :data:`GENERATED`
    (the built-in suite). The result is checked against the task-table schema; ids must be
    unique within the file.
    """
    if name not in CONVERTERS:
        raise KeyError(f"unknown benchmark {name!r}; known: {sorted(CONVERTERS)}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"load_benchmark: limit must be a positive integer or None, got {limit!r}")
    if path is None and name in GENERATED:
        rows = GENERATED[name]()
    elif path is None:
        if name not in DEFAULT_FILES:
            raise ValueError(f"load_benchmark: benchmark {name!r} needs a path to its JSONL file")
        rows = read_jsonl(DEFAULT_FILES[name])
    else:
        rows = read_jsonl(path)
    convert = CONVERTERS[name]
    records: list[TaskRecord] = []
    first_line: dict[str, int] = {}
    for row in rows:
        if limit is not None and len(records) == limit:
            break
        try:
            record = convert(row)
        except RowError as exc:
            raise BenchmarkDataError(f"{row.path}:{row.line}: {name}: {exc}") from None
        if record.record_id in first_line:
            raise BenchmarkDataError(
                f"{row.path}:{row.line}: {name}: duplicate record id {record.record_id!r} "
                f"(first on line {first_line[record.record_id]})"
            )
        first_line[record.record_id] = row.line
        records.append(record)
    if not records:
        raise BenchmarkDataError(f"{path}: {name}: the file holds no rows")
    try:
        records_to_frame(records)  # schema check of the whole table (rows in file order)
    except TaskTableError as exc:
        lines = [first_line[records[int(i)].record_id] for i in exc.labels]
        where = ",".join(str(n) for n in lines[:5]) or "?"
        raise BenchmarkDataError(f"{row.path}:{where}: {name}: {exc}") from None
    return records
