"""Input checks and small exact helpers shared by the metric modules.

Everything here raises :class:`~simkit.errors.SimkitError` for input a user can fix, with one line that
names the problem and the fix. The engine catches these and adds the model and layer names.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from simkit.errors import SimkitError


def as_matrix(x, name: str = "x", dtype: torch.dtype | None = torch.float64) -> Tensor:
    """``x`` as a 2-D tensor ``(n, p)``, cast to ``dtype`` (``None`` keeps a floating dtype).

    Accepts tensors and array-likes. Raises for other ranks and for NaN/Inf values.
    """
    t = torch.as_tensor(x)
    if t.dim() != 2:
        raise SimkitError(
            f"{name} must be a 2-D (n, features) matrix, got shape {tuple(t.shape)}; "
            "flatten each example first, e.g. x.reshape(len(x), -1)"
        )
    if dtype is not None:
        t = t.to(dtype)
    elif not t.is_floating_point():
        t = t.to(torch.get_default_dtype())
    check_finite(t, name)
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
    if int(k) != k or k < 1:
        raise SimkitError(f"k must be a positive integer, got {k!r}; the default is k=10")
    if k > n - 1:
        raise SimkitError(
            f"k={k} neighbours need at least {k + 1} samples, got {n}; use more samples or a smaller k"
        )


def check_positive(value: float, name: str) -> None:
    """Raise unless ``value`` is a finite number > 0."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise SimkitError(f"{name} must be a positive number, got {value!r}")


def check_chunk(chunk: int | None) -> None:
    """Raise unless ``chunk`` is None (automatic) or a positive integer number of rows."""
    if chunk is not None and (int(chunk) != chunk or chunk < 1):
        raise SimkitError(f"chunk must be a positive integer (rows per block), got {chunk!r}")


def is_constant(x: Tensor) -> bool:
    """True when every row of ``x (n, p)`` equals the first one (CKA is then undefined)."""
    return bool((x == x[:1]).all())


def warn_undefined(reason: str, stacklevel: int = 3, metric: str = "CKA") -> None:
    """The one warning for an undefined similarity (the engine re-raises it with the layer name)."""
    warnings.warn(f"{metric} is undefined ({reason}); returning NaN", RuntimeWarning, stacklevel=stacklevel)


def exact_quantile(t: Tensor, q: float) -> Tensor:
    """The ``q``-quantile of all entries of ``t`` with linear interpolation (numpy's default).

    Exact for tensors of any size (``torch.quantile`` refuses inputs over 2**24 elements in older torch
    releases; simkit supports torch >= 2.1): two ``kthvalue`` selections on the flattened tensor. Returns a 0-d tensor of ``t``'s dtype.
    """
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
    v_hi = torch.kthvalue(flat, lo + 2).values
    return v_lo + frac * (v_hi - v_lo)
