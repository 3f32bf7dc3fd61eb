"""Per-batch linear Grams ``K = x xᵀ`` of many layers: fast, and accurate in float32.

The minibatch CKA path spends most of its time here: a Gram costs ``b²·p`` multiply-adds per layer and
batch, against the layer's own forward cost, so two things matter.

* **Speed.** On the CPU a wide layer's Gram is split into column chunks and computed as one batched
  product of its lower block triangle (:func:`linear_gram`): the chunks run in parallel without
  synchronisation, and only ``3/4`` of the products are formed. ResNet's 65,536-wide stem layers take
  about 0.75× the time of ``x @ x.T`` on 2 threads (``benchmarks/bench_gram.py``).
* **Accuracy.** A float32 Gram carries a rounding error of about ``ε·(‖mean‖² + Σ var)`` per entry,
  and centring leaves values of size ``Σ var``; a layer whose features are dominated by their mean
  (deep ResNet blocks: ``‖mean‖² ≈ 5–100 · Σ var``) would lose those digits. Such layers are computed
  from features shifted by the batch's first row (:func:`shifted_gram`), which centring cancels
  exactly. Whether to shift is guessed before any product from two rows (:func:`two_row_guesses`), and
  checked after the product for the layers that were not shifted (:func:`batch_grams`).
* **Constant layers.** A layer whose rows agree up to float rounding has no variance to compare; the
  same two rows flag candidates, the whole batch confirms them, and their Grams are set exactly to zero
  (the accumulators then report NaN and a warning instead of a similarity of rounding noise).

Everything depends on the batch alone (no state from earlier batches), so any split of the batches over
processes gives the same Grams.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from simkit.metrics._checks import CONSTANT_RTOL, is_constant

#: A layer is recomputed shifted when its Gram shows ``‖mean‖² > SHIFT_RATIO · Σ var``.
SHIFT_RATIO = 4.0
#: ... and shifted from the start when two rows suggest ``‖mean‖² > SHIFT_GUESS · Σ var``
#: (a margin below SHIFT_RATIO, so a wrong guess costs time, never accuracy).
SHIFT_GUESS = 1.0
#: Column chunks of the CPU product. A constant, not the thread count: the float32 sums must not depend
#: on how many threads (or torchrun processes) run, so that any split of the work gives the same Grams.
CHUNKS = 4
#: The chunked symmetric product is used when every chunk is at least this many columns wide.
MIN_CHUNK = 2048


def _chunks(p: int, device: torch.device) -> int:
    """How many column chunks the CPU product uses for width ``p`` (1: a plain matmul)."""
    return CHUNKS if device.type == "cpu" and p >= CHUNKS * MIN_CHUNK else 1


def linear_gram(x: Tensor, out: Tensor | None = None) -> Tensor:
    """``x xᵀ`` for ``x (b, p)``, in ``x``'s dtype: ``(b, b)``, written to ``out`` when given.

    Wide layers on the CPU: ``p`` is cut into ``c`` column chunks (a view, no copy), each chunk gives
    the lower block triangle ``[x; x_bottom] · [x_topᵀ, x_bottomᵀ]`` of its partial Gram in one batched
    product, and the ``c`` partial Grams are summed. Results equal ``x @ x.T`` up to float rounding.
    """
    b, p = x.shape
    if out is None:
        out = torch.empty(b, b, dtype=x.dtype, device=x.device)
    chunks = _chunks(p, x.device)
    if chunks == 1 or b < 4:
        return torch.mm(x, x.T, out=out)
    width = p // chunks
    main = x[:, :chunks * width].unflatten(1, (chunks, width)).transpose(0, 1)  # (c, b, width), a view
    half = b // 2
    left = torch.bmm(main, main[:, :half].transpose(1, 2)).sum(0)               # (b, half)
    right = torch.bmm(main[:, half:], main[:, half:].transpose(1, 2)).sum(0)    # (b - half, b - half)
    rest = x[:, chunks * width:]
    if rest.shape[1]:
        left.addmm_(rest, rest[:half].T)
        right.addmm_(rest[half:], rest[half:].T)
    out[:, :half] = left
    out[half:, half:] = right
    out[:half, half:] = left[half:].T
    return out


def shifted_gram(x: Tensor, out: Tensor, buf: Tensor) -> Tensor:
    """``(x − x₀)(x − x₀)ᵀ`` for ``x (b, p)``, ``x₀`` its first row, into ``out (b, b)``.

    ``buf`` is scratch space of at least ``b·p`` elements. Row and column 0 come out exactly zero (all
    ``b`` rows are multiplied all the same: BLAS runs much slower on an odd row count); a constant
    layer gives exactly zero.
    """
    b, p = x.shape
    return linear_gram(torch.sub(x, x[:1], out=buf[:b * p].view(b, p)), out)


def two_row_guesses(acts: Sequence[Tensor]) -> tuple[list[bool], list[bool]]:
    """Per layer ``(b, p)``, from its first two rows: (mean-dominated?, constant up to rounding?).

    Mean-dominated: ``x₀·x₁ > SHIFT_GUESS · ‖x₀ − x₁‖²/2``; ``x₀·x₁`` estimates ``‖mean‖²`` and
    ``‖x₀ − x₁‖²/2`` estimates ``Σ var`` (exactly, in expectation, for independent rows). Possibly
    constant: ``‖x₀ − x₁‖² ≤ CONSTANT_RTOL · ‖x₀‖²`` (the difference is formed first, so it does not
    cancel); :func:`batch_grams` confirms it on the whole batch. One small product per layer and one
    device sync; non-finite rows give False twice. All layers must share one dtype.
    """
    if not acts or acts[0].shape[0] < 2:
        return [False] * len(acts), [False] * len(acts)
    pairs = []
    for x in acts:
        rows = torch.stack([x[0], x[0] - x[1]])
        pairs.append(torch.mm(rows, rows.T))
    g = torch.stack(pairs).double()                                      # (L, 2, 2)
    first, first_diff, spread = g[:, 0, 0], g[:, 0, 1], g[:, 1, 1]      # ‖x₀‖², x₀·(x₀ − x₁), ‖x₀ − x₁‖²
    dominated = first - first_diff > SHIFT_GUESS * 0.5 * spread         # x₀·x₁ against Σ var
    constant = spread <= CONSTANT_RTOL * first
    return dominated.tolist(), constant.tolist()


def batch_grams(acts: Sequence[Tensor]) -> Tensor:
    """Linear Grams of one batch of L layers ``(b, p_i)`` → ``(L, b, b)`` float64.

    Products run in the activations' dtype (half types in float32; float64 when any layer is float64).
    Mean-dominated layers are shifted by their first row (see the module notes); HSIC only sees centred
    Grams, which the shift leaves unchanged. A layer constant up to float rounding in this batch
    (:func:`simkit.metrics._checks.is_constant`) gets an exactly zero Gram, so its rounding noise is not
    read as similarity. Non-finite activations give a non-finite diagonal (the caller checks the traces).
    """
    b = acts[0].shape[0]
    dtype = torch.float64 if any(x.dtype == torch.float64 for x in acts) else torch.float32
    xs = [x.detach() if x.dtype == dtype else x.detach().to(dtype) for x in acts]
    out = torch.empty(len(xs), b, b, dtype=dtype, device=xs[0].device)
    shift, maybe_constant = two_row_guesses(xs)
    constant = [c and is_constant(x) for x, c in zip(xs, maybe_constant, strict=True)]
    shift = [s and not c for s, c in zip(shift, constant, strict=True)]
    widest = max((x.shape[1] for x, s in zip(xs, shift, strict=True) if s), default=0)
    buf = torch.empty(b * widest, dtype=dtype, device=out.device)

    def shifted(i: int) -> None:
        nonlocal buf
        if buf.numel() < b * xs[i].shape[1]:  # a redo wider than every guessed layer
            buf = torch.empty(b * xs[i].shape[1], dtype=dtype, device=out.device)
        shifted_gram(xs[i], out[i], buf)

    for i, x in enumerate(xs):
        if constant[i]:
            out[i].zero_()
        elif shift[i]:
            shifted(i)
        else:
            linear_gram(x, out[i])
    g = out.double()
    plain = [i for i, (s, c) in enumerate(zip(shift, constant, strict=True)) if not s and not c]
    if plain and b > 1:  # a guess that missed: the Gram itself shows a dominant mean
        mean_sq = g[plain].sum((-2, -1)) / (b * b)                          # ‖mean‖²
        total = torch.diagonal(g[plain], dim1=-2, dim2=-1).sum(-1) / b       # ‖mean‖² + Σ var
        redo = (mean_sq * (1 + SHIFT_RATIO) > SHIFT_RATIO * total).tolist()
        for i, r in zip(plain, redo, strict=True):
            if r:
                shifted(i)
                g[i] = out[i]
    return g
