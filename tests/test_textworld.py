"""TextWorld as the interactive environment: records, seeded generation, the cache, steps.

Games are generated for real (TextWorld's generator and its bundled Inform 7 compiler, about
2 s a game) into a temporary cache; winning uses the walkthrough that TextWorld stores with
each game, so success comes from the game's own state.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest
import textworld

from evosteer_core.benchmarks import load_benchmark
from evosteer_core.benchmarks.rewards import evaluate
from evosteer_core.benchmarks.textworld_suite import SUITE_LEVELS, SUITE_SIZE, GameSpec
from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import Environment
from evosteer_core.executors.textworld_env import TextWorldFactory, game_file

FIXTURE = Path(__file__).parent / "data" / "benchmarks" / "textworld.jsonl"


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> TextWorldFactory:
    return TextWorldFactory(tmp_path_factory.mktemp("textworld-cache"))


@pytest.fixture(scope="module")
def record() -> TaskRecord:
    return load_benchmark("textworld", FIXTURE)[0]


def walkthrough(factory: TextWorldFactory, record: TaskRecord) -> list[str]:
    """The winning commands TextWorld stored with the generated game."""
    path = game_file(GameSpec.of(record), factory.cache_dir)
    return list(textworld.Game.load(str(path.with_suffix(".json"))).walkthrough)


def with_max_steps(record: TaskRecord, max_steps: int) -> TaskRecord:
    return dataclasses.replace(record, meta={**record.meta, "max_steps": max_steps})


def test_the_walkthrough_wins_and_the_reward_is_the_games_success(factory, record):
    env = factory(record, (0, "ep"))
    assert isinstance(env, Environment)
    commands = walkthrough(factory, record)
    assert len(commands) >= 2
    assert evaluate(record, None, env) == 0.0
    for i, command in enumerate(commands):
        assert env.phase_fraction() == pytest.approx(i / len(commands))
        step = env.step(command)
        assert step.ok, (command, step.observation)
        assert step.done == step.success == (i == len(commands) - 1)
        assert ">" not in step.observation.splitlines()[0]
    assert "You won!" in env.observe()
    assert (env.done, env.success, env.steps_done, env.phase_fraction()) == (
        True,
        True,
        len(commands),
        1.0,
    )
    assert evaluate(record, "any text", env) == 1.0
    after = env.step("look")
    assert (after.ok, after.done, env.steps_done) == (False, True, len(commands))


def test_the_opening_observation_states_the_objective_and_the_room(factory, record):
    env = factory(record, (0, "ep"))
    text = env.observe()
    assert text.startswith("Objective: ") and "-= " in text
    assert not any(line.startswith(">") for line in text.splitlines())


def test_a_refused_command_costs_a_step_and_changes_nothing(factory, record):
    env = factory(record, (0, "ep"))
    first = walkthrough(factory, record)[0]
    for bad in ("xyzzy", "take the unicorn", ""):
        step = env.step(bad)
        assert not step.ok and not step.done, (bad, step.observation)
    assert env.steps_done == 3 and env.phase_fraction() == 0.0
    assert "not a verb" in env.step("dance around\nwildly").observation
    assert env.step(f"  {first.upper()}  ").ok  # the game's parser ignores case and spacing
    assert env.steps_done == 5 and env.phase_fraction() > 0
    assert evaluate(record, None, env) == 0.0


def test_the_step_limit_ends_the_episode_unwon(factory, record):
    limited = with_max_steps(record, 1)
    env = factory(limited, (0, "ep"))
    first, second, *_ = walkthrough(factory, record)
    last = env.step(first)
    assert (last.ok, last.done, last.success) == (True, True, False)
    assert "ran out of steps" in last.observation
    assert env.step(second).observation == "The episode is over."
    assert env.steps_done == 1 and evaluate(limited, None, env) == 0.0


def test_the_same_record_gives_the_same_game_generated_once(factory, record, tmp_path):
    spec = GameSpec.of(record)
    cached = game_file(spec, factory.cache_dir)
    stamp = cached.stat().st_mtime_ns
    start = time.monotonic()
    assert game_file(spec, factory.cache_dir) == cached
    assert time.monotonic() - start < 1.0 and cached.stat().st_mtime_ns == stamp
    elsewhere = game_file(spec, tmp_path)  # generated afresh in another cache
    assert elsewhere != cached
    game = json.loads(cached.with_suffix(".json").read_text())
    assert json.loads(elsewhere.with_suffix(".json").read_text()) == game
    other = game_file(dataclasses.replace(spec, seed=spec.seed + 1), tmp_path)
    assert json.loads(other.with_suffix(".json").read_text()) != game


def test_the_factory_refuses_records_that_are_not_textworld_games(factory, record):
    alfworld = TaskRecord(
        "alfworld/t1", "alfworld", "alfworld", "Your task is to: x", "interactive"
    )
    with pytest.raises(ValueError, match="'alfworld/t1' .alfworld. is not a TextWorld game"):
        factory.check(alfworld)
    meta = {k: v for k, v in record.meta.items() if k != "seed"}
    with pytest.raises(ValueError, match="meta lacks the game field 'seed'"):
        factory(dataclasses.replace(record, meta=meta), (0, "ep"))
    with pytest.raises(ValueError, match=r"meta\.rooms: expected an integer in \[1, 50\]"):
        factory.check(dataclasses.replace(record, meta={**record.meta, "rooms": 0}))


def test_the_built_in_suite_and_a_spec_file_give_textworld_records():
    suite = load_benchmark("textworld")
    assert len(suite) == SUITE_SIZE and suite == load_benchmark("textworld")
    assert len({r.record_id for r in suite}) == SUITE_SIZE
    assert len({r.meta["seed"] for r in suite}) == SUITE_SIZE
    assert {(r.family, r.metric, r.meta["harness"]) for r in suite} == {
        ("alfworld", "interactive", "textworld")
    }
    sizes = [(r.meta["rooms"], r.meta["objects"], r.meta["quest_length"]) for r in suite[:6]]
    assert sizes == list(SUITE_LEVELS) * 2
    assert load_benchmark("textworld", limit=4) == suite[:4]
    first, second = load_benchmark("textworld", FIXTURE)
    assert first.record_id == "textworld/house-a" and first.meta["max_steps"] == 50
    assert GameSpec.of(second) == GameSpec(seed=8, rooms=4, objects=8, quest_length=4)
    assert second.meta["max_steps"] == 30 and "30 commands" in second.prompt


def test_a_missing_textworld_package_fails_when_the_factory_is_built(monkeypatch):
    monkeypatch.setitem(sys.modules, "textworld", None)  # makes `import textworld` fail
    with pytest.raises(RuntimeError, match="^executor.environment 'textworld' needs the textw"):
        TextWorldFactory()
