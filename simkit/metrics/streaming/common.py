"""What every streaming path shares: the part protocol, layer names for warnings and errors, batch checks,
the permutation-null draws, and small tensor helpers (the declared states: :mod:`.state`)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics.cka import cka_ratio
from simkit.metrics.streaming.state import State

#: Progress of the work done after the last batch (neighbour searches, permutation nulls):
#: ``report(phase, advance, total)`` — ``advance`` more units of ``phase``'s ``total`` are done.
PhaseProgress = Callable[[str, int, int], None]

#: ``compute()`` of a path: ``{metric: {"value": (La, Lb)[, "null", "null_mean", "null_p95"]}}``.
Values = dict[str, dict[str, np.ndarray]]


class Part(Protocol):
    """One strategy of the accumulator (minibatch Grams, feature sums, per-fold sums, stored activations).

    ``states``: the part's declared states (:mod:`simkit.metrics.streaming.state`), through which the
    accumulator moves, merges, re-bases, saves and loads it. ``update`` gets the batch's rows ``b``, its
    global index and ``offset``, the global position of its first sample (the fold of ``ridge_r2``);
    ``compute`` reports its long phases to ``progress`` (None: silent)."""

    metrics: list[str]
    states: list[State]

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int,
               offset: int = 0) -> None: ...

    def compute(self, progress: PhaseProgress | None = None) -> Values: ...

    def describe(self) -> dict[str, dict[str, Any]]: ...


def own(t: Tensor) -> Tensor:
    """``t`` detached, copied only when it is a view into a larger buffer (which storing would keep)."""
    t = t.detach()
    whole = t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def segments(dims: Sequence[int], device: torch.device | None = None) -> Tensor:
    """Layer index of every concatenated column: ``(Σ dims,)`` int64."""
    return torch.repeat_interleave(torch.arange(len(dims), device=device), torch.as_tensor(dims, device=device))


def segsum(t: Tensor, seg: Tensor, count: int, dim: int) -> Tensor:
    """Sum ``t`` (1-D or 2-D) over the groups ``seg`` along ``dim``: that axis shrinks to ``count``.

    A product with the one-hot ``(len(seg), count)`` matrix (``index_add_`` along columns is slow on CPU).
    """
    onehot = torch.zeros(len(seg), count, dtype=t.dtype, device=t.device)
    onehot[torch.arange(len(seg), device=t.device), seg] = 1.0
    if dim == 0:
        return onehot.T @ t
    return t @ onehot


def check_batch(acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], dims_a: list[int],
                dims_b: list[int]) -> int:
    """Rows of one batch; raises for a wrong number of layers, wrong widths or unequal sample counts."""
    for label, acts, dims in (("A", acts_a, dims_a), ("B", acts_b, dims_b)):
        if len(acts) != len(dims):
            raise SimkitError(f"model {label} gave {len(acts)} layers but the accumulator was built for "
                              f"{len(dims)}; pass the same layers in every batch")
        for i, (t, d) in enumerate(zip(acts, dims, strict=True)):
            if t.dim() != 2 or t.shape[1] != d:
                raise SimkitError(f"model {label} layer {i} has shape {tuple(t.shape)}, expected (b, {d}); "
                                  "reduce every activation to (batch, features) with the same width")
    rows = {int(t.shape[0]) for t in (*acts_a, *acts_b)}
    if len(rows) != 1:
        raise SimkitError(f"found inconsistent numbers of samples in one batch: {sorted(rows)}; both "
                          "models must see the same examples")
    return rows.pop()


def mask_constant(values: Tensor, const_a: Tensor, const_b: Tensor) -> Tensor:
    """Set rows of constant A layers and columns of constant B layers of ``(..., La, Lb)`` to NaN."""
    bad = const_a[:, None] | const_b[None, :]
    return values.masked_fill(bad, float("nan"))


def cka_chance(metric: str, value: Tensor, nx: Tensor, ny: Tensor, fro_a: Tensor, fro_b: Tensor,
               n: float) -> Tensor:
    """The exact expectation of ``metric`` under a random permutation of B's samples (La, Lb), from each
    layer's ``tr(K_c)`` (``nx (La,)``, ``ny (Lb,)``: ``‖X_c‖²_F``) and ``‖K_c‖²_F`` (``fro_a``, ``fro_b``): for
    linear CKA ``tr(K_c)·tr(L_c) / ((n − 1)·‖K_c‖_F·‖L_c‖_F)`` (the permutations average B's centred Gram to
    ``tr(L_c)/(n − 1)·H``), for unbiased CKA 0 (HSIC_1 is unbiased under independence), NaN where ``value`` is."""
    if metric == "unbiased_cka":
        return torch.where(torch.isfinite(value), torch.zeros_like(value), value)
    return cka_ratio(nx[:, None] * ny[None, :] / (n - 1), fro_a[:, None], fro_b[None, :], warn=False)


def null_summary(null: Tensor) -> dict[str, np.ndarray]:
    """``null (K, La, Lb)`` → its mean, 95th and 5th percentiles over the K draws (NaN kept)."""
    arr = null.detach().cpu().numpy()
    return {"null": arr, "null_mean": arr.mean(0), "null_p95": np.percentile(arr, 95, axis=0),
            "null_p05": np.percentile(arr, 5, axis=0)}


def perm_generator(seed: int, index: int) -> torch.Generator:
    """A CPU generator for the null draws of batch ``index`` (or of the whole data set: index −1).

    The null's own seed recipe (simkit.metrics imports nothing above itself, so not ``simkit.seeding``);
    unchanged, so null values stay the same.
    """
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(index) + 1) % (2**63 - 1))


def bootstrap_weights(count: int, seed: int, index: int, device: torch.device | str) -> Tensor:
    """``count`` Poisson(1) weights ``(count,)`` float64 of batch ``index``: one per bootstrap replicate.

    The Poisson bootstrap resamples batches independently (each replicate takes batch ``index`` w times,
    w ~ Poisson(1), the streaming limit of a multinomial resample), so replicates are sums that add over
    batches and ranks; the draws of a batch depend on ``(seed, index)`` alone (a stream apart from the
    null's)."""
    generator = torch.Generator().manual_seed(((int(seed) * 1_000_003 + int(index) + 1) * 7 + 5) % (2**63 - 1))
    return torch.poisson(torch.ones(count, dtype=torch.float64), generator=generator).to(device)


def ci_summary(value: np.ndarray, replicates: np.ndarray, confidence: float,
               blocks: int | None = None) -> dict[str, np.ndarray]:
    """``ci_low``, ``ci_high`` of ``value (La, Lb)``: value ± q·sd, sd the standard deviation of the
    bootstrap ``replicates (R, La, Lb)`` (NaN ignored; all-NaN cells stay NaN), centred on the estimate.
    q: Student's t quantile at ``confidence`` with ``blocks − 1`` degrees of freedom when the resampled
    units are ``blocks`` batches (often few: a percentile interval of 20 batches covered 91.5 % at 95 %,
    this one 94.5 %), else the normal quantile (samples; a percentile interval there is shifted up by the
    duplicated samples: 87 % at n = 200, this one 91 %; tests/engine/test_confidence_intervals.py)."""
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        sd = np.nanstd(replicates, axis=0, ddof=1)
    tail = 0.5 + confidence / 2
    q = float(stats.norm.ppf(tail) if blocks is None else stats.t.ppf(tail, max(1, blocks - 1)))
    return {"ci_low": value - q * sd, "ci_high": value + q * sd}


def draw_perms(count: int, n: int, generator: torch.Generator, device: torch.device | str,
               groups: Tensor | None = None, blocks: Tensor | None = None) -> Tensor:
    """``count`` random permutations of ``range(n)``: ``(count, n)`` int64. ``groups`` (``(n,)`` int64 group
    codes ≥ 0): each permutation moves a sample only within its group (uniform over those permutations).
    ``blocks`` (``(n,)`` int64 block ids: the sequence or image each row (token, position) comes from):
    whole blocks move, see :func:`block_perms`."""
    if blocks is not None:
        return block_perms(count, blocks, generator).to(device)
    keys = torch.rand(count, n, generator=generator)
    if groups is None:
        return keys.argsort(1).to(device)
    codes = groups.cpu()
    shuffled = (codes[None, :].double() * 2 + keys.double()).argsort(1)   # each group's members, shuffled
    members = codes.argsort(stable=True)                                   # each group's members, in order
    perms = torch.empty_like(shuffled)
    perms[:, members] = shuffled
    return perms.to(device)


class BlockLayout:
    """The blocks of ``(n,)`` int64 block ids: ``order`` the rows grouped by block (each block's rows in their
    order), ``starts``/``sizes`` each block's place in ``order`` (blocks numbered 0 … k − 1 by id),
    ``block`` each row's block number and ``rank`` its place within its block."""

    def __init__(self, blocks: Tensor):
        codes = blocks.cpu()
        _, self.block, self.sizes = torch.unique(codes, return_inverse=True, return_counts=True)
        self.order = self.block.argsort(stable=True)
        self.starts = self.sizes.cumsum(0) - self.sizes
        place = torch.empty_like(self.order)
        place[self.order] = torch.arange(len(codes))
        self.rank = place - self.starts[self.block]

    def strata(self) -> Tensor:
        """Each block's stratum: blocks of the same size share one (``(k,)`` int64)."""
        return torch.unique(self.sizes, return_inverse=True)[1]

    def rows_of(self, chosen: Tensor) -> Tensor:
        """The rows of the blocks ``chosen`` (``(m,)`` block numbers, repeats allowed), block after block."""
        sizes = self.sizes[chosen]
        first = torch.repeat_interleave(self.starts[chosen], sizes)
        within = torch.arange(int(sizes.sum())) - torch.repeat_interleave(sizes.cumsum(0) - sizes, sizes)
        return self.order[first + within]


def block_perms(count: int, blocks: Tensor, generator: torch.Generator) -> Tensor:
    """``count`` permutations ``(count, n)`` int64 (CPU) of rows that come in blocks (``blocks``: ``(n,)`` block
    ids; tokens of one sequence, positions of one image): each moves whole blocks onto blocks of the same
    size, row ``j`` of a block onto row ``j`` of its image, uniform over those permutations. Blocks of
    different sizes are never exchanged: the exchangeability blocks of Winkler et al. (2015, PALM), with
    the strata the sets of equal-sized blocks (images all share one size, so any block permutation)."""
    layout = BlockLayout(blocks)
    moved = draw_perms(count, len(layout.sizes), generator, "cpu", layout.strata())   # (count, k) blocks
    target = layout.starts[moved[:, layout.block]] + layout.rank[None, :]
    return layout.order[target]


def bootstrap_rows(n: int, generator: torch.Generator, blocks: Tensor | None = None) -> Tensor:
    """One bootstrap resample's rows: ``n`` rows drawn with replacement (``(n,)`` int64), or with ``blocks``
    (``(n,)`` block ids) as many whole blocks drawn with replacement as there are, all their rows taken (so
    every row of a block gets the same weight)."""
    if blocks is None:
        return torch.randint(n, (n,), generator=generator)
    layout = BlockLayout(blocks[:n])
    chosen = torch.randint(len(layout.sizes), (len(layout.sizes),), generator=generator)
    return layout.rows_of(chosen)


def exchangeable_share(blocks: Tensor) -> float:
    """The fraction of rows whose block has another block of the same size (so a block permutation can move
    it): 1 for images or sequences of one length."""
    layout = BlockLayout(blocks)
    strata = layout.strata()
    members = torch.bincount(strata)[strata]          # blocks in each block's stratum
    return float(layout.sizes[members >= 2].sum()) / max(1, len(blocks))


class Names:
    """Layer labels for messages: the engine's names when given, else ``A[i]`` / ``B[j]``."""

    def __init__(self, names_a: Sequence[str] | None, names_b: Sequence[str] | None, la: int, lb: int):
        self.a = list(names_a) if names_a is not None else [f"A[{i}]" for i in range(la)]
        self.b = list(names_b) if names_b is not None else [f"B[{j}]" for j in range(lb)]

    def warn_constant(self, metric: str, const_a: Tensor, const_b: Tensor) -> None:
        bad = [self.a[i] for i in torch.nonzero(const_a).flatten().tolist()]
        bad += [self.b[j] for j in torch.nonzero(const_b).flatten().tolist()]
        if bad:
            warnings.warn(f"{metric} is undefined for constant layer(s) {', '.join(bad)} "
                          "(every sample has the same activation); their pairs are NaN",
                          RuntimeWarning, stacklevel=4)

    def non_finite(self, side: str, layer: int) -> SimkitError:
        names = self.a if side == "a" else self.b
        return SimkitError(f"non-finite activations (NaN or Inf) in layer {names[layer]} of model "
                           f"{side.upper()}; check the model's weights and the input scale")

    def check_finite(self, *sums: tuple[str, Tensor]) -> None:
        """Raise for the first non-finite entry of per-layer sums ``(side, (L,))``."""
        for side, t in sums:
            bad = torch.nonzero(~torch.isfinite(t)).flatten().tolist()
            if bad:
                raise self.non_finite(side, bad[0])
