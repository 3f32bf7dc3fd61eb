"""Exact linear and unbiased CKA and the shape measures, path ``"features"``: feature-space sums
streamed over batches.

Memory is independent of ``n`` (about ``8·P·Q + 20·(Σp_i² + Σq_j²)`` bytes, :func:`feature_path_bytes`).
The sums are taken about a fixed reference shift per column (the first batch's mean) and can be
re-referenced exactly (the part's declared state is a :class:`~simkit.metrics.streaming.state.ShiftedSums`),
so the sums of two accumulators fed disjoint batches add. At the end the HSIC terms come from the sums and go through :mod:`simkit.metrics.cka`:
HSIC_1 from :func:`~simkit.metrics.cka.hsic1_from_terms`, the ratio from
:func:`~simkit.metrics.cka.cka_ratio`, and constant layers from the one rule
:func:`simkit.metrics._checks.constant_columns` applied to the sums. The shape measures (Procrustes,
CCA family, shape metric) use only the centred self blocks and the cross sum: each layer's covariance
spectrum once, then every pair (:mod:`simkit.metrics.streaming.shapes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.metrics._checks import constant_columns
from simkit.metrics.cka import cka_ratio, hsic1_from_terms
from simkit.metrics.settings import MeasureSettings
from simkit.metrics.shape import PROCRUSTES, SHAPE_MEASURES, Spectrum, spectrum_from_cov
from simkit.metrics.streaming.common import (
    Names,
    PhaseProgress,
    Values,
    cka_chance,
    mask_constant,
    segments,
    segsum,
)
from simkit.metrics.streaming.shapes import shape_notes, shape_settings, shape_values
from simkit.metrics.streaming.state import ShiftedSums, State

#: Rows of the cross sum centred at a time in :meth:`FeaturePart._cross_blocks` (a slab that stays in cache).
SLAB_BYTES = 1 << 22


def feature_path_bytes(dims_a: Sequence[int], dims_b: Sequence[int], itemsize: int = 4) -> int:
    """Bytes the exact feature-space path is budgeted (the routing's estimate, an upper bound of its peak):
    the float64 sums (each batch's products are added to them in place), ``(16 + itemsize)`` bytes per
    self-block entry (room for one layer's centred covariance and its decomposition at the end; no longer
    a per-batch copy, so this bound is loose), one A layer's centred cross block at the end (the shape
    measures'), and the small vectors."""
    p, q = sum(dims_a), sum(dims_b)
    return 8 * p * q + (16 + itemsize) * (sum(d * d for d in dims_a) + sum(d * d for d in dims_b)) \
        + 16 * max(dims_a) * q + 16 * (p + q) * (len(dims_a) + len(dims_b) + 2)


def _equal_width_runs(dims: list[int]) -> list[tuple[int, int, int, int]]:
    """Consecutive layers of equal width: ``(first column, offset in the flattened self blocks, width,
    count)`` per run."""
    runs: list[tuple[int, int, int, int]] = []
    start = off = 0
    for w in dims:
        if runs and runs[-1][2] == w:
            first, first_off, _, count = runs[-1]
            runs[-1] = (first, first_off, w, count + 1)
        else:
            runs.append((start, off, w, 1))
        start, off = start + w, off + w * w
    return runs


def _cross_terms(c: Tensor, dx: Tensor, dy: Tensor, dims_a: list[int],
                 dims_b: list[int]) -> tuple[Tensor, Tensor]:
    """The two terms of a shift taken from the float64 cross sum ``c = Σ x' y'ᵀ`` (P, Q):
    ``(cy (P, Lb), cx (Q, La))``, ``Σ_r x'_r v_r`` and ``Σ_r y'_r u_r`` (u = x'·δ, v = y'·ε per layer)."""
    cy = torch.empty(len(dx), len(dims_b), dtype=torch.float64, device=dx.device)
    start = 0
    for j, w in enumerate(dims_b):
        cy[:, j] = c[:, start:start + w] @ dy[start:start + w]
        start += w
    cx = torch.empty(len(dy), len(dims_a), dtype=torch.float64, device=dx.device)
    start = 0
    for i, w in enumerate(dims_a):
        cx[:, i] = c[start:start + w].T @ dx[start:start + w]
        start += w
    return cy, cx


def _move_sums(sums: ShiftedSums, dx: Tensor, dy: Tensor, *, dims_a: list[int], dims_b: list[int]) -> None:
    """The feature path's re-referencing (:data:`~simkit.metrics.streaming.state.Move`): every sum, the
    cross sum included, moved by ``dx``, ``dy`` (:func:`_shift_sums`)."""
    dev = dx.device
    terms = _cross_terms(sums["cross"], dx, dy, dims_a, dims_b)
    u, v = _shift_sums(sums.t, terms, dx, dy, dims_a, dims_b, segments(dims_a, dev), segments(dims_b, dev))
    sums["cross"].addmm_(u, v)


def _shift_sums(s: dict[str, Tensor], terms: tuple[Tensor, Tensor], dx: Tensor, dy: Tensor,
                dims_a: list[int], dims_b: list[int], seg_a: Tensor, seg_b: Tensor) -> tuple[Tensor, Tensor]:
    """Re-reference the feature-path sums ``s`` (taken about shifts c_x, c_y) to ``c_x − dx, c_y − dy``.

    In place on every entry of ``s`` except ``"cross"``; ``terms`` are the two terms the shift takes from
    the cross sum, ``(cy (P, Lb), cx (Q, La))`` (:func:`_cross_terms`).
    Returns ``(U (P, 2), V (2, Q))``: the new cross sum is ``c + U @ V``.
    Exact algebra in float64 with x'' = x' + δ, y'' = y' + ε (u = x'·δ, v = y'·ε per layer).
    """
    la, lb = len(dims_a), len(dims_b)
    n = float(s["n"].item())
    dd_x, dd_y = segsum(dx * dx, seg_a, la, 0), segsum(dy * dy, seg_b, lb, 0)
    sx, sy, tx, ty = s["sx"].clone(), s["sy"].clone(), s["tx"].clone(), s["ty"].clone()
    su_x, su_y = segsum(sx * dx, seg_a, la, 0), segsum(sy * dy, seg_b, lb, 0)   # Σ_r u, Σ_r v
    cy, cx = terms
    quad = segsum(dx[:, None] * cy, seg_a, la, 0)                                 # Σ_r u v
    a_v = segsum(dy[:, None] * s["y_rx"], seg_b, lb, 0).T                         # Σ_r ‖x'‖² v
    u_b = segsum(dx[:, None] * s["x_ry"], seg_a, la, 0)                           # Σ_r u ‖y'‖²
    su2_x, sdx = _self_products(s["self_x"], dims_a, dx)
    su2_y, sdy = _self_products(s["self_y"], dims_b, dy)
    au_x = segsum(dx * s["x_rx"], seg_a, la, 0)
    au_y = segsum(dy * s["y_ry"], seg_b, lb, 0)
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


def cca_chance(value: Tensor, spec_a: list[Spectrum], spec_b: list[Spectrum], n: float) -> Tensor:
    """The exact expectation of ``cca`` (mean squared canonical correlation, no ridge) under a random
    permutation of B's samples, ``max(r_x, r_y) / (n − 1)`` per pair (La, Lb): the permutations average B's
    projection of rank r_y to ``r_y/(n − 1)·H``, so ``E tr(P_X P_Y) = r_x·r_y/(n − 1)``. NaN where the value
    is NaN."""
    ranks_a = torch.tensor([s.rank for s in spec_a], dtype=torch.float64, device=value.device)
    ranks_b = torch.tensor([s.rank for s in spec_b], dtype=torch.float64, device=value.device)
    chance = torch.maximum(ranks_a[:, None], ranks_b[None, :]) / (n - 1)
    return torch.where(torch.isfinite(value), chance, value)


class FeaturePart:
    """Exact linear and unbiased CKA and the shape measures of all pairs from streamed feature-space sums
    (memory ∝ P·Q). ``mode``: the accumulator's mode, as recorded (shape measures use all samples in either).

    Declared state: one ``shifted_sum`` (``self.s``), about the shifts of A's and B's columns."""

    def __init__(self, metrics: list[str], dims_a: list[int], dims_b: list[int], names: Names,
                 settings: MeasureSettings | None = None, mode: str = "exact"):
        self.metrics, self.dims_a, self.dims_b, self.names = metrics, dims_a, dims_b, names
        self.settings, self.mode = settings or MeasureSettings(), mode
        la, lb, p, q = len(dims_a), len(dims_b), sum(dims_a), sum(dims_b)
        self.s = s = ShiftedSums((p, q), partial(_move_sums, dims_a=dims_a, dims_b=dims_b))
        self.states: list[State] = [s]
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
        self.seg_a, self.seg_b = segments(dims_a), segments(dims_b)
        self._runs = {"x": _equal_width_runs(dims_a), "y": _equal_width_runs(dims_b)}
        self._onehots: dict[tuple[str, torch.device], Tensor] = {}

    def _about_shift(self, acts: Sequence[Tensor], side: str) -> Tensor:
        """One model's layers concatenated, in float64, about this side's reference shift ``c``: ``x' = x − c``
        ``(b, P)``.

        The first batch sets ``c`` to its own mean. The difference is one float64 rounding of the exact
        (float32 or float64) activation, and exactly zero for a column equal to ``c``. Raises for a
        non-finite column sum (naming the layer) before any sum is touched.
        """
        seg = self.seg_a if side == "x" else self.seg_b
        xd = torch.cat([a.detach().to(torch.float64) for a in acts], 1)
        if self.s.shift[side] is None:
            self.s.offset(side, xd.mean(0))  # the first batch's mean becomes the reference shift
        xd.sub_(self.s.shifts()["xy".index(side)].to(xd.device))
        bad = torch.nonzero(~torch.isfinite(xd.sum(0))).flatten()[:1].tolist()  # one sum per column
        if bad:
            raise self.names.non_finite("a" if side == "x" else "b", int(seg[bad[0]]))
        return xd

    def _onehot(self, side: str, device: torch.device) -> Tensor:
        """The layer indicator of this side's columns, ``(P, L)`` float64 (built once per device):
        ``t @ onehot`` sums ``t``'s columns per layer."""
        key = (side, device)
        if key not in self._onehots:
            seg, count = (self.seg_a, len(self.dims_a)) if side == "x" else (self.seg_b, len(self.dims_b))
            onehot = torch.zeros(len(seg), count, dtype=torch.float64, device=device)
            onehot[torch.arange(len(seg), device=device), seg.to(device)] = 1.0
            self._onehots[key] = onehot
        return self._onehots[key]

    def _add_side(self, xd: Tensor, side: str) -> Tensor:
        """Add one side's own sums (``s``, ``t``, ``rr``, the self blocks) of ``xd (b, P)``, taken about the
        reference shift; returns each row's squared norm per layer ``(b, L)``."""
        s = self.s
        rows = (xd * xd) @ self._onehot(side, xd.device)
        s["s" + side].add_(xd.sum(0))
        s["t" + side].add_(rows.sum(0))
        s[f"rr_{side}{side}"].add_((rows * rows).sum(0))
        blocks = s["self_" + side]
        for start, off, width, count in self._runs[side]:  # layers of one width: one batched product
            x = xd[:, start:start + count * width].unflatten(1, (count, width)).transpose(0, 1)  # (k, b, w)
            blocks[off:off + count * width * width].view(count, width, width).baddbmm_(x.transpose(1, 2), x)
        return rows

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int,
               offset: int = 0) -> None:
        """Add one batch (L_a tensors ``(b, p_i)``, L_b tensors ``(b, q_j)``) to the sums, in place.

        Every sum is taken about the reference shifts (``x' = x − c_x``, ``y' = y − c_y``, float64) and each
        product is added straight into its float64 sum (``addmm_``/``baddbmm_``, no per-batch copy of a
        P×Q or p×p block): the cross sum ``Σ x'y'ᵀ`` is one ``(P, b) @ (b, Q)`` product over all layer
        pairs, each run of equal-width layers' self blocks one batched product, and the per-row norms'
        sums ``Σ x' ‖y'‖²`` of both models one ``(P, b) @ (b, L_a + L_b)`` product.

        Error bound: ``x'`` carries one float64 rounding (exactly zero for a column equal to ``c``) and a
        product sum over the batch's ``b`` rows is off by at most ``γ_b·Σ_r |x'_r||y'_r|``, ``γ_b ≈ b·2⁻⁵³``
        (typically ``√b·2⁻⁵³``), per entry of every sum. That is the order of the earlier per-batch
        centring (``x − m``, then an exact-algebra rank-2 move ``b·δεᵀ`` to ``c``, itself rounded at
        ``2⁻⁵³·b|δ||ε|``), so any split of the data into batches still gives the same sums to float64
        rounding once they are about the same shifts, for float32 activations too (what the agreement
        tests pin, to 1e-12). Products in float32 on these differences would be about twice as fast per
        GEMM but off by ``γ_b`` with ``2⁻²⁴`` (≈ 4·10⁻⁶ relative at b = 64): far outside that contract.
        """
        s = self.s
        dev = acts_a[0].device
        s.to(dev)
        self.seg_a, self.seg_b = self.seg_a.to(dev), self.seg_b.to(dev)
        xd = self._about_shift(acts_a, "x")
        yd = self._about_shift(acts_b, "y")
        s["n"].add_(float(b))
        rx, ry = self._add_side(xd, "x"), self._add_side(yd, "y")
        s["rr_xy"].addmm_(rx.T, ry)
        la, lb = len(self.dims_a), len(self.dims_b)
        x_rows = xd.T @ torch.cat([rx, ry], 1)                   # (P, La + Lb): Σ x' ‖x'‖², Σ x' ‖y'‖²
        y_rows = yd.T @ torch.cat([ry, rx], 1)
        s["x_ry"].add_(x_rows[:, la:])
        s["y_rx"].add_(y_rows[:, lb:])
        s["x_rx"].add_(x_rows[:, :la].gather(1, self.seg_a[:, None]).squeeze(1))  # own layer only
        s["y_ry"].add_(y_rows[:, :lb].gather(1, self.seg_b[:, None]).squeeze(1))
        s["cross"].addmm_(xd.T, yd)

    @staticmethod
    def _constant(blocks: Tensor, sums: Tensor, shift: Tensor, dims: list[int], n: float) -> Tensor:
        """Constant layers ``(L,)`` bool: every column has ``Σ (x − x̄)² ≤ CONSTANT_RTOL · Σ x²``.

        The one rule (:func:`simkit.metrics._checks.constant_columns`, as in ``is_constant``), from the sums about the reference shift ``c``:
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
        column_constant = constant_columns(centred, about_zero).double()
        seg = segments(dims, sums.device)
        return segsum(column_constant, seg, len(dims), 0) == torch.as_tensor(dims, device=sums.device)

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

    def compute(self, progress: PhaseProgress | None = None) -> Values:
        """Every metric of this part from the sums (``progress``: unused, nothing here takes long)."""
        s = self.s
        n = float(s["n"].item())
        la, lb = len(self.dims_a), len(self.dims_b)
        seg_a, seg_b = self.seg_a.to(s["sx"].device), self.seg_b.to(s["sx"].device)
        self.names.check_finite(("a", s["tx"] + s["rr_xx"]), ("b", s["ty"] + s["rr_yy"]))
        if "unbiased_cka" in self.metrics and n < 4:
            raise SimkitError(f"unbiased CKA needs at least 4 samples, got {int(n)}; use more samples (`n`)")
        if n < 2:
            what = "linear CKA" if "linear_cka" in self.metrics else ", ".join(self.metrics)
            raise SimkitError(f"{what} needs at least 2 samples, got {int(n)}; use more samples (`n`)")
        cka = [m for m in self.metrics if m not in SHAPE_MEASURES]
        shapes = [m for m in self.metrics if m in SHAPE_MEASURES]
        out: Values = self._cka(cka, n, la, lb, seg_a, seg_b) if cka else {}
        if shapes:
            out.update(self._shapes(shapes, n))
        return out

    def _constants(self, n: float) -> tuple[Tensor, Tensor]:
        s = self.s
        shift_x, shift_y = self.s.shifts()
        return (self._constant(s["self_x"], s["sx"], shift_x, self.dims_a, n),
                self._constant(s["self_y"], s["sy"], shift_y, self.dims_b, n))

    def _spectra(self, blocks: Tensor, mu: Tensor, dims: list[int], n: float, loadings: bool,
                 vectors: bool = True) -> list[Spectrum]:
        """Each layer's centred covariance ``Σ (x − μ)(x − μ)ᵀ`` from its self block, decomposed once (with its
        eigenvectors unless ``vectors`` is False); the rank by the one rule of float64 sums
        (:func:`~simkit.metrics._checks.rank_rtol`, each layer its own width)."""
        out = []
        start = off = 0
        for d in dims:
            block = blocks[off:off + d * d].view(d, d)
            u = mu[start:start + d]
            c = block - n * torch.outer(u, u)
            out.append(spectrum_from_cov((c + c.T) / 2, loadings, vectors))
            start, off = start + d, off + d * d
        return out

    def _shapes(self, measures: list[str], n: float) -> Values:
        s = self.s
        mux, muy = s["sx"] / n, s["sy"] / n
        const_a, const_b = self._constants(n)
        pw = "pwcca" in measures
        bases = not set(measures) <= set(PROCRUSTES)   # Procrustes alone: the eigenvalues, T0 = C_c itself
        spec_a = self._spectra(s["self_x"], mux, self.dims_a, n, pw, bases)
        spec_b = self._spectra(s["self_y"], muy, self.dims_b, n, pw, bases)
        starts = [sum(self.dims_a[:i]) for i in range(len(self.dims_a))]

        def cross(i: int) -> list[Tensor]:  # T0 = Vᵀ C_c W of A layer i with every B layer
            d, start = self.dims_a[i], starts[i]
            c = s["cross"][start:start + d] - n * torch.outer(mux[start:start + d], muy)
            if not bases:
                return list(torch.split(c, self.dims_b, 1))
            w = spec_a[i].basis.T @ c
            return [part @ sb.basis for part, sb in zip(torch.split(w, self.dims_b, 1), spec_b, strict=True)]

        values = shape_values(measures, spec_a, spec_b, cross, int(n), self.settings, self.names, const_a, const_b)
        out = {}
        for m in measures:
            self.names.warn_constant(m, const_a, const_b)
            out[m] = {"value": values[m].cpu().numpy()}
            if m == "cca" and self.settings.cca_eps == 0:
                out[m]["chance"] = cca_chance(values[m], spec_a, spec_b, n).cpu().numpy()
        return out

    def _cross_blocks(self, mux: Tensor, muy: Tensor, n: float, seg_b: Tensor, lb: int) -> tuple[Tensor, Tensor]:
        """Per layer pair ``(La, Lb)``: ``‖C_c‖²`` of the centred cross block ``C_c = C − n·μx μyᵀ`` and
        ``μxᵀ C μy``, from the cross sum ``C`` about the reference shifts.

        One pass over ``C`` in slabs of rows of at most :data:`SLAB_BYTES` (the centred slab is squared and
        summed while in cache, never a copy of a whole layer's P×Q block); the slab's columns are summed
        per A layer, then per B layer.
        """
        cross = self.s["cross"]
        q = cross.shape[1]
        colsq = torch.zeros(len(self.dims_a), q, dtype=torch.float64, device=cross.device)
        proj = torch.zeros_like(colsq)
        step = max(1, SLAB_BYTES // (8 * q))
        buf = torch.empty(min(step, max(self.dims_a)), q, dtype=torch.float64, device=cross.device)
        start = 0
        for i, d in enumerate(self.dims_a):
            for lo in range(start, start + d, step):
                hi = min(lo + step, start + d)
                c, u = cross[lo:hi], mux[lo:hi]
                proj[i].addmv_(c.T, u)
                centred = torch.addr(c, u, muy, alpha=-n, out=buf[:hi - lo])
                colsq[i].add_(centred.square_().sum(0))
            start += d
        return segsum(colsq, seg_b, lb, 1), segsum(proj * muy, seg_b, lb, 1)

    def _cka(self, metrics: list[str], n: float, la: int, lb: int, seg_a: Tensor, seg_b: Tensor) -> Values:
        s = self.s
        mux, muy = s["sx"] / n, s["sy"] / n
        mxn, myn = segsum(mux * mux, seg_a, la, 0), segsum(muy * muy, seg_b, lb, 0)
        nx, ny = s["tx"] - n * mxn, s["ty"] - n * myn  # ‖X_c‖², ‖Y_c‖²
        fro, quad = self._cross_blocks(mux, muy, n, seg_b, lb)
        fro_a, quad_a = self._self_terms(s["self_x"], mux, self.dims_a, n)
        fro_b, quad_b = self._self_terms(s["self_y"], muy, self.dims_b, n)
        # ⟨rowsq(X_c), rowsq(Y_c)⟩ expanded in the sums about the reference shifts
        a_y = segsum(muy[:, None] * s["y_rx"], seg_b, lb, 0).T      # (La, Lb): μ_yᵀ Σ y ‖x‖²
        a_x = segsum(mux[:, None] * s["x_ry"], seg_a, la, 0)        # (La, Lb): μ_xᵀ Σ x ‖y‖²
        rc = (s["rr_xy"] - 2 * a_y - 2 * a_x + 4 * quad + myn[None, :] * s["tx"][:, None]
              + mxn[:, None] * s["ty"][None, :] - 3 * n * mxn[:, None] * myn[None, :])
        rc_a = (s["rr_xx"] - 4 * segsum(mux * s["x_rx"], seg_a, la, 0) + 4 * quad_a
                + 2 * mxn * s["tx"] - 3 * n * mxn * mxn)
        rc_b = (s["rr_yy"] - 4 * segsum(muy * s["y_ry"], seg_b, lb, 0) + 4 * quad_b
                + 2 * myn * s["ty"] - 3 * n * myn * myn)
        shift_x, shift_y = self.s.shifts()
        const_a = self._constant(s["self_x"], s["sx"], shift_x, self.dims_a, n)
        const_b = self._constant(s["self_y"], s["sy"], shift_y, self.dims_b, n)
        out = {}
        for m in metrics:
            if m == "linear_cka":  # biased HSIC times (n−1)², which the ratio cancels
                value = cka_ratio(fro, fro_a[:, None], fro_b[None, :], warn=False)
            else:  # HSIC_1 from its four terms; for centred features 1ᵀK̃1 = −‖X_c‖², 1ᵀK̃L̃1 = ⟨rowsq, rowsq⟩
                count = int(n)
                h = hsic1_from_terms(count, fro - rc, -nx[:, None], -ny[None, :], rc)
                h_a = hsic1_from_terms(count, fro_a - rc_a, -nx, -nx, rc_a)
                h_b = hsic1_from_terms(count, fro_b - rc_b, -ny, -ny, rc_b)
                value = cka_ratio(h, h_a[:, None], h_b[None, :], warn=False)
            self.names.warn_constant(m, const_a, const_b)
            out[m] = {"value": mask_constant(value, const_a, const_b).cpu().numpy(),
                      "chance": mask_constant(cka_chance(m, value, nx, ny, fro_a, fro_b, n),
                                              const_a, const_b).cpu().numpy()}
        return out

    def describe(self) -> dict[str, dict[str, Any]]:
        n = int(self.s["n"].item())
        state = sum(t.numel() * 8 for t in self.s.summed())
        out: dict[str, dict[str, Any]] = {}
        for m in self.metrics:
            if m in SHAPE_MEASURES:
                out[m] = {"mode": self.mode, "path": "features", "n": n, "null": 0, "state_bytes": state,
                          "measure": shape_notes(m), **shape_settings([m], self.settings),
                          "note": "exact, from streamed covariances of all samples (in either mode)"}
            else:
                out[m] = {"mode": "exact", "path": "features", "n": n,
                          "hsic": "unbiased HSIC_1" if m == "unbiased_cka" else "biased HSIC",
                          "kernel": "linear", "null": 0, "state_bytes": state}
        return out

