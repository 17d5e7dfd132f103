"""The SIMULATED interactive environment (alfworld-like household game) of the sim suite.

The game is won by issuing the record's ``subgoals`` in order within ``max_steps`` commands.
A matching command completes the current subgoal (except for a seeded "slip", e.g. a stuck
drawer); a ``put``/``drop`` of the object elsewhere after it was taken undoes the last
completed subgoal; other known commands do nothing; anything else is rejected (``ok=False``).
"""

from __future__ import annotations

from evosteer_core.episode.records import TaskRecord
from evosteer_core.executors.base import EnvStep
from evosteer_core.infra.seeding import derive_seed

_UNIT = float(2**63)


class SimEnvironment:
    """One episode's game state, shared by every node of the episode."""

    def __init__(self, task: TaskRecord, seed_key: tuple[int, str], slip: float) -> None:
        meta = task.meta
        try:
            self.subgoals: tuple[str, ...] = tuple(meta["subgoals"])
            self.receptacles: tuple[str, ...] = tuple(meta["receptacles"])
            self.obj: str = str(meta["object"])
            self.max_steps: int = int(meta["max_steps"])
        except KeyError as exc:
            raise ValueError(
                f"record {task.record_id!r}: interactive sim task lacks meta field {exc}"
            ) from exc
        if not self.subgoals:
            raise ValueError(f"record {task.record_id!r}: meta.subgoals is empty")
        takes = [i for i, g in enumerate(self.subgoals) if g.startswith("take ")]
        self.carry_phase = takes[0] + 1 if takes else len(self.subgoals)
        """Phases from which the object is carried (a misplaced put undoes progress)."""
        self.seed_key = seed_key
        self.record_id = task.record_id
        self.slip = slip
        self.phase = 0
        self.steps_done = 0
        self.done = False
        self.success = False
        self.last_observation = f"You are in the middle of a room. {task.prompt.split('] ', 1)[-1]}"

    def observe(self) -> str:
        return self.last_observation

    def phase_fraction(self) -> float:
        """Completed subgoals / all subgoals."""
        return self.phase / len(self.subgoals)

    def next_command(self) -> str:
        """The command that would complete the current subgoal (the simulated agent's target)."""
        return self.subgoals[min(self.phase, len(self.subgoals) - 1)]

    def step(self, command: str) -> EnvStep:
        if self.done:
            return EnvStep("The episode is over.", ok=False, done=True, success=self.success)
        self.steps_done += 1
        cmd = " ".join(command.lower().split())
        ok = True
        if cmd == self.subgoals[self.phase]:
            slip = (
                derive_seed(*self.seed_key, self.record_id, "env-slip", self.steps_done) / _UNIT
                < self.slip
            )
            if slip:
                obs = "Nothing happens; it seems stuck."
            else:
                self.phase += 1
                obs = f"You {cmd.split()[0]} successfully."
        elif (
            self.phase >= self.carry_phase and cmd.startswith(("put ", "drop ")) and self.obj in cmd
        ):
            self.phase -= 1
            obs = f"You put down the {self.obj}. You are no longer carrying it."
        elif cmd in ("look", "inventory") or (
            cmd.startswith("go to ") and cmd[6:] in self.receptacles
        ):
            obs = "You arrive there. You see nothing useful." if cmd != "look" else "You look."
        else:
            ok = False
            obs = "Nothing happens."
        if self.phase == len(self.subgoals):
            self.done = self.success = True
            obs += " You won!"
        elif self.steps_done >= self.max_steps:
            self.done = True
            obs += " You ran out of steps."
        self.last_observation = obs
        return EnvStep(obs, ok=ok, done=self.done, success=self.success)
