"""A tiny Llama-style causal language model in plain torch (the exact-surgery paper's test bed).

Pre-norm blocks x ← x + Attn(RMSNorm(x)); x ← x + SwiGLU(RMSNorm(x)), rotary position embeddings,
no biases, untied output head. Traceable by torch.fx. Built-in zoo name: ``simkit:llama``.
"""

from __future__ import annotations

from torch import Tensor, nn

from simkit.blocks import LlamaBranch, RMSNorm


class Block(nn.Module):
    """Pre-norm Llama block: x (b, t, d) → x + R(x)."""

    def __init__(self, d: int, heads: int, max_len: int) -> None:
        super().__init__()
        self.branch = LlamaBranch(d, heads, max_len)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.branch(x)


class TinyLlama(nn.Module):
    """Token ids (b, t) int64, t ≤ max_len → logits (b, t, vocab). Blocks in ``self.blocks``."""

    def __init__(self, vocab: int = 50, d: int = 128, heads: int = 4, blocks: int = 4, max_len: int = 64) -> None:
        super().__init__()
        self.vocab, self.max_len = vocab, max_len
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, max_len) for _ in range(blocks))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
