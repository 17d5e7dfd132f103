"""Values that pin float bytes are pinned per machine.

MKL and oneDNN choose their kernels by CPU vendor and instruction set, so the last bits of a
float32 reduction, and with them the sha256 of a float artifact, differ between machines for
the same code and seeds (the discrete trajectories do not). A pinned value is therefore kept
per :func:`machine_key`; on a machine with no entry the test fails and says how to record one
(on an unchanged commit: the values of the other machines are the check that the code did not
move).
"""

from __future__ import annotations

from typing import TypeVar

import pytest
import torch

T = TypeVar("T")


def machine_key() -> str:
    """What decides the float kernels: CPU vendor, torch's CPU capability, torch's version."""
    vendor = "unknown-vendor"
    try:
        with open("/proc/cpuinfo") as f:
            vendor = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("vendor_id")), vendor
            )
    except OSError:
        pass
    return f"{vendor} {torch.backends.cpu.get_cpu_capability()} torch {torch.__version__}"


def pinned(table: dict[str, T], what: str, record: str) -> T:
    """This machine's entry of ``table``; a missing one fails, naming the machine and ``record``
    (the command that writes it)."""
    key = machine_key()
    if key not in table:
        pytest.fail(
            f"{what}: none recorded for this machine ({key}; recorded: "
            f"{', '.join(sorted(table))}); on an unchanged commit run: {record}"
        )
    return table[key]
