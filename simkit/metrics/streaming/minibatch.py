"""Minibatch CKA (Nguyen et al. 2021), path ``"gram"``: per-batch Grams, three summed HSIC streams.

Every estimator step is :mod:`simkit.metrics.cka`'s: :func:`~simkit.metrics.cka.center_gram`,
:func:`~simkit.metrics.cka.u_center_gram`, the median and RBF kernel
(:func:`~simkit.metrics.cka.median_of_distances`, :func:`~simkit.metrics.cka.rbf_from_sq_distances`)
and the ratio (:func:`~simkit.metrics.cka.cka_ratio`). Constant layers: a layer is constant when it is
constant (:func:`simkit.metrics._checks.is_constant`, applied per batch by
:func:`simkit.metrics.gram.batch_grams`, which then gives it an exactly zero Gram) in every batch.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from simkit.catalog import GRAM_KINDS
from simkit.errors import SimkitError
from simkit.metrics.cka import (
    center_gram,
    cka_ratio,
    median_of_distances,
    rbf_from_sq_distances,
    sq_distances,
    u_center_gram,
)
from simkit.metrics.gram import batch_grams
from simkit.metrics.inference import pearson3_p
from simkit.metrics.permutation_moments import pair_cumulants
from simkit.metrics.streaming.common import (
    Names,
    PhaseProgress,
    Values,
    bootstrap_weights,
    ci_summary,
    draw_perms,
    mask_constant,
    null_summary,
    perm_generator,
)
from simkit.metrics.streaming.state import State, Sums

#: how the minibatch CKA p-values are found (``describe()["p_value"]``)
MOMENT_P_VALUE = ("Pearson type III fit of the exact permutation mean, variance and skewness of the summed per-batch "
                  "HSIC (Kazi-Aoual et al. 1995; each batch permuted on its own, so the cumulants add)")


def checked_grams(acts: Sequence[Tensor], names: Names, side: str) -> tuple[Tensor, Tensor]:
    """Per-batch linear Grams of one model's layers: L tensors ``(b, p_i)`` → ``(L, b, b)`` float64, and
    which layers varied in this batch ``(L,)`` bool.

    :func:`simkit.metrics.gram.batch_grams` (fast, shifted where the mean dominates, exactly zero for a
    layer that is constant in the batch), plus two checks for free from the Gram's trace: non-finite
    (a NaN or Inf activation, or one whose square overflows; raises :class:`SimkitError` naming the layer
    of model ``side``, "a" or "b") and zero (the layer was constant: every row the same).
    """
    g = batch_grams(acts)
    trace = torch.diagonal(g, dim1=-2, dim2=-1).sum(-1)
    finite = torch.isfinite(trace).tolist()
    if not all(finite):
        raise names.non_finite(side, finite.index(False))
    return g, trace != 0


class GramMemo:
    """Model B's per-batch Grams (:func:`checked_grams`) kept by batch index, for a side whose activations are
    the same at every use with the same batches: a training monitor's fixed reference, measured again at
    every logged step. A new memo for new activations; never shared between accumulators of different
    batchings."""

    def __init__(self) -> None:
        self.grams: dict[int, tuple[Tensor, Tensor]] = {}

    def get(self, batch_index: int, acts: Sequence[Tensor], names: Names) -> tuple[Tensor, Tensor]:
        """B's Grams of batch ``batch_index``: computed from ``acts`` the first time, then kept."""
        if batch_index not in self.grams:
            self.grams[batch_index] = checked_grams(acts, names, "b")
        return self.grams[batch_index]


def rbf_from_linear(g: Tensor, factor: float) -> Tensor:
    """RBF Grams ``(L, b, b)`` from linear Grams ``g (L, b, b)`` with per-layer median bandwidth.

    σ_l = factor · median of the distances over pairs i < j (the one median); σ = 0 → ``K = [d = 0]``.
    """
    b = g.shape[-1]
    d2 = sq_distances(g, torch.diagonal(g, dim1=-2, dim2=-1), torch.arange(b, device=g.device))
    medians = [median_of_distances(d.__getitem__, b, b, g.device) for d in d2]
    sigma = factor * torch.stack(medians)
    return rbf_from_sq_distances(d2, sigma[:, None, None])


class MinibatchPart:
    """Nguyen et al.'s minibatch CKA for any of linear_cka / unbiased_cka / rbf_cka, all pairs at once.

    Declared state: one ``sum`` (``self.s``): the sample and batch counts, the layers that varied, and per
    metric the three HSIC streams (with the null's and the bootstrap replicates' when asked, and with
    ``moments`` the cross stream's permutation cumulants, summed over batches).

    moments: p-values from a Pearson type III fit of the cross stream's exact permutation cumulants
    (:mod:`simkit.metrics.permutation_moments`: per batch from its Grams' traces; independent batches add).
    groups: ``(n,)`` int64 group codes of the samples in data order; the null's permutations of a batch
    then move each sample only within its group. blocks: ``(rows,)`` int64 block ids of the rows in data
    order (the sequence or image of each token or position); the null's permutations of a batch then move
    whole blocks (``common.block_perms``); the bootstrap resamples whole batches anyway."""

    def __init__(self, metrics: list[str], dims_a: list[int], dims_b: list[int], null: int, seed: int,
                 rbf_factor: float, names: Names, ci: float | None = None, ci_resamples: int = 200, *,
                 moments: bool = False, groups: Tensor | None = None, blocks: Tensor | None = None,
                 memo_b: GramMemo | None = None):
        self.metrics, self.dims_a, self.dims_b = metrics, dims_a, dims_b
        self.memo_b = memo_b
        self.null, self.seed, self.rbf_factor, self.names = null, seed, rbf_factor, names
        self.ci, self.resamples = ci, ci_resamples if ci is not None else 0
        self.moments, self.groups, self.blocks = moments, groups, blocks
        la, lb = len(dims_a), len(dims_b)
        self.s = Sums()
        self.states: list[State] = [self.s]
        # n, batches seen, batches with b < 2, batches with b < 4
        self.s.add("counts", 4)
        for side, count in (("a", la), ("b", lb)):  # per layer: batches in which it was not constant
            self.s.add(f"varied_{side}", count)
        for m in metrics:
            self.s.add(f"{m}.cross", la, lb)
            self.s.add(f"{m}.self_a", la)
            self.s.add(f"{m}.self_b", lb)
            if null:
                self.s.add(f"{m}.null", null, la, lb)
            if moments:  # the permutation mean, variance and third cumulant of the cross stream
                self.s.add(f"{m}.moments", 3, la, lb)
            if self.resamples:  # the bootstrap replicates' streams (module docstring of common.bootstrap_weights)
                self.s.add(f"{m}.boot_cross", self.resamples, la, lb)
                self.s.add(f"{m}.boot_self_a", self.resamples, la)
                self.s.add(f"{m}.boot_self_b", self.resamples, lb)

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int,
               offset: int = 0) -> None:
        s = self.s
        s.to(acts_a[0].device)
        counts = s["counts"]
        counts[0] += b
        counts[1] += 1
        if b < 2:
            counts[2] += 1
            return
        if b < 4:
            counts[3] += 1
        ga, varied_a = checked_grams(acts_a, self.names, "a")
        gb, varied_b = (checked_grams(acts_b, self.names, "b") if self.memo_b is None
                        else self.memo_b.get(batch_index, acts_b, self.names))
        s["varied_a"].add_(varied_a)
        s["varied_b"].add_(varied_b)
        perms = None
        if self.null:
            grouped = None if self.groups is None else self.groups[offset:offset + b]
            blocked = None if self.blocks is None else self.blocks[offset:offset + b]
            perms = draw_perms(self.null, b, perm_generator(self.seed, batch_index), ga.device, grouped, blocked)
        centred = {"a": center_gram(ga), "b": center_gram(gb)}
        weights = bootstrap_weights(self.resamples, self.seed, batch_index, ga.device) if self.resamples else None
        for m in self.metrics:
            kind = GRAM_KINDS[m]
            if kind == "unbiased":
                if b < 4:
                    continue
                scale = 1.0 / math.sqrt(b * (b - 3))
                fa, fb = u_center_gram(ga) * scale, u_center_gram(gb) * scale
            elif kind == "biased":
                fa, fb = centred["a"] / (b - 1), centred["b"] / (b - 1)
            else:
                fa = center_gram(rbf_from_linear(ga, self.rbf_factor)) / (b - 1)
                fb = center_gram(rbf_from_linear(gb, self.rbf_factor)) / (b - 1)
            self._add(m, fa, fb, perms, weights)

    def _add(self, m: str, fa: Tensor, fb: Tensor, perms: Tensor | None, weights: Tensor | None) -> None:
        """Add one batch's HSIC streams of metric ``m`` from centred Grams ``fa (La, b, b)``, ``fb (Lb, b, b)``
        (and to every bootstrap replicate, ``weights (R,)`` times)."""
        s = self.s
        la, lb, b = fa.shape[0], fb.shape[0], fa.shape[-1]
        flat_a, flat_b = fa.reshape(la, b * b), fb.reshape(lb, b * b)
        self_a, self_b = (flat_a * flat_a).sum(1), (flat_b * flat_b).sum(1)
        if weights is None:
            s[f"{m}.cross"].addmm_(flat_a, flat_b.T)
        else:
            cross = flat_a @ flat_b.T
            s[f"{m}.cross"].add_(cross)
            s[f"{m}.boot_cross"].add_(weights[:, None, None] * cross)
            s[f"{m}.boot_self_a"].add_(weights[:, None] * self_a)
            s[f"{m}.boot_self_b"].add_(weights[:, None] * self_b)
        s[f"{m}.self_a"].add_(self_a)
        s[f"{m}.self_b"].add_(self_b)
        if self.moments:
            s[f"{m}.moments"].add_(pair_cumulants(fa, fb))
        if perms is not None:  # B's Grams permuted, a few draws at a time (≤ 2**25 entries held)
            step = max(1, 2**25 // (lb * b * b))
            for first in range(0, perms.shape[0], step):
                chunk = perms[first:first + step]
                k = chunk.shape[0]
                permuted = fb[:, chunk[:, :, None], chunk[:, None, :]]  # (Lb, k, b, b)
                prod = flat_a @ permuted.reshape(lb * k, b * b).T  # (La, Lb·k)
                s[f"{m}.null"][first:first + k].add_(prod.reshape(la, lb, k).permute(2, 0, 1))

    def constant(self) -> tuple[Tensor, Tensor]:
        """Constant layers ``(La,), (Lb,)`` bool: constant (``is_constant``) in every batch it was fed."""
        return self.s["varied_a"] == 0, self.s["varied_b"] == 0

    def compute(self, progress: PhaseProgress | None = None) -> Values:
        """Every metric's CKA from the summed streams (``progress``: unused, nothing here takes long)."""
        s = self.s
        counts = s["counts"].tolist()
        const_a, const_b = self.constant()
        out = {}
        for m in self.metrics:
            used = counts[1] - counts[2] - (counts[3] if GRAM_KINDS[m] == "unbiased" else 0)
            least = 4 if GRAM_KINDS[m] == "unbiased" else 2
            if used <= 0:
                raise SimkitError(f"minibatch {m} needs batches of at least {least} samples and got none; "
                                  "raise `batch_size` (or use `mode`=exact)")
            skipped = counts[1] - used
            if skipped:
                warnings.warn(f"minibatch {m}: skipped {int(skipped)} batch(es) with fewer than {least} "
                              "samples", RuntimeWarning, stacklevel=3)
            self_a, self_b = s[f"{m}.self_a"][:, None], s[f"{m}.self_b"][None, :]
            value = mask_constant(cka_ratio(s[f"{m}.cross"], self_a, self_b, warn=False), const_a, const_b)
            self.names.warn_constant(m, const_a, const_b)
            out[m] = {"value": value.cpu().numpy()}
            if self.null:
                null = mask_constant(cka_ratio(s[f"{m}.null"], self_a, self_b, warn=False), const_a, const_b)
                out[m].update(null_summary(null))
            if self.moments:
                out[m].update(self._p_values(m, const_a, const_b))
            if self.resamples and self.ci is not None:
                boot = cka_ratio(s[f"{m}.boot_cross"], s[f"{m}.boot_self_a"][:, :, None],
                                 s[f"{m}.boot_self_b"][:, None, :], warn=False)
                replicates = mask_constant(boot, const_a, const_b).cpu().numpy()
                out[m].update(ci_summary(value.cpu().numpy(), replicates, self.ci, int(used)))
        return out

    def _p_values(self, m: str, const_a: Tensor, const_b: Tensor) -> dict[str, Any]:
        """``p_value`` (the Pearson type III fit of the cross stream's summed permutation cumulants; the
        ratio's denominators do not change under B's permutations) and ``chance`` (the exact permutation
        mean of the value) of metric ``m``."""
        s = self.s
        k1, k2, k3 = s[f"{m}.moments"]
        norm = torch.sqrt(s[f"{m}.self_a"][:, None] * s[f"{m}.self_b"][None, :])
        chance = mask_constant(k1 / torch.where(norm > 0, norm, torch.ones_like(norm)), const_a, const_b)
        p = pearson3_p(*(t.cpu().numpy() for t in (s[f"{m}.cross"], k1, k2, k3)))
        p[chance.isnan().cpu().numpy()] = float("nan")
        return {"p_value": p, "chance": chance.cpu().numpy()}

    def describe(self) -> dict[str, dict[str, Any]]:
        counts = self.s["counts"].tolist()
        out: dict[str, dict[str, Any]] = {}
        for m in self.metrics:
            skipped = counts[2] + (counts[3] if GRAM_KINDS[m] == "unbiased" else 0)
            out[m] = {"mode": "minibatch", "path": "gram", "n": int(counts[0]), "batches": int(counts[1]),
                      "skipped_batches": int(skipped),
                      "hsic": "unbiased HSIC_1" if GRAM_KINDS[m] == "unbiased" else "biased HSIC",
                      "estimator": "Nguyen et al. minibatch CKA: per-batch unbiased HSIC_1 summed over batches"
                      if GRAM_KINDS[m] == "unbiased" else
                      "per-batch biased HSIC summed over batches: its bias is set by the batch size, not n",
                      "kernel": "rbf" if m == "rbf_cka" else "linear", "null": self.null}
            if self.ci is not None:
                out[m]["ci"] = (f"{self.ci:.0%} interval: value ± t(batches − 1) × the standard deviation of "
                                f"a Poisson bootstrap over batches, {self.resamples} replicates")
            if m == "rbf_cka":
                out[m]["bandwidth"] = f"{self.rbf_factor} x per-batch median pairwise distance"
            if self.moments:
                out[m]["p_value"] = MOMENT_P_VALUE
        return out
