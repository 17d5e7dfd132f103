"""Shared setup of the diagnostic scripts: the common options and an untrained session on the
SIMULATED suite with skills off (tilt_ceiling, capacity_probe), and a stored run's checkpoint
(admission_gain, gradient_noise, checkpoint_tilt)."""

from __future__ import annotations

import argparse

import torch

from evosteer_core.infra.artifacts import RunIndex, open_store
from evosteer_core.infra.config import RunConfig, config_from_dict, load_config
from evosteer_core.infra.configio import parse_override
from evosteer_core.infra.runs import run_config
from evosteer_core.pipeline.stage_io import StepStore
from evosteer_core.training.session import Session, init_state, open_session
from evosteer_core.training.state import TrainState
from evosteer_core.training.warm_start import stage_warm_start


def add_session_options(p: argparse.ArgumentParser) -> None:
    """--config, --heldout, --threads and --set."""
    p.add_argument("--config", default=None, help="run config (default: embedded tiny-sim)")
    p.add_argument("--heldout", type=int, default=16, help="held-out tasks per family")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--set", nargs="*", default=[], help="extra config overrides KEY=VALUE")


def untrained_session(args: argparse.Namespace) -> Session:
    """A fresh session (θ == ρ) from the options of :func:`add_session_options`; with
    ``policy.init`` its ρ is the warm-started reference."""
    torch.set_num_threads(args.threads)
    cfg = load_config(
        args.config,
        overrides={
            "skills.enabled": False,
            "sim.n_heldout_per_family": args.heldout,
            **dict(parse_override(kv) for kv in args.set),
        },
    )
    cfg = stage_warm_start(cfg)  # policy.init: fit (or find) the warm-started reference
    return open_session(cfg, init_state(cfg))


def stored_checkpoint(
    store_root: str, run: str, step: int | None = None, overrides: dict | None = None
) -> tuple[RunConfig, TrainState, int]:
    """A stored run's recorded config (with ``overrides``), its checkpoint at ``step`` (default:
    the last step it holds) and that step; a run or step the store lacks raises
    :class:`~evosteer_core.infra.artifacts.MissingArtifactError`."""
    store = open_store(store_root)
    cfg = config_from_dict(run_config(store, run).to_dict(), f"{run}/config.yaml", overrides)
    index = RunIndex(store, run)
    at = max(index.steps()) if step is None else step
    return cfg, StepStore(store).get_state(index.lookup(at, "state")), at
