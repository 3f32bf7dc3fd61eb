"""Tokens or positions as samples (``CompareSettings.samples``): each batch's layer outputs of both sides
turned into rows, and the block (sequence or image) every row comes from.

- ``tokens``: every real token of a sequence layer ``(b, L, d)`` is a row ``(d,)``: padding is left out by the
  attention mask, as the mask-aware mean leaves it out (``simkit.layers.reduce_activation``); without a mask
  every token counts. Both sides must give the same number of tokens for every sequence (else a
  SimkitError saying so), so that row ``i`` of A and of B is the same token.
- ``positions``: every spatial position of a conv map ``(b, c, h, w)`` (or ``(b, c, L)``) is a row ``(c,)``.
  The maps of all chosen layers of both sides are first pooled to one common grid by adaptive average
  pooling (``torch.nn.functional.adaptive_avg_pool2d``), the smallest height and the smallest width among
  them, as ReSi's ``align_spatial_dimensions`` pools the larger map of a pair to the smaller one (here one
  grid for every pair, as the all-pairs accumulator sees one set of rows).

Tokens of one sequence (positions of one image) are not exchangeable: the accumulator gets every row's
block (``blocks``), so chance levels permute, and intervals resample, whole sequences or images
(``simkit.metrics.streaming.common.block_perms``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from simkit.errors import SimkitError

#: what a row is, per kind (the summary's wording)
UNITS = {"tokens": ("tokens", "sequences"), "positions": ("positions", "images")}


def token_rows(t: Tensor, mask: Tensor | None, layer: str) -> tuple[Tensor, Tensor]:
    """``t (b, L, d)`` → its real tokens ``(T, d)`` (sequence after sequence, in token order) and each
    sequence's count ``(b,)`` int64; ``mask (b, L)`` marks the real tokens (ignored unless its shape is
    ``(b, L)``, as the mask-aware mean ignores it)."""
    if t.dim() != 3:
        raise SimkitError(f"layer {layer} has outputs of shape {tuple(t.shape[1:])} per sample, not a token sequence "
                          "(tokens, features); choose sequence layers for `samples` tokens, or compare sequences")
    if mask is None or tuple(mask.shape) != tuple(t.shape[:2]):
        return t.reshape(-1, t.shape[2]), torch.full((t.shape[0],), t.shape[1], dtype=torch.int64)
    keep = mask.to(t.device).bool()
    return t[keep], keep.sum(1).cpu().to(torch.int64)


def spatial_shape(shape: Sequence[int], layer: str) -> tuple[int, ...]:
    """The spatial axes of a conv map's per-sample shape ``(c, h, w)`` or ``(c, L)``."""
    if len(shape) not in (2, 3):
        raise SimkitError(f"layer {layer} has outputs of shape {tuple(shape)} per sample, not a conv map (channels, "
                          "height, width); choose conv layers for `samples` positions, or compare images")
    return tuple(int(s) for s in shape[1:])


def common_grid(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    """The grid every map is pooled to: the smallest extent of each spatial axis (maps of one rank only)."""
    if len({len(s) for s in shapes}) != 1:
        raise SimkitError("`samples` positions needs maps of one kind: all 2-D (channels, height, width) or all 1-D "
                          "(channels, length); choose layers of one kind")
    return tuple(min(axis) for axis in zip(*shapes, strict=True))


def position_rows(t: Tensor, grid: tuple[int, ...]) -> Tensor:
    """``t (b, c, *spatial)`` pooled to ``grid`` by adaptive average pooling → ``(b·prod(grid), c)``, image after
    image, positions in row-major order."""
    if tuple(t.shape[2:]) == grid:
        pooled = t
    elif len(grid) == 2:
        pooled = F.adaptive_avg_pool2d(t, (grid[0], grid[1]))
    else:
        pooled = F.adaptive_avg_pool1d(t, grid[0])
    return pooled.flatten(2).transpose(1, 2).reshape(-1, t.shape[1])


class SampleRows:
    """The rows of every batch when tokens or positions are the samples, and the block of every row.

    kind: ``tokens`` or ``positions``; sequences: the sequences (images) compared, in data order;
    batch_size: sequences per global batch; counts: each sequence's rows when known before the first batch
    (the real tokens of an attention mask, ``(sequences,)``), else every sequence gets as many rows as the
    first batch gave it (no mask: all tokens; positions: the common grid)."""

    def __init__(self, kind: str, sequences: int, batch_size: int, counts: Any = None):
        if kind not in UNITS:
            raise SimkitError(f"`samples` {kind!r} makes no rows; choose tokens or positions")
        self.kind, self.sequences, self.batch_size = kind, int(sequences), int(batch_size)
        self.counts = None if counts is None else np.asarray(counts, dtype=np.int64)[:self.sequences]
        self.grid: tuple[int, ...] | None = None
        self.shapes: dict[str, str] = {}

    def rows(self, index: int, raw_a: Sequence[Tensor], raw_b: Sequence[Tensor], masks: tuple[Any, Any],
             names: tuple[Sequence[str], Sequence[str]]) -> tuple[list[Tensor], list[Tensor]]:
        """Batch ``index``'s rows of both sides from the layers' outputs ``raw_* (b, ...)`` (``masks``: each
        side's attention mask ``(b, L)`` or None; ``names``: the layers, for messages)."""
        if self.kind == "positions":
            return self._positions(raw_a, raw_b, names)
        sides = []
        for raw, mask, layer_names, label in zip((raw_a, raw_b), masks, names, "AB", strict=True):
            rows, counts = [], None
            for t, name in zip(raw, layer_names, strict=True):
                kept, per_sequence = token_rows(t, mask, name)
                if counts is not None and not torch.equal(counts, per_sequence):
                    raise SimkitError(f"layers of model {label} give different tokens per sequence ({name} differs "
                                      "from the first); choose layers of one sequence length")
                counts = per_sequence
                rows.append(kept)
            sides.append((rows, counts))
        self._check_tokens(index, sides[0][1], sides[1][1])
        return sides[0][0], sides[1][0]

    def _check_tokens(self, index: int, counts_a: Tensor | None, counts_b: Tensor | None) -> None:
        """Both sides give the same tokens for every sequence, and as many as the blocks expect."""
        if counts_a is None or counts_b is None:
            return
        if not torch.equal(counts_a, counts_b):
            first = int(torch.nonzero(counts_a != counts_b)[0, 0])
            raise SimkitError(f"the two sides give different numbers of tokens for sequence {index * self.batch_size + first} "
                              f"({int(counts_a[first])} and {int(counts_b[first])}), so their tokens cannot be paired as "
                              "samples; tokenize both the same way (one tokenizer, the same `max_length`) or compare "
                              "sequences")
        self._check_counts(index, counts_a)

    def _check_counts(self, index: int, counts: Tensor) -> None:
        """The batch's per-sequence rows as the blocks say (the mask known up front, or the first batch's)."""
        start = index * self.batch_size
        if self.counts is None:
            self.counts = np.full(self.sequences, int(counts[0]), dtype=np.int64)
        expected = self.counts[start:start + len(counts)]
        if not np.array_equal(expected, counts.numpy()):
            raise SimkitError(f"the layers give {int(counts.sum())} tokens for sequences {start}…{start + len(counts) - 1} "
                              f"where the attention mask marks {int(expected.sum())}; give a mask of the layers' "
                              "(samples, tokens) shape, or none")

    def _positions(self, raw_a: Sequence[Tensor], raw_b: Sequence[Tensor],
                   names: tuple[Sequence[str], Sequence[str]]) -> tuple[list[Tensor], list[Tensor]]:
        """Every map of both sides pooled to the common grid (fixed by the first batch), as rows."""
        if self.grid is None:
            layers = [(name, t) for raw, side in zip((raw_a, raw_b), names, strict=True)
                      for name, t in zip(side, raw, strict=True)]
            shapes = [spatial_shape(t.shape[1:], name) for name, t in layers]
            self.grid = common_grid(shapes)
            self.counts = np.full(self.sequences, int(np.prod(self.grid)), dtype=np.int64)
        for t, name in [*zip(raw_a, names[0], strict=True), *zip(raw_b, names[1], strict=True)]:
            spatial_shape(t.shape[1:], name)
        return [position_rows(t, self.grid) for t in raw_a], [position_rows(t, self.grid) for t in raw_b]

    def blocks(self) -> Tensor:
        """``(rows,)`` int64: the sequence (image) of every row, in data order (after the first batch)."""
        if self.counts is None:
            raise SimkitError("the blocks of the rows are known only after the first batch")
        return torch.repeat_interleave(torch.arange(len(self.counts)), torch.as_tensor(self.counts))

    def offset(self, index: int) -> int:
        """The global row of global batch ``index``'s first row."""
        if self.counts is None:
            return 0
        return int(self.counts[:index * self.batch_size].sum())

    def total(self) -> int | None:
        """The rows of the whole comparison (None until known)."""
        return None if self.counts is None else int(self.counts.sum())

    def label(self) -> str:
        """The layers table's reduction: ``tokens``, or ``positions HxW`` (the common grid)."""
        if self.kind == "tokens":
            return "tokens"
        return "positions " + "x".join(str(s) for s in self.grid or ())

    def record(self) -> dict[str, Any]:
        """The summary's ``sample_unit``: what a sample is, the rows and the sequences (images) they come from."""
        unit, blocks = UNITS[self.kind]
        rows = self.total() or 0
        out: dict[str, Any] = {"unit": unit, "rows": rows, blocks: len(self.counts) if self.counts is not None else 0}
        if self.grid is not None:
            out["grid"] = list(self.grid)
        out["text"] = f"{unit}: {rows} {unit} from {out[blocks]} {blocks}"
        return out


def mask_of(data: Any) -> Tensor | None:
    """The attention mask ``(n, L)`` of data given as a Dataset or a dict of tensors, else None."""
    inputs = getattr(data, "inputs", data)
    mask = inputs.get("attention_mask") if isinstance(inputs, dict) else None
    return mask if isinstance(mask, Tensor) and mask.dim() == 2 else None


def batch_mask(batch: Any) -> Tensor | None:
    """The attention mask of one batch of inputs (a dict with ``attention_mask``), else None."""
    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    return mask if isinstance(mask, Tensor) else None


def refuse_samples(samples: str, what: str) -> None:
    """A SimkitError when tokens or positions are asked of ``what`` (caches, a study), which compare one vector
    per sample."""
    if samples != "sequences":
        raise SimkitError(f"`samples` {samples} needs each layer's tokens or positions, but {what} compares one vector "
                          "per sample; compare two models or two sets of activations instead")
