"""Every ``docs/method.md §N.M`` citation in the repository names a section that exists.

docs/method.md is the repository's own statement of the method; code and docs cite it by its
stable section numbers. The repository must stand on its own, so no text may cite the
project's former out-of-repository spec any more either.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHOD = ROOT / "docs" / "method.md"
SCANNED = (
    "evosteer_core",
    "evosteer_flyte",
    "tasks",
    "workflows",
    "scripts",
    "experiments",
    "tests",
    "docs",
    "README.md",
)
SKIPPED_DIRS = {".venv", "__pycache__", ".git", "learning"}
"""``learning``: the raw files of the learning runs (experiments/results/learning/), not prose."""

REQUIRED = {"1", "2"} | {f"1.{k}" for k in range(1, 11)} | {f"2.{k}" for k in range(1, 5)}
"""Sections whose numbers the code cites: §1.1–1.10 (EvoSteer), §2.1–2.4 (CollabFlow)."""

PAPER_TAGS = (
    "paper Eq. 2",
    "paper Eq. 3",
    "paper Eq. 5",
    "paper Eq. 7",
    "paper Eq. 8",
    "paper Eq. 9",
    "paper Eq. 11",
    "paper Eqs. 7–9",
    "paper Alg. 1",
    "paper Table 3",
    "paper Def. 1",
    "paper Def. 2",
    "paper A.4",
    "paper A.6",
    "paper Prop. A.13",
    "paper A.22",
    "paper A.23",
    "paper Prop. C.5",
)
"""Paper numbers quoted in the code, each tagged next to its statement in method.md."""

_HEADING = re.compile(r"^(#{2,3}) (\d+(?:\.\d+)?) \S")
_REF = r"\d+(?:\.\d+)?"
_CITE = re.compile(
    rf"method(?:\.md)?\s*§\s*({_REF}(?:\s*(?:[–-]|,|and)\s*(?:§\s*{_REF}|\d+\.\d+))*)"
)
"""``method §1.7``, ``docs/method.md §1.1–1.3``, ``method.md §1.10, §2.4``: every number in
the chain is a cited section (after a separator a number needs § or the N.M form, so the
``5`` of ``§1.3, 5 s`` is not one)."""
_OLD_SPEC = re.compile(r"\b" + "SP" + r"EC\b")
"""The former spec's name (spelled in two parts so this file does not match itself)."""


def method_sections() -> list[str]:
    """The section numbers of method.md's ``## N`` and ``### N.M`` headings, in order."""
    found = []
    for line in METHOD.read_text(encoding="utf-8").splitlines():
        m = _HEADING.match(line)
        if m:
            level, number = m.groups()
            assert (level == "###") == ("." in number), f"method.md: {line!r} at the wrong level"
            found.append(number)
    return found


def scanned_files() -> list[Path]:
    """Every *.py and *.md file of the scanned parts of the repository."""
    files: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            files += [
                p
                for p in sorted(path.rglob("*"))
                if p.suffix in (".py", ".md")
                and p.is_file()
                and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)
            ]
    return files


def cited_sections(text: str) -> list[tuple[int, str]]:
    """(line number, section) of every method.md citation in ``text``."""
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for m in _CITE.finditer(line):
            out += [(lineno, ref) for ref in re.findall(_REF, m.group(1))]
    return out


def test_method_has_every_cited_section_once() -> None:
    sections = method_sections()
    duplicates = sorted({s for s in sections if sections.count(s) > 1})
    assert not duplicates, f"docs/method.md repeats sections {duplicates}"
    missing = sorted(REQUIRED - set(sections))
    assert not missing, f"docs/method.md lacks sections {missing}"


def test_citation_pattern_reads_ranges_and_lists() -> None:
    text = "x (docs/method.md §1.1–1.3)\ny method §1.10, §2.4 and z\nw method.md §1.3, 5 s"
    assert cited_sections(text) == [(1, "1.1"), (1, "1.3"), (2, "1.10"), (2, "2.4"), (3, "1.3")]


def test_every_method_citation_names_an_existing_section() -> None:
    sections = set(method_sections())
    dangling = [
        f"{path.relative_to(ROOT)}:{lineno}: §{ref}"
        for path in scanned_files()
        for lineno, ref in cited_sections(path.read_text(encoding="utf-8"))
        if ref not in sections
    ]
    assert not dangling, "citations of missing docs/method.md sections:\n" + "\n".join(dangling)


def test_method_tags_the_paper_numbers_the_code_quotes() -> None:
    text = METHOD.read_text(encoding="utf-8")
    missing = [tag for tag in PAPER_TAGS if tag not in text]
    assert not missing, f"docs/method.md has no tag for {missing}"


def test_nothing_cites_the_former_out_of_repository_spec() -> None:
    hits = [
        f"{path.relative_to(ROOT)}:{lineno}: {line.strip()[:100]}"
        for path in scanned_files()
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if _OLD_SPEC.search(line)
    ]
    assert not hits, (
        f"{len(hits)} lines name the out-of-repository spec; cite docs/method.md instead:\n"
        + "\n".join(hits)
    )
