"""Streaming all-pairs similarity accumulators: every layer of A against every layer of B, batch by batch.

One call builds the accumulator the engine feeds (spec §0.1–0.3)::

    acc = make_accumulator(["linear_cka", "unbiased_cka"], "minibatch", dims_a, dims_b)
    for acts_a, acts_b in batches:           # acts_a: list of (b, p_i) tensors, acts_b: list of (b, q_j)
        acc.update(acts_a, acts_b)
    acc.reduce_over_ranks(device)  # under torchrun, on every rank (a no-op in one process)
    acc.compute()  # {metric: {"value": (La, Lb), ["null": (K, La, Lb), "null_mean", "null_p95"]}}
    acc.describe() # {metric: {"mode", "path", "n", ...}} for result.meta

How each metric is computed (``path`` in :meth:`Accumulator.describe`):

* ``minibatch`` mode, ``linear_cka`` / ``unbiased_cka`` / ``rbf_cka`` — path ``"gram"`` (Nguyen et al.
  2021). Per batch each layer's Gram ``K = x xᵀ`` is computed ONCE, in the activations' dtype
  (:mod:`simkit.metrics.gram`: a chunked symmetric product on the CPU; a layer whose features are
  dominated by their mean is computed from features shifted by the batch's first row — HSIC is
  unchanged by a shift), then moved to float64 and centred (``HKH``, biased HSIC, for ``linear_cka``
  and ``rbf_cka``) or U-centred (HSIC_1, for ``unbiased_cka``). The flattened Grams of all layers are
  stacked as ``(L, b²)`` rows and every pair's HSIC comes from one matrix product.
  Per batch HSIC is normalised by ``(b−1)²`` (biased) or ``b(b−3)`` (HSIC_1), so batches of unequal size
  are averaged as HSIC values; the three streams are summed and the ratio is taken at the end.
  ``rbf_cka``: per-batch RBF Grams with the batch's median pairwise distance (pairs ``i < j``) times
  ``rbf_factor``; a zero bandwidth uses the ``σ → 0`` limit ``K = [d = 0]``.
  Small batches: a batch with ``b < 2`` is skipped by every metric and one with ``b < 4`` by
  ``unbiased_cka`` (HSIC_1 needs 4 samples); the counts are in ``describe()`` and a warning is issued.
  If a metric gets no batch at all, :meth:`compute` raises :class:`SimkitError`.
* ``exact`` mode, ``linear_cka`` / ``unbiased_cka`` — path ``"features"``: feature-space sums streamed
  over batches, memory independent of ``n``. All layers of A are concatenated into one ``(b, P)``
  matrix, all of B into ``(b, Q)``, and the cross-product ``XᵀY`` (P×Q) comes from ONE matmul per batch
  in the activations' dtype, on batch-centred features (so every float32 product depends on its batch
  alone), then moved in float64 to a fixed reference shift per column (the first batch's mean) and
  added to float64 sums. HSIC is unchanged by a constant shift, and the shift removes the cancellation
  that large feature means would cause (the quartic terms lose ``(mean/std)⁴`` digits without it).
  With the per-layer self products, column sums, row-norm sums, ``Σ_r x_r‖y_r‖²`` and ``Σ‖x_r‖²‖y_r‖²``,
  the biased HSIC ``‖X_cᵀY_c‖²`` and the unbiased ``n(n−3)·HSIC_1`` (spec §0.2 feature-space form,
  expanded about the exact global mean) follow exactly at the end. Needs about
  ``20·P·Q + 8·(Σp_i² + Σq_j²)`` bytes (:func:`feature_path_bytes`); when that exceeds
  ``memory_budget_bytes`` the metric falls back to path ``"stored-gram"``.
* path ``"stored-gram"`` (exact ``rbf_cka``, exact CKA beyond the memory budget, and every exact CKA
  metric when a permutation null is asked for): the activations are stored (in their dtype, normally
  float32: ``n·(P+Q)·itemsize`` bytes) up to ``max_stored_n`` samples — beyond that :class:`SimkitError`
  tells the user to use ``--mode minibatch`` or ``--reduce mean``. At the end the centred (or
  U-centred, or centred RBF) Gram rows are produced in blocks of rows, so memory is
  ``O((La+Lb)·rows·n)``, never ``(La+Lb)·n²``; ``rbf_cka`` also needs one ``n × n`` distance matrix per
  layer for the exact median.
* ``mutual_knn`` (both modes) — path ``"stored-knn"``: activations stored as above, each layer's exact
  k nearest neighbours computed once (``simkit.metrics.knn``, Huh et al. preprocessing), every pair's
  score from the neighbour sets. Always computed on all the data, also in minibatch mode.

Permutation null (``null=K > 0``): the metric recomputed with B's samples shuffled K times, reported
as ``null`` (K, La, Lb), ``null_mean`` and ``null_p95`` (95th percentile, linear interpolation).
Minibatch mode permutes B's centred Grams within each batch (centring commutes with permutations), with
the permutations of batch ``i`` drawn from ``(seed, i)``; ``i`` defaults to ``rank + world_size · calls``
(``simkit.batches``' round-robin split), so the draws do not depend on the number of processes. Exact
mode needs the stored activations (``n·(P+Q)·itemsize`` bytes) and costs K extra Gram passes over B's
layers (``K·n²·ΣQ`` multiply-adds).

Constant layers: CKA is undefined; the pairs involving them are NaN and a ``RuntimeWarning`` names the
layer (``names_a`` / ``names_b``). Non-finite activations raise :class:`SimkitError` naming the layer, in
:meth:`update`, at no extra pass over the features: from the Gram's trace (minibatch), the column sums
(feature path), or one sum per layer (stored paths).

Distributed: :meth:`Accumulator.reduce_over_ranks` does everything, on every rank. Underneath,
:meth:`state` lists every float64 sum; adding the states of two accumulators fed with disjoint batches
gives the state of one fed with all of them, provided they use the same reference shifts (minibatch
sums have none; the feature path takes its shifts from the first batch it sees, so they are first made
common: ``shifts()`` broadcast from rank 0, then ``rebase(shifts)``, exact in float64). Stored paths
(``needs_gather``) hold activations, not sums: they are all-gathered and put back in global batch
order. Every float32 product depends on its batch alone, so 1 and N processes agree to float64
rounding. :meth:`Accumulator.merge` combines two accumulators in one process the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from simkit import distributed
from simkit.errors import SimkitError
from simkit.metrics._checks import CONSTANT_RTOL, is_constant
from simkit.metrics.cka import center_gram, u_center_gram
from simkit.metrics.gram import batch_grams
from simkit.metrics.knn import clamp_normalize, knn_indices

METRICS = ("linear_cka", "unbiased_cka", "rbf_cka", "mutual_knn")
MODES = ("exact", "minibatch")
#: Gram kind of each CKA metric: biased centring (linear), U-centring (linear), biased centring (RBF).
KINDS = {"linear_cka": "biased", "unbiased_cka": "unbiased", "rbf_cka": "rbf"}


# ------------------------------------------------------------------------------------------ helpers


def _own(t: Tensor) -> Tensor:
    """``t`` detached, copied only when it is a view into a larger buffer (which storing would keep)."""
    t = t.detach()
    whole = t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    return t if whole else t.clone()


def _compute_dtype(t: Tensor) -> torch.dtype:
    """The dtype per-batch products run in: the activations' dtype, half types upcast to float32."""
    return t.dtype if t.dtype in (torch.float32, torch.float64) else torch.float32


def _segments(dims: Sequence[int], device: torch.device | None = None) -> Tensor:
    """Layer index of every concatenated column: ``(Σ dims,)`` int64."""
    return torch.repeat_interleave(torch.arange(len(dims), device=device), torch.as_tensor(dims, device=device))


def _segsum(t: Tensor, seg: Tensor, count: int, dim: int) -> Tensor:
    """Sum ``t`` (1-D or 2-D) over the groups ``seg`` along ``dim``: that axis shrinks to ``count``.

    A product with the one-hot ``(len(seg), count)`` matrix (``index_add_`` along columns is slow on CPU).
    """
    onehot = torch.zeros(len(seg), count, dtype=t.dtype, device=t.device)
    onehot[torch.arange(len(seg), device=t.device), seg] = 1.0
    if dim == 0:
        return onehot.T @ t
    return t @ onehot


def _check_batch(acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], dims_a: list[int],
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


def _ratio(cross: Tensor, self_a: Tensor, self_b: Tensor) -> Tensor:
    """``cross / sqrt(self_a ⊗ self_b)`` for ``(..., La, Lb)``; non-positive denominators give NaN."""
    den = self_a[:, None] * self_b[None, :]
    out = cross / den.clamp_min(0).sqrt()
    return torch.where(den > 0, out, torch.full_like(out, float("nan")))


def _mask_constant(values: Tensor, const_a: Tensor, const_b: Tensor) -> Tensor:
    """Set rows of constant A layers and columns of constant B layers of ``(..., La, Lb)`` to NaN."""
    bad = const_a[:, None] | const_b[None, :]
    return values.masked_fill(bad, float("nan"))


def _null_summary(null: Tensor) -> dict[str, np.ndarray]:
    """``null (K, La, Lb)`` → its mean and 95th percentile over the K draws (NaN kept)."""
    arr = null.detach().cpu().numpy()
    return {"null": arr, "null_mean": arr.mean(0), "null_p95": np.percentile(arr, 95, axis=0)}


def _perm_generator(seed: int, index: int) -> torch.Generator:
    """A CPU generator for the null draws of batch ``index`` (or of the whole data set: index −1)."""
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(index) + 1) % (2**63 - 1))


def _draw_perms(count: int, n: int, generator: torch.Generator, device) -> Tensor:
    """``count`` random permutations of ``range(n)``: ``(count, n)`` int64."""
    return torch.rand(count, n, generator=generator).argsort(1).to(device)


class _Names:
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


class _Sums:
    """A named set of float64 tensors that add across batches and ranks (kept in insertion order)."""

    def __init__(self):
        self.t: dict[str, Tensor] = {}

    def add(self, name: str, *shape: int) -> None:
        self.t[name] = torch.zeros(shape, dtype=torch.float64)

    def to(self, device: torch.device) -> None:
        if self.t and next(iter(self.t.values())).device != device:
            self.t = {k: v.to(device) for k, v in self.t.items()}

    def list(self) -> list[Tensor]:
        return list(self.t.values())

    def merge(self, other: _Sums) -> None:
        for k, v in self.t.items():
            v += other.t[k].to(v.device)

    def __getitem__(self, name: str) -> Tensor:
        return self.t[name]


# ------------------------------------------------------------------------------- minibatch (Grams)


def _batch_grams(acts: Sequence[Tensor], names: _Names, side: str) -> Tensor:
    """Per-batch linear Grams of one model's layers: L tensors ``(b, p_i)`` → ``(L, b, b)`` float64.

    :func:`simkit.metrics.gram.batch_grams` (fast, and shifted where the mean dominates), plus the
    finiteness check for free: a NaN or Inf activation (or one whose square overflows) makes the Gram's
    trace non-finite; raises :class:`SimkitError` naming the layer of model ``side`` ("a" or "b").
    """
    g = batch_grams(acts)
    finite = torch.isfinite(torch.diagonal(g, dim1=-2, dim2=-1).sum(-1)).tolist()
    if not all(finite):
        raise names.non_finite(side, finite.index(False))
    return g


def _rbf_from_linear(g: Tensor, factor: float) -> Tensor:
    """RBF Grams ``(L, b, b)`` from linear Grams ``g (L, b, b)`` with per-layer median bandwidth.

    σ_l = factor · median of the distances over pairs i < j (numpy's median); σ = 0 → ``K = [d = 0]``.
    """
    b = g.shape[-1]
    diag = torch.diagonal(g, dim1=-2, dim2=-1)
    d2 = (diag[:, :, None] + diag[:, None, :] - 2.0 * g).clamp_min(0.0)
    d2 = d2 * (1.0 - torch.eye(b, dtype=g.dtype, device=g.device))
    iu = torch.triu_indices(b, b, offset=1, device=g.device)
    sigma = factor * torch.quantile(d2[:, iu[0], iu[1]].sqrt(), 0.5, dim=1)
    two_s2 = (2.0 * sigma * sigma)[:, None, None]
    k = torch.exp(-d2 / torch.where(two_s2 > 0, two_s2, torch.ones_like(two_s2)))
    return torch.where(two_s2 > 0, k, (d2 == 0).to(g.dtype))


class _MinibatchPart:
    """Nguyen et al.'s minibatch CKA for any of linear_cka / unbiased_cka / rbf_cka, all pairs at once."""

    def __init__(self, metrics: list[str], dims_a: list[int], dims_b: list[int], null: int, seed: int,
                 rbf_factor: float, names: _Names):
        self.metrics, self.dims_a, self.dims_b = metrics, dims_a, dims_b
        self.null, self.seed, self.rbf_factor, self.names = null, seed, rbf_factor, names
        la, lb = len(dims_a), len(dims_b)
        self.s = _Sums()
        # n, batches seen, batches with b < 2, batches with b < 4
        self.s.add("counts", 4)
        for side, count in (("a", la), ("b", lb)):  # constancy: Σ‖HKH‖², Σ tr(HKH)² (shift-invariant)
            self.s.add(f"var_{side}", count)
            self.s.add(f"trsq_{side}", count)
        for m in metrics:
            self.s.add(f"{m}.cross", la, lb)
            self.s.add(f"{m}.self_a", la)
            self.s.add(f"{m}.self_b", lb)
            if null:
                self.s.add(f"{m}.null", null, la, lb)
        self.needs_gather = False

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int) -> None:
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
        ga = _batch_grams(acts_a, self.names, "a")
        gb = _batch_grams(acts_b, self.names, "b")
        perms = None
        if self.null:
            perms = _draw_perms(self.null, b, _perm_generator(self.seed, batch_index), ga.device)
        centred = {}
        for side, g in (("a", ga), ("b", gb)):
            c = center_gram(g)
            centred[side] = c
            s[f"var_{side}"].add_((c * c).sum((-2, -1)))
            s[f"trsq_{side}"].add_(torch.diagonal(c, dim1=-2, dim2=-1).sum(-1).square())
        for m in self.metrics:
            kind = KINDS[m]
            if kind == "unbiased":
                if b < 4:
                    continue
                scale = 1.0 / math.sqrt(b * (b - 3))
                fa, fb = u_center_gram(ga) * scale, u_center_gram(gb) * scale
            elif kind == "biased":
                fa, fb = centred["a"] / (b - 1), centred["b"] / (b - 1)
            else:
                fa = center_gram(_rbf_from_linear(ga, self.rbf_factor)) / (b - 1)
                fb = center_gram(_rbf_from_linear(gb, self.rbf_factor)) / (b - 1)
            self._add(m, fa, fb, perms)

    def _add(self, m: str, fa: Tensor, fb: Tensor, perms: Tensor | None) -> None:
        """Add one batch's HSIC streams of metric ``m`` from centred Grams ``fa (La, b, b)``, ``fb (Lb, b, b)``."""
        s = self.s
        la, lb, b = fa.shape[0], fb.shape[0], fa.shape[-1]
        flat_a, flat_b = fa.reshape(la, b * b), fb.reshape(lb, b * b)
        s[f"{m}.cross"].addmm_(flat_a, flat_b.T)
        s[f"{m}.self_a"].add_((flat_a * flat_a).sum(1))
        s[f"{m}.self_b"].add_((flat_b * flat_b).sum(1))
        if perms is not None:  # B's Grams permuted, a few draws at a time (≤ 2**25 entries held)
            step = max(1, 2**25 // (lb * b * b))
            for first in range(0, perms.shape[0], step):
                chunk = perms[first:first + step]
                k = chunk.shape[0]
                permuted = fb[:, chunk[:, :, None], chunk[:, None, :]]  # (Lb, k, b, b)
                prod = flat_a @ permuted.reshape(lb * k, b * b).T  # (La, Lb·k)
                s[f"{m}.null"][first:first + k].add_(prod.reshape(la, lb, k).permute(2, 0, 1))

    def state(self) -> list[Tensor]:
        return self.s.list()

    def merge(self, other: _MinibatchPart) -> None:
        self.s.merge(other.s)

    def _constant(self) -> tuple[Tensor, Tensor]:
        """Constant layers ``(La,), (Lb,)`` bool: ``Σ‖HKH‖² ≤ 1e-9 · Σ tr(HKH)²``.

        Any non-constant batch has ``‖HKH‖_F² ≥ tr(HKH)² / b``; a constant layer is shifted by its own
        value (its first row, see :mod:`simkit.metrics.gram`), so both sums are exactly 0 for it.
        """
        s = self.s
        return (s["var_a"] <= 1e-9 * s["trsq_a"], s["var_b"] <= 1e-9 * s["trsq_b"])

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        s = self.s
        self.names.check_finite(("a", s["var_a"]), ("b", s["var_b"]))
        counts = s["counts"].tolist()
        const_a, const_b = self._constant()
        out = {}
        for m in self.metrics:
            used = counts[1] - counts[2] - (counts[3] if KINDS[m] == "unbiased" else 0)
            least = 4 if KINDS[m] == "unbiased" else 2
            if used <= 0:
                raise SimkitError(f"minibatch {m} needs batches of at least {least} samples and got none; "
                                  "raise --batch-size (or use --mode exact)")
            skipped = counts[1] - used
            if skipped:
                warnings.warn(f"minibatch {m}: skipped {int(skipped)} batch(es) with fewer than {least} "
                              "samples", RuntimeWarning, stacklevel=3)
            value = _mask_constant(_ratio(s[f"{m}.cross"], s[f"{m}.self_a"], s[f"{m}.self_b"]),
                                   const_a, const_b)
            self.names.warn_constant(m, const_a, const_b)
            out[m] = {"value": value.cpu().numpy()}
            if self.null:
                den = (s[f"{m}.self_a"][:, None] * s[f"{m}.self_b"][None, :]).clamp_min(0).sqrt()
                null = _mask_constant(s[f"{m}.null"] / den, const_a, const_b)
                out[m].update(_null_summary(null))
        return out

    def describe(self) -> dict[str, dict]:
        counts = self.s["counts"].tolist()
        out = {}
        for m in self.metrics:
            skipped = counts[2] + (counts[3] if KINDS[m] == "unbiased" else 0)
            out[m] = {"mode": "minibatch", "path": "gram", "n": int(counts[0]), "batches": int(counts[1]),
                      "skipped_batches": int(skipped),
                      "hsic": "unbiased HSIC_1" if KINDS[m] == "unbiased" else "biased HSIC",
                      "kernel": "rbf" if m == "rbf_cka" else "linear", "null": self.null}
            if m == "rbf_cka":
                out[m]["bandwidth"] = f"{self.rbf_factor} x per-batch median pairwise distance"
        return out


# --------------------------------------------------------------------------- exact (feature space)


def feature_path_bytes(dims_a: Sequence[int], dims_b: Sequence[int], itemsize: int = 4) -> int:
    """Peak bytes of the exact feature-space path: the float64 sums, one batch's product (in the
    activations' dtype and in float64), one layer block at the end, and the small vectors."""
    p, q = sum(dims_a), sum(dims_b)
    return (16 + itemsize) * p * q + 8 * (sum(d * d for d in dims_a) + sum(d * d for d in dims_b)) \
        + 16 * max(dims_a) * q + 16 * (p + q) * (len(dims_a) + len(dims_b) + 2)


def _shift_sums(s: dict[str, Tensor], c: Tensor, dx: Tensor, dy: Tensor, dims_a: list[int],
                dims_b: list[int], seg_a: Tensor, seg_b: Tensor) -> tuple[Tensor, Tensor]:
    """Re-reference the feature-path sums ``s`` (taken about shifts c_x, c_y) to ``c_x − dx, c_y − dy``.

    In place on every entry of ``s`` except ``"cross"``; ``c`` (P, Q) is the float64 cross sum
    ``Σ x' y'ᵀ`` (read only). Returns ``(U (P, 2), V (2, Q))``: the new cross sum is ``c + U @ V``.
    Exact algebra in float64 with x'' = x' + δ, y'' = y' + ε (u = x'·δ, v = y'·ε per layer).
    """
    la, lb = len(dims_a), len(dims_b)
    n = float(s["n"].item())
    dd_x, dd_y = _segsum(dx * dx, seg_a, la, 0), _segsum(dy * dy, seg_b, lb, 0)
    sx, sy, tx, ty = s["sx"].clone(), s["sy"].clone(), s["tx"].clone(), s["ty"].clone()
    su_x, su_y = _segsum(sx * dx, seg_a, la, 0), _segsum(sy * dy, seg_b, lb, 0)   # Σ_r u, Σ_r v
    cy = torch.empty(len(dx), lb, dtype=torch.float64, device=dx.device)         # Σ_r x'_r v_r
    start = 0
    for j, w in enumerate(dims_b):
        cy[:, j] = c[:, start:start + w] @ dy[start:start + w]
        start += w
    cx = torch.empty(len(dy), la, dtype=torch.float64, device=dx.device)         # Σ_r y'_r u_r
    start = 0
    for i, w in enumerate(dims_a):
        cx[:, i] = c[start:start + w].T @ dx[start:start + w]
        start += w
    quad = _segsum(dx[:, None] * cy, seg_a, la, 0)                                 # Σ_r u v
    a_v = _segsum(dy[:, None] * s["y_rx"], seg_b, lb, 0).T                         # Σ_r ‖x'‖² v
    u_b = _segsum(dx[:, None] * s["x_ry"], seg_a, la, 0)                           # Σ_r u ‖y'‖²
    su2_x, sdx = _self_products(s["self_x"], dims_a, dx)
    su2_y, sdy = _self_products(s["self_y"], dims_b, dy)
    au_x = _segsum(dx * s["x_rx"], seg_a, la, 0)
    au_y = _segsum(dy * s["y_ry"], seg_b, lb, 0)
    tx_new, ty_new = tx + 2 * su_x + n * dd_x, ty + 2 * su_y + n * dd_y
    s["rr_xy"].add_(2 * a_v + dd_y[None, :] * tx[:, None] + 2 * u_b + 4 * quad
                    + 2 * dd_y[None, :] * su_x[:, None] + dd_x[:, None] * ty[None, :]
                    + 2 * dd_x[:, None] * su_y[None, :] + n * dd_x[:, None] * dd_y[None, :])
    s["rr_xx"].add_(4 * au_x + 2 * dd_x * tx + 4 * su2_x + 4 * dd_x * su_x + n * dd_x * dd_x)
    s["rr_yy"].add_(4 * au_y + 2 * dd_y * ty + 4 * su2_y + 4 * dd_y * su_y + n * dd_y * dd_y)
    s["x_ry"].add_(2 * cy + sx[:, None] * dd_y[None, :] + dx[:, None] * ty_new[None, :])
    s["y_rx"].add_(2 * cx + sy[:, None] * dd_x[None, :] + dy[:, None] * tx_new[None, :])
    s["x_rx"].add_(2 * sdx + dd_x[seg_a] * sx + dx * tx_new[seg_a])
    s["y_ry"].add_(2 * sdy + dd_y[seg_b] * sy + dy * ty_new[seg_b])
    for key, dims, d, sums in (("self_x", dims_a, dx, sx), ("self_y", dims_b, dy, sy)):
        start = off = 0
        for w in dims:  # S'' = S + Σx' δᵀ + δ Σx'ᵀ + n δδᵀ as one rank-2 product
            sl = slice(start, start + w)
            s[key][off:off + w * w].view(w, w).addmm_(torch.stack([sums[sl], d[sl]], 1),
                                                       torch.stack([d[sl], sums[sl] + n * d[sl]], 0))
            start, off = start + w, off + w * w
    s["sx"].add_(n * dx)
    s["sy"].add_(n * dy)
    s["tx"].copy_(tx_new)
    s["ty"].copy_(ty_new)
    return torch.stack([sx, dx], 1), torch.stack([dy, sy + n * dy], 0)


def _self_products(blocks: Tensor, dims: list[int], d: Tensor) -> tuple[Tensor, Tensor]:
    """Per layer ``δᵀ S δ`` ``(L,)`` and the stacked ``S δ`` ``(P,)`` from flattened self blocks."""
    quads, prods = [], []
    start = off = 0
    for w in dims:
        v = blocks[off:off + w * w].view(w, w) @ d[start:start + w]
        prods.append(v)
        quads.append(d[start:start + w] @ v)
        start, off = start + w, off + w * w
    return torch.stack(quads), torch.cat(prods)


class _FeaturePart:
    """Exact linear and unbiased CKA of all pairs from streamed feature-space sums (memory ∝ P·Q)."""

    def __init__(self, metrics: list[str], dims_a: list[int], dims_b: list[int], names: _Names):
        self.metrics, self.dims_a, self.dims_b, self.names = metrics, dims_a, dims_b, names
        la, lb, p, q = len(dims_a), len(dims_b), sum(dims_a), sum(dims_b)
        self.s = s = _Sums()
        s.add("n", 1)
        s.add("sx", p)                     # Σ x
        s.add("sy", q)
        s.add("cross", p, q)               # Σ x yᵀ
        s.add("self_x", sum(d * d for d in dims_a))   # Σ x_i x_iᵀ, layer blocks flattened
        s.add("self_y", sum(d * d for d in dims_b))
        s.add("tx", la)                    # Σ ‖x_i‖² per layer
        s.add("ty", lb)
        s.add("rr_xy", la, lb)             # Σ_r ‖x_r‖² ‖y_r‖²
        s.add("rr_xx", la)                 # Σ_r ‖x_r‖⁴
        s.add("rr_yy", lb)
        s.add("x_ry", p, lb)               # Σ_r x_r ‖y_r‖²
        s.add("y_rx", q, la)
        s.add("x_rx", p)                   # Σ_r x_r ‖x_r‖² (own layer)
        s.add("y_ry", q)
        self.seg_a, self.seg_b = _segments(dims_a), _segments(dims_b)
        self.shift: dict[str, Tensor | None] = {"x": None, "y": None}
        self.dtype: torch.dtype | None = None
        self.needs_gather = False

    def _side(self, acts: Sequence[Tensor], side: str, bs: dict[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Concatenate one model's layers, centre them on the batch mean, put this side's sums in ``bs``.

        The batch's sums are taken about its own mean ``m``: the batch-centred ``x̃ = x − m`` (compute
        dtype) feeds the float32 products, ``x̃`` in float64 the rest, so they depend on the batch alone.
        Returns (x̃ (b, P) compute dtype, x̃ (b, P) float64, δ = m − c (P,) float64: the shift to apply).
        """
        seg, dims = (self.seg_a, self.dims_a) if side == "x" else (self.seg_b, self.dims_b)
        dtype = torch.float64 if any(a.dtype == torch.float64 for a in acts) else torch.float32
        x = torch.cat([a.detach().to(dtype) for a in acts], 1)
        mean = x.mean(0, dtype=torch.float64).to(dtype)  # exact for a constant column
        xt = x - mean
        if self.shift[side] is None:
            self.dtype = dtype
            self.shift[side] = mean.double()
        xd = xt.double()
        bs["s" + side] = col = xd.sum(0)
        bad = torch.nonzero(~torch.isfinite(col)).flatten()[:1].tolist()  # one sum per column
        if bad:
            raise self.names.non_finite("a" if side == "x" else "b", int(seg[bad[0]]))
        rows = _segsum(xd * xd, seg, len(dims), 1)
        bs["t" + side] = rows.sum(0)
        bs[f"rr_{side}{side}"] = (rows * rows).sum(0)
        bs[f"{side}_r{side}"] = (xd * rows[:, seg]).sum(0)
        bs[f"_rows_{side}"] = rows
        blocks = torch.empty(sum(d * d for d in dims), dtype=torch.float64, device=x.device)
        start = off = 0
        for d in dims:  # per-layer self products, in the compute dtype
            sl = slice(start, start + d)
            blocks[off:off + d * d].view(d, d).copy_(xt[:, sl].T @ xt[:, sl])
            start, off = start + d, off + d * d
        bs["self_" + side] = blocks
        return xt, xd, mean.double() - self.shift[side]

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int) -> None:
        s = self.s
        dev = acts_a[0].device
        s.to(dev)
        self.seg_a, self.seg_b = self.seg_a.to(dev), self.seg_b.to(dev)
        bs: dict[str, Tensor] = {"n": torch.full((1,), float(b), dtype=torch.float64, device=dev)}
        xt, xd, dx = self._side(acts_a, "x", bs)
        yt, yd, dy = self._side(acts_b, "y", bs)
        if xt.dtype != yt.dtype:
            xt, yt = xd, yd
        rx, ry = bs.pop("_rows_x"), bs.pop("_rows_y")
        bs["rr_xy"] = rx.T @ ry
        bs["x_ry"] = xd.T @ ry
        bs["y_rx"] = yd.T @ rx
        cross = (xt.T @ yt).double()  # the one big product, in the activations' dtype
        shift = None
        if bool((dx != 0).any() or (dy != 0).any()):  # move the batch's sums to the reference shifts
            shift = _shift_sums(bs, cross, dx, dy, self.dims_a, self.dims_b, self.seg_a, self.seg_b)
        for key, value in bs.items():
            s[key].add_(value)
        s["cross"].add_(cross)
        if shift is not None:
            s["cross"].addmm_(*shift)

    def shifts(self) -> list[Tensor]:
        """The reference shifts ``[(P,), (Q,)]`` float64 the sums are taken about (first batch's means)."""
        return [self.shift[k].clone() if self.shift[k] is not None else
                torch.zeros(sum(d), dtype=torch.float64) for k, d in (("x", self.dims_a), ("y", self.dims_b))]

    def rebase(self, shifts: Sequence[Tensor]) -> None:
        """Re-reference every sum to new shifts ``[(P,), (Q,)]`` (exact algebra in float64).

        Precise when the new shifts are close to the old ones (e.g. another rank's first-batch means).
        """
        dtype = self.dtype or torch.float64
        new = {k: t.detach().to(dtype).double() for k, t in zip("xy", shifts, strict=True)}
        if self.shift["x"] is None:
            self.shift.update(new)
            return
        s = self.s
        dev = s["sx"].device
        dx, dy = self.shift["x"] - new["x"].to(dev), self.shift["y"] - new["y"].to(dev)  # x'' = x' + δ
        u, v = _shift_sums(s.t, s["cross"], dx, dy, self.dims_a, self.dims_b, self.seg_a.to(dev),
                           self.seg_b.to(dev))
        s["cross"].addmm_(u, v)
        self.shift.update({k: v.to(dev) for k, v in new.items()})

    def state(self) -> list[Tensor]:
        return self.s.list()

    def merge(self, other: _FeaturePart) -> None:
        """Add ``other``'s sums after re-referencing them (in place) to this part's shifts."""
        if self.shift["x"] is None:
            self.shift, self.dtype = dict(other.shift), other.dtype
        elif other.shift["x"] is not None:
            other.rebase(self.shifts())
        self.s.merge(other.s)

    @staticmethod
    def _constant(blocks: Tensor, sums: Tensor, shift: Tensor, dims: list[int], n: float) -> Tensor:
        """Constant layers ``(L,)`` bool: every column has ``Σ (x − x̄)² ≤ CONSTANT_RTOL · Σ x²``.

        :func:`simkit.metrics._checks.is_constant`'s rule, from the sums about the reference shift ``c``:
        ``Σ (x − c)²`` is the self block's diagonal, so the centred sum is ``diag − (Σ (x − c))²/n`` and
        the sum about zero ``diag + 2c·Σ (x − c) + n·c²``, all in float64. A column that is constant up
        to float rounding counts as constant; so does a layer whose columns all do.
        """
        diag, off = [], 0
        for d in dims:
            diag.append(blocks[off:off + d * d].view(d, d).diagonal())
            off += d * d
        about_shift = torch.cat(diag)
        shift = shift.to(sums.device)
        centred = about_shift - sums * sums / n
        about_zero = about_shift + 2 * shift * sums + n * shift * shift
        column_constant = (centred <= CONSTANT_RTOL * about_zero).double()
        seg = _segments(dims, sums.device)
        return _segsum(column_constant, seg, len(dims), 0) == torch.as_tensor(dims, device=sums.device)

    def _self_terms(self, blocks: Tensor, mu: Tensor, dims: list[int], n: float,
                    ) -> tuple[Tensor, Tensor]:
        """Per layer ‖S_c‖² and μᵀ S μ from the flattened self blocks: two ``(L,)`` tensors."""
        fro, quad = [], []
        start = off = 0
        for d in dims:
            block = blocks[off:off + d * d].view(d, d)
            u = mu[start:start + d]
            centred = block - n * torch.outer(u, u)
            fro.append((centred * centred).sum())
            quad.append(u @ block @ u)
            start, off = start + d, off + d * d
        return torch.stack(fro), torch.stack(quad)

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        s = self.s
        n = float(s["n"].item())
        la, lb = len(self.dims_a), len(self.dims_b)
        seg_a, seg_b = self.seg_a.to(s["sx"].device), self.seg_b.to(s["sx"].device)
        self.names.check_finite(("a", s["tx"] + s["rr_xx"]), ("b", s["ty"] + s["rr_yy"]))
        if "unbiased_cka" in self.metrics and n < 4:
            raise SimkitError(f"unbiased CKA needs at least 4 samples, got {int(n)}; use more samples (--n)")
        if n < 2:
            raise SimkitError(f"linear CKA needs at least 2 samples, got {int(n)}; use more samples (--n)")
        mux, muy = s["sx"] / n, s["sy"] / n
        mxn, myn = _segsum(mux * mux, seg_a, la, 0), _segsum(muy * muy, seg_b, lb, 0)
        nx, ny = s["tx"] - n * mxn, s["ty"] - n * myn  # ‖X_c‖², ‖Y_c‖²
        # cross terms, one A layer (all B layers) at a time: ‖C_c‖² and μxᵀ C μy per block
        fro = torch.empty(la, lb, dtype=torch.float64, device=mux.device)
        quad = torch.empty_like(fro)
        start = 0
        for i, d in enumerate(self.dims_a):
            c = s["cross"][start:start + d]
            u = mux[start:start + d]
            centred = c - n * torch.outer(u, muy)
            fro[i] = _segsum((centred * centred).sum(0), seg_b, lb, 0)
            quad[i] = _segsum((u @ c) * muy, seg_b, lb, 0)
            start += d
        fro_a, quad_a = self._self_terms(s["self_x"], mux, self.dims_a, n)
        fro_b, quad_b = self._self_terms(s["self_y"], muy, self.dims_b, n)
        # ⟨rowsq(X_c), rowsq(Y_c)⟩ expanded in the sums about the reference shifts
        a_y = _segsum(muy[:, None] * s["y_rx"], seg_b, lb, 0).T      # (La, Lb): μ_yᵀ Σ y ‖x‖²
        a_x = _segsum(mux[:, None] * s["x_ry"], seg_a, la, 0)        # (La, Lb): μ_xᵀ Σ x ‖y‖²
        rc = (s["rr_xy"] - 2 * a_y - 2 * a_x + 4 * quad + myn[None, :] * s["tx"][:, None]
              + mxn[:, None] * s["ty"][None, :] - 3 * n * mxn[:, None] * myn[None, :])
        rc_a = (s["rr_xx"] - 4 * _segsum(mux * s["x_rx"], seg_a, la, 0) + 4 * quad_a
                + 2 * mxn * s["tx"] - 3 * n * mxn * mxn)
        rc_b = (s["rr_yy"] - 4 * _segsum(muy * s["y_ry"], seg_b, lb, 0) + 4 * quad_b
                + 2 * myn * s["ty"] - 3 * n * myn * myn)
        const_a = self._constant(s["self_x"], s["sx"], self.shift["x"], self.dims_a, n)
        const_b = self._constant(s["self_y"], s["sy"], self.shift["y"], self.dims_b, n)
        out = {}
        for m in self.metrics:
            if m == "linear_cka":
                value = _ratio(fro, fro_a, fro_b)
            else:  # n(n−3)·HSIC_1 = ‖X_cᵀY_c‖² − n/(n−2)⟨rowsq, rowsq⟩ + ‖X_c‖²‖Y_c‖²/((n−1)(n−2))
                k1, k2 = n / (n - 2), 1.0 / ((n - 1) * (n - 2))
                h = fro - k1 * rc + k2 * nx[:, None] * ny[None, :]
                value = _ratio(h, fro_a - k1 * rc_a + k2 * nx * nx, fro_b - k1 * rc_b + k2 * ny * ny)
            self.names.warn_constant(m, const_a, const_b)
            out[m] = {"value": _mask_constant(value, const_a, const_b).cpu().numpy()}
        return out

    def describe(self) -> dict[str, dict]:
        n = int(self.s["n"].item())
        return {m: {"mode": "exact", "path": "features", "n": n,
                    "hsic": "unbiased HSIC_1" if m == "unbiased_cka" else "biased HSIC",
                    "kernel": "linear", "null": 0,
                    "state_bytes": sum(t.numel() * 8 for t in self.s.list())} for m in self.metrics}


# -------------------------------------------------------------------------- exact (stored activations)


class _GramRows:
    """Rows of one layer's centred (``biased``), U-centred (``unbiased``) or centred RBF Gram, on demand.

    x: ``(n, p)`` stored activations. ``rows(idx)`` → ``(len(idx), n)`` float64, never the whole n × n.
    """

    def __init__(self, x: Tensor, kind: str, factor: float, chunk: int, constant: bool):
        self.kind, self.n, self.constant = kind, x.shape[0], constant
        dtype = _compute_dtype(x)
        x = x.to(dtype)
        self.xc = x - x.mean(0, dtype=torch.float64).to(dtype)
        if constant:
            return
        n = self.n
        if kind == "unbiased":  # m of the U-centring from column sums of K̃ = K − diag(K)
            xd = self.xc.double()
            rowsq = (xd * xd).sum(1)
            colsum = xd @ xd.sum(0) - rowsq
            m = colsum / (n - 2)
            self.m = m - m.sum() / (2 * (n - 1))
        elif kind == "rbf":
            self.sq = (self.xc.double() ** 2).sum(1)
            self.sigma = factor * _median_distance_chunked(self, chunk)
            if not self.sigma > 0:
                raise SimkitError("RBF bandwidth is 0: the median pairwise distance of a layer is 0 (most "
                                  "samples are duplicates); use linear CKA for this layer")
            means = torch.cat([self._rbf(torch.arange(s, min(n, s + chunk), device=x.device)).mean(1)
                               for s in range(0, n, chunk)])
            self.row_mean, self.grand = means, means.mean()

    def _sqdist(self, idx: Tensor) -> Tensor:
        g = (self.xc[idx] @ self.xc.T).double()
        d2 = (self.sq[idx, None] + self.sq[None, :] - 2.0 * g).clamp_min(0.0)
        d2[torch.arange(len(idx), device=idx.device), idx] = 0.0
        return d2

    def _rbf(self, idx: Tensor) -> Tensor:
        return torch.exp(-self._sqdist(idx) / (2.0 * self.sigma * self.sigma))

    def rows(self, idx: Tensor) -> Tensor:
        if self.constant:
            return torch.zeros(len(idx), self.n, dtype=torch.float64, device=idx.device)
        if self.kind == "biased":
            return (self.xc[idx] @ self.xc.T).double()
        if self.kind == "unbiased":
            g = (self.xc[idx] @ self.xc.T).double() - self.m[idx, None] - self.m[None, :]
            g[torch.arange(len(idx), device=idx.device), idx] = 0.0
            return g
        return self._rbf(idx) - self.row_mean[idx, None] - self.row_mean[None, :] + self.grand


def _median_distance_chunked(rows: _GramRows, chunk: int) -> float:
    """Exact median Euclidean distance over pairs i < j (numpy's median), ``n(n−1)/2`` values held."""
    from simkit.metrics._checks import exact_quantile

    n = rows.n
    parts = []
    for s in range(0, n, chunk):
        idx = torch.arange(s, min(n, s + chunk), device=rows.xc.device)
        d2 = rows._sqdist(idx)
        upper = torch.arange(n, device=idx.device)[None, :] > idx[:, None]
        parts.append(d2[upper].sqrt())
    return float(exact_quantile(torch.cat(parts), 0.5))


class _StoredPart:
    """Metrics that need all activations at once: exact-mode Gram-path CKA and mutual k-NN."""

    def __init__(self, metrics: list[str], mode: str, dims_a: list[int], dims_b: list[int], null: int,
                 seed: int, rbf_factor: float, knn_k: int, memory_budget_bytes: int, max_stored_n: int,
                 names: _Names, reasons: dict[str, str]):
        self.metrics, self.mode, self.dims_a, self.dims_b = metrics, mode, dims_a, dims_b
        self.null, self.seed, self.rbf_factor, self.knn_k = null, seed, rbf_factor, knn_k
        self.budget, self.max_n, self.names, self.reasons = memory_budget_bytes, max_stored_n, names, reasons
        self.chunks_a: list[list[Tensor]] = []
        self.chunks_b: list[list[Tensor]] = []
        self.indices: list[int] = []  # global batch index of every stored chunk (order of the data)
        self.n = 0
        self.needs_gather = True

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int) -> None:
        if self.n + b > self.max_n:
            raise SimkitError(
                f"{', '.join(self.metrics)} in {self.mode} mode store all activations and n would exceed "
                f"max_stored_n={self.max_n}; use --mode minibatch (CKA metrics), --reduce mean, or a smaller --n")
        self.names.check_finite(("a", torch.stack([a.detach().sum(dtype=torch.float64) for a in acts_a])),
                                ("b", torch.stack([t.detach().sum(dtype=torch.float64) for t in acts_b])))
        self.chunks_a.append([_own(a) for a in acts_a])
        self.chunks_b.append([_own(t) for t in acts_b])
        self.indices.append(batch_index)
        self.n += b

    def state(self) -> list[Tensor]:
        return []

    def merge(self, other: _StoredPart) -> None:
        self.chunks_a += other.chunks_a
        self.chunks_b += other.chunks_b
        self.indices += other.indices
        self.n += other.n

    def gather(self, device: torch.device | None) -> None:
        """Collect every rank's stored chunks on every rank (``all_gather_object``, through the CPU)."""
        import torch.distributed as dist

        mine = (self.indices, [[t.cpu() for t in c] for c in self.chunks_a],
                [[t.cpu() for t in c] for c in self.chunks_b])
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        dev = device if device is not None else (self.chunks_a[0][0].device if self.chunks_a else None)
        self.indices, self.chunks_a, self.chunks_b = [], [], []
        for indices, chunks_a, chunks_b in everyone:
            self.indices += indices
            self.chunks_a += [[t.to(dev) for t in c] for c in chunks_a]
            self.chunks_b += [[t.to(dev) for t in c] for c in chunks_b]
        self.n = sum(len(c[0]) for c in self.chunks_a)

    def _layers(self) -> tuple[list[Tensor], list[Tensor]]:
        """All stored samples per layer, in global batch order: ``[(n, p_i)]``, ``[(n, q_j)]``."""
        order = sorted(range(len(self.indices)), key=self.indices.__getitem__)
        xa = [torch.cat([self.chunks_a[k][i] for k in order]) for i in range(len(self.dims_a))]
        xb = [torch.cat([self.chunks_b[k][j] for k in order]) for j in range(len(self.dims_b))]
        return xa, xb

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        n = self.n
        if n == 0:
            raise SimkitError("no samples were given to the accumulator; check --data and --n")
        xa, xb = self._layers()
        self.names.check_finite(("a", torch.stack([x.double().sum() for x in xa])),
                                ("b", torch.stack([x.double().sum() for x in xb])))
        const_a = torch.tensor([is_constant(x) for x in xa], device=xa[0].device)
        const_b = torch.tensor([is_constant(x) for x in xb], device=xa[0].device)
        out = {}
        perms = None
        if self.null:
            perms = _draw_perms(self.null, n, _perm_generator(self.seed, -1), xa[0].device)
        for m in self.metrics:
            if m == "mutual_knn":
                result = self._knn(xa, xb, perms, const_a, const_b)
            else:
                least = 4 if m == "unbiased_cka" else 2
                if n < least:
                    raise SimkitError(f"{m} needs at least {least} samples, got {n}; use more samples (--n)")
                result = self._gram(m, xa, xb, perms, const_a, const_b)
            self.names.warn_constant(m, const_a, const_b)
            out[m] = {k: (v if isinstance(v, np.ndarray) else v.cpu().numpy()) for k, v in result.items()}
        return out

    def _chunk(self, layers: int) -> int:
        """Rows per block so that ``layers`` blocks of ``rows × n`` float64 use a quarter of the budget."""
        return max(1, min(self.n, self.budget // (4 * 8 * max(1, layers) * self.n)))

    def _gram(self, m: str, xa: list[Tensor], xb: list[Tensor], perms: Tensor | None, const_a: Tensor,
              const_b: Tensor) -> dict:
        n, kind = self.n, KINDS[m]
        la, lb = len(xa), len(xb)
        chunk = self._chunk(la + lb)
        if kind == "rbf" and 16 * n * n > self.budget:
            raise SimkitError(f"exact rbf_cka needs the median of all {n * (n - 1) // 2} pairwise distances "
                              f"({16 * n * n} bytes) over memory_budget_bytes={self.budget}; "
                              "use --mode minibatch or a smaller --n")
        ga = [_GramRows(x, kind, self.rbf_factor, chunk, bool(c)) for x, c in zip(xa, const_a, strict=True)]
        gb = [_GramRows(x, kind, self.rbf_factor, chunk, bool(c)) for x, c in zip(xb, const_b, strict=True)]
        dev = xa[0].device
        cross = torch.zeros(la, lb, dtype=torch.float64, device=dev)
        self_a = torch.zeros(la, dtype=torch.float64, device=dev)
        self_b = torch.zeros(lb, dtype=torch.float64, device=dev)
        null = torch.zeros(self.null, la, lb, dtype=torch.float64, device=dev)
        for start in range(0, n, chunk):
            idx = torch.arange(start, min(n, start + chunk), device=dev)
            rows_a = torch.stack([g.rows(idx) for g in ga]).reshape(la, -1)
            rows_b = torch.stack([g.rows(idx) for g in gb]).reshape(lb, -1)
            cross.addmm_(rows_a, rows_b.T)
            self_a.add_((rows_a * rows_a).sum(1))
            self_b.add_((rows_b * rows_b).sum(1))
            for k in range(self.null):  # B's Gram with samples permuted: L[π, π], rows idx
                pk = perms[k]
                rows_bk = torch.stack([g.rows(pk[idx])[:, pk] for g in gb]).reshape(lb, -1)
                null[k].addmm_(rows_a, rows_bk.T)
        result = {"value": _mask_constant(_ratio(cross, self_a, self_b), const_a, const_b)}
        if self.null:
            den = (self_a[:, None] * self_b[None, :]).clamp_min(0).sqrt()
            result.update(_null_summary(_mask_constant(null / den, const_a, const_b)))
        return result

    def _knn(self, xa: list[Tensor], xb: list[Tensor], perms: Tensor | None, const_a: Tensor,
             const_b: Tensor) -> dict:
        """Mutual k-NN of all pairs from each layer's neighbour sets, as sets of edge codes ``r·n + s``.

        A constant layer's neighbours are all ties: its pairs are NaN, as for CKA."""
        n, k = self.n, self.knn_k
        if k > n - 1:
            raise SimkitError(f"mutual_knn with k={k} needs at least {k + 1} samples, got {n}; "
                              "use more samples or a smaller --knn-k")
        dev = xa[0].device
        rows = torch.arange(n, device=dev)[:, None]

        def neighbours(x: Tensor) -> Tensor:
            x = x.to(_compute_dtype(x))
            return knn_indices(clamp_normalize(x), k)

        codes_a = torch.stack([(rows * n + neighbours(x)).flatten() for x in xa])  # (La, n·k)
        idx_b = [neighbours(x) for x in xb]
        la, lb = len(xa), len(xb)
        layer_off = torch.arange(la, device=dev)[:, None] * (n * n)
        keys_a = (codes_a + layer_off).flatten()

        def overlap(nb: Tensor) -> Tensor:
            """Mean shared fraction of every A layer with one B neighbour set ``nb (n, k)`` → (La,)."""
            codes = (rows * n + nb).flatten()[None, :] + layer_off
            hits = torch.isin(codes.flatten(), keys_a).view(la, -1)
            return hits.sum(1).double() / (n * k)

        value = torch.stack([overlap(nb) for nb in idx_b], 1)
        result: dict = {"value": _mask_constant(value, const_a, const_b)}
        if self.null:
            null = torch.empty(self.null, la, lb, dtype=torch.float64, device=dev)
            for t in range(self.null):  # neighbours of Y[π]: π⁻¹ applied to Y's neighbours of π(i)
                pk = perms[t]
                inv = torch.empty_like(pk)
                inv[pk] = torch.arange(n, device=dev)
                for j, nb in enumerate(idx_b):
                    null[t, :, j] = overlap(inv[nb[pk]])
            result.update(_null_summary(_mask_constant(null, const_a, const_b)))
        return result

    def describe(self) -> dict[str, dict]:
        out = {}
        stored = sum(sum(t.numel() * t.element_size() for t in c) for c in self.chunks_a + self.chunks_b)
        for m in self.metrics:
            path = "stored-knn" if m == "mutual_knn" else "stored-gram"
            out[m] = {"mode": self.mode, "path": path, "n": self.n, "null": self.null,
                      "stored_bytes": stored, "reason": self.reasons.get(m, "")}
            if m == "mutual_knn":
                out[m].update(k=self.knn_k, note="computed on all samples in either mode")
            else:
                out[m].update(hsic="unbiased HSIC_1" if m == "unbiased_cka" else "biased HSIC",
                              kernel="rbf" if m == "rbf_cka" else "linear")
            if m == "rbf_cka":
                out[m]["bandwidth"] = f"{self.rbf_factor} x median pairwise distance over all samples"
        return out


# ------------------------------------------------------------------------------------ the accumulator


class Accumulator:
    """All chosen metrics over all layer pairs, fed batch by batch (see the module docstring)."""

    def __init__(self, parts: list, metrics: list[str], dims_a: list[int], dims_b: list[int]):
        self.parts, self.metrics, self.dims_a, self.dims_b = parts, metrics, dims_a, dims_b
        self.calls = 0

    @property
    def needs_gather(self) -> bool:
        """True when some metric holds stored activations (ranks must ``merge``, not all_reduce)."""
        return any(p.needs_gather for p in self.parts)

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], batch_index: int | None = None,
               ) -> None:
        """Add one batch: ``acts_a`` L_a tensors ``(b, p_i)``, ``acts_b`` L_b tensors ``(b, q_j)``, same rows.

        ``batch_index``: the batch's global position (seeds the minibatch null, orders stored samples).
        Default: ``rank + world_size · calls``, the batch this rank gets under ``simkit.batches``'s
        round-robin split (``calls`` in one process).
        """
        b = _check_batch(acts_a, acts_b, self.dims_a, self.dims_b)
        if batch_index is None:
            batch_index = distributed.rank() + distributed.world_size() * self.calls
        self.calls += 1
        for part in self.parts:
            part.update(acts_a, acts_b, b, int(batch_index))

    def to(self, device: torch.device | str) -> Accumulator:
        """Move the sums to ``device`` (e.g. an accumulator that saw no batch, before an NCCL all_reduce)."""
        for part in self.parts:
            if hasattr(part, "s"):
                part.s.to(torch.device(device))
        return self

    def reduce_over_ranks(self, device: torch.device | str | None = None) -> None:
        """Combine this accumulator with every other rank's (a no-op in one process); call on all ranks.

        Aligns the feature path's reference shifts on rank 0's (broadcast + :meth:`rebase`),
        all-reduces every sum of :meth:`state` and all-gathers stored activations, so every rank then
        holds the accumulator of the whole data set, as if one process had seen every batch.
        """
        if not distributed.is_distributed():
            return
        import torch.distributed as dist

        if device is not None:
            self.to(device)
        shifts = self.shifts()
        if shifts:
            dev = self.state()[0].device
            shifts = [t.to(dev) for t in shifts]
            for t in shifts:
                dist.broadcast(t, src=0)
            self.rebase(shifts)
        for t in self.state():
            distributed.all_reduce_sum(t)
        for part in self.parts:
            if part.needs_gather:
                part.gather(None if device is None else torch.device(device))

    def state(self) -> list[Tensor]:
        """Every float64 sum (the live tensors): adding them in place across ranks combines the ranks."""
        return [t for part in self.parts for t in part.state()]

    def shifts(self) -> list[Tensor]:
        """The reference shifts (float64 tensors) of the exact feature path's sums; ``[]`` without one."""
        return [t for part in self.parts if isinstance(part, _FeaturePart) for t in part.shifts()]

    def rebase(self, shifts: Sequence[Tensor]) -> None:
        """Re-reference the feature path's sums to ``shifts`` (as returned by :meth:`shifts`, e.g. rank 0's)."""
        for part in self.parts:
            if isinstance(part, _FeaturePart):
                part.rebase(shifts)

    def merge(self, other: Accumulator) -> Accumulator:
        """Fold in ``other`` (built with the same arguments, fed other batches): sums add, stores append."""
        for mine, theirs in zip(self.parts, other.parts, strict=True):
            mine.merge(theirs)
        return self

    def compute(self) -> dict[str, dict[str, np.ndarray]]:
        """``{metric: {"value": (La, Lb)[, "null": (K, La, Lb), "null_mean", "null_p95"]}}`` in float64."""
        out = {}
        for part in self.parts:
            out.update(part.compute())
        return {m: out[m] for m in self.metrics}

    def describe(self) -> dict[str, dict]:
        """How each metric was computed: ``{metric: {"mode", "path", "n", ...}}``."""
        out = {}
        for part in self.parts:
            out.update(part.describe())
        return {m: out[m] for m in self.metrics}


def make_accumulator(metrics: Sequence[str], mode: str, dims_a: Sequence[int], dims_b: Sequence[int], *,
                     null: int = 0, seed: int = 0, rbf_factor: float = 1.0, knn_k: int = 10,
                     memory_budget_bytes: int = 2**30, max_stored_n: int = 50_000,
                     names_a: Sequence[str] | None = None, names_b: Sequence[str] | None = None,
                     ) -> Accumulator:
    """An accumulator of ``metrics`` for layers of widths ``dims_a`` (model A) × ``dims_b`` (model B).

    mode: ``"exact"`` (full-data values) or ``"minibatch"`` (Nguyen et al.'s averaged HSIC streams).
    null: K permutations of B's samples for a null distribution (0: none). names_*: layer names used in
    warnings and errors (default ``A[i]``, ``B[j]``). Paths and their memory: module docstring.
    """
    metrics = list(dict.fromkeys(metrics))
    for m in metrics:
        if m not in METRICS:
            from simkit.errors import unknown_name_error

            raise unknown_name_error("metric", m, METRICS, "valid: " + ", ".join(METRICS))
    if not metrics:
        raise SimkitError("no metric chosen; pass at least one of " + ", ".join(METRICS))
    if mode not in MODES:
        raise SimkitError(f"unknown mode {mode!r}; choose exact or minibatch")
    dims_a, dims_b = [int(d) for d in dims_a], [int(d) for d in dims_b]
    if not dims_a or not dims_b or min(dims_a + dims_b) < 1:
        raise SimkitError(f"every model needs at least one layer of width >= 1, got {dims_a} and {dims_b}")
    if int(null) != null or null < 0:
        raise SimkitError(f"null must be 0 or a positive number of permutations, got {null!r}")
    if not (math.isfinite(rbf_factor) and rbf_factor > 0):
        raise SimkitError(f"rbf_factor must be a positive number, got {rbf_factor!r}")
    if int(knn_k) != knn_k or knn_k < 1:
        raise SimkitError(f"knn_k must be a positive integer, got {knn_k!r}; the default is 10")
    names = _Names(names_a, names_b, len(dims_a), len(dims_b))
    cka = [m for m in metrics if m != "mutual_knn"]
    stored = [m for m in metrics if m == "mutual_knn"]
    reasons = {"mutual_knn": "k-NN needs all samples"}
    parts: list = []
    if mode == "minibatch" and cka:
        parts.append(_MinibatchPart(cka, dims_a, dims_b, int(null), seed, float(rbf_factor), names))
    elif mode == "exact":
        linear = [m for m in cka if m != "rbf_cka"]
        fits = feature_path_bytes(dims_a, dims_b) <= memory_budget_bytes
        if linear and fits and not null:
            parts.append(_FeaturePart(linear, dims_a, dims_b, names))
        else:
            why = ("a permutation null needs stored activations" if null else
                   f"the feature-space sums need {feature_path_bytes(dims_a, dims_b)} bytes "
                   f"> memory_budget_bytes={memory_budget_bytes}")
            reasons.update({m: why for m in linear})
            stored = linear + stored
        if "rbf_cka" in cka:
            reasons["rbf_cka"] = "RBF kernels need all samples"
            stored = ["rbf_cka"] + stored
    if stored:
        parts.append(_StoredPart(stored, mode, dims_a, dims_b, int(null), seed, float(rbf_factor), int(knn_k),
                                 int(memory_budget_bytes), int(max_stored_n), names, reasons))
    return Accumulator(parts, metrics, dims_a, dims_b)
