"""SIMULATED executor and task suite: a seeded stand-in for LLM agents (docs/sim.md).

Everything in this package is simulated. It exists so that the whole training loop learns
visibly and replays bit-identically on a CPU; results obtained with it are labelled "sim".
"""

from evosteer_core.sim.environment import SimEnvironment
from evosteer_core.sim.executor import SimExecutor
from evosteer_core.sim.model import DEFAULT_MODEL, FamilyModel, SimModel
from evosteer_core.sim.skills import LATENT_SKILLS, SKILL_EFFECTS, skill_effect
from evosteer_core.sim.suite import SIM_SOURCE, make_sim_record, make_sim_suite

__all__ = [
    "DEFAULT_MODEL",
    "LATENT_SKILLS",
    "SIM_SOURCE",
    "SKILL_EFFECTS",
    "FamilyModel",
    "SimEnvironment",
    "SimExecutor",
    "SimModel",
    "make_sim_record",
    "make_sim_suite",
    "skill_effect",
]
