"""The built-in small networks (`simkit:mlp`, `simkit:cnn1d`, `simkit:cnn2d`).

They are the guide, target and linearization networks of the research runners, so their module
names are a stable contract:

- ``blocks.0``, ``blocks.1``, ... — one building block per layer, each with children ``conv``/``fc``,
  ``bn`` (``nn.Identity`` when ``batchnorm=False``) and ``relu`` (an ``nn.ReLU`` module);
- ``flatten`` (``nn.Flatten``; first in the MLP, after the blocks in the CNNs) and ``head``
  (``nn.Linear`` → logits (b, num_classes)).

With ``residual=True`` every block after the first returns ``x + relu(bn(conv(x)))`` (channels stay
constant so the sum is defined). Convolutions use "same" padding, so the length (or H×W) is kept.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from simkit.errors import SimkitError


class ConvBlock(nn.Module):
    """``relu(bn(conv(x)))``, plus ``x`` when ``residual``: (b, c_in, ...) → (b, c_out, ...)."""

    def __init__(self, conv: nn.Module, bn: nn.Module, residual: bool = False):
        super().__init__()
        self.residual = residual
        self.conv, self.bn, self.relu = conv, bn, nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn(self.conv(x)))
        return x + out if self.residual else out


class DenseBlock(nn.Module):
    """``relu(bn(fc(x)))``, plus ``x`` when ``residual``: (b, d_in) → (b, d_out)."""

    def __init__(self, fc: nn.Module, bn: nn.Module, residual: bool = False):
        super().__init__()
        self.residual = residual
        self.fc, self.bn, self.relu = fc, bn, nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn(self.fc(x)))
        return x + out if self.residual else out


def _check(name: str, **values: int) -> None:
    for key, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise SimkitError(f"simkit:{name}: {key} must be a positive integer, got {value!r}")


class MLP(nn.Module):
    """Flatten → ``depth`` × (Linear → BN? → ReLU) → Linear head.

    Input (b, ...) with prod(...) = in_features → logits (b, num_classes). Blocks: ``blocks.i``.
    """

    def __init__(self, in_features: int = 40, hidden: int = 128, depth: int = 3, num_classes: int = 10,
                 batchnorm: bool = False, residual: bool = False):
        super().__init__()
        _check("mlp", in_features=in_features, hidden=hidden, depth=depth, num_classes=num_classes)
        self.flatten = nn.Flatten()
        blocks = []
        for i in range(depth):
            width_in = in_features if i == 0 else hidden
            bn = nn.BatchNorm1d(hidden) if batchnorm else nn.Identity()
            blocks.append(DenseBlock(nn.Linear(width_in, hidden, bias=not batchnorm), bn, residual and i > 0))
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(self.flatten(x)))

    def example_input(self) -> Tensor:
        """One zero sample (1, in_features) for dry runs (`simkit layers`)."""
        first = self.blocks[0]
        assert isinstance(first, DenseBlock) and isinstance(first.fc, nn.Linear)
        return torch.zeros(1, first.fc.in_features)


class _ConvNet(nn.Module):
    """Shared body of CNN1d/CNN2d: blocks of conv → BN → ReLU, flatten, linear head."""

    conv: type[nn.Module]
    norm: type[nn.Module]

    def __init__(self, name: str, in_channels: int, spatial: tuple[int, ...], channels: int, layers: int,
                 kernel: int, batchnorm: bool, residual: bool, num_classes: int):
        super().__init__()
        self.in_channels, self.spatial_shape = in_channels, spatial
        _check(name, in_channels=in_channels, channels=channels, layers=layers, kernel=kernel,
               num_classes=num_classes)
        if kernel % 2 == 0:
            raise SimkitError(f"simkit:{name}: kernel must be odd (same padding), got {kernel}")
        blocks = []
        for i in range(layers):
            conv = self.conv(in_channels if i == 0 else channels, channels, kernel, padding=kernel // 2,
                             bias=not batchnorm)
            bn = self.norm(channels) if batchnorm else nn.Identity()
            blocks.append(ConvBlock(conv, bn, residual and i > 0))
        self.blocks = nn.Sequential(*blocks)
        self.flatten = nn.Flatten()
        self.head = nn.Linear(channels * math.prod(spatial), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.flatten(self.blocks(x)))

    def example_input(self) -> Tensor:
        """One zero sample (1, in_channels, *spatial) for dry runs (`simkit layers`)."""
        return torch.zeros(1, self.in_channels, *self.spatial_shape)


class CNN1d(_ConvNet):
    """1-D conv net for MNIST-1D: (b, in_channels, length) → logits (b, num_classes).

    ``blocks.i`` output: (b, channels, length); ``head`` input: (b, channels · length).
    """

    conv, norm = nn.Conv1d, nn.BatchNorm1d

    def __init__(self, in_channels: int = 1, length: int = 40, channels: int = 32, layers: int = 3,
                 kernel: int = 5, batchnorm: bool = True, residual: bool = False, num_classes: int = 10):
        _check("cnn1d", length=length)
        super().__init__("cnn1d", in_channels, (length,), channels, layers, kernel, batchnorm, residual,
                         num_classes)


class CNN2d(_ConvNet):
    """2-D conv net for 8×8 digits: (b, in_channels, size, size) → logits (b, num_classes).

    ``blocks.i`` output: (b, channels, size, size); ``head`` input: (b, channels · size²).
    """

    conv, norm = nn.Conv2d, nn.BatchNorm2d

    def __init__(self, in_channels: int = 1, size: int = 8, channels: int = 32, layers: int = 3,
                 kernel: int = 3, batchnorm: bool = True, residual: bool = False, num_classes: int = 10):
        _check("cnn2d", size=size)
        super().__init__("cnn2d", in_channels, (size, size), channels, layers, kernel, batchnorm, residual,
                         num_classes)


__all__ = ["MLP", "CNN1d", "CNN2d", "ConvBlock", "DenseBlock"]
