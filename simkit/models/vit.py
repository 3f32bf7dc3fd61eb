"""A small Vision Transformer (`simkit:vit`) for MNIST-1D sequences and 8×8 digits, in plain torch.

Non-overlapping patches → linear patch embedding, a learned class token and learned position
embeddings → ``depth`` pre-norm transformer blocks → final LayerNorm → class-token readout → linear
head (the DINOv2-style guide of the Network-of-Theseus ViT → Patch-MLP row).

Input: ``(b, in_channels, length)`` with ``length % patch == 0`` (T = length / patch tokens), or, with
``size`` set, ``(b, in_channels, size, size)`` cut into ``patch × patch`` squares (T = (size / patch)²).
Module names (a stable contract for ``simkit layers``, compare and the recipes):

- ``embed`` → (b, 1 + T, dim): ``embed.proj`` (the patch projection, a Conv with kernel = stride =
  patch, so each token sees only its own patch), plus ``embed.cls_token`` and ``embed.pos_embed``;
- ``blocks.i`` → (b, 1 + T, dim): ``x + attn(norm1(x))`` then ``x + mlp(norm2(x))``; children
  ``norm1``, ``attn`` (:class:`Attention`: ``qkv``, ``proj``; the only module that mixes tokens),
  ``norm2``, ``mlp`` (:class:`TokenMLP`: ``fc1``, ``act``, ``fc2``, applied to every token alone);
- ``readout`` → (b, dim): :class:`Readout`, LayerNorm then the class token (``pool="cls"``) or the
  mean of the patch tokens (``pool="mean"``); ``head`` → logits (b, num_classes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError

POOLS = ("cls", "mean")


class PatchEmbedding(nn.Module):
    """Patches → tokens with a class token in front and learned positions: (b, C, *spatial) → (b, 1 + T, d).

    ``proj`` is a Conv1d/Conv2d with kernel = stride = patch (one linear map per patch, no overlap).
    """

    def __init__(self, in_channels: int, dim: int, patch: int, tokens: int, image: bool) -> None:
        super().__init__()
        conv = nn.Conv2d if image else nn.Conv1d
        self.proj = conv(in_channels, dim, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.empty(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.empty(1, 1 + tokens, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The class token and positions only (``proj`` resets itself): N(0, 0.02²) as in ViT/DINOv2."""
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.pos_embed, std=0.02)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.proj(x).flatten(2).transpose(1, 2)  # (b, T, d)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.pos_embed


class Attention(nn.Module):
    """Bidirectional multi-head self-attention: (b, L, d) → (b, L, d). ``qkv``, then ``proj``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.d_head = heads, dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        b, length, d = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, self.d_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)  # (b, h, L, d_head)
        return self.proj(y.transpose(1, 2).reshape(b, length, d))


class TokenMLP(nn.Module):
    """The same two-layer MLP at every token, independently: (b, L, d) → (b, L, d) (no token mixing).

    ``fc1`` (d → hidden), ``act`` (GELU), ``fc2`` (hidden → d). Extra positional/keyword arguments
    (masks of a replaced attention module) are accepted and ignored.
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor, *args: object, **kwargs: object) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x (b, L, d) → x + attn(norm1(x)) → · + mlp(norm2(·)).

    ``residual = True`` marks it as a residual block (deep-to-shallow aligns such groups on output − input).
    """

    residual = True

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = TokenMLP(dim, hidden)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Readout(nn.Module):
    """LayerNorm, then pool: (b, prefix + T, d) → (b, d).

    pool ``cls``: token 0 (the class token); ``mean``: the mean of the T patch tokens (tokens
    ``prefix..``; the class token is left out), the readout of a Patch-MLP, whose class token never
    sees the patches.
    """

    def __init__(self, norm: nn.Module, pool: str = "cls", prefix: int = 1) -> None:
        super().__init__()
        if pool not in POOLS:
            raise SimkitError(f"unknown readout pool {pool!r}; use one of {', '.join(POOLS)}")
        self.norm, self.pool, self.prefix = norm, pool, prefix

    def forward(self, x: Tensor) -> Tensor:
        x = self.norm(x)
        return x[:, 0] if self.pool == "cls" else x[:, self.prefix:].mean(dim=1)

    def extra_repr(self) -> str:
        return f"pool={self.pool!r}, prefix={self.prefix}"


def _positive(**values: object) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SimkitError(f"simkit:vit: {key} must be a positive integer, got {value!r}")


class ViT(nn.Module):
    """A small ViT: (b, in_channels, length) or (b, in_channels, size, size) → logits (b, num_classes).

    in_channels, length (1-D input; ignored when ``size`` is set), size (side of a square image; None
    for 1-D), patch (patch length or side), dim (token width), depth (blocks), heads (attention heads;
    divides dim), mlp_ratio (hidden width of each block's MLP = mlp_ratio · dim), num_classes,
    pool (``cls``: class-token readout, the default; ``mean``: mean of the patch tokens).
    """

    def __init__(self, in_channels: int = 1, length: int = 40, size: int | None = None, patch: int = 4,
                 dim: int = 64, depth: int = 4, heads: int = 4, mlp_ratio: float = 2, num_classes: int = 10,
                 pool: str = "cls") -> None:
        super().__init__()
        _positive(in_channels=in_channels, patch=patch, dim=dim, depth=depth, heads=heads,
                  num_classes=num_classes)
        if size is not None:
            _positive(size=size)
        else:
            _positive(length=length)
        side = size if size is not None else length
        if side % patch:
            what = "size" if size is not None else "length"
            raise SimkitError(f"simkit:vit: {what} {side} is not a multiple of patch {patch}; pick a patch "
                              f"that divides it")
        if dim % heads:
            raise SimkitError(f"simkit:vit: dim {dim} is not a multiple of heads {heads}; change dim or heads")
        if isinstance(mlp_ratio, bool) or not isinstance(mlp_ratio, int | float) or mlp_ratio <= 0:
            raise SimkitError(f"simkit:vit: mlp_ratio must be a positive number, got {mlp_ratio!r}")
        if pool not in POOLS:
            raise SimkitError(f"simkit:vit: pool must be one of {', '.join(POOLS)}, got {pool!r}")
        hidden = max(1, round(mlp_ratio * dim))
        image = size is not None
        self.in_channels = in_channels
        self.input_shape: tuple[int, ...] = (side, side) if image else (side,)
        self.tokens = (side // patch) ** (2 if image else 1)
        self.embed = PatchEmbedding(in_channels, dim, patch, self.tokens, image)
        self.blocks = nn.Sequential(*(Block(dim, heads, hidden) for _ in range(depth)))
        self.readout = Readout(nn.LayerNorm(dim), pool)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.readout(self.blocks(self.embed(x))))

    def example_input(self) -> Tensor:
        """One zero sample (1, in_channels, *spatial) for dry runs (`simkit layers`)."""
        return torch.zeros(1, self.in_channels, *self.input_shape)


__all__ = ["ViT", "PatchEmbedding", "Attention", "TokenMLP", "Block", "Readout", "POOLS"]
