"""The explicit load function of a comparison: two model specs and a data spec → modules and data.

Analysis functions take modules and data; this is where spec strings become them for a comparison,
with the policies a command-line user gets and a Python caller can reuse: the seed rule for two
models (:func:`simkit.seeding.pair_seeds`), and the tokenizer of ``text:`` data (each ``hf:`` model
reads the text through its own tokenizer, so B may get its own inputs, ``data_b``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from simkit.data import Dataset, load_data
from simkit.engine.array_files import is_array_path
from simkit.engine.arrays import IMPORTED
from simkit.engine.sources import is_cache, read_manifest
from simkit.errors import SimkitError
from simkit.faults import phase
from simkit.models import load_model
from simkit.models.loading import MODEL_SPEC_KINDS
from simkit.seeding import pair_seeds

#: the kinds of model spec (``file:``, ``hf:``, ...): a source named so is a model, whatever its suffix
MODEL_KINDS = tuple(kind.partition(":")[0] for kind in MODEL_SPEC_KINDS)


@dataclass
class LoadedPair:
    """Two models and the data they read: ``data_b`` is B's own form of the same samples, or None."""

    model_a: nn.Module
    model_b: nn.Module
    data: Dataset
    data_b: Dataset | None
    seeds: dict[str, int]


def text_tokenizers(data: str, models: list[str]) -> tuple[str | None, str | None]:
    """Which tokenizer reads ``text:FILE`` data for each model: its own for an ``hf:`` model, the other
    model's for one that is not (None when neither is, or when the spec names ``tokenizer=``)."""
    if not data.startswith("text:") or "tokenizer=" in data:
        return None, None
    own = [spec if spec.startswith("hf:") else None for spec in models]
    return own[0] or own[1], own[1] or own[0]


def load_pair(spec_a: str, spec_b: str, data: str, *, seed: int = 0, data_seed: int = 0, n: int | None = None,
              trust: bool = False, weights_a: str | Path | None = None,
              weights_b: str | Path | None = None, dtype: str | None = None) -> LoadedPair:
    """Load two models and the data for ``simkit.compare`` (seeds by :func:`~simkit.seeding.pair_seeds`:
    the models from ``seed``, the data from ``data_seed``; ``text:`` data tokenised per model, see the
    module docstring); ``dtype``: both models' (``simkit.models.load_model``)."""
    seeds = pair_seeds(seed, data_seed)
    tokenizers = text_tokenizers(data, [spec_a, spec_b])
    dataset = load_data(data, n=n, seed=seeds["data"], tokenizer=tokenizers[0])
    dataset_b = None if tokenizers[1] == tokenizers[0] else \
        load_data(data, n=n, seed=seeds["data"], tokenizer=tokenizers[1])
    model_a = load_model(spec_a, seed=seeds["model_a"], trust=trust, weights=_path(weights_a), dtype=dtype)
    model_b = load_model(spec_b, seed=seeds["model_b"], trust=trust, weights=_path(weights_b), dtype=dtype)
    phase("loading")  # a test hook (simkit.faults): nothing unless SIMKIT_KILL_AT names it
    return LoadedPair(model_a, model_b, dataset, dataset_b, seeds)


def _path(weights: str | Path | None) -> str | None:
    return None if weights is None else str(weights)


def source_kind(path: str) -> str:
    """``"cache"`` (written by ``simkit capture`` from a model), ``"arrays"`` (an activation file or
    directory, or a cache imported from one) or ``"model"`` (a model spec)."""
    if path.partition(":")[0].strip().lower() in MODEL_KINDS:  # file:model.pt is a model, not activations
        return "model"
    if is_cache(path):
        return "arrays" if read_manifest(path).get("source") == IMPORTED else "cache"
    return "arrays" if is_array_path(path) else "model"


def classify_sources(paths: list[str]) -> str:
    """``"caches"`` when every entry is an activation cache (two: a comparison, more: a study), ``"models"``
    for exactly two model specs, ``"arrays"`` for activation files (mixed with caches or not); anything else
    is a SimkitError saying what to pass."""
    kinds = [source_kind(p) for p in paths]
    if "model" in kinds and len(set(kinds)) > 1:
        raise SimkitError("mix of model specs and activations (caches or files); pass two model specs, or only "
                          "caches and activation files")
    if len(paths) < 2:
        raise SimkitError(f"compare needs two models (or two or more caches or activation files), got {len(paths)}")
    if "arrays" in kinds:
        return "arrays"
    if "cache" in kinds:
        return "caches"
    if len(paths) != 2:
        raise SimkitError(f"compare takes exactly two model specs, got {len(paths)}; a study needs caches "
                          "(write them with `simkit capture`) or activation files")
    return "models"


def data_for(spec: str, model: str, *, n: int | None, seed: int) -> Any:
    """The data a single model reads (``simkit capture``): ``text:`` through an ``hf:`` model's tokenizer;
    ``seed``: the data's seed (``--data-seed``), not the model's."""
    tokenizer = text_tokenizers(spec, [model, model])[0] if model.startswith("hf:") else None
    return load_data(spec, n=n, seed=seed, tokenizer=tokenizer)
