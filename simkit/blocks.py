"""Plain-torch building blocks shared by the model zoo and surgery: RMSNorm, rotary causal
self-attention, SwiGLU, and the Llama-style residual branch R(x).

Pre-norm attention + SwiGLU MLP with rotary positions and no biases (the exact-surgery paper's block
branch): a Llama block of :mod:`simkit.models.llama` is x + R(x), a gated graft of
:mod:`simkit.surgery` x + α·R(x). Torch only, so surgery can build its branches from it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError


class RMSNorm(nn.Module):
    """x (..., d) → x / sqrt(mean(x²) + eps) · weight."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def _rotary_tables(max_len: int, d_head: int) -> tuple[Tensor, Tensor]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)  # (max_len, d_head/2)
    return angles.cos().float(), angles.sin().float()


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x (b, h, t, d_head) with tables (t, d_head/2)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return out.flatten(-2)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention with rotary positions: x (b, t, d) → (b, t, d).

    ``out`` is the output projection (zeroed by a net2net graft).
    """

    cos: Tensor  # rotary tables (max_len, d_head/2), non-persistent buffers
    sin: Tensor

    def __init__(self, d: int, heads: int, max_len: int) -> None:
        super().__init__()
        if d % heads or (d // heads) % 2:
            raise SimkitError(f"d={d} must be a multiple of 2·heads (heads={heads}); change d or heads")
        self.heads, self.d_head = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        cos, sin = _rotary_tables(max_len, self.d_head)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.d_head).permute(2, 0, 3, 1, 4)
        cos, sin = torch.narrow(self.cos, 0, 0, t), torch.narrow(self.sin, 0, 0, t)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, h, t, d_head)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    """x (..., d) → down(silu(gate(x)) · up(x)); ``down`` is the output projection."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBranch(nn.Module):
    """Residual branch R(x) = a + m with a = Attn(RMSNorm(x)), m = SwiGLU(RMSNorm(x + a)): (b, t, d) → (b, t, d).

    A Llama block is x + R(x); a gated graft uses x + α·R(x).
    """

    def __init__(self, d: int, heads: int = 4, max_len: int = 64, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(d)
        self.attn = CausalSelfAttention(d, heads, max_len)
        self.mlp_norm = RMSNorm(d)
        self.mlp = SwiGLU(d, mlp_ratio * d)

    def forward(self, x: Tensor) -> Tensor:
        a = self.attn(self.attn_norm(x))
        return a + self.mlp(self.mlp_norm(x + a))

    def output_projections(self) -> list[nn.Linear]:
        return [self.attn.out, self.mlp.down]
