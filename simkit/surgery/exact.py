"""Bit-level checks of the exact-surgery paper (spec §4): compare bits, not values.

``x + α·R(x)`` with α = 0 equals x bit for bit in IEEE-754 when R(x) is finite (so α·R(x) = ±0) and
no component of x is −0.0 (−0.0 + +0.0 = +0.0 flips the sign bit). Both are checked on a probe batch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from simkit.errors import SimkitError

_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def int_view(t: Tensor) -> Tensor:
    """The tensor's raw bits as a same-width integer tensor (same shape)."""
    return t.detach().contiguous().view(_INT_VIEW[t.element_size()])


def bit_mismatches(a: Tensor, b: Tensor) -> int:
    """Number of positions where ``a`` and ``b`` (same shape and dtype) differ in any bit.

    +0.0 vs −0.0 and NaNs with different payloads count as mismatches; equal NaN bits do not.
    """
    if a.shape != b.shape or a.dtype != b.dtype:
        raise SimkitError(f"bit comparison needs equal shapes and dtypes, got {tuple(a.shape)} {a.dtype} "
                          f"and {tuple(b.shape)} {b.dtype}")
    return int((int_view(a) != int_view(b).to(a.device)).sum())


def flatten_tensors(output: Any) -> list[Tensor]:
    """All tensors in a model output (tensor, tuple/list, dict, or an object with ``to_tuple``), in order."""
    if isinstance(output, Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for v in output.values() for t in flatten_tensors(v)]
    if isinstance(output, list | tuple):
        return [t for v in output for t in flatten_tensors(v)]
    if hasattr(output, "to_tuple"):
        return flatten_tensors(output.to_tuple())
    return []


def output_mismatches(before: list[Tensor], after: list[Tensor]) -> tuple[int, int]:
    """(values compared, bit mismatches) over two flattened model outputs."""
    if len(before) != len(after):
        raise SimkitError(f"the model returned {len(before)} tensors before the graft and {len(after)} after")
    compared = sum(t.numel() for t in before)
    return compared, sum(bit_mismatches(x, y) for x, y in zip(before, after, strict=True))


def negative_zeros(t: Tensor) -> int:
    """Number of −0.0 entries."""
    return int(((t == 0) & torch.signbit(t)).sum()) if t.is_floating_point() else 0


def preconditions(stream: Tensor, branch_out: Tensor | None) -> dict[str, int]:
    """The paper's exactness conditions on a probe batch.

    stream: the residual stream at the graft site (b, ...); branch_out: R(stream) or None.
    Returns counts: stream_values, stream_nonfinite, stream_negative_zeros, branch_nonfinite, violations.
    """
    out = {"stream_values": stream.numel(),
           "stream_nonfinite": int((~torch.isfinite(stream)).sum()),
           "stream_negative_zeros": negative_zeros(stream),
           "branch_nonfinite": int((~torch.isfinite(branch_out)).sum()) if branch_out is not None else 0}
    out["violations"] = out["stream_nonfinite"] + out["stream_negative_zeros"] + out["branch_nonfinite"]
    return out
