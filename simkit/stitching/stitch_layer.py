"""Stitch layers: a 1×1 convolution for feature maps (resizing when spatial sizes differ), a linear map
for vectors and tokens, and their least-squares fit (the closed form of the DM objective).

Activation layouts (batch first):

* ``vector``: (b, d)            → ``nn.Linear(p, q)``
* ``tokens``: (b, T, d)         → ``nn.Linear(p, q)`` on the last axis, token counts must agree
* ``map1d``:  (b, C, L)         → ``nn.Conv1d(C_a, C_b, 1)`` after resizing L_a → L_b
* ``map2d``:  (b, C, H, W)      → ``nn.Conv2d(C_a, C_b, 1)`` after resizing (H_a, W_a) → (H_b, W_b)

Every layout is a per-position linear map over the feature (channel) axis, so the least-squares fit
treats each position of each sample as one row: ``X (n·positions, p)``, ``Y (n·positions, q)``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError

LAYOUTS = ("vector", "tokens", "map1d", "map2d")


def infer_layout(shape: tuple[int, ...], *, tokens: bool = False) -> str:
    """Layout of one sample's activation ``shape`` (no batch axis): (d,), (C, L) / (T, d), (C, H, W).

    ``tokens=True`` reads 2-D activations as (T, d) token sequences instead of (C, L) feature maps.
    """
    if len(shape) == 1:
        return "vector"
    if len(shape) == 2:
        return "tokens" if tokens else "map1d"
    if len(shape) == 3:
        return "map2d"
    raise SimkitError(f"cannot stitch activations of shape {tuple(shape)} (one sample); a stitch needs "
                      "(d,), (C, L), (T, d) or (C, H, W): pick another layer")


def check_bridgeable(shape_a: tuple[int, ...], shape_b: tuple[int, ...], layout_a: str, layout_b: str,
                     where: str = "") -> None:
    """Raise SimkitError when no stitch maps activations of ``shape_a`` onto ``shape_b``."""
    at = f" ({where})" if where else ""
    if layout_a != layout_b:
        raise SimkitError(f"no stitch bridges A's {layout_a} activations {tuple(shape_a)} and B's {layout_b} "
                          f"activations {tuple(shape_b)}{at}; pick layers of the same kind (both feature "
                          "maps, both vectors or both token sequences)")
    if layout_a == "tokens" and shape_a[0] != shape_b[0]:
        raise SimkitError(f"no stitch bridges {shape_a[0]} tokens of A and {shape_b[0]} tokens of B{at}; "
                          "use inputs of the same length for both models")


class LeastSquares:
    """Affine least squares ``Y ≈ X Wᵀ + c`` in float64, accumulated over batches (normal equations).

    Estimator rules: ``__init__`` stores settings only, ``fit`` returns ``self``, learned attributes end
    in ``_``. ``ridge`` adds ``ridge · trace(XᵀX)/p · I`` to the (centred) Gram matrix (0 = plain
    least squares; the minimum-norm solution is used when XᵀX is singular).

    Learned: ``coef_`` (q, p), ``intercept_`` (q,), ``residual_`` (mean squared residual per row,
    summed over the q outputs), ``n_rows_``.
    """

    def __init__(self, ridge: float = 0.0):
        self.ridge = ridge

    def fit(self, x: Tensor | Iterable[tuple[Tensor, Tensor]], y: Tensor | None = None) -> LeastSquares:
        """Fit on ``x (n, p)``, ``y (n, q)``, or on an iterable of such ``(x, y)`` batches."""
        pairs: Iterable[tuple[Tensor, Tensor]]
        if y is not None:
            if not isinstance(x, Tensor):
                raise SimkitError("least squares: give `x` as a tensor when `y` is given")
            pairs = [(x, y)]
        else:
            if isinstance(x, Tensor):
                raise SimkitError("least squares: give `y`, or `x` as an iterable of (x, y) batches")
            pairs = x
        n = 0
        for xb, yb in pairs:
            xb = xb.detach().to(torch.float64).reshape(len(xb), -1)
            yb = yb.detach().to(torch.float64).reshape(len(yb), -1)
            if len(xb) != len(yb):
                raise SimkitError(f"least squares: inconsistent numbers of rows: [{len(xb)}, {len(yb)}]")
            if n == 0:
                sx, sy = xb.sum(0), yb.sum(0)
                sxx, sxy, syy = xb.T @ xb, xb.T @ yb, (yb * yb).sum()
            else:
                sx, sy = sx + xb.sum(0), sy + yb.sum(0)
                sxx, sxy, syy = sxx + xb.T @ xb, sxy + xb.T @ yb, syy + (yb * yb).sum()
            n += len(xb)
        if n == 0:
            raise SimkitError("least squares needs at least one row; give the stitch some training inputs")
        mx, my = sx / n, sy / n
        cxx = sxx - n * torch.outer(mx, mx)
        cxy = sxy - n * torch.outer(mx, my)
        if self.ridge > 0:
            cxx = cxx + self.ridge * torch.trace(cxx) / len(cxx) * torch.eye(len(cxx), dtype=cxx.dtype)
        w = torch.linalg.pinv(cxx, hermitian=True) @ cxy  # (p, q)
        self.coef_ = w.T.contiguous()
        self.intercept_ = my - mx @ w
        # ‖Y − XW − c‖² from the sums: Σ‖y−my‖² − 2 tr(Wᵀ Cxy) + tr(Wᵀ Cxx W)  (plain, unridged Cxx)
        cxx_plain = sxx - n * torch.outer(mx, mx)
        syy_c = syy - n * (my @ my)
        rss = syy_c - 2 * torch.sum(w * cxy) + torch.sum(w * (cxx_plain @ w))
        self.residual_ = float(torch.clamp(rss, min=0.0) / n)
        self.n_rows_ = n
        return self

    def predict(self, x: Tensor) -> Tensor:
        """``x (n, p)`` → ``(n, q)`` in float64."""
        return x.to(torch.float64) @ self.coef_.T + self.intercept_


class StitchLayer(nn.Module):
    """Maps A's activation at the stitch onto B's: ``(b, *shape_a) → (b, *shape_b)``.

    ``shape_a``/``shape_b``: one sample's activation shapes; ``layout``: one of LAYOUTS (see
    :func:`infer_layout`). Feature maps of different spatial size are resized (linear / bilinear
    interpolation) to B's size before the 1×1 convolution. Initialised as the identity where shapes
    allow it (else PyTorch's default); :meth:`fit` sets the least-squares (DM) solution.
    """

    def __init__(self, shape_a: tuple[int, ...], shape_b: tuple[int, ...], layout: str):
        super().__init__()
        if layout not in LAYOUTS:
            raise SimkitError(f"unknown stitch layout {layout!r}; use one of {', '.join(LAYOUTS)}")
        check_bridgeable(tuple(shape_a), tuple(shape_b), layout, layout)
        self.shape_a, self.shape_b, self.layout = tuple(shape_a), tuple(shape_b), layout
        p, q = self.features(shape_a), self.features(shape_b)
        self.map: nn.Linear | nn.Conv1d | nn.Conv2d
        if layout in ("vector", "tokens"):
            self.map = nn.Linear(p, q)
        elif layout == "map1d":
            self.map = nn.Conv1d(p, q, kernel_size=1)
        else:
            self.map = nn.Conv2d(p, q, kernel_size=1)
        if p == q:
            self.set_affine(torch.eye(p, dtype=torch.float64), torch.zeros(q, dtype=torch.float64))

    def features(self, shape: tuple[int, ...]) -> int:
        """Size of the axis the stitch maps: d for vectors/tokens, C for feature maps."""
        return shape[-1] if self.layout in ("vector", "tokens") else shape[0]

    @property
    def spatial_b(self) -> tuple[int, ...]:
        return self.shape_b[1:] if self.layout in ("map1d", "map2d") else ()

    def resize(self, h: Tensor) -> Tensor:
        """Feature maps ``(b, C_a, *S_a)`` → ``(b, C_a, *S_b)``; other layouts unchanged."""
        if self.layout == "map1d" and h.shape[-1:] != self.spatial_b:
            return F.interpolate(h, size=self.spatial_b, mode="linear", align_corners=False)
        if self.layout == "map2d" and tuple(h.shape[-2:]) != self.spatial_b:
            return F.interpolate(h, size=self.spatial_b, mode="bilinear", align_corners=False)
        return h

    def forward(self, h: Tensor) -> Tensor:
        """``h (b, *shape_a)`` → ``(b, *shape_b)``."""
        return self.map(self.resize(h))

    def rows(self, h: Tensor) -> Tensor:
        """Per-position rows of the mapped axis: ``(b, *shape) → (b·positions, features)``."""
        if self.layout in ("vector", "tokens"):
            return h.reshape(-1, h.shape[-1])
        return h.flatten(2).transpose(1, 2).reshape(-1, h.shape[1])

    def set_affine(self, coef: Tensor, intercept: Tensor) -> None:
        """Set the map to ``coef (q, p)``, ``intercept (q,)``."""
        weight, bias = self.map.weight, self.map.bias
        if bias is None:  # every map is built with a bias
            raise SimkitError("the stitch map has no bias to set")
        with torch.no_grad():
            weight.copy_(coef.to(weight).reshape(weight.shape))
            bias.copy_(intercept.to(weight))

    def fit(self, pairs: Iterable[tuple[Tensor, Tensor]], ridge: float = 0.0) -> StitchLayer:
        """Least-squares (DM closed form) fit on batches ``(h_a (b, *shape_a), h_b (b, *shape_b))``.

        Sets the weights and the learned attributes ``lstsq_`` (the fitted :class:`LeastSquares`) and
        ``dm_residual_`` (mean over samples of ‖S(h_a) − h_b‖², the DM loss at the solution).
        """
        positions = 1
        for size in (self.shape_b[:-1] if self.layout == "tokens" else self.spatial_b):
            positions *= size

        def rows():
            for h_a, h_b in pairs:
                yield self.rows(self.resize(h_a.detach())), self.rows(h_b.detach())

        self.lstsq_ = LeastSquares(ridge=ridge).fit(rows())
        self.set_affine(self.lstsq_.coef_, self.lstsq_.intercept_)
        self.dm_residual_ = self.lstsq_.residual_ * positions
        return self
