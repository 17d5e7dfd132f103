"""Seed derivation: every random draw is keyed by (run seed, step, record, rollout, purpose)."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any sequence of printable parts (ints, strings), stable across runs."""
    text = "\x1f".join(repr(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def numpy_rng(*parts: object) -> np.random.Generator:
    """A numpy generator seeded by ``derive_seed(*parts)``."""
    return np.random.default_rng(derive_seed(*parts))


def torch_generator(*parts: object) -> torch.Generator:
    """A CPU torch generator seeded by ``derive_seed(*parts)``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(*parts))
    return g
