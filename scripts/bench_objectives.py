"""Time AnchorTB loss + backward: the O(T) identity vs the explicit O(T²) span sum.

For 192 trajectories (one paper-sized step) of T = 8, 32, 64 actions, prints the median wall
time of forward + backward of
  * o(T)        : ``trajectory_losses`` (cumulative-sum identity A.23), whole batch at once;
  * span-matrix : ``span_loss_matrix`` — every span residual, vectorised over spans through the
                  incidence matrix A_T (O(T²) residuals, O(T³) work) and over rows;
  * span-loop   : ``span_loss_loop`` — the literal double loop in Python, one trajectory at a
                  time (only for T ≤ --loop-max-t; it is slow by construction).
Run: ``python scripts/bench_objectives.py [--repeats 5] [--loop-max-t 8] [--dtype float32]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from evosteer_core.infra.seeding import torch_generator
from evosteer_core.objectives import implemented_flows, trajectory_losses
from evosteer_core.objectives.base import TrajectoryBatch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the test oracle
from objective_oracle import span_loss_loop, span_loss_matrix

N_TRAJECTORIES = 192
BETA = 2.0


def make_batch(length: int, dtype: torch.dtype) -> TrajectoryBatch:
    gen = torch_generator("bench_objectives", length)
    n = N_TRAJECTORIES

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dtype)

    return TrajectoryBatch(
        delta_logp=draw(n, length).requires_grad_(True),
        action_mask=torch.ones(n, length, dtype=torch.bool),
        lengths=torch.full((n,), length),
        u=torch.rand(n, generator=gen, dtype=dtype) * BETA,
        c=0.1 * draw(n, length + 1),
        b=(0.1 * draw(n, length + 1)).requires_grad_(True),
        log_reward=torch.rand(n, generator=gen, dtype=dtype) * BETA,
    )


def o_t(batch: TrajectoryBatch) -> torch.Tensor:
    return trajectory_losses(implemented_flows(batch, BETA), batch.delta_logp, batch.lengths).mean()


def span_matrix(batch: TrajectoryBatch) -> torch.Tensor:
    return span_loss_matrix(implemented_flows(batch, BETA), batch.delta_logp, batch.lengths).mean()


def span_loop(batch: TrajectoryBatch) -> torch.Tensor:
    flows = implemented_flows(batch, BETA)
    length = batch.max_actions
    rows = [span_loss_loop(flows[r], batch.delta_logp[r], length) for r in range(batch.batch_size)]
    return torch.stack(rows).mean()


def time_it(
    fn: Callable[[TrajectoryBatch], torch.Tensor], batch: TrajectoryBatch, repeats: int
) -> tuple[float, float]:
    """(median seconds of loss + backward, loss value)."""
    times, value = [], 0.0
    for _ in range(repeats):
        batch.delta_logp.grad, batch.b.grad = None, None
        start = time.perf_counter()
        loss = fn(batch)
        loss.backward()
        times.append(time.perf_counter() - start)
        value = loss.item()
    return statistics.median(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop-max-t", type=int, default=8)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(
        f"AnchorTB loss+backward, {N_TRAJECTORIES} trajectories, {args.dtype}, "
        f"{args.threads} thread(s), median of {args.repeats}"
    )
    print(f"{'T':>4} {'form':<12} {'ms':>10} {'x o(T)':>8} {'loss':>12}")
    for length in (8, 32, 64):
        batch = make_batch(length, dtype)
        forms = [("o(T)", o_t, args.repeats), ("span-matrix", span_matrix, args.repeats)]
        if length <= args.loop_max_t:
            forms.append(("span-loop", span_loop, 1))
        base = None
        for name, fn, repeats in forms:
            seconds, value = time_it(fn, batch, repeats)
            base = base or seconds
            print(
                f"{length:>4} {name:<12} {1e3 * seconds:>10.3f} {seconds / base:>8.1f} {value:>12.6f}"
            )


if __name__ == "__main__":
    main()
