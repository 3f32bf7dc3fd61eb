"""Per-batch Grams (simkit.metrics.gram) against float64 numpy references, on every code path.

The chunked symmetric product only runs for wide layers; ``MIN_CHUNK`` is lowered here so that small
inputs take it too, and each test says which path it checks.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from simkit.metrics import gram
from tests import reference


@pytest.fixture
def chunked(monkeypatch):
    """Every layer of at least CHUNKS·4 columns takes the chunked symmetric product."""
    monkeypatch.setattr(gram, "MIN_CHUNK", 4)
    return gram.CHUNKS * 4


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 17), extra=st.integers(0, 9), seed=st.integers(0, 2**16))
def test_linear_gram_equals_reference_on_the_chunked_path(b, extra, seed):
    """Odd and even batch sizes; widths with and without a remainder after the chunks."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gram, "MIN_CHUNK", 4)
        p = gram.CHUNKS * 4 + extra
        x = np.random.default_rng(seed).normal(size=(b, p))
        assert gram._chunks(p, torch.device("cpu")) > 1
        got = gram.linear_gram(torch.from_numpy(x))
    np.testing.assert_allclose(got.numpy(), x @ x.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(4, 1), (64, 3), (5, 700)])
def test_linear_gram_equals_reference_on_the_plain_path(shape):
    x = np.random.default_rng(1).normal(size=shape)
    assert gram._chunks(shape[1], torch.device("cpu")) == 1
    ref = x @ x.T
    np.testing.assert_allclose(gram.linear_gram(torch.from_numpy(x)).numpy(), ref, atol=1e-12 * np.abs(ref).max())


def test_linear_gram_writes_into_a_strided_out(chunked):
    x = torch.randn(9, chunked + 3, dtype=torch.float64)
    out = torch.full((10, 10), 7.0, dtype=torch.float64)
    gram.linear_gram(x, out[1:, 1:])
    np.testing.assert_allclose(out[1:, 1:].numpy(), (x @ x.T).numpy(), rtol=1e-12)
    assert (out[0] == 7).all() and (out[:, 0] == 7).all()


def test_shifted_gram_is_the_gram_of_features_minus_the_first_row(chunked):
    x = torch.randn(12, chunked + 5, dtype=torch.float64) + 50.0
    out = torch.empty(12, 12, dtype=torch.float64)
    gram.shifted_gram(x, out, torch.empty(12 * x.shape[1], dtype=torch.float64))
    shifted = (x - x[:1]).numpy()
    np.testing.assert_allclose(out.numpy(), shifted @ shifted.T, rtol=1e-12, atol=1e-9)
    assert (out[0] == 0).all() and (out[:, 0] == 0).all()


def test_two_row_guesses():
    rng = np.random.default_rng(2)
    noise = torch.from_numpy(rng.normal(size=(8, 500)))
    rounded = torch.full((8, 5), 3.0)
    rounded[1] += 1e-9
    layers = [noise, noise + 10.0, torch.zeros(8, 5), torch.full((8, 5), 3.0), rounded, 3.0 + 1e-3 * noise]
    dominated, constant = gram.two_row_guesses(layers)
    assert dominated == [False, True, False, True, True, True]
    assert constant == [False, False, True, True, True, False]
    assert gram.two_row_guesses([noise[:1]]) == ([False], [False])


@pytest.mark.parametrize("path", ["plain", "chunked"])
def test_float32_grams_of_mean_dominated_layers_stay_accurate(path, monkeypatch):
    """‖mean‖² = 10⁴ · Σ var: an unshifted float32 Gram would lose about 4 of its 7 digits."""
    if path == "chunked":
        monkeypatch.setattr(gram, "MIN_CHUNK", 4)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 256)) + 100.0 * rng.normal(size=256)
    g = gram.batch_grams([torch.from_numpy(x).float()])[0].numpy()
    ref = reference.linear_gram(x.astype(np.float32).astype(np.float64))
    err = np.abs(reference.centre_gram(g) - ref).max() / np.abs(ref).max()
    assert err < 1e-5
    plain = torch.from_numpy(x).float()
    naive = reference.centre_gram((plain @ plain.T).double().numpy())
    assert np.abs(naive - ref).max() / np.abs(ref).max() > 10 * err  # the shift is what keeps the digits


def test_a_missed_guess_is_redone_from_the_gram(monkeypatch):
    """Rows 0 and 1 far apart, every other row at the mean: the guess says no, the Gram says yes."""
    calls = []
    original = gram.shifted_gram
    monkeypatch.setattr(gram, "shifted_gram", lambda *a: calls.append(1) or original(*a))
    rng = np.random.default_rng(4)
    mean = 100.0 * rng.normal(size=64)
    x = np.tile(mean, (16, 1)) + 0.01 * rng.normal(size=(16, 64))
    x[0] += 100.0 * rng.normal(size=64)  # ‖x₀ − mean‖² ≈ ‖mean‖²: the two rows suggest no dominant mean,
    x[1] = 2 * mean - x[0]                # but over all 16 rows ‖mean‖² ≈ 8 · Σ var
    t = torch.from_numpy(x).float()
    assert gram.two_row_guesses([t])[0] == [False]
    g = gram.batch_grams([t])[0].numpy()
    assert calls == [1]
    ref = reference.linear_gram(x.astype(np.float32).astype(np.float64))
    assert np.abs(reference.centre_gram(g) - ref).max() / np.abs(ref).max() < 1e-5


def test_constant_layers_give_exactly_zero_centred_grams(chunked):
    layers = [torch.full((6, chunked), 2.5), torch.zeros(6, 3), torch.full((6, 7), -1.0)]
    for g in gram.batch_grams(layers):
        assert (reference.centre_gram(g.numpy()) == 0).all() or (g == 0).all()
        assert (g == 0).all()


def test_batch_grams_dtypes_and_non_finite_traces():
    gen = torch.Generator().manual_seed(0)
    half = torch.randn(5, 9, generator=gen).half()
    g = gram.batch_grams([half, torch.randn(5, 4, generator=gen)])
    assert g.dtype == torch.float64 and g.shape == (2, 5, 5)
    # HSIC sees centred Grams only, which a mean-dominated draw's shift leaves unchanged (found unseeded:
    # some draws of 5 rows are shifted, so the raw Gram is not the reference's)
    h = torch.eye(5, dtype=torch.float64) - 1 / 5
    reference_gram = (half.float() @ half.float().T).double()
    np.testing.assert_allclose((h @ g[0] @ h).numpy(), (h @ reference_gram @ h).numpy(), rtol=1e-6, atol=1e-5)
    bad = torch.randn(5, 9, generator=gen)
    bad[3, 2] = float("nan")
    for layer in (bad, bad + 1e3):  # unshifted and shifted layers both report it on the diagonal
        trace = torch.diagonal(gram.batch_grams([layer])[0]).sum()
        assert not torch.isfinite(trace)


def test_layers_constant_up_to_rounding_get_exactly_zero_grams(chunked):
    """Rows equal up to float32 rounding (a bias-only layer computed in different orders) have no
    variance: an exactly zero Gram, not a Gram of rounding noise. Real small variance and a huge constant
    column beside varying ones are kept."""
    gen = torch.Generator().manual_seed(5)
    terms = torch.randn(64, generator=gen)
    sums = torch.stack([terms[torch.randperm(64, generator=gen)].sum() for _ in range(12)])
    assert sums.unique().numel() > 1
    rounded = sums[:, None] + torch.linspace(-3, 3, chunked)           # (12, chunked), float32
    varying = 1.0 + 1e-3 * torch.randn(12, chunked, generator=gen)
    big_column = torch.cat([torch.full((12, 1), 1e8), torch.randn(12, 7, generator=gen)], 1)
    g = gram.batch_grams([rounded, varying, big_column])
    assert (g[0] == 0).all()
    for i, x in ((1, varying), (2, big_column)):
        ref = reference.linear_gram(x.double().numpy())
        assert np.abs(reference.centre_gram(g[i].numpy()) - ref).max() / np.abs(ref).max() < 1e-4


def test_chunking_does_not_depend_on_the_thread_count(chunked):
    """Under torchrun each process may run fewer threads: the Grams must come out the same."""
    x = torch.randn(16, chunked + 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gram.linear_gram(x)
        assert gram._chunks(x.shape[1], x.device) == gram.CHUNKS
        torch.set_num_threads(2)
        two = gram.linear_gram(x)
    finally:
        torch.set_num_threads(before)
    assert gram._chunks(x.shape[1], x.device) == gram.CHUNKS
    torch.testing.assert_close(one, two, rtol=0, atol=0)
