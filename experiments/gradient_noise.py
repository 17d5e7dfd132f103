"""How much of one training step's actor gradient is signal: the gradient noise scale.

Usage: python experiments/gradient_noise.py [--config CONFIG] [--store STORE --run RUN [--step N]]
       [--draws 8] [--threads 2] [--set KEY=VALUE ...]

Everything here is SIMULATED when the run is. One step's LoRA gradient G is a mean over the
step's trained trajectories, so it is the expected gradient μ plus the noise of which records
were drawn and how their episodes went. This script draws K independent steps at the *same*
parameters (a checkpoint's, or the warm-started reference's; the batches and rollout seeds of
steps N+1..N+K, each from a fresh session of the same state, clipping off) and estimates, from
G_1..G_K (each unbiased):

    noise  tr C  = Σ_k |G_k − Ḡ|² / (K − 1)      (the variance of one step's gradient)
    signal |μ|²  = |Ḡ|² − tr C / K

and reports SNR = |μ|² / tr C (one step's signal against its noise; ± a delete-one jackknife
standard error over the draws, conservative), the mean pairwise cosine of the draws, and
B_noise = B · tr C / |μ|², the batch (in trained trajectories) at which one step's signal
would equal its noise if the noise falls as 1/B (the "simple noise scale" of McCandlish et
al., 2018, An Empirical Model of Large-Batch Training). docs/table2_sim.md
("Why the adapter's tilt stays small") has the figures of the table2-sim runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: experiments.*

from evosteer_core.episode.world import World, build_world
from evosteer_core.infra.artifacts import MissingArtifactError
from evosteer_core.infra.config import RunConfig, load_config
from evosteer_core.infra.configio import parse_override
from evosteer_core.training.loop import train_step
from evosteer_core.training.session import init_state, open_session
from evosteer_core.training.state import TrainState
from evosteer_core.training.warm_start import stage_warm_start
from experiments.probe_session import stored_checkpoint

UNCLIPPED = 1e30  # train.grad_clip for the draws: the gradient as the objective computes it


@dataclass(frozen=True)
class NoiseScale:
    """The estimates of one set of draws (see the module docstring), with delete-one jackknife
    standard errors of the signal, the noise and the SNR (nan for K = 2): conservative, since
    the jackknife overstates a variance (Efron and Stein, 1981; by up to ~1.5× in standard
    error at the runs' low SNR and K = 8, tests/test_gradient_noise.py)."""

    draws: int
    signal: float  # |μ|², unbiased
    noise: float  # tr C, unbiased
    mean_cosine: float  # mean over pairs k < l of cos(G_k, G_l)
    signal_se: float
    noise_se: float
    snr_se: float

    @property
    def snr(self) -> float:
        return self.signal / self.noise if self.noise > 0 else float("inf")

    def batch_for_snr_one(self, batch: float) -> float:
        """B_noise: the batch at which one step's signal equals its noise (noise ∝ 1/B); inf
        when the estimated signal is not positive."""
        return batch * self.noise / self.signal if self.signal > 0 else float("inf")


def _moments(g: np.ndarray) -> tuple[float, float]:
    """(signal, noise) of the draws in the rows of ``g``."""
    k = g.shape[0]
    mean = g.mean(axis=0)
    noise = float(((g - mean) ** 2).sum() / (k - 1))
    return float(mean @ mean - noise / k), noise


def _jackknife_se(values: np.ndarray) -> float:
    """The delete-one jackknife standard error from the K leave-one-out estimates."""
    k = len(values)
    return float(np.sqrt((k - 1) / k * ((values - values.mean()) ** 2).sum()))


def noise_scale(grads: np.ndarray) -> NoiseScale:
    """The estimates from K ≥ 2 independent gradients, one per row of ``grads``."""
    g = np.asarray(grads, dtype=np.float64)
    k = g.shape[0]
    if g.ndim != 2 or k < 2:
        raise ValueError(f"need a (K ≥ 2, P) array of gradients, got shape {g.shape}")
    signal, noise = _moments(g)
    unit = g / np.linalg.norm(g, axis=1, keepdims=True)
    cos = unit @ unit.T
    signal_se = noise_se = snr_se = float("nan")
    if k > 2:
        loo = np.array([_moments(np.delete(g, i, axis=0)) for i in range(k)])
        signal_se = _jackknife_se(loo[:, 0])
        noise_se = _jackknife_se(loo[:, 1])
        snrs = np.divide(loo[:, 0], loo[:, 1], out=np.full(k, np.nan), where=loo[:, 1] > 0)
        snr_se = _jackknife_se(snrs)
    mean_cosine = float(cos[np.triu_indices(k, 1)].mean())
    return NoiseScale(k, signal, noise, mean_cosine, signal_se, noise_se, snr_se)


def step_gradient(
    cfg: RunConfig, state: TrainState, world: World, step: int
) -> tuple[np.ndarray, float]:
    """The unclipped LoRA gradient of step ``step`` taken from ``state`` and its number of
    trained trajectories (a fresh session, so every draw starts from the same state)."""
    s = open_session(cfg, state, world)
    _, metrics = train_step(s, state, step)
    grads = [p.grad.detach().double().flatten() for p in s.policy.trainable_parameters()]
    return torch.cat(grads).numpy(), float(metrics["n_trajectories"])


def lora_vector(cfg: RunConfig, state: TrainState, world: World) -> np.ndarray:
    """A state's LoRA parameters, flattened in the order of :func:`step_gradient`'s gradient."""
    params = open_session(cfg, state, world).policy.trainable_parameters()
    return torch.cat([p.detach().double().flatten() for p in params]).numpy()


@dataclass(frozen=True)
class Drift:
    """How the draws' gradients lie along the adapter's drift d = θ_at − θ_from: a positive
    cosine means descent points back toward θ_from."""

    norm: float  # |d|
    rms: float  # |d| / √P, per parameter
    cosine: float  # cos(Ḡ, d)
    per_draw: float  # mean over draws of cos(G_k, d)
    per_draw_se: float


def drift_cosines(grads: np.ndarray, drift: np.ndarray) -> Drift:
    """:class:`Drift` of the draws in the rows of ``grads`` along ``drift``."""
    g = np.asarray(grads, dtype=np.float64)
    d = np.asarray(drift, dtype=np.float64)
    unit = d / np.linalg.norm(d)
    mean = g.mean(axis=0)
    per = g @ unit / np.linalg.norm(g, axis=1)
    se = float(per.std(ddof=1) / np.sqrt(len(per)))
    norm = float(np.linalg.norm(d))
    return Drift(
        norm,
        float(norm / np.sqrt(d.size)),
        float(mean @ unit / np.linalg.norm(mean)),
        float(per.mean()),
        se,
    )


def load_state(args: argparse.Namespace) -> tuple[RunConfig, TrainState, int]:
    """The config, state and step to draw from: a stored run's checkpoint, or the (warm-started)
    untrained state of ``--config``."""
    overrides = {"train.grad_clip": UNCLIPPED, **dict(parse_override(kv) for kv in args.set)}
    if args.run is None:
        cfg = stage_warm_start(load_config(args.config, overrides=overrides))
        return cfg, init_state(cfg), 0
    return stored_checkpoint(args.store, args.run, args.step, overrides)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default=None, help="run config (default: embedded tiny-sim)")
    p.add_argument("--store", default=None, help="store root of --run")
    p.add_argument("--run", default=None, help="a stored run: draw at its checkpoint")
    p.add_argument("--step", type=int, default=None, help="the run's step (default: its last)")
    p.add_argument("--draws", type=int, default=8, help="independent steps K (≥ 2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--drift-from",
        type=int,
        default=None,
        help="with --run: also the draws' cosines with θ(step) − θ(this step)",
    )
    p.add_argument("--save", default=None, help="write the draws' gradients and sizes (.npz)")
    p.add_argument("--set", nargs="*", default=[], help="extra config overrides KEY=VALUE")
    args = p.parse_args()
    if args.run is not None and args.store is None:
        p.error("--run needs --store")
    if args.drift_from is not None and args.run is None:
        p.error("--drift-from needs --run")
    if args.draws < 2:
        p.error("--draws must be at least 2")
    torch.set_num_threads(args.threads)
    try:
        cfg, state, at = load_state(args)
        start = None
        if args.drift_from is not None:
            start = stored_checkpoint(args.store, args.run, args.drift_from)[1]
    except MissingArtifactError as exc:  # a run id or step the store does not hold
        sys.exit(f"gradient_noise: {exc}")
    world = build_world(cfg)
    grads, sizes = [], []
    for k in range(1, args.draws + 1):
        g, n = step_gradient(cfg, state, world, at + k)
        grads.append(g)
        sizes.append(n)
        print(
            f"  draw {k}/{args.draws}: step {at + k}, {n:.0f} trajectories, |G| {np.linalg.norm(g):.4g}",
            file=sys.stderr,
            flush=True,
        )
    if args.save:
        np.savez_compressed(args.save, grads=np.stack(grads), trajectories=np.array(sizes))
    est = noise_scale(np.stack(grads))
    batch = float(np.mean(sizes))
    print(
        f"state: {'run ' + args.run if args.run else 'untrained'} at step {at} "
        f"(train.seed {cfg.train.seed}, {cfg.train.batch_size} records, "
        f"{cfg.train.rollouts_theta}θ + {cfg.train.rollouts_rho}ρ; SIMULATED)"
    )
    print(
        f"draws {est.draws}, trained trajectories a step {batch:.1f}, LoRA parameters {grads[0].size}"
    )
    print(
        f"signal |μ|² {est.signal:.4g} ± {est.signal_se:.2g}  "
        f"noise tr C {est.noise:.4g} ± {est.noise_se:.2g}  "
        f"SNR {est.snr:.4f} ± {est.snr_se:.4f}  mean cosine {est.mean_cosine:.4f}  "
        f"B_noise {est.batch_for_snr_one(batch):.0f} trajectories"
    )
    if start is not None:
        dr = drift_cosines(
            np.stack(grads), lora_vector(cfg, state, world) - lora_vector(cfg, start, world)
        )
        print(
            f"drift from step {args.drift_from}: |d| {dr.norm:.4f} (rms {dr.rms:.4f} a parameter)  "
            f"cos(Ḡ, d) {dr.cosine:+.3f}  per draw {dr.per_draw:+.3f} ± {dr.per_draw_se:.3f}"
        )


if __name__ == "__main__":
    main()
