"""The Mann–Whitney AUC, the rank statistic training logs for the anchors' p̂ against the reward
(``anchor_auc``) and the tilt diagnostics of experiments/ reuse."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Mann–Whitney AUC P(score of a positive > score of a negative), ties 1/2; NaN when one
    class is absent."""
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))
