"""Explicit randomness: one seed gives the same numbers on every run."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, numpy and torch; return a torch.Generator seeded with ``seed`` for explicit use."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)
