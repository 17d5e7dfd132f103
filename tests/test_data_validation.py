"""Bad benchmark data fails at the train entry point, before a run is opened or a step runs,
in one line naming file, line and field (docs/reliability.md)."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
from pipeline_support import count_stage_calls, isolate_flyte_cache, small_config

from evosteer_core.benchmarks import BenchmarkDataError
from evosteer_core.infra.configio import ConfigError, InputError
from evosteer_core.pipeline import stage_io as core
from evosteer_flyte.workflows.train import train

DATA = Path(__file__).parent / "data" / "benchmarks"
GOOD = DATA / "hotpotqa.jsonl"


def _not_utf8(tmp: Path) -> Path:
    path = tmp / "latin1.jsonl"
    path.write_bytes(GOOD.read_bytes().splitlines()[0] + b'\n{"question": "caf\xe9?"}\n')
    return path


def _corrupt_gz(tmp: Path) -> Path:
    path = tmp / "cut.jsonl.gz"
    blob = gzip.compress(GOOD.read_bytes(), mtime=0)
    path.write_bytes(blob[: len(blob) // 2])
    return path


def _bad_field(tmp: Path) -> Path:
    return DATA / "bad" / "hotpotqa_empty_question.jsonl"


def _missing(tmp: Path) -> Path:
    return tmp / "nowhere.jsonl"


CASES = {
    "not-utf8": (_not_utf8, r":2: not UTF-8 text \(byte 0xe9 at column 18\)"),
    "corrupt-gz": (_corrupt_gz, r":1: corrupt or truncated gzip data"),
    "bad-field": (_bad_field, r":1: hotpotqa: field 'question': expected a non-empty string"),
    "missing": (_missing, r": benchmark file not found"),
}


@pytest.fixture
def flyte(monkeypatch, tmp_path):
    """An isolated flytekit cache and counters of init_state and of every core stage."""
    isolate_flyte_cache(monkeypatch, tmp_path / "home")
    calls = count_stage_calls(monkeypatch)
    real_init = core.init_state

    def init_state(cfg):
        calls[("init_state", 0)] += 1
        return real_init(cfg)

    monkeypatch.setattr(core, "init_state", init_state)
    return calls


def _config(tmp_path: Path, train_path: Path, split: str = "train", **slice_keys: object):
    good = [{"name": "hotpotqa", "path": str(GOOD), "limit": 2}]
    bad = [{"name": "hotpotqa", "path": str(train_path), **slice_keys}]
    slices = (
        {"train": bad, "heldout": good} if split == "train" else {"train": good, "heldout": bad}
    )
    return small_config(
        tmp_path / "run",
        **{"data.source": "benchmarks", **{f"data.{k}": v for k, v in slices.items()}},
    )


def _run(cfg) -> InputError:
    with pytest.raises(InputError) as info:
        train(config_yaml=cfg.to_yaml(), steps=1)
    return info.value


def _message(err: InputError) -> str:
    """The error's own line (flytekit's local execution puts a line naming the workflow
    before it)."""
    *prefix, line = str(err).split("\n")
    assert all(p.startswith("Error encountered while executing") for p in prefix), prefix
    return line.strip()


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_bad_benchmark_data_fails_before_the_first_step(flyte, tmp_path, case, split):
    make, message = CASES[case]
    path = make(tmp_path)
    err = _run(_config(tmp_path, path, split))
    assert isinstance(err, BenchmarkDataError)
    text = _message(err)
    assert text.startswith(str(path)), text
    assert re.search(message, text), text
    assert not flyte, f"ran before the data check: {dict(flyte)}"
    assert not (tmp_path / "run" / "mlflow.db").exists()  # no MLflow run was opened


def test_a_slice_past_the_end_of_its_file_names_the_slice_key(flyte, tmp_path):
    err = _run(_config(tmp_path, GOOD, offset=50))
    assert isinstance(err, ConfigError)
    assert _message(err) == (f"<config>: data.train[0].offset: 50 selects no rows: {GOOD} holds 2")
    assert not flyte


def test_an_unknown_benchmark_names_the_slice_key(flyte, tmp_path):
    cfg = small_config(
        tmp_path / "run",
        **{"data.source": "benchmarks", "data.train": [{"name": "squad", "path": str(GOOD)}]},
    )
    err = _run(cfg)
    assert isinstance(err, ConfigError)
    assert _message(err).startswith("<config>: data.train[0].name: unknown benchmark 'squad'")
    assert not flyte


def test_evosteer_train_prints_one_line_naming_file_and_line(flyte, tmp_path, capsys):
    from evosteer_flyte.cli import main

    path = _not_utf8(tmp_path)
    config = tmp_path / "bad-data.yaml"
    config.write_text(_config(tmp_path, path).to_yaml(), encoding="utf-8")
    assert main(["train", "--config", str(config), "--steps", "1"]) != 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("evosteer train: "), last
    assert f"{path}:2: not UTF-8 text (byte 0xe9 at column 18)" in last, last
    assert not flyte
