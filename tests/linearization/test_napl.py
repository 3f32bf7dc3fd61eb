"""NAPL and path-length distributions against hand derivations and brute-force path enumeration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from simkit.errors import SimkitError
from simkit.linearization.napl import path_lengths
from simkit.linearization.slope import SlopeReLU


def slope(channels: int, linear: int) -> SlopeReLU:
    """A SlopeReLU with ``linear`` of its ``channels`` slopes frozen at 1 (p = 1 − linear/channels)."""
    m = SlopeReLU(channels)
    m.frozen[:linear] = True
    with torch.no_grad():
        m.alpha[:linear] = 1.0
        m.alpha[linear:] = 0.3
    return m


def poisson_binomial(ps: list[float]) -> np.ndarray:
    """P(k successes) by enumerating all 2^L outcomes (float64), independent of the DP."""
    out = np.zeros(len(ps) + 1)
    for outcome in itertools.product([0, 1], repeat=len(ps)):
        out[sum(outcome)] += np.prod([p if o else 1 - p for p, o in zip(ps, outcome, strict=True)])
    return out


@given(st.lists(st.integers(0, 4), min_size=1, max_size=6))
@settings(max_examples=30, deadline=None)
def test_plain_net_is_sum_of_p(linear_counts):
    layers: list[nn.Module] = []
    for k in linear_counts:
        layers += [nn.Linear(4, 4), slope(4, k)]
    model = nn.Sequential(*layers, nn.Linear(4, 2))
    ps = [1 - k / 4 for k in linear_counts]
    stats = path_lengths(model)
    assert stats.napl == pytest.approx(sum(ps), abs=1e-12)
    np.testing.assert_allclose(stats.distribution, poisson_binomial(ps), atol=1e-12)
    assert stats.apl == pytest.approx(sum(ps), abs=1e-12)          # one path: APL = NAPL
    assert [a.p for a in stats.activations] == pytest.approx(ps)


class Residual(nn.Module):
    """n blocks x ← x + relu(fc(x)): one activation per block."""

    def __init__(self, n: int):
        super().__init__()
        self.fcs = nn.ModuleList(nn.Linear(3, 3) for _ in range(n))
        self.act = nn.ReLU()

    def forward(self, x):
        for fc in self.fcs:
            x = x + self.act(fc(x))
        return x


@given(st.integers(1, 8))
@settings(max_examples=8, deadline=None)
def test_residual_blocks_give_binomial_half(n):
    stats = path_lengths(Residual(n))
    binomial = np.array([math.comb(n, k) / 2**n for k in range(n + 1)])
    np.testing.assert_allclose(stats.distribution, binomial, atol=1e-12)
    assert stats.napl == pytest.approx(n / 2)
    assert stats.num_paths == 2**n


class ShapeQueries(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)

    def forward(self, x):
        x = torch.relu(x.view(x.size(0), -1))
        b, d = x.shape
        x = self.fc(x).reshape(b, d) + x.new_zeros(x.size(0), d) + torch.ones_like(x)   # constants
        return torch.relu(x).flatten(1)


def test_shape_queries_are_not_branches():
    for example in (None, torch.randn(2, 2, 3)):
        stats = path_lengths(ShapeQueries(), example)
        assert stats.napl == pytest.approx(2.0)
        np.testing.assert_allclose(stats.distribution, [0, 0, 1], atol=1e-15)
        assert stats.num_paths == 1


class Uneven(nn.Module):
    """out = [g(x) + relu(g2(x))] + relu(relu(l(x))): branches carrying 2 and 1 paths.

    Paths and lengths: g → 0, g2 → 1, l → 2. NAPL halves at each merge: ½(½·0 + ½·1) + ½·2 = 1.25;
    APL weighs the three paths equally: (0 + 1 + 2)/3 = 1.
    """

    def __init__(self):
        super().__init__()
        self.g, self.g2, self.l = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        a = self.g(x) + torch.relu(self.g2(x))
        return a + torch.relu(torch.relu(self.l(x)))


def test_normalised_and_unnormalised_path_length():
    stats = path_lengths(Uneven())
    assert stats.napl == pytest.approx(1.25)
    np.testing.assert_allclose(stats.distribution, [0.25, 0.25, 0.5], atol=1e-15)
    assert stats.apl == pytest.approx(1.0)
    np.testing.assert_allclose(stats.apl_distribution, [1 / 3, 1 / 3, 1 / 3], atol=1e-15)
    assert stats.num_paths == 3


class InPlace(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)

    def forward(self, x):
        h = self.fc(x)
        h.relu_()          # the result is not used; h itself is overwritten
        return h * 2


def test_in_place_activations_count():
    assert path_lengths(InPlace()).napl == pytest.approx(1.0)


def test_torchvision_resnet18():
    """Stem ReLU (1) + 8 BasicBlocks of relu(x + F(x)), F with one ReLU: 1 + 8·(½·1 + 1) = 13.

    The length is 1 + 8 + Binomial(8, ½) (the shared block ReLU module counts at each call)."""
    torchvision = pytest.importorskip("torchvision")
    stats = path_lengths(torchvision.models.resnet18(num_classes=3))
    assert stats.napl == pytest.approx(13.0)
    expected = np.zeros(18)
    expected[9:] = [math.comb(8, k) / 256 for k in range(9)]
    np.testing.assert_allclose(stats.distribution, expected, atol=1e-12)
    assert len(stats.activations) == 17


class Branchy(nn.Module):
    def forward(self, x):
        return torch.relu(x) if x.mean() > 0 else x


def test_untraceable_model_is_an_error():
    with pytest.raises(SimkitError, match="cannot trace Branchy with torch.fx"):
        path_lengths(Branchy())


def test_opaque_torch_modules_warn():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.GRU(4, 4))
    with pytest.warns(RuntimeWarning, match="2 \\(GRU\\) is one torch.fx node"):
        stats = path_lengths(model)
    assert stats.napl == pytest.approx(1.0)
