"""Typed config loading: every shipped config loads, errors name the key, paper = Table 3."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest
import yaml

from evosteer_core.episode.budget import BudgetLimits
from evosteer_core.infra.config import (
    RunConfig,
    config_from_dict,
    default_config,
    load_config,
)
from evosteer_core.infra.configio import ConfigError, build, flatten, parse_override
from evosteer_core.infra.runs import config_hash, run_id_for

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))


@dataclass(frozen=True)
class Inner:
    x: int = 0


@dataclass(frozen=True)
class Outer:
    mode: Literal["a", "b"]
    limit: int | None = None
    weights: dict[str, float] = field(default_factory=dict)
    items: list[Inner] = field(default_factory=list)


def write(tmp_path: Path, data: dict, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def minimal() -> dict:
    return {"name": "t", "store": {"root": "runs"}}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    assert len(config_hash(cfg)) == 64


def test_shipped_presets_exist() -> None:
    names = {p.name for p in CONFIGS}
    assert {"tiny-sim.yaml", "cpu-smollm2.yaml", "paper.yaml"} <= names


def test_default_is_the_packaged_tiny_sim_and_the_repo_copy_is_the_same_file() -> None:
    repo_copy = REPO / "configs" / "tiny-sim.yaml"
    packaged = REPO / "evosteer_core" / "data" / "tiny-sim.yaml"
    assert repo_copy.read_bytes() == packaged.read_bytes()
    cfg = default_config()
    assert cfg == load_config(repo_copy)
    assert cfg.executor.kind == "sim" and cfg.policy.backbone == "tiny"
    assert not cfg.store.root.startswith("s3://")


def test_paper_yaml_is_table_3() -> None:
    cfg = load_config(REPO / "configs" / "paper.yaml")
    t, a, s, p = cfg.train, cfg.anchors, cfg.skills, cfg.policy
    assert (t.steps, t.batch_size, t.rollouts_theta, t.rollouts_rho) == (240, 32, 2, 2)
    assert (t.beta, t.seed) == (2.0, 42)
    assert (t.actor.lr, t.actor.betas, t.actor.weight_decay) == (5e-6, (0.95, 0.999), 0.01)
    assert (t.heads.lr, t.heads.betas[0]) == (1e-3, 0.9)
    assert t.grad_clip == 1.0
    assert (t.value_fit_steps, t.value_window) == (50, 4)
    assert s.alpha == 0.05
    assert a.kappa == (2.0, 4.0, 0.5)
    assert (a.n0, a.c_max, a.min_visits, a.record_prior_cap) == (8, 0.25, 8, 20)
    # author from step 9, every step; re-evaluation every 10 steps
    assert (s.warmup_steps + 1, s.author_every, s.reeval_every) == (9, 1, 10)
    assert (p.temperature, cfg.executor.temperature) == (1.0, 0.3)
    assert (p.context_tokens, p.max_action_tokens) == (24_576, 256)
    assert p.backbone == "Qwen/Qwen3.5-9B"
    assert (p.lora.r, p.lora.alpha, p.lora.dropout) == (64, 128, 0.0)
    assert set(p.lora.target_modules) == {"q_proj", "k_proj", "v_proj", "o_proj"}
    assert cfg.executor.kind == "openai" and cfg.store.root.startswith("s3://")
    # docs/method.md §1.3 reference budgets
    assert cfg.budget == BudgetLimits()
    assert (cfg.budget.total_tokens, cfg.budget.tool_calls, cfg.budget.wall_time_s) == (
        98_304,
        50,
        600.0,
    )


def test_schema_defaults_are_the_reference_values() -> None:
    """A section left out means 'as in the paper': defaults equal paper.yaml's method values."""
    paper = load_config(REPO / "configs" / "paper.yaml")
    bare = config_from_dict(minimal())
    for section in ("train", "anchors", "budget"):
        assert getattr(bare, section) == getattr(paper, section), section
    assert bare.policy.lora == paper.policy.lora


def test_unknown_key_names_path_file_and_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, {**minimal(), "train": {"stpes": 3}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "train.stpes" in msg and "'steps'" in msg


def test_unknown_nested_key(tmp_path: Path) -> None:
    path = write(tmp_path, {**minimal(), "train": {"actor": {"learning_rate": 1e-3}}})
    with pytest.raises(ConfigError, match=r"train\.actor\.learning_rate: unknown key"):
        load_config(path)


@pytest.mark.parametrize(
    ("section", "value", "path", "expected"),
    [
        ({"train": {"steps": "ten"}}, None, "train.steps", "expected int, found str 'ten'"),
        ({"train": {"steps": 2.5}}, None, "train.steps", "expected int, found float 2.5"),
        ({"train": {"steps": True}}, None, "train.steps", "expected int, found bool True"),
        ({"skills": {"enabled": 1}}, None, "skills.enabled", "expected bool, found int 1"),
        ({"executor": {"kind": "vllm"}}, None, "executor.kind", "expected 'sim' | 'openai'"),
        ({"anchors": {"kappa": [2, 4]}}, None, "anchors.kappa", "3 items"),
        ({"anchors": {"kappa": [2, "x", 1]}}, None, "anchors.kappa[1]", "expected float"),
        (
            {"policy": {"lora": {"target_modules": "q_proj"}}},
            None,
            "policy.lora.target_modules",
            "tuple[str, ...]",
        ),
        ({"train": {"actor": 5}}, None, "train.actor", "expected a mapping (AdamWConfig)"),
    ],
)
def test_wrong_type_names_path_expected_and_found(
    tmp_path: Path, section: dict, value: None, path: str, expected: str
) -> None:
    file = write(tmp_path, {**minimal(), **section})
    with pytest.raises(ConfigError) as err:
        load_config(file)
    msg = str(err.value)
    assert f"{file}: {path}:" in msg
    assert expected in msg


def test_missing_required_value(tmp_path: Path) -> None:
    path = write(tmp_path, {"name": "t"})
    with pytest.raises(ConfigError, match=r"store: missing required value"):
        load_config(path)
    path = write(tmp_path, {"name": "t", "store": {"s3_endpoint": None}})
    with pytest.raises(ConfigError, match=r"store\.root: missing required value \(str\)"):
        load_config(path)


def test_cross_field_validation_names_section(tmp_path: Path) -> None:
    path = write(tmp_path, {**minimal(), "executor": {"kind": "openai", "model": "m"}})
    with pytest.raises(ConfigError, match=r"executor\.base_url: required when kind is 'openai'"):
        load_config(path)
    path = write(tmp_path, {**minimal(), "budget": {"tool_calls": -1}})
    with pytest.raises(ConfigError, match=r": budget: budget\.tool_calls must be >= 0"):
        load_config(path)


def test_exponent_floats_and_ints_for_floats(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("name: t\nstore: {root: r}\ntrain:\n  actor: {lr: 5e-6}\n  grad_clip: 2\n")
    cfg = load_config(path)
    assert cfg.train.actor.lr == 5e-6 and isinstance(cfg.train.grad_clip, float)


def test_invalid_yaml_names_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: <root>: invalid YAML"):
        load_config(path)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "absent.yaml")


def test_parse_yaml_reads_what_the_python_loader_reads() -> None:
    """Tasks parse the config with libyaml's parser: every shipped config, and the scalar forms
    YAML 1.1 is picky about, come out as PyYAML's pure-Python SafeLoader reads them (exponent
    floats aside, which both read as floats); a syntax error keeps the Python loader's context."""
    from evosteer_core.infra.configio import parse_yaml

    class Plain(yaml.SafeLoader):
        pass

    pattern = r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+)$"
    Plain.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(pattern), list("-+0123456789"))
    root = Path(__file__).resolve().parent.parent
    texts = [p.read_text() for p in sorted((root / "configs").glob("*.yaml"))]
    texts.append("a: 0x10\nb: 1_000\nc: yes\nd: 2026-12-01\ne: ~\nf: '1e3'\ng: [1, -2.5, +3]\n")
    assert len(texts) > 3
    for text in texts:
        assert parse_yaml(text, "t.yaml") == yaml.load(text, Loader=Plain)  # noqa: S506
    assert parse_yaml("lr: 5e-6\nx: 1E+3", "t") == {"lr": 5e-6, "x": 1000.0}
    with pytest.raises(ConfigError, match=r"(?s)invalid YAML: .*\^"):  # the caret's context
        parse_yaml("name: [unclosed\n", "bad.yaml")


def test_overrides_are_typed_and_validated() -> None:
    cfg = load_config(None, overrides={"train.steps": 3, "policy.lora.r": 4})
    assert cfg.train.steps == 3 and cfg.policy.lora.r == 4
    assert parse_override("train.actor.lr=1e-4") == ("train.actor.lr", 1e-4)
    assert parse_override("executor.base_url=null") == ("executor.base_url", None)
    with pytest.raises(ConfigError, match=r"train\.steps: expected int, found str 'x'"):
        load_config(None, overrides={"train.steps": "x"})
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("train.steps")


def test_round_trip_through_yaml_and_hash_semantics() -> None:
    cfg = default_config()
    again = config_from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg and config_hash(again) == config_hash(cfg)
    moved = load_config(None, overrides={"store.root": "/elsewhere", "name": "other"})
    assert config_hash(moved) == config_hash(cfg)  # operational sections excluded
    changed = load_config(None, overrides={"train.seed": 43})
    assert config_hash(changed) != config_hash(cfg)


def test_flatten_gives_dotted_params() -> None:
    flat = flatten(default_config().to_dict())
    assert flat["train.actor.lr"] == 1e-3
    assert flat["anchors.kappa"] == [2.0, 4.0, 0.5]
    assert flat["store.root"] == "runs"


def test_generic_loader_optional_dict_list_and_literal() -> None:
    out = build(Outer, {"mode": "b", "weights": {"u": 1}, "items": [{"x": 2}, {}]}, "f.yaml")
    assert out == Outer("b", None, {"u": 1.0}, [Inner(2), Inner(0)])
    with pytest.raises(ConfigError, match=r"f\.yaml: items\[1\]\.x: expected int"):
        build(Outer, {"mode": "a", "items": [{}, {"x": "no"}]}, "f.yaml")
    with pytest.raises(ConfigError, match=r"weights\.u: expected float"):
        build(Outer, {"mode": "a", "weights": {"u": "no"}}, "f.yaml")
    with pytest.raises(ConfigError, match=r"limit: expected int \| null"):
        build(Outer, {"mode": "a", "limit": "no"}, "f.yaml")


def test_a_retired_images_section_still_loads_and_is_ignored(tmp_path, caplog):
    """``images`` is retired (nothing read it): an old file with a value set loads with one
    warning naming the file and the section; a recorded config's all-null section loads
    silently; the config is the one without the section (same run id)."""
    plain = default_config()
    old = plain.to_dict()
    old["images"] = {"cpu": "ghcr.io/x/cpu:1", "train_gpu": None, "rollout_vllm": None}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    with caplog.at_level(logging.WARNING, logger="evosteer_core"):
        cfg = load_config(path)
    assert cfg == plain and run_id_for(cfg) == run_id_for(plain)
    (record,) = [r for r in caplog.records if "retired" in r.getMessage()]
    assert record.getMessage().startswith(f"{path}: images: ignored, the section is retired")
    caplog.clear()
    recorded = {**plain.to_dict(), "images": {"cpu": None, "train_gpu": None, "rollout_vllm": None}}
    with caplog.at_level(logging.WARNING, logger="evosteer_core"):
        assert config_from_dict(recorded) == plain
    assert not caplog.records
    assert "images" not in plain.to_dict()
