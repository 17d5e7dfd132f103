"""Training objectives behind one interface (``Objective``), built by name from a registry."""

from evosteer_core.objectives.anchortb import (
    AnchorTB,
    action_coefficients,
    implemented_flows,
    trajectory_losses,
)
from evosteer_core.objectives.base import (
    Objective,
    ObjectiveOutput,
    TrajectoryBatch,
    build_objective,
    objective_names,
    register_objective,
)

__all__ = [
    "AnchorTB",
    "Objective",
    "ObjectiveOutput",
    "TrajectoryBatch",
    "action_coefficients",
    "build_objective",
    "implemented_flows",
    "objective_names",
    "register_objective",
    "trajectory_losses",
]
