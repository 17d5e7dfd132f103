"""Property tests over bad input: every invalid config value (through the loader that
``evosteer train --config/--set`` uses) and every invalid benchmark row or file is one
:class:`InputError` naming where (``key`` or ``file:line: field``), never another exception
from deep inside (docs/reliability.md)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from evosteer_core.benchmarks import BenchmarkDataError, load_benchmark
from evosteer_core.benchmarks.loaders import CONVERTERS
from evosteer_core.infra.config import RunConfig, load_config
from evosteer_core.infra.configio import ConfigError, InputError, parse_override

DATA = Path(__file__).parent / "data" / "benchmarks"
PRESET = "evosteer_core/data/tiny-sim.yaml"
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- config values


def _optional(tp: Any) -> tuple[Any, bool]:
    """(the annotation without None, whether None is allowed)."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return (args[0] if len(args) == 1 else tp), len(args) < len(typing.get_args(tp))
    return tp, False


def _keys(cls: type, prefix: str = "") -> list[tuple[str, Any, bool]]:
    """Every typed key of a config dataclass: (dotted key, annotation, None allowed)."""
    out = []
    for f in dataclasses.fields(cls):
        tp, nullable = _optional(typing.get_type_hints(cls)[f.name])
        key = f"{prefix}{f.name}"
        out.append((key, tp, nullable))
        if dataclasses.is_dataclass(tp):
            out += _keys(tp, key + ".")
    return out


KEYS = _keys(RunConfig)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def _wrong_type(tp: Any, nullable: bool) -> st.SearchStrategy:
    """Values that the annotation ``tp`` does not accept (non-finite floats included)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        ok = lambda v: isinstance(v, bool)  # noqa: E731
    elif tp is int:
        ok = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    elif tp is float:
        return st.one_of(
            SCALARS.filter(lambda v: isinstance(v, bool) or not isinstance(v, int | float)),
            st.sampled_from([float("nan"), float("inf"), float("-inf")]),
        ).filter(lambda v: v is not None or not nullable)
    elif tp is str:
        ok = lambda v: isinstance(v, str)  # noqa: E731
    elif origin is Literal:
        ok = lambda v: any(type(v) is type(a) and v == a for a in args)  # noqa: E731
    elif origin is tuple:
        ok = lambda v: isinstance(v, list)  # noqa: E731
    elif origin is dict:
        ok = lambda v: isinstance(v, dict)  # noqa: E731
    elif dataclasses.is_dataclass(tp):
        return SCALARS.filter(lambda v: not isinstance(v, dict) and v is not None)
    else:
        raise AssertionError(f"no strategy for {tp!r}")
    return SCALARS.filter(lambda v: not ok(v) and (v is not None or not nullable))


@st.composite
def _bad_setting(draw) -> tuple[str, Any]:
    key, tp, nullable = draw(st.sampled_from(KEYS))
    return key, draw(_wrong_type(tp, nullable))


def test_the_walk_covers_every_section():
    sections = {k.split(".")[0] for k, *_ in KEYS}
    assert {f.name for f in dataclasses.fields(RunConfig)} <= sections
    assert len(KEYS) > 80


BASE = {
    "executor.kind": "openai",
    "executor.base_url": "http://127.0.0.1:9/v1",
    "executor.model": "m",
    "executor.retriever": {"kind": "bm25", "corpus_ref": {"uri": "file:///c", "sha256": "0" * 64}},
    "policy.init": {"kind": "sft", "ref": {"uri": "file:///w", "sha256": "0" * 64}},
    "experiment": {"rows": [{"name": "a"}]},
}
"""The preset with every optional section filled in, so that each key exists and is valid."""


@PROPERTY
@given(_bad_setting())
def test_a_mistyped_value_is_a_config_error_at_its_key(setting):
    key, value = setting
    assert isinstance(load_config(None, overrides=BASE), RunConfig)
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides={**BASE, key: value})
    assert info.value.path == key, (key, value, str(info.value))
    assert str(info.value).startswith(f"{PRESET}: {key}: expected"), str(info.value)


@PROPERTY
@given(st.sampled_from([k for k, *_ in KEYS]), st.text(max_size=30))
def test_any_set_text_loads_or_is_one_config_error(key, raw):
    """``--set KEY=TEXT`` with arbitrary text: a valid config or a ConfigError naming a key."""
    assume("\x00" not in raw)
    try:
        override = parse_override(f"{key}={raw}")
        cfg = load_config(None, overrides=dict([override]))
    except ConfigError as exc:
        assert exc.path == "<root>" or exc.path.split(".")[0] in _SECTIONS, str(exc)
        assert "\n" not in str(exc).strip() or "invalid YAML" in str(exc)
    else:
        assert isinstance(cfg, RunConfig)


_SECTIONS = {f.name for f in dataclasses.fields(RunConfig)}

_NUMERIC_RANGES = [
    ("train.steps", 0),
    ("train.batch_size", -3),
    ("train.grad_clip", 0.0),
    ("train.beta", -1.0),
    ("train.max_nonfinite_steps", -1),
    ("train.actor.lr", 0.0),
    ("anchors.n0", 0),
    ("anchors.min_visits", 0),
    ("policy.temperature", 0.0),
    ("policy.lora.r", 0),
    ("policy.lora.dropout", 1.0),
    ("sim.n_train_per_family", 0),
    ("skills.alpha", 1.0),
    ("skills.reeval_every", 0),
    ("executor.timeout_s", -1.0),
    ("executor.retries", -1),
]


@pytest.mark.parametrize(("key", "value"), _NUMERIC_RANGES)
def test_an_out_of_range_value_names_its_key(key, value):
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides={key: value})
    assert info.value.path == key, str(info.value)


def test_a_config_file_that_is_not_utf8_names_the_file_and_line(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_bytes(b"name: t\nstore:\n  root: caf\xe9\n")
    with pytest.raises(ConfigError, match=rf"^{path}:3: .*not UTF-8 text \(byte 0xe9\)"):
        load_config(path)


@PROPERTY
@given(st.data())
def test_a_mutated_config_file_loads_or_is_one_config_error(data):
    """Replace one value of the preset's YAML by arbitrary text: a config or a ConfigError
    naming the file."""
    lines = Path(PRESET).read_text().splitlines()
    valued = [
        i for i, line in enumerate(lines) if ":" in line and not line.lstrip().startswith("#")
    ]
    i = data.draw(st.sampled_from(valued))
    head = lines[i].split(":")[0]
    lines[i] = f"{head}: {data.draw(st.text(max_size=20))}"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mutated.yaml"
        path.write_text("\n".join(lines), encoding="utf-8", errors="surrogatepass")
        try:
            load_config(path)
        except ConfigError as exc:
            assert str(exc).startswith(str(path)), str(exc)


# --------------------------------------------------------------------------- benchmark rows

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
FIXTURES = sorted(set(CONVERTERS) - {"humaneval"})


def _rows(name: str) -> list[dict]:
    text = (DATA / f"{name}.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="evosteer-props-") as tmp:
        yield Path(tmp)


def _load(name: str, path: Path) -> None:
    """Load ``path``; any failure must be a BenchmarkDataError that starts with the file."""
    try:
        load_benchmark(name, path)
    except InputError as exc:
        assert isinstance(exc, BenchmarkDataError), repr(exc)
        raise


@st.composite
def _mutated_row(draw) -> tuple[str, dict, str]:
    """(benchmark, a fixture row with one field set to any JSON value or removed, field)."""
    name = draw(st.sampled_from(FIXTURES))
    rows = _rows(name)
    row = dict(draw(st.sampled_from(rows[1:] or rows)))
    field = draw(st.sampled_from(sorted(row)))
    if draw(st.booleans()):
        row[field] = draw(JSON)
    else:
        del row[field]
    return name, row, field


@PROPERTY
@given(_mutated_row())
def test_a_row_with_a_bad_field_fails_naming_file_line_and_field(workdir, case):
    name, row, field = case
    path = workdir / f"{name}.jsonl"
    first = _rows(name)[0]
    path.write_text(json.dumps(first) + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    try:
        _load(name, path)
    except BenchmarkDataError as exc:
        text = str(exc)
        assert text.startswith(f"{path}:2: {name}: "), text
        assert "field '" in text or "duplicate record id" in text, text


@PROPERTY
@given(st.sampled_from(FIXTURES), st.binary(max_size=40).filter(lambda b: b"\n" not in b))
def test_a_line_of_arbitrary_bytes_fails_naming_file_and_line(workdir, name, junk):
    path = workdir / f"{name}-bytes.jsonl"
    path.write_bytes((DATA / f"{name}.jsonl").read_bytes().splitlines()[0] + b"\n" + junk + b"\n")
    try:
        _load(name, path)
    except BenchmarkDataError as exc:
        assert str(exc).startswith(f"{path}:2: "), str(exc)


@PROPERTY
@given(st.sampled_from(FIXTURES), st.data())
def test_a_damaged_gzip_file_fails_naming_the_file(workdir, name, data):
    """A gzip stream cut short or with a flipped byte: loads (the byte was in a header field)
    or one BenchmarkDataError naming the file and the line being read."""
    blob = bytearray(gzip.compress((DATA / f"{name}.jsonl").read_bytes(), mtime=0))
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    else:
        blob[data.draw(st.integers(0, len(blob) - 1))] ^= data.draw(st.integers(1, 255))
    path = workdir / f"{name}-damaged.jsonl.gz"
    path.write_bytes(bytes(blob))
    try:
        _load(name, path)
    except BenchmarkDataError as exc:
        assert str(exc).startswith(f"{path}:"), str(exc)


@pytest.mark.parametrize(
    ("name", "field", "value"),
    [
        ("aime", "answer", "²"),  # str.isdigit() is true, yet int() refuses it
        ("aime", "answer", "--5"),
        ("aime", "answer", "٣"),  # not an ASCII digit string
        ("textworld", "rooms", 10**30),
    ],
)
def test_an_odd_field_value_names_its_line_and_field(workdir, name, field, value):
    row = {**_rows(name)[0], field: value}
    path = workdir / f"{name}-found.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match=rf"^{path}:1: {name}: field '{field}': "):
        load_benchmark(name, path)


@pytest.mark.parametrize(
    ("key", "value"),
    [("train.beta", 10**400), ("budget.wall_time_s", float("nan")), ("train.grad_clip", 1e999)],
)
def test_a_float_key_refuses_huge_and_non_finite_numbers(key, value):
    with pytest.raises(ConfigError, match=rf"^{PRESET}: {key}: expected a (finite )?float"):
        load_config(None, overrides={key: value})


def test_a_deeply_nested_set_value_is_a_config_error():
    with pytest.raises(ConfigError, match="nested too deeply"):
        parse_override("train.steps=" + "[" * 5000)


def test_an_integer_too_long_for_json_names_file_and_line(workdir):
    path = workdir / "long-int.jsonl"
    path.write_text('{"question": "q", "answer": ' + "7" * 5000 + "}\n", encoding="utf-8")
    with pytest.raises(BenchmarkDataError, match=rf"^{path}:1: not valid JSON \(Exceeds"):
        load_benchmark("hotpotqa", path)


def test_an_override_value_is_not_edited_by_a_later_override():
    retriever = {"kind": "bm25", "corpus": "c.jsonl"}
    overrides = {**BASE, "executor.retriever": retriever, "executor.retriever.id_field": "k"}
    assert load_config(None, overrides=overrides).executor.retriever.id_field == "k"
    assert retriever == {"kind": "bm25", "corpus": "c.jsonl"}


def test_a_record_only_the_table_schema_refuses_names_its_line(workdir, monkeypatch):
    """A converter's record that breaks a table rule (a blank gold answer) names its line."""
    from evosteer_core.benchmarks import loaders

    convert = loaders.CONVERTERS["hotpotqa"]

    def blank_answer_on_line_2(row):
        record = convert(row)
        return dataclasses.replace(record, answers=(" ",)) if row.line == 2 else record

    monkeypatch.setitem(loaders.CONVERTERS, "hotpotqa", blank_answer_on_line_2)
    path = DATA / "hotpotqa.jsonl"
    with pytest.raises(BenchmarkDataError, match=rf"^{path}:2: hotpotqa: task table failed"):
        load_benchmark("hotpotqa", path)
