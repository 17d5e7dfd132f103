"""Training objectives behind one interface (``Objective``), built by name from a registry."""

from evosteer_core.objectives.anchortb import (
    AnchorTB,
    action_coefficients,
    implemented_flows,
    trajectory_losses,
)
from evosteer_core.objectives.base import (
    GradientSource,
    Objective,
    ObjectiveOutput,
    ScoredTrajectory,
    TrajectoryBatch,
    build_objective,
    collate,
    objective_from_config,
    objective_names,
    register_objective,
)
from evosteer_core.objectives.ctb import CollaborativeTB
from evosteer_core.objectives.grpo import GRPO
from evosteer_core.objectives.ppo import PPO
from evosteer_core.objectives.tb import TrajectoryBalance
from evosteer_core.objectives.tempered_tb import TemperedTB

__all__ = [
    "GRPO",
    "PPO",
    "AnchorTB",
    "CollaborativeTB",
    "GradientSource",
    "Objective",
    "ObjectiveOutput",
    "ScoredTrajectory",
    "TemperedTB",
    "TrajectoryBalance",
    "TrajectoryBatch",
    "action_coefficients",
    "build_objective",
    "collate",
    "implemented_flows",
    "objective_from_config",
    "objective_names",
    "register_objective",
    "trajectory_losses",
]
