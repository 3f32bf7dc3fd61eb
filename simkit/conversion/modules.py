"""Target modules that replace guide modules, and helpers to make fresh (re-initialised) copies.

- :class:`LowRankLinear`: flatten → Linear(d_in, r, bias=False) → Linear(r, d_out) → reshape; the
  conv-to-mlp target (spec §1). Input (b, *in_shape), output (b, *out_shape).
- :class:`RecurrentBlock`: x + W·RNN(norm(x)) over the token axis; the attention-to-rnn target.
  Input (b, T, d), output (b, T, d). Causal by construction (a left-to-right recurrence).
- :class:`Passthrough`: returns its first argument; stands in for the later members of a replaced group.
"""

from __future__ import annotations

import copy
import math
import warnings

import torch
from torch import nn

from simkit.errors import SimkitError


class LowRankLinear(nn.Module):
    """A rank-``rank`` linear map over the whole flattened feature map.

    in_shape, out_shape: per-example shapes (no batch axis), e.g. (C, L).
    forward: (b, *in_shape) → (b, *out_shape).
    """

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...], rank: int) -> None:
        super().__init__()
        if rank < 1:
            raise SimkitError(f"`rank` must be at least 1, got {rank}")
        self.in_shape, self.out_shape, self.rank = tuple(in_shape), tuple(out_shape), int(rank)
        self.down = nn.Linear(math.prod(self.in_shape), self.rank, bias=False)
        self.up = nn.Linear(self.rank, math.prod(self.out_shape))

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return self.up(self.down(x.reshape(x.shape[0], -1))).reshape(x.shape[0], *self.out_shape)

    def extra_repr(self) -> str:
        return f"in_shape={self.in_shape}, out_shape={self.out_shape}, rank={self.rank}"


#: the torch module of each recurrent cell (``simkit.settings.convert.CELLS``)
CELL_MODULES = {"gru": nn.GRU, "lstm": nn.LSTM, "rnn": nn.RNN}


class RecurrentBlock(nn.Module):
    """A residual recurrent layer over the sequence: ``x + proj(rnn(LayerNorm(x)))``.

    d: model width; hidden: recurrent state width (default d); cell: gru | lstm | rnn.
    forward: (b, T, d) → (b, T, d); extra positional/keyword arguments of the replaced transformer
    block (masks, rotary tables) are accepted and ignored: the recurrence is causal by itself.
    """

    def __init__(self, d: int, hidden: int | None = None, cell: str = "gru") -> None:
        super().__init__()
        if cell not in CELL_MODULES:
            raise SimkitError(f"unknown recurrent cell {cell!r} (`cell`); use one of {', '.join(CELL_MODULES)}")
        hidden = hidden or d
        self.norm = nn.LayerNorm(d)
        self.rnn = CELL_MODULES[cell](d, hidden, batch_first=True)
        self.proj = nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        y, _ = self.rnn(self.norm(x))
        return x + self.proj(y)


class Passthrough(nn.Module):
    """Identity that accepts (and ignores) any extra arguments: ``(b, ...) → (b, ...)``."""

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return x


def reinitialise(module: nn.Module, seed: int) -> nn.Module:
    """Reset every parameter of ``module`` in place from ``seed`` (BatchNorm running stats too).

    Normalisation modules without ``reset_parameters`` (a class name containing "Norm", e.g. a
    hand-written RMSNorm) get weight = 1 and bias = 0; other modules holding their own parameters
    without ``reset_parameters`` keep their values, and a warning names them.
    """
    generator_state = torch.get_rng_state()
    # on CUDA, parameters draw from the device's generator: leave the caller's state alone there too
    cuda_states = {p.device: torch.cuda.get_rng_state(p.device) for p in module.parameters() if p.is_cuda}
    torch.manual_seed(seed)
    kept = []
    try:
        for name, sub in module.named_modules():
            own = list(sub.parameters(recurse=False))
            if hasattr(sub, "reset_parameters"):
                sub.reset_parameters()
            elif own and "Norm" in type(sub).__name__:
                with torch.no_grad():
                    for pname, p in sub.named_parameters(recurse=False):
                        p.fill_(1.0 if pname == "weight" else 0.0)
            elif own:
                kept.append(name or type(sub).__name__)
            if hasattr(sub, "reset_running_stats"):
                sub.reset_running_stats()
    finally:
        torch.set_rng_state(generator_state)
        for device, state in cuda_states.items():
            torch.cuda.set_rng_state(state, device)
    if kept:
        warnings.warn("re-initialisation kept the parameters of modules without reset_parameters: "
                      + ", ".join(kept[:8]), RuntimeWarning, stacklevel=2)
    return module


def fresh_copy(module: nn.Module, seed: int) -> nn.Module:
    """A deep copy of ``module`` with every parameter re-initialised from ``seed``."""
    return reinitialise(copy.deepcopy(module), seed)
