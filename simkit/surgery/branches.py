"""The gated residual block F(x) = x + α·R(x) and the built-in residual branches R.

Built-in branches are described by JSON-able specs ``{"kind", "shape", "seed", "dtype"}`` (``shape``
is the per-sample stream shape) and built deterministically from them, so a graft log can rebuild
them. Each has ``output_projections()``: the layers a net2net gate zeroes.
- ``mlp``: pre-norm MLP on the last axis, LayerNorm(d) → Linear(d, 4d) → GELU → Linear(4d, d); (..., d).
- ``llama``: pre-norm attention + SwiGLU MLP (:class:`simkit.blocks.LlamaBranch`); (b, t, d).
- ``conv``: GroupNorm(1, c) → Conv(c, c, 3) → GELU → Conv(c, c, 3), 1-d or 2-d maps; (b, c, L) or (b, c, h, w).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from simkit.blocks import LlamaBranch
from simkit.errors import SimkitError
from simkit.settings.graft import BRANCHES


class GatedResidual(nn.Module):
    """F(x) = x + α·R(x), α a learnable scalar: x (b, ...) → (b, ...)."""

    def __init__(self, branch: nn.Module, alpha: float = 0.0, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.branch = branch
        self.alpha = nn.Parameter(torch.tensor(float(alpha), dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.alpha * self.branch(x)

    @torch.no_grad()
    def undo_distance(self, x: Tensor) -> float:
        """|α| · mean over samples of ‖R(x)‖₂ (how far the block is from the identity) for x (b, ...)."""
        r = self.branch(x).flatten(1).double()
        return float(self.alpha.abs().double() * r.norm(dim=1).mean())


class MLPBranch(nn.Module):
    """Pre-norm MLP on the last axis: (..., d) → (..., d)."""

    def __init__(self, d: int, ratio: int = 4) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc = nn.Linear(d, ratio * d)
        self.act = nn.GELU()
        self.out = nn.Linear(ratio * d, d)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.act(self.fc(self.norm(x))))

    def output_projections(self) -> list[nn.Module]:
        return [self.out]


class ConvBranch(nn.Module):
    """Pre-norm conv branch on feature maps: (b, c, L) or (b, c, h, w) → same shape."""

    def __init__(self, channels: int, dims: int) -> None:
        super().__init__()
        conv = nn.Conv1d if dims == 1 else nn.Conv2d
        self.norm = nn.GroupNorm(1, channels)
        self.conv1 = conv(channels, channels, 3, padding=1)
        self.act = nn.GELU()
        self.out = conv(channels, channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(self.act(self.conv1(self.norm(x))))

    def output_projections(self) -> list[nn.Module]:
        return [self.out]


def branch_spec(kind: str, sample_shape: tuple[int, ...], seed: int, dtype: torch.dtype) -> dict[str, Any]:
    """The JSON-able description of a built-in branch for a stream of per-sample shape ``sample_shape``."""
    if kind not in BRANCHES:
        raise SimkitError(f"unknown branch {kind!r}; use one of {', '.join(BRANCHES)} or pass an nn.Module")
    shape = list(sample_shape)
    if kind == "llama" and len(shape) != 2:
        raise SimkitError(f"branch 'llama' needs a (batch, tokens, d) stream, got per-sample shape {tuple(shape)}; "
                          "use branch 'mlp' or 'conv'")
    if kind == "conv" and len(shape) not in (2, 3):
        raise SimkitError(f"branch 'conv' needs a (batch, c, L) or (batch, c, h, w) stream, got per-sample shape "
                          f"{tuple(shape)}; use branch 'mlp'")
    if not shape:
        raise SimkitError("the stream at the graft site has no feature axis (one scalar per sample); graft elsewhere")
    return {"kind": kind, "shape": shape, "seed": int(seed), "dtype": str(dtype).removeprefix("torch.")}


def build_branch(spec: dict[str, Any]) -> nn.Module:
    """A built-in branch from its spec, initialised from ``spec["seed"]`` (the global RNG is untouched)."""
    kind, shape = spec["kind"], spec["shape"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec["seed"])
        if kind == "mlp":
            module: nn.Module = MLPBranch(shape[-1])
        elif kind == "llama":
            d = shape[-1]
            heads = next((h for h in (4, 2, 1) if d % (2 * h) == 0), None)
            if heads is None:
                raise SimkitError(f"branch 'llama' needs an even width, got d={d}; use branch 'mlp'")
            module = LlamaBranch(d, heads=heads, max_len=max(64, shape[0]))
        else:
            module = ConvBranch(shape[0], dims=len(shape) - 1)
    return module.to(getattr(torch, spec["dtype"]))


def output_projections(branch: nn.Module) -> list[nn.Module]:
    """The branch's output projections (what net2net zeroes); SimkitError when it does not declare them."""
    method = getattr(branch, "output_projections", None)
    if method is None:
        raise SimkitError(f"gate 'net2net' must zero the output projections of {type(branch).__name__}, which has "
                          "no output_projections() method; add one returning those layers, or use gate 'shadow'")
    return list(method())


@torch.no_grad()
def zero_output_projections(branch: nn.Module) -> None:
    """Zero, in place, the own parameters of the branch's output projections (net2net's zero output)."""
    for layer in output_projections(branch):
        for p in layer.parameters(recurse=False):
            p.zero_()
