"""Cross-validated ridge predictivity ``ridge_r2``, path ``"folds"``: per-fold moments streamed over batches.

Sample ``g`` (its global position: the batch's ``offset`` plus its row) is in fold ``g mod k``. Per fold
the part adds ``n``, ``Σx``, ``Σy``, each A layer's ``Σxxᵀ``, ``Σxyᵀ`` (P×Q) and ``Σ‖y‖²`` per B layer,
about a fixed reference shift per column (the first batch's means, re-referenced exactly by the
declared :class:`~simkit.metrics.streaming.state.ShiftedSums`, as on the feature path), in float64; the
products of one batch are split by fold, so together they cost one ``P × Q`` product per batch, in float64 on batch-centred float64 copies of
the features (as on the feature path: every product depends on its batch alone, and the sums are float64
sums, which the one numerical-rank rule of ``ridge_lambda = 0`` assumes). Memory
``≈ 8·k·(P·Q + Σp_i²)`` bytes (:func:`fold_path_bytes`). The estimator is
:func:`simkit.metrics.predictivity.ridge_from_moments` (the pseudo-inverse's rank by each A layer's own
width, :func:`~simkit.metrics._checks.rank_rtol`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import Tensor

from simkit.metrics._checks import constant_columns
from simkit.metrics.predictivity import FoldMoments, check_fold_samples, ridge_from_moments
from simkit.metrics.settings import MeasureSettings
from simkit.metrics.streaming.common import Names, PhaseProgress, Values, mask_constant, segments, segsum
from simkit.metrics.streaming.state import ShiftedSums, State


def fold_path_bytes(dims_a: Sequence[int], dims_b: Sequence[int], folds: int, itemsize: int = 4) -> int:
    """Peak bytes of the streamed ridge path: k folds of float64 sums plus one batch's product."""
    p, q = sum(dims_a), sum(dims_b)
    per_fold = p * q + sum(d * d for d in dims_a) + p + q + len(dims_b) + 1
    return 8 * folds * per_fold + (8 + itemsize) * p * q + 16 * max(dims_a) * q


def _outer_blocks(u: Tensor, v: Tensor, dims: Sequence[int]) -> Tensor:
    """Flattened per-layer blocks of ``u vᵀ`` (both ``(P,)``) → ``(Σ d²,)``."""
    return torch.cat([torch.outer(a, b).flatten() for a, b in zip(torch.split(u, list(dims)),
                                                                  torch.split(v, list(dims)), strict=True)])


def _move_sums(sums: ShiftedSums, dx: Tensor, dy: Tensor, *, dims_a: list[int], dims_b: list[int],
               folds: int) -> None:
    """The fold path's re-referencing (:data:`~simkit.metrics.streaming.state.Move`): every fold's sums
    moved by ``dx``, ``dy`` (exact algebra in float64)."""
    seg_b, lb = segments(dims_b, dx.device), len(dims_b)
    for f in range(folds):
        n, sx, sy = sums["n"][f], sums["sx"][f].clone(), sums["sy"][f].clone()
        sums["sxx"][f].add_(_outer_blocks(sx, dx, dims_a) + _outer_blocks(dx, sx, dims_a)
                            + n * _outer_blocks(dx, dx, dims_a))
        sums["sxy"][f].add_(torch.outer(sx, dy) + torch.outer(dx, sy) + n * torch.outer(dx, dy))
        cols = 2 * dy * sy + n * dy * dy
        sums["tyy"][f].add_(segsum(cols, seg_b, lb, 0))
        sums["yy_cols"].add_(cols)
        sums["sx"][f].add_(n * dx)
        sums["sy"][f].add_(n * dy)


def ridge_describe(settings: MeasureSettings) -> dict[str, Any]:
    """The ridge_r2 settings and fold rule, for ``describe()``."""
    return {"ridge_lambda": settings.ridge_lambda, "ridge_folds": settings.ridge_folds,
            "folds": "sample i in fold i mod ridge_folds", "directional": True,
            "note": "rows (model A's layers) predict columns (model B's layers): the matrix is not symmetric"}


class FoldPart:
    """``ridge_r2`` of all pairs (A layer predicts B layer) from streamed per-fold moments.

    Declared state: one ``shifted_sum`` (``self.s``), about the shifts of A's and B's columns."""

    def __init__(self, dims_a: list[int], dims_b: list[int], names: Names, settings: MeasureSettings,
                 mode: str = "exact"):
        self.metrics = ["ridge_r2"]
        self.dims_a, self.dims_b, self.names, self.settings, self.mode = dims_a, dims_b, names, settings, mode
        k, p, q = settings.ridge_folds, sum(dims_a), sum(dims_b)
        self.s = s = ShiftedSums((p, q), partial(_move_sums, dims_a=dims_a, dims_b=dims_b, folds=k))
        self.states: list[State] = [s]
        s.add("n", k)
        s.add("sx", k, p)
        s.add("sy", k, q)
        s.add("sxx", k, sum(d * d for d in dims_a))
        s.add("sxy", k, p, q)
        s.add("tyy", k, len(dims_b))
        s.add("yy_cols", q)                # Σ (y − c)² per column (constant rule for B)
        self.seg_b = segments(dims_b)

    def _side(self, acts: Sequence[Tensor], side: str) -> tuple[Tensor, Tensor]:
        """One model's layers concatenated as float64 and centred on the batch mean ``m``: ``(x̃ (b, P),
        δ = m − c (P,))``, c the reference shift (the first batch's mean)."""
        xd = torch.cat([a.detach().to(torch.float64) for a in acts], 1)
        mean = xd.mean(0)
        xd.sub_(mean)
        offset = self.s.offset(side, mean)
        col = xd.sum(0)
        bad = torch.nonzero(~torch.isfinite(col)).flatten()[:1].tolist()
        if bad:
            dims = self.dims_a if side == "x" else self.dims_b
            raise self.names.non_finite("a" if side == "x" else "b", int(segments(dims)[bad[0]]))
        return xd, offset

    def update(self, acts_a: Sequence[Tensor], acts_b: Sequence[Tensor], b: int, batch_index: int,
               offset: int = 0) -> None:
        s = self.s
        dev = acts_a[0].device
        s.to(dev)
        xd, dx = self._side(acts_a, "x")
        yd, dy = self._side(acts_b, "y")
        seg_b = self.seg_b.to(dev)
        lb = len(self.dims_b)
        k = self.settings.ridge_folds
        fold = (int(offset) + torch.arange(b, device=dev)) % k
        for f in torch.unique(fold).tolist():
            rows = torch.nonzero(fold == f).flatten()
            xfd, yfd = xd[rows], yd[rows]
            nf = float(len(rows))
            cx, cy = xfd.sum(0), yfd.sum(0)
            s["n"][f] += nf
            # Σ (x − c)(y − c)ᵀ = x̃ᵀỹ + (Σx̃) δ_yᵀ + δ_x (Σỹ)ᵀ + n δ_x δ_yᵀ, in place on the P × Q sum
            s["sxy"][f].addmm_(xfd.T, yfd).addr_(cx, dy).addr_(dx, cy).addr_(dx, dy, alpha=nf)
            blocks = torch.cat([(part.T @ part).flatten() for part in torch.split(xfd, self.dims_a, 1)])
            s["sxx"][f].add_(blocks + _outer_blocks(cx, dx, self.dims_a) + _outer_blocks(dx, cx, self.dims_a)
                             + nf * _outer_blocks(dx, dx, self.dims_a))
            s["sx"][f].add_(cx + nf * dx)
            s["sy"][f].add_(cy + nf * dy)
            cols = (yfd * yfd).sum(0) + 2 * dy * cy + nf * dy * dy
            s["tyy"][f].add_(segsum(cols, seg_b, lb, 0))
            s["yy_cols"].add_(cols)

    def _constant(self, n: float) -> tuple[Tensor, Tensor]:
        """Constant layers by the one rule, from the summed moments about the reference shifts."""
        s = self.s
        shift_x, shift_y = self.s.shifts()
        sx, sy = s["sx"].sum(0), s["sy"].sum(0)
        diag, off = [], 0
        sxx = s["sxx"].sum(0)
        for d in self.dims_a:
            diag.append(sxx[off:off + d * d].view(d, d).diagonal())
            off += d * d
        about_x = torch.cat(diag)
        shift_x, shift_y = shift_x.to(sx.device), shift_y.to(sx.device)
        out = []
        for about, sums, shift, dims in ((about_x, sx, shift_x, self.dims_a), (s["yy_cols"], sy, shift_y, self.dims_b)):
            centred = about - sums * sums / n
            zero = about + 2 * shift * sums + n * shift * shift
            col = constant_columns(centred, zero).double()
            seg = segments(dims, sums.device)
            out.append(segsum(col, seg, len(dims), 0) == torch.as_tensor(dims, device=sums.device))
        return out[0], out[1]

    def compute(self, progress: PhaseProgress | None = None) -> Values:
        """Every metric of this part from the sums (``progress``: unused, nothing here takes long)."""
        s = self.s
        n = float(s["n"].sum().item())
        check_fold_samples(int(n), self.settings.ridge_folds)
        moments = FoldMoments(s["n"], s["sx"], s["sy"], s["sxx"], s["sxy"], s["tyy"])
        value = ridge_from_moments(moments, self.dims_a, self.dims_b, self.settings.ridge_lambda)
        const_a, const_b = self._constant(n)
        self.names.warn_constant("ridge_r2", const_a, const_b)
        return {"ridge_r2": {"value": mask_constant(value, const_a, const_b).cpu().numpy()}}

    def describe(self) -> dict[str, dict[str, Any]]:
        return {"ridge_r2": {"mode": self.mode, "path": "folds", "n": int(self.s["n"].sum().item()), "null": 0,
                             "state_bytes": sum(t.numel() * 8 for t in self.s.summed()),
                             **ridge_describe(self.settings)}}
