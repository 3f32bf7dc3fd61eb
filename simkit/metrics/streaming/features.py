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
from simkit.metrics.streaming.common import Names, PhaseProgress, Values, mask_constant, segments, segsum
from simkit.metrics.streaming.shapes import shape_notes, shape_settings, shape_values
from simkit.metrics.streaming.state import ShiftedSums, State


def feature_path_bytes(dims_a: Sequence[int], dims_b: Sequence[int], itemsize: int = 4) -> int:
    """Peak bytes of the exact feature-space path: the float64 sums (each batch's cross product is added to
    them in place), one batch's self products (in the activations' dtype and in float64), one layer block
    at the end, and the small vectors."""
    p, q = sum(dims_a), sum(dims_b)
    return 8 * p * q + (16 + itemsize) * (sum(d * d for d in dims_a) + sum(d * d for d in dims_b)) \
        + 16 * max(dims_a) * q + 16 * (p + q) * (len(dims_a) + len(dims_b) + 2)


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
    the cross sum, ``(cy (P, Lb), cx (Q, La))`` (:func:`_cross_terms`, or from the batch's own features).
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

    def _side(self, acts: Sequence[Tensor], side: str, bs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """Concatenate one model's layers, centre them on the batch mean, put this side's sums in ``bs``.

        The batch's sums are taken about its own mean ``m``: the centring ``x̃ = x − m`` and every product
        of ``x̃`` run in float64 (exact for a constant column), so they depend on the batch alone and any
        split of the data into batches gives the same sums up to float64 rounding, for float32 activations
        too. Returns (x̃ (b, P) float64, δ = m − c (P,) float64: the shift to apply).
        """
        seg, dims = (self.seg_a, self.dims_a) if side == "x" else (self.seg_b, self.dims_b)
        xd = torch.cat([a.detach().to(torch.float64) for a in acts], 1)
        mean = xd.mean(0)
        xd.sub_(mean)
        offset = self.s.offset(side, mean)
        bs["s" + side] = col = xd.sum(0)
        bad = torch.nonzero(~torch.isfinite(col)).flatten()[:1].tolist()  # one sum per column
        if bad:
            raise self.names.non_finite("a" if side == "x" else "b", int(seg[bad[0]]))
        rows = segsum(xd * xd, seg, len(dims), 1)
        bs["t" + side] = rows.sum(0)
        bs[f"rr_{side}{side}"] = (rows * rows).sum(0)
        bs[f"{side}_r{side}"] = (xd * rows[:, seg]).sum(0)
        bs[f"_rows_{side}"] = rows
        blocks = torch.empty(sum(d * d for d in dims), dtype=torch.float64, device=xd.device)
        start = off = 0
        for d in dims:  # per-layer self products
            sl = slice(start, start + d)
            torch.mm(xd[:, sl].T, xd[:, sl], out=blocks[off:off + d * d].view(d, d))
            start, off = start + d, off + d * d
        bs["self_" + side] = blocks
        return xd, offset

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int,
               offset: int = 0) -> None:
        s = self.s
        dev = acts_a[0].device
        s.to(dev)
        self.seg_a, self.seg_b = self.seg_a.to(dev), self.seg_b.to(dev)
        bs: dict[str, Tensor] = {"n": torch.full((1,), float(b), dtype=torch.float64, device=dev)}
        xd, dx = self._side(acts_a, "x", bs)
        yd, dy = self._side(acts_b, "y", bs)
        rx, ry = bs.pop("_rows_x"), bs.pop("_rows_y")
        bs["rr_xy"] = rx.T @ ry
        bs["x_ry"] = xd.T @ ry
        bs["y_rx"] = yd.T @ rx
        shifted = bool((dx != 0).any() or (dy != 0).any())  # move the batch's sums to the reference shifts
        terms = self._add_cross(xd, yd, bs, dx, dy, shifted)
        if terms is not None:
            _shift_sums(bs, terms, dx, dy, self.dims_a, self.dims_b, self.seg_a, self.seg_b)
        for key, value in bs.items():
            s[key].add_(value)

    def _add_cross(self, xd: Tensor, yd: Tensor, bs: dict[str, Tensor], dx: Tensor, dy: Tensor,
                   shifted: bool) -> tuple[Tensor, Tensor] | None:
        """Add the batch's cross product ``x̃ᵀỹ`` and, when ``shifted``, its move to the reference shifts
        (``+ U V``, :func:`_shift_sums`) to the cross sum in ONE float64 product ``[x̃ᵀ U] [ỹ; V]`` of the
        batch-centred features (``x̃``, ``ỹ`` ``(b, P)``, ``(b, Q)`` float64): the P×Q sum is read and written
        once per batch, and every term depends on the batch alone. Returns the shift terms
        ``(cy (P, Lb), cx (Q, La))`` (``Σ_r x̃_r v_r``, ``Σ_r ỹ_r u_r``, from the same float64 features), or
        None when not ``shifted``."""
        total = self.s["cross"]
        if not shifted:
            total.addmm_(xd.T, yd)
            return None
        b = float(bs["n"].item())
        u = torch.stack([bs["sx"], dx], 1)                     # (P, 2), the batch's own column sums
        v = torch.stack([dy, bs["sy"] + b * dy], 0)            # (2, Q)
        total.addmm_(torch.cat([xd.T, u], 1), torch.cat([yd, v], 0))
        seg_a, seg_b = self.seg_a, self.seg_b
        v_rows = segsum(yd * dy, seg_b, len(self.dims_b), 1)   # (b, Lb): v_r = ỹ_r·ε per B layer
        u_rows = segsum(xd * dx, seg_a, len(self.dims_a), 1)   # (b, La): u_r = x̃_r·δ per A layer
        return xd.T @ v_rows, yd.T @ u_rows

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

    def _cka(self, metrics: list[str], n: float, la: int, lb: int, seg_a: Tensor, seg_b: Tensor) -> Values:
        s = self.s
        mux, muy = s["sx"] / n, s["sy"] / n
        mxn, myn = segsum(mux * mux, seg_a, la, 0), segsum(muy * muy, seg_b, lb, 0)
        nx, ny = s["tx"] - n * mxn, s["ty"] - n * myn  # ‖X_c‖², ‖Y_c‖²
        # cross terms, one A layer (all B layers) at a time: ‖C_c‖² and μxᵀ C μy per block
        fro = torch.empty(la, lb, dtype=torch.float64, device=mux.device)
        quad = torch.empty_like(fro)
        start = 0
        for i, d in enumerate(self.dims_a):
            c = s["cross"][start:start + d]
            u = mux[start:start + d]
            centred = c - n * torch.outer(u, muy)
            fro[i] = segsum((centred * centred).sum(0), seg_b, lb, 0)
            quad[i] = segsum((u @ c) * muy, seg_b, lb, 0)
            start += d
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
                      "chance": mask_constant(self._cka_chance(m, value, nx, ny, fro_a, fro_b, n),
                                              const_a, const_b).cpu().numpy()}
        return out

    @staticmethod
    def _cka_chance(metric: str, value: Tensor, nx: Tensor, ny: Tensor, fro_a: Tensor, fro_b: Tensor,
                    n: float) -> Tensor:
        """The exact expectation of ``metric`` under a random permutation of B's samples (La, Lb): for
        linear CKA ``tr(K_c)·tr(L_c) / ((n − 1)·‖K_c‖_F·‖L_c‖_F)`` (the permutations average B's centred
        Gram to ``tr(L_c)/(n − 1)·H``), for unbiased CKA 0 (HSIC_1 is unbiased under independence)."""
        if metric == "unbiased_cka":
            return torch.where(torch.isfinite(value), torch.zeros_like(value), value)
        return cka_ratio(nx[:, None] * ny[None, :] / (n - 1), fro_a[:, None], fro_b[None, :], warn=False)

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

