"""Flushing denormal floats to zero for speed, scoped so it never leaks into the caller's process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


def denormals_flushed() -> bool:
    """True when the CPU currently flushes denormal floats to zero (torch.set_flush_denormal)."""
    tiny = torch.tensor(1e-310, dtype=torch.float64)  # stored as is; the multiply sees the mode
    return bool((tiny * 1.0).item() == 0.0)


@contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush denormals inside the block (they can make CPU training 10× slower), then restore the mode.

    Process-wide state: leaving it on would break code that relies on IEEE-754 subnormals afterwards
    (bit-exactness checks, hypothesis' float strategies).
    """
    before = denormals_flushed()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)
