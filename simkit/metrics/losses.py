"""Differentiable alignment losses: 1 − CKA, 1 − unbiased CKA, D-MNN (spec §0.5), soft mutual k-NN.

Every loss takes ``(target, guide)`` activations of the same ``n`` examples — ``(n, ...)`` tensors,
flattened per example here — and returns a 0-d tensor in the inputs' dtype (float32 for speed in
training; gradients are checked with ``torch.autograd.gradcheck`` in float64). Shapes are checked
(:class:`SimkitError`); values are not (a NaN in training propagates to the training loop).

D-MNN and the τ → 0 limit — what actually holds
-----------------------------------------------
The spec asks that D-MNN "approach the discrete overlap score as τ → 0". It does not, and cannot:
as τ → 0 the softmaxes ``P_i`` (guide) and ``Q_i`` (target) over the support ``S_i`` collapse onto a
single point each — the guide's and the target's *nearest* neighbour ``g(i)``, ``t(i)`` (both always in
``S_i``). Hence, exactly in the limit (ties aside),

    τ · D-MNN(τ)  →  (1/n) Σ_i [ s^T_{i,t(i)} − s^T_{i,g(i)} ]      (s^T = target cosine similarity)

so D-MNN → 0 when every point's nearest neighbour agrees across the two representations and grows like
``gap/τ`` otherwise; ``k`` only sets the support ``S_i`` and drops out of the limit. The k-NN overlap of
neighbours 2..k is invisible to it. ``tests/metrics/test_losses.py`` checks this limit numerically, and an
example whose 10-NN overlap is below 1 while D-MNN → 0.

The quantity that does approach the discrete mutual-k-NN score is :func:`soft_mutual_knn`: soft top-k
memberships ``σ((s_ij − θ_i)/τ)`` with ``θ_i`` halfway between the k-th and (k+1)-th similarity,
so as τ → 0 it converges to :func:`simkit.metrics.knn.mutual_knn` exactly
whenever those two similarities differ (tested).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from simkit.errors import SimkitError, unknown_name_error
from simkit.metrics._checks import (
    check_chunk,
    check_finite,
    check_k,
    check_min_n,
    check_positive,
    check_real_tensor,
    check_same_n,
    row_eps,
)
from simkit.metrics.cka import linear_cka_tensor, unbiased_cka_tensor
from simkit.metrics.knn import CHUNK_ELEMENTS, clamp_normalize, knn_indices

#: D-MNN uses one dense ``n × n`` pass up to this many examples (when no ``chunk`` is given).
DENSE_MAX_N = 2048


def _flat_pair(target: Tensor, guide: Tensor, minimum: int, what: str,
               names: tuple[str, str] = ("target", "guide")) -> tuple[Tensor, Tensor]:
    for name, t in zip(names, (target, guide), strict=True):
        if not isinstance(t, Tensor) or t.dim() < 2:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise SimkitError(f"{what}: {name} must be a tensor (n, ...) of n examples, got {shape}")
        check_real_tensor(t, name)
    check_same_n(target.shape[0], guide.shape[0])
    check_min_n(target.shape[0], minimum, what)
    dtype = torch.promote_types(target.dtype, guide.dtype)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return target.reshape(len(target), -1).to(dtype), guide.reshape(len(guide), -1).to(dtype)


def cka_loss(target: Tensor, guide: Tensor) -> Tensor:
    """``1 − linear CKA`` of ``target (n, ...)`` and ``guide (n, ...)``, ``n ≥ 2`` → 0-d tensor.

    Feature-space products when ``p·q < n²``, Gram products otherwise. Symmetric in its arguments.
    A constant side makes CKA undefined: NaN plus a warning.
    """
    x, y = _flat_pair(target, guide, 2, "cka_loss")
    return 1.0 - linear_cka_tensor(x, y)


def unbiased_cka_loss(target: Tensor, guide: Tensor) -> Tensor:
    """``1 − unbiased (HSIC_1) linear CKA`` of ``target (n, ...)``, ``guide (n, ...)``, ``n ≥ 4`` → 0-d.

    Unbiased CKA can be slightly negative or above 1 for small ``n``, so the loss can leave [0, 1].
    """
    x, y = _flat_pair(target, guide, 4, "unbiased_cka_loss")
    return 1.0 - unbiased_cka_tensor(x, y)


# ----------------------------------------------------------------------------------------------- D-MNN


def dmnn_support(t_hat: Tensor, g_hat: Tensor, k: int, chunk: int | None = None) -> tuple[Tensor, Tensor]:
    """``S_i`` = top-k(guide) ∪ top-k(target) of row-normalised ``t_hat``, ``g_hat (n, d)``, no gradient.

    Returns ``idx (n, 2k)`` int64 (guide's k first, then the target's) and ``valid (n, 2k)`` bool,
    False where a target neighbour repeats a guide neighbour. Exact chunked top-k, no n × n matrix.
    """
    with torch.no_grad():
        a = knn_indices(g_hat.detach(), k, chunk)
        b = knn_indices(t_hat.detach(), k, chunk)
        dup = (b[:, :, None] == a[:, None, :]).any(-1)
    valid = torch.cat([torch.ones_like(dup), ~dup], 1)
    return torch.cat([a, b], 1), valid


def _masked_kl(logits_p: Tensor, logits_q: Tensor, valid: Tensor) -> Tensor:
    """Row-wise ``KL(softmax p ‖ softmax q)`` over the entries where ``valid``; ``(c, m)`` → ``(c,)``.

    Log-softmax over masked logits; masked log-probabilities are zeroed before use (no ``0 · log 0``,
    no NaN in the backward pass).
    """
    log_p = torch.log_softmax(logits_p.masked_fill(~valid, -torch.inf), 1).masked_fill(~valid, 0.0)
    log_q = torch.log_softmax(logits_q.masked_fill(~valid, -torch.inf), 1).masked_fill(~valid, 0.0)
    return (log_p.exp() * (log_p - log_q)).sum(1)


def _rows_kl(t_rows, t_nb, g_rows, g_nb, valid, tau: float) -> Tensor:
    """Per-row D-MNN terms for a block: rows ``(c, d)``, their neighbours ``(c, m, d)``, ``valid (c, m)``.

    The logits are similarities ``ŝ_ij/τ``: ``−D_ij/τ`` up to a per-row constant that softmax ignores.
    """
    s_t = torch.bmm(t_nb, t_rows[:, :, None]).squeeze(2)
    s_g = torch.bmm(g_nb, g_rows[:, :, None]).squeeze(2)
    return _masked_kl(s_g / tau, s_t / tau, valid)


class _ChunkedDMNN(torch.autograd.Function):
    """D-MNN over a fixed support, block by block; the backward pass recomputes each block.

    Memory ``O(n·d + n·k + chunk·k·d)``: nothing of size n × n, and no autograd graph over all blocks.
    """

    @staticmethod
    def forward(ctx, t_hat, g_hat, idx, valid, tau, chunk):
        n = len(t_hat)
        total = t_hat.new_zeros(())
        for s in range(0, n, chunk):
            r = slice(s, min(n, s + chunk))
            total = total + _rows_kl(t_hat[r], t_hat[idx[r]], g_hat[r], g_hat[idx[r]], valid[r], tau).sum()
        ctx.save_for_backward(t_hat, g_hat, idx, valid)
        ctx.tau, ctx.chunk = tau, chunk
        return total / n

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        t_hat, g_hat, idx, valid = ctx.saved_tensors
        need_t, need_g = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, chunk = len(t_hat), ctx.chunk
        grads = [torch.zeros_like(t_hat) if need_t else None, torch.zeros_like(g_hat) if need_g else None]
        for s in range(0, n, ctx.chunk):
            r = slice(s, min(n, s + chunk))
            nb = idx[r]
            with torch.enable_grad():
                parts = []
                for full, need in ((t_hat, need_t), (g_hat, need_g)):
                    parts += [full[r].detach().requires_grad_(need), full[nb].detach().requires_grad_(need)]
                block = _rows_kl(parts[0], parts[1], parts[2], parts[3], valid[r], ctx.tau).sum() * (grad / n)
                leaves = [p for p in parts if p.requires_grad]
                got = iter(torch.autograd.grad(block, leaves))
            for side, need in enumerate((need_t, need_g)):
                if need:
                    g_rows, g_nb = next(got), next(got)
                    grads[side][r] += g_rows
                    grads[side].index_add_(0, nb.reshape(-1), g_nb.reshape(-1, g_nb.shape[-1]))
        return grads[0], grads[1], None, None, None, None


def kl_chunk(k: int, p: int, q: int) -> int:
    """Rows per block in D-MNN's KL stage: the gathered neighbours ``(chunk, 2k, p + q)`` hold about
    ``CHUNK_ELEMENTS / 4`` entries (the top-k stage uses the search's own tiles, ``knn_search.TILE``)."""
    return max(1, CHUNK_ELEMENTS // 4 // (2 * k * (p + q)))


def dmnn_loss(target: Tensor, guide: Tensor, k: int = 10, tau: float = 0.1, chunk: int | None = None) -> Tensor:
    """D-MNN (spec §0.5), guide → target: ``(1/n) Σ_i KL(P_i ‖ Q_i)`` → 0-d tensor, ``n ≥ k + 1``.

    ``target (n, ...)``, ``guide (n, ...)`` are flattened and row-L2-normalised; ``D_ij = 1 − ĝ_i·ĝ_j``
    (``D_ii = ∞``); ``S_i`` = top-k(guide) ∪ top-k(target) (:func:`dmnn_support`, no gradient);
    ``P_i`` = softmax over ``S_i`` of ``−D^G_i·/τ``, ``Q_i`` likewise on the target. Gradients reach
    both inputs (detach the guide to freeze it). Up to :data:`DENSE_MAX_N` examples and without
    ``chunk`` one dense n × n pass; otherwise blocks of rows (``chunk``, or by default
    ``knn_search.TILE`` for the top-k and :func:`kl_chunk` for the KL terms) with a recomputing
    backward: memory ``O(n·(p + q + k) + chunk·n)`` at n = 50,000, first-order gradients only. Both
    paths agree to rounding. NaN or Inf in either input is a SimkitError (the neighbour search needs finite values).
    See the module docstring for what happens as τ → 0.
    """
    check_positive(tau, "tau")
    check_chunk(chunk)
    x, y = _flat_pair(target, guide, 2, "dmnn_loss")
    for name, t in (("target", x), ("guide", y)):
        check_finite(t, f"`{name}`")  # the neighbour search needs finite values
    n = len(x)
    check_k(k, n)
    t_hat, g_hat = F.normalize(x, dim=1, eps=row_eps(x.dtype)), F.normalize(y, dim=1, eps=row_eps(y.dtype))
    idx, valid = dmnn_support(t_hat, g_hat, k, chunk)
    if chunk is None and n <= DENSE_MAX_N:
        mask = torch.zeros(n, n, dtype=torch.bool, device=x.device)
        mask.scatter_(1, idx, True)  # duplicates in idx all write True: the union
        return _masked_kl(g_hat @ g_hat.T / tau, t_hat @ t_hat.T / tau, mask).mean()
    return _ChunkedDMNN.apply(t_hat, g_hat, idx, valid, float(tau), int(chunk or kl_chunk(k, x.shape[1], y.shape[1])))


# ------------------------------------------------------------------------------------ soft mutual k-NN


def soft_mutual_knn(x: Tensor, y: Tensor, k: int = 10, tau: float = 0.01, q: float | None = 0.95) -> Tensor:
    """A smooth mutual k-NN score of ``x (n, ...)``, ``y (n, ...)`` that tends to ``mutual_knn`` as τ → 0.

    Rows are preprocessed like :func:`~simkit.metrics.knn.mutual_knn` (clamp to the ``q``-quantile of
    ``|x|``, treated as a constant in the gradient; then L2-normalise); ``q=None`` skips the clamp. Soft membership ``m_ij = σ((s_ij − θ_i)/τ)`` with ``θ_i`` halfway between the
    k-th and (k+1)-th largest similarity of row i (self excluded; the gradient flows through it); the score is
    ``mean_i Σ_j m^x_ij m^y_ij / k``. Dense: ``O(n²)`` memory, for training-batch sizes. ``n ≥ k + 2``.
    """
    check_positive(tau, "tau")
    a, b = _flat_pair(x, y, 2, "soft_mutual_knn", ("x", "y"))
    n = len(a)
    check_k(k, n)
    if k + 2 > n:
        raise SimkitError(f"soft_mutual_knn with k={k} needs at least {k + 2} samples, got {n}; use a smaller k")
    for name, t in (("x", a), ("y", b)):
        if not t.shape[1]:
            raise SimkitError(f"soft_mutual_knn: `{name}` has no features (shape {tuple(t.shape)}); give at least one")

    def membership(z: Tensor) -> Tensor:
        zn = F.normalize(z, dim=1, eps=row_eps(z.dtype)) if q is None else clamp_normalize(z, q)
        s = (zn @ zn.T).masked_fill(torch.eye(n, dtype=torch.bool, device=z.device), -torch.inf)
        top = s.topk(k + 1, dim=1).values  # differentiable: θ moves with the order statistics
        theta = (top[:, k - 1 : k] + top[:, k : k + 1]) / 2
        return torch.sigmoid((s - theta) / tau)

    return (membership(a) * membership(b)).sum(1).mean() / k


# --------------------------------------------------------------------------------------------- registry

LOSSES: dict[str, Callable[..., Tensor]] = {
    "cka": cka_loss,
    "unbiased_cka": unbiased_cka_loss,
    "dmnn": dmnn_loss,
}


def alignment_loss(name: str) -> Callable[..., Tensor]:
    """The loss called ``name`` (``cka``, ``unbiased_cka``, ``dmnn``), used as ``fn(target, guide)``."""
    if name not in LOSSES:
        raise unknown_name_error("alignment loss", name, LOSSES, f"valid: {', '.join(LOSSES)}")
    return LOSSES[name]
