"""Operating characteristics of the sequential skill tests (figures quoted in docs/skills.md).

Runs the full validation procedure of tests/test_sequential.py (``run_procedure``: one
candidate per family, 5 pairs per family per step, one look per step with new discordant
pairs) many times and prints (1) the family-wise rate of false promotions/retirements for
null skills and (2) how many pairs a helpful / harmful skill needs before its decision.

Usage: .venv/bin/python scripts/bench_skill_admission.py [--runs N]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_sequential import ALPHA, run_procedure  # noqa: E402

from evosteer_core.episode.records import FAMILIES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    args = parser.parse_args()

    null = {f: ("iid", p) for f, p in zip(FAMILIES, (0.1, 0.3, 0.5, 0.5, 0.7, 0.9), strict=True)}
    results = [run_procedure(seed, null, steps=40) for seed in range(args.runs)]
    fwer = sum(bool(r) for r in results) / args.runs
    per_skill = sum(len(r) for r in results) / (args.runs * len(null))
    hi = fwer + 1.96 * math.sqrt(max(fwer * (1 - fwer), 1e-12) / args.runs)
    print(f"null: 6 candidates x 200 pairs x {args.runs} runs, alpha={ALPHA}")
    print(
        f"  family-wise false decision rate {fwer:.4f} (95% upper {hi:.4f}); per skill {per_skill:.4f}"
    )

    for label, models in (
        ("helpful j=1", {"hotpotqa": ("signs", 0.35, 0.05)}),
        ("harmful j=1", {"hotpotqa": ("signs", 0.05, 0.35)}),
        (
            "helpful j=6",
            {**{f: ("iid", 0.5) for f in FAMILIES[:5]}, "alfworld": ("signs", 0.35, 0.05)},
        ),
    ):
        fam = list(models)[-1]
        runs = [run_procedure(seed, models, steps=60) for seed in range(min(args.runs, 1000))]
        decided = [r[fam] for r in runs if fam in r]
        n = np.array([k for _, k in decided])
        kinds = {d for d, _ in decided}
        print(
            f"{label}: decided {len(decided)}/{len(runs)} within 300 pairs ({kinds}); pairs to "
            f"decision median {np.median(n):.0f}, p90 {np.percentile(n, 90):.0f}, "
            f"p95 {np.percentile(n, 95):.0f}, max {n.max()}"
        )


if __name__ == "__main__":
    main()
