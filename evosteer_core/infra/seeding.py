"""Seed derivation: every random draw is keyed by (run seed, step, record, rollout, purpose)."""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any sequence of printable parts (ints, strings), stable across runs."""
    text = "\x1f".join(repr(p) for p in parts)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def settle_threads() -> None:
    """Put torch's thread pool in one state, whatever the process did before: set the count
    (to the one in force). ``torch.set_num_threads`` also turns MKL's dynamic threading off,
    and on some CPUs (Intel, measured) that changes the last bits of float32 reductions; so a
    stage run in a fresh process and one run after a caller set the count write other bytes
    unless every stage sets it first (docs/pipeline.md, "Bit-identical")."""
    torch.set_num_threads(torch.get_num_threads())


def numpy_rng(*parts: object) -> np.random.Generator:
    """A numpy generator seeded by ``derive_seed(*parts)``."""
    return np.random.default_rng(derive_seed(*parts))


def torch_generator(*parts: object) -> torch.Generator:
    """A CPU torch generator seeded by ``derive_seed(*parts)``."""
    g = torch.Generator()
    g.manual_seed(derive_seed(*parts))
    return g
