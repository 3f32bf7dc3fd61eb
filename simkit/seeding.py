"""Explicit randomness: one seed gives the same numbers on every run."""

from __future__ import annotations

import random
import zlib

import numpy as np
import torch


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, numpy and torch; return a torch.Generator seeded with ``seed`` for explicit use."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def derive_seed(seed: int, *keys: int | str) -> int:
    """The one recipe for sub-seeds: a 63-bit seed from ``seed`` and labels (ints or strings).

    ``derive_seed(seed, "scratch")``, ``derive_seed(seed, "perm", batch)``: independent streams for
    every label, the same number on every run and platform (numpy's SeedSequence; strings by CRC-32).
    """
    words = [int(seed) & 0xFFFFFFFFFFFFFFFF]
    words += [zlib.crc32(k.encode()) if isinstance(k, str) else int(k) & 0xFFFFFFFFFFFFFFFF for k in keys]
    hi, lo = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return ((int(hi) << 32) | int(lo)) & (2**63 - 1)


def generator(seed: int, *keys: int | str) -> torch.Generator:
    """A CPU torch.Generator seeded with ``derive_seed(seed, *keys)`` (``seed`` itself without keys)."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys) if keys else int(seed))


def pair_seeds(seed: int, data_seed: int = 0) -> dict[str, int]:
    """The one seed rule of every command that builds two models from specs (compare, stitch): model A
    gets ``seed``, model B ``seed + 1`` (so the same spec twice gives two independently initialised
    networks, and ``simkit capture --seed 1`` of B stores the activations a comparison with ``--seed 0``
    sees), and the data ``data_seed`` (0 unless given: apart from ``seed``, so changing only the model
    seed keeps the data)."""
    return {"model_a": seed, "model_b": seed + 1, "data": data_seed}
