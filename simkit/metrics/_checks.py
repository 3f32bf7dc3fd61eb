"""Input checks and small exact helpers shared by the metric modules.

Everything here raises :class:`~simkit.errors.SimkitError` for input a user can fix, with one line that
names the problem and the fix. The engine catches these and adds the model and layer names.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from simkit.errors import SimkitError


def as_matrix(x, name: str = "x", dtype: torch.dtype | None = torch.float64) -> Tensor:
    """``x`` as a 2-D tensor ``(n, p)``, cast to ``dtype`` (``None`` keeps a floating dtype).

    Accepts tensors and array-likes. Raises for other ranks, for NaN/Inf values, complex values and
    tensors on the meta device.
    """
    t = check_real_tensor(torch.as_tensor(x), name)
    if t.dim() != 2:
        raise SimkitError(
            f"`{name}` must be a 2-D (n, features) matrix, got shape {tuple(t.shape)}; "
            "flatten each example first, e.g. x.reshape(len(x), -1)"
        )
    if dtype is not None:
        t = t.to(dtype)
    elif not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    check_finite(t, name)
    return t


def check_real_tensor(t: Tensor, name: str) -> Tensor:
    """``t`` unless it lies on the meta device (a shape without values) or holds complex values; else a
    SimkitError naming the argument ``name``."""
    if t.device.type == "meta":
        raise SimkitError(f"`{name}` is a tensor on the meta device (a shape without values); pass real "
                          "activations (load the model's weights, e.g. model.to_empty(device='cpu'), and run it)")
    if t.is_complex():
        raise SimkitError(f"`{name}` holds complex values ({t.dtype}); pass real activations, e.g. "
                          f"{name}.real or {name}.abs()")
    return t


def check_tensor(t: Any, name: str, min_dim: int = 2, max_dim: int | None = None, square: bool = False) -> Tensor:
    """``t`` itself when it is a floating-point torch tensor with values, of ``min_dim`` to ``max_dim``
    dimensions (the last two equal when ``square``); else a SimkitError naming the argument ``name``. For the
    building blocks, which compute in their input's dtype and check no values (NaN in, NaN out)."""
    if not isinstance(t, Tensor):
        raise SimkitError(f"`{name}` must be a torch tensor, got {type(t).__name__}; convert it first, e.g. "
                          f"torch.as_tensor({name})")
    check_real_tensor(t, name)
    if not t.is_floating_point():
        raise SimkitError(f"`{name}` must hold floating-point values, got {t.dtype}; cast it first, e.g. "
                          f"{name}.double()")
    if t.dim() < min_dim or (max_dim is not None and t.dim() > max_dim) or (square and t.shape[-1] != t.shape[-2]):
        want = "a square (..., n, n) matrix" if square else "a 2-D (n, features) matrix" if max_dim == 2 else \
            f"at least {min_dim}-D"
        raise SimkitError(f"`{name}` must be {want}, got shape {tuple(t.shape)}")
    return t


def check_finite(t: Tensor, name: str = "x") -> None:
    """Raise if ``t`` holds NaN or Inf (the caller adds the model and layer)."""
    if not bool(torch.isfinite(t).all()):
        raise SimkitError(
            f"non-finite activations (NaN or Inf) in {name}; check the model and layer for overflow "
            "or divergence (e.g. run it in float32 instead of float16)"
        )


def check_same_n(*ns: int) -> None:
    """Raise unless all sample counts agree."""
    if len(set(ns)) > 1:
        raise SimkitError(
            f"found inconsistent numbers of samples: {list(ns)}; both sides must hold the same "
            "examples in the same order"
        )


def check_min_n(n: int, minimum: int, what: str) -> None:
    """Raise unless ``n >= minimum``."""
    if n < minimum:
        raise SimkitError(
            f"{what} needs at least {minimum} samples, got {n}; use more samples (or linear_cka)"
        )


def check_k(k: int, n: int) -> None:
    """Raise unless 1 <= k <= n - 1 (neighbours exclude the point itself)."""
    if not _whole(k) or k < 1:
        raise SimkitError(f"`k` must be a positive integer, got {k!r}; the default is k=10")
    if k > n - 1:
        raise SimkitError(
            f"k={k} neighbours need at least {k + 1} samples, got {n}; use more samples or a smaller k"
        )


def _whole(value: Any) -> bool:
    """True for a whole number (``3`` or ``3.0``); False for anything else (text, None, NaN, inf)."""
    try:
        return bool(int(value) == value)
    except (TypeError, ValueError, OverflowError):
        return False


def row_eps(dtype: torch.dtype) -> float:
    """``F.normalize``'s ``eps`` for rows of ``dtype``: its default 1e-12 where the dtype holds it, else the
    dtype's smallest normal number (float16: a row of zeros stays zeros instead of 0/0 = NaN)."""
    return max(1e-12, float(torch.finfo(dtype).tiny))


def check_positive(value: float, name: str) -> None:
    """Raise unless ``value`` is a finite number > 0."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise SimkitError(f"`{name}` must be a positive number, got {value!r}")


def check_chunk(chunk: int | None) -> None:
    """Raise unless ``chunk`` is None (automatic) or a positive integer number of rows."""
    if chunk is not None and (not _whole(chunk) or chunk < 1):
        raise SimkitError(f"`chunk` must be a positive integer (rows per block), got {chunk!r}")


#: A column is constant when its centred second moment is at most this fraction of its second moment
#: about zero: the one rule (:func:`constant_columns`) of :func:`is_constant`, the exact streaming paths
#: and the minibatch Grams (:mod:`simkit.metrics.gram`). Squared spread, so a relative spread below
#: about 1e-6 (about 8 float32 rounding steps) counts as constant.
CONSTANT_RTOL = 1e-12


def constant_columns(centred: Tensor, about_zero: Tensor, rtol: float = CONSTANT_RTOL) -> Tensor:
    """THE constant rule, per column, from two second moments (any shape, elementwise, bool):
    ``Σ (x − μ)² ≤ rtol · Σ x²``. :func:`is_constant` applies it to a matrix (hence per batch to the
    minibatch Grams, :mod:`simkit.metrics.gram`); the exact feature path applies it to its sums."""
    return centred <= rtol * about_zero


def is_constant(x: Tensor, rtol: float = CONSTANT_RTOL) -> bool:
    """True when every row of ``x (n, p)`` is the same up to float rounding (CKA is then undefined).

    Rule, per column j: ``Σ_i (x_ij − μ_j)² ≤ rtol · Σ_i x_ij²`` (μ_j the column mean), for every
    column (the streaming accumulators apply the same rule). The scale is the column's own magnitude:
    a column that is c plus rounding noise of c (a bias-only layer in float32, 1e8 ± 1e-1) is constant,
    one with a genuine relative spread above ~1e-6 (1 ± 1e-3, or any spread around 0) is not, and a
    huge constant column next to a varying one does not hide the variation. Each column is scaled by
    its largest absolute value first (no overflow or underflow of the squares); accumulated in float64,
    a few thousand rows at a time, on ``x``'s device.
    """
    n = x.shape[0]
    if n < 2:
        return True
    scale = torch.maximum(x.amax(0), -x.amin(0)).to(torch.float64)  # max |x_ij| per column, no copy of x
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    mean = (x.sum(0, dtype=torch.float64) / scale) / n
    spread = torch.zeros_like(scale)
    size = torch.zeros_like(scale)
    step = max(1, 2**22 // max(1, x.shape[1]))
    for start in range(0, n, step):
        part = x[start:start + step].to(torch.float64) / scale
        spread += ((part - mean) ** 2).sum(0)
        size += (part * part).sum(0)
    return bool(constant_columns(spread, size, rtol).all())


#: Machine epsilon of the numerical-rank rule. Every path takes its covariances (the functions, the feature
#: path's streamed sums, the fold path's per-fold sums, the stored paths' spectra) as float64 products of
#: float64 copies of the activations, so whatever the activations' dtype their rank is judged at
#: float64's precision: float32 activations hold exactly the values they hold, and directions that
#: are small but above float64 rounding are real (scikit-learn and numpy see them too).
RANK_EPS = float(torch.finfo(torch.float64).eps)


def rank_rtol(width: int) -> float:
    """THE numerical-rank rule, relative to the largest eigenvalue: ``max(100, p) · eps(float64)``.

    An eigenvalue ``λ`` of a layer's centred covariance ``X̃ᵀX̃`` (``p`` = the layer's features, whatever
    matrix is decomposed: the ``p × p`` covariance or the ``n × n`` Gram) counts in the rank when
    ``λ > rank_rtol(p) · λ_max``; on the singular values of ``X̃`` that is ``σ > √(max(100, p)·eps) · σ_max``
    (``1.5e-7 σ_max`` up to 100 features, ``3.4e-7 σ_max`` at 512). The float64 sums and their
    eigendecomposition resolve eigenvalues to a few ``p · eps · λ_max``, so the rule keeps every direction
    above that noise and drops only directions that no float64 computation resolves (exact duplicates,
    the ``p − n + 1`` null directions of a layer wider than the sample). Each layer has its own tolerance.
    Used by :func:`rank_mask` and so by :mod:`simkit.metrics.shape` (the CCA family's whitening, all paths)
    and :func:`simkit.metrics.predictivity.ridge_from_moments` (``ridge_r2``'s pseudo-inverse, all paths).
    """
    return max(100, int(width)) * RANK_EPS


def rank_mask(lam: Tensor, width: int) -> Tensor:
    """The eigenvalues ``lam (r,)`` (any order) of a layer of ``width`` features counted in its numerical
    rank (:func:`rank_rtol`): bool ``(r,)``, all False when no eigenvalue is positive."""
    top = float(lam.max()) if lam.numel() else 0.0
    if not top > 0:
        return torch.zeros_like(lam, dtype=torch.bool)
    return lam > rank_rtol(width) * top


def warn_undefined(reason: str, stacklevel: int = 3, metric: str = "CKA") -> None:
    """The one warning for an undefined similarity (the engine re-raises it with the layer name)."""
    warnings.warn(f"{metric} is undefined ({reason}); returning NaN", RuntimeWarning, stacklevel=stacklevel)


def exact_quantile(t: Tensor, q: float) -> Tensor:
    """The ``q``-quantile of all entries of ``t`` with linear interpolation (numpy's default).

    Exact for tensors of any size (``torch.quantile`` refuses inputs over 2**24 elements in older torch
    releases; simkit supports torch >= 2.1): two ``kthvalue`` selections on the flattened tensor. Returns a 0-d tensor of ``t``'s dtype.
    """
    if isinstance(q, bool) or not isinstance(q, int | float) or not 0 <= q <= 1:
        raise SimkitError(f"`q` must be a quantile in [0, 1], got {q!r}")
    flat = t.reshape(-1)
    m = flat.numel()
    if m == 0:
        raise SimkitError("cannot take a quantile of an empty tensor; pass at least one value")
    pos = (m - 1) * float(q)
    lo = int(math.floor(pos))
    frac = pos - lo
    v_lo = torch.kthvalue(flat, lo + 1).values
    if frac == 0.0 or lo + 1 >= m:
        return v_lo
    # the next order statistic without a second selection: v_lo again when it repeats, else the
    # smallest entry above it (two passes over the data instead of a copy and a quickselect)
    if int((flat <= v_lo).sum()) >= lo + 2:
        v_hi = v_lo
    else:
        above = flat[flat > v_lo]
        v_hi = above.min() if above.numel() else v_lo  # none above: NaN entries (sorted last), which propagate
    return v_lo + frac * (v_hi - v_lo)
