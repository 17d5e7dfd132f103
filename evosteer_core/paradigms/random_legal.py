"""Random legal graph (docs/paradigms.md, "random"): uniformly random legal actions until
STOP, the action cap or the budget ends the episode. A floor for the others, not one of the
paper's four paradigms; its draws are keyed by the episode's seeds, so it is reproducible."""

from __future__ import annotations

import random
from dataclasses import dataclass

from evosteer_core.episode.runtime import Episode
from evosteer_core.infra.seeding import derive_seed


@dataclass(frozen=True)
class RandomParadigm:
    name: str = "random"

    def run(self, ep: Episode) -> None:
        rng = random.Random(derive_seed(ep.run_seed, ep.episode_key, "random-paradigm"))
        while not ep.stopped:
            legal = ep.legal_actions()
            ep.apply(legal[rng.randrange(len(legal))])


RANDOM = RandomParadigm()
