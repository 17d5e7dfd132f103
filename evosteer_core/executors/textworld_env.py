"""TextWorld as the real interactive environment of the ``openai`` executor (offline).

``executor.environment: textworld`` makes :class:`TextWorldFactory` the executor's
environment factory. Each ``textworld`` record (``benchmarks.textworld_suite``) names a game
by its :class:`GameSpec`; the game is generated with TextWorld's own generator (what
``tw-make custom`` runs) and compiled by its bundled Inform 7 on first use, into
``$EVOSTEER_CACHE/textworld/<textworld version>/<spec>/``, and reused afterwards: the same
record and TextWorld version give the same game. Step semantics are in docs/executors.md.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

from evosteer_core.benchmarks.textworld_suite import TEXTWORLD_MAX_STEPS, GameSpec
from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import EnvStep
from evosteer_core.infra.model_cache import cache_root, is_complete, publish_folder

GAME_FILE = "game.z8"
_MARK = "evosteer_game_spec.json"
_BLANK_LINES = re.compile(r"\n\s*\n(\s*\n)+")
_PROMPT = re.compile(r"^>.*", re.MULTILINE | re.DOTALL)  # the input prompt and status line
_RESTART = re.compile(r"^Would you like to RESTART.*$", re.MULTILINE)


def _textworld() -> Any:
    """The ``textworld`` package (imported on first use: it takes seconds to import)."""
    try:
        import textworld
        import textworld.generator
    except ImportError as exc:
        raise RuntimeError(
            "executor.environment 'textworld' needs the textworld package "
            f"(pip install textworld): {exc}"
        ) from exc
    return textworld


def game_file(spec: GameSpec, cache_dir: Path) -> Path:
    """The compiled game of ``spec`` under ``cache_dir``, generated on the first call."""
    tw = _textworld()
    target = Path(cache_dir) / "textworld" / tw.__version__ / spec.key()
    if not is_complete(target, _MARK):
        publish_folder(target, _MARK, json.dumps(asdict(spec)), lambda tmp: _generate(spec, tmp))
    return target / GAME_FILE


def _generate(spec: GameSpec, folder: Path) -> None:
    """Generate and compile the game of ``spec`` into ``folder`` (game.z8, .json, .ni)."""
    tw = _textworld()
    options = tw.GameOptions()
    options.seeds = spec.seed
    options.nb_rooms = spec.rooms
    options.nb_objects = spec.objects
    options.quest_length = spec.quest_length
    options.path = str(folder / GAME_FILE)
    options.force_recompile = True
    try:
        game = tw.generator.make_game(options)
        tw.generator.compile_game(game, options)
    except Exception as exc:  # the generator raises its own (undocumented) error classes
        raise RuntimeError(
            f"TextWorld could not generate game {spec.key()}: {type(exc).__name__}: {exc}"
        ) from exc


def _clean(text: str) -> str:
    """Game text without the interpreter's prompt, status line and restart question."""
    text = _RESTART.sub("", _PROMPT.sub("", text))
    return _BLANK_LINES.sub("\n\n", text).strip()


class TextWorldEnvironment:
    """One episode in one compiled TextWorld game, shared by every node of the episode.

    Every command counts as a step. ``ok`` is True when the game took the command as an
    action (its move counter advanced), False when its parser refused it ("That's not a verb
    I recognise.", "You can't see any such thing."). The episode is done when the game is won
    or lost or after ``max_steps`` commands; ``success`` is the game's own ``won`` flag.
    """

    def __init__(self, path: Path, max_steps: int = TEXTWORLD_MAX_STEPS) -> None:
        tw = _textworld()
        infos = tw.EnvInfos(
            objective=True, description=True, moves=True, won=True, lost=True, policy_commands=True
        )
        with warnings.catch_warnings():
            # jericho's "not fully supported" warning: TextWorld tracks the state itself
            warnings.filterwarnings("ignore", message=r"Game .* is not fully supported")
            self._env = tw.start(str(path), request_infos=infos)
        state = self._env.reset()
        self.objective: str = _clean(state["objective"])
        self._moves: int = state["moves"]
        self._plan_length = max(1, len(state["policy_commands"]))
        self._remaining = len(state["policy_commands"])
        self.max_steps = max_steps
        self.steps_done = 0
        self.done = False
        self.success = False
        self.last_observation = _clean(state["description"])

    def observe(self) -> str:
        """The objective (the task text does not hold it) and the latest observation."""
        return f"Objective: {self.objective}\n\n{self.last_observation}"

    def phase_fraction(self) -> float:
        """Progress along the quest: the share of the game's own shortest winning command
        sequence from the start that is no longer needed (1 once won, 0 if none is done)."""
        return min(1.0, max(0.0, 1.0 - self._remaining / self._plan_length))

    def step(self, command: str) -> EnvStep:
        if self.done:
            return EnvStep("The episode is over.", ok=False, done=True, success=self.success)
        self.steps_done += 1
        state, _score, _done = self._env.step(" ".join(command.split()))
        ok = state["moves"] > self._moves
        self._moves = state["moves"]
        self._remaining = len(state["policy_commands"] or ())
        obs = _clean(state.feedback)
        if state["won"]:
            self.done = self.success = True
            obs += "\nYou won!"
        elif state["lost"]:
            self.done = True
            obs += "\nYou lost the game."
        elif self.steps_done >= self.max_steps:
            self.done = True
            obs += "\nYou ran out of steps."
        self.last_observation = obs
        return EnvStep(obs, ok=ok, done=self.done, success=self.success)


class TextWorldFactory:
    """The environment factory for ``textworld`` records (``executor.environment``)."""

    name = "textworld"

    def __init__(self, cache_dir: Path | None = None) -> None:
        _textworld()  # a missing package fails when the executor is built, not mid-rollout
        self.cache_dir = Path(cache_dir) if cache_dir is not None else cache_root()

    def check(self, task: TaskRecord) -> None:
        """Raise ValueError (naming the record) unless ``task`` is a valid TextWorld game."""
        GameSpec.of(task)

    def __call__(self, task: TaskRecord, seed_key: tuple[int, str]) -> TextWorldEnvironment:
        """A fresh episode of the record's game (the game does not depend on ``seed_key``)."""
        path = game_file(GameSpec.of(task), self.cache_dir)
        return TextWorldEnvironment(path, int(task.meta.get("max_steps", TEXTWORLD_MAX_STEPS)))
