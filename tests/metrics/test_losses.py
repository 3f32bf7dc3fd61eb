"""Differentiable alignment losses: values against numpy references, gradcheck, the τ → 0 behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from simkit.errors import SimkitError
from simkit.metrics import losses as L
from simkit.metrics.knn import knn_indices, knn_overlap, mutual_knn
from tests import reference

# ------------------------------------------------------------------------------ data


def pair(n, p, q, seed, dtype=torch.float64, mix=0.5):
    g = torch.Generator().manual_seed(seed)
    guide = torch.randn(n, q, generator=g, dtype=dtype)
    target = torch.randn(n, p, generator=g, dtype=dtype) + mix * guide[:, :1]
    return target, guide


# ----------------------------------------------------------------------------------------- values


@pytest.mark.parametrize("n,p,q", [(4, 1, 3), (6, 20, 2), (9, 3, 3), (30, 5, 50)])
def test_cka_losses_match_numpy(n, p, q):
    t, g = pair(n, p, q, n)
    np.testing.assert_allclose(float(L.cka_loss(t, g)), 1 - reference.cka(t.numpy(), g.numpy(), "linear_cka"), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(
        float(L.unbiased_cka_loss(t, g)), 1 - reference.cka(t.numpy(), g.numpy(), "unbiased_cka"), rtol=1e-10, atol=1e-10
    )


def test_losses_flatten_conv_maps_and_keep_dtype():
    t = torch.randn(8, 2, 3, 3)
    g = torch.randn(8, 5)
    flat = t.reshape(8, -1).double().numpy()
    assert L.cka_loss(t, g).dtype == torch.float32
    assert float(L.cka_loss(t, g)) == pytest.approx(1 - reference.cka(flat, g.double().numpy(), "linear_cka"), abs=1e-5)
    assert L.dmnn_loss(t, g, k=3).dtype == torch.float32
    assert L.cka_loss(t, g.double()).dtype == torch.float64  # mixed dtypes promote


@pytest.mark.parametrize("n,p,q,k,tau", [(12, 3, 5, 1, 0.1), (30, 8, 4, 5, 0.1), (40, 16, 16, 10, 0.05), (11, 2, 2, 10, 1.0)])
def test_dmnn_matches_numpy_dense_and_chunked(n, p, q, k, tau):
    t, g = pair(n, p, q, n + k)
    ref = reference.dmnn(t.numpy(), g.numpy(), k, tau)
    assert float(L.dmnn_loss(t, g, k=k, tau=tau)) == pytest.approx(ref, rel=1e-10, abs=1e-12)
    for chunk in (1, 7, n):
        assert float(L.dmnn_loss(t, g, k=k, tau=tau, chunk=chunk)) == pytest.approx(ref, rel=1e-10, abs=1e-12)


def test_dmnn_switches_to_the_chunked_path_above_dense_max_n(monkeypatch):
    t, g = pair(30, 5, 4, 8)
    ref = reference.dmnn(t.numpy(), g.numpy(), 4, 0.1)
    calls = []
    monkeypatch.setattr(L, "DENSE_MAX_N", 10)
    monkeypatch.setattr(L._ChunkedDMNN, "apply", lambda *a, _f=L._ChunkedDMNN.apply: calls.append(a[-1]) or _f(*a))
    assert float(L.dmnn_loss(t, g, k=4)) == pytest.approx(ref, rel=1e-10)
    assert calls == [L.kl_chunk(4, 5, 4)]


def test_dmnn_dense_and_chunked_gradients_agree():
    t, g = pair(50, 6, 9, 3)
    grads = []
    for chunk in (None, 3, 16):
        tt, gg = t.clone().requires_grad_(), g.clone().requires_grad_()
        L.dmnn_loss(tt, gg, k=5, chunk=chunk).backward()
        grads.append((tt.grad, gg.grad))
    for gt, gg in grads[1:]:
        torch.testing.assert_close(gt, grads[0][0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(gg, grads[0][1], rtol=1e-10, atol=1e-12)
    assert grads[0][0].abs().sum() > 0 and grads[0][1].abs().sum() > 0


@pytest.mark.parametrize("chunk", [None, 4])
def test_dmnn_frozen_guide_gets_no_gradient(chunk):
    t, g = pair(20, 4, 4, 5)
    t.requires_grad_()
    loss = L.dmnn_loss(t, g, k=3, chunk=chunk)
    loss.backward()
    assert g.grad is None and t.grad is not None and t.grad.abs().sum() > 0


def test_dmnn_is_zero_for_a_rotated_and_scaled_copy():
    t, g = pair(25, 6, 6, 6)
    Q, _ = torch.linalg.qr(torch.randn(6, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    for tau in (1.0, 0.1, 1e-3):
        assert float(L.dmnn_loss(3.0 * g @ Q, g, k=5, tau=tau)) == pytest.approx(0.0, abs=1e-10)
    assert float(L.dmnn_loss(t, g, k=5)) > 0.1


# -------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("n,p,q", [(6, 3, 8), (4, 5, 5)])  # feature-space and Gram-form branches
def test_gradcheck_cka_losses(n, p, q):
    t, g = pair(n, p, q, 1)
    args = (t.requires_grad_(), g.requires_grad_())
    assert gradcheck(L.cka_loss, args)
    assert gradcheck(L.unbiased_cka_loss, args)


@pytest.mark.parametrize("chunk", [None, 3])
def test_gradcheck_dmnn(chunk):
    t, g = pair(12, 4, 3, 2)
    args = (t.requires_grad_(), g.requires_grad_())
    assert gradcheck(lambda a, b: L.dmnn_loss(a, b, k=3, tau=0.5, chunk=chunk), args)


def test_gradcheck_soft_mutual_knn():
    t, g = pair(12, 4, 3, 3)
    args = (t.requires_grad_(), g.requires_grad_())
    assert gradcheck(lambda a, b: L.soft_mutual_knn(a, b, k=3, tau=0.5, q=None), args)


# ---------------------------------------------------------------------------------- the τ → 0 limit


def top1_gap(T, G):
    """(1/n) Σ_i [s^T_{i,t(i)} − s^T_{i,g(i)}]: the target-similarity gap between the nearest neighbours."""
    ST, SG = 1 - reference.cosine_distances(T), 1 - reference.cosine_distances(G)
    rows = np.arange(len(T))
    return np.mean(ST[rows, ST.argmax(1)] - ST[rows, SG.argmax(1)])


def test_dmnn_times_tau_tends_to_the_top1_gap_not_the_knn_overlap():
    t, g = pair(40, 8, 8, 7, mix=2.0)
    gap = top1_gap(t.numpy(), g.numpy())
    assert gap > 0.01  # some nearest neighbours disagree
    errs = [abs(tau * float(L.dmnn_loss(t, g, k=10, tau=tau)) - gap) for tau in (1e-2, 1e-3, 1e-5)]
    assert errs[-1] < 1e-4 and errs[-1] < errs[0]
    # k only sets the support: the limit is the same for every k
    assert 1e-5 * float(L.dmnn_loss(t, g, k=2, tau=1e-5)) == pytest.approx(gap, abs=1e-4)


def test_dmnn_tends_to_zero_when_nearest_neighbours_agree_even_if_the_knn_overlap_is_low():
    # 20 tight twin pairs in each representation, with unrelated pair centres: every point's nearest
    # neighbour is its twin on both sides, while the rest of the 10-NN sets are unrelated
    gen = torch.Generator().manual_seed(0)

    def twins():
        centres = torch.randn(20, 8, generator=gen, dtype=torch.float64).repeat_interleave(2, 0)
        return centres + 0.01 * torch.randn(40, 8, generator=gen, dtype=torch.float64)

    g, t = twins(), twins()
    tn, gn = torch.nn.functional.normalize(t, dim=1), torch.nn.functional.normalize(g, dim=1)
    assert torch.equal(knn_indices(tn, 1), knn_indices(gn, 1))  # every nearest neighbour agrees
    overlap10 = float(knn_overlap(knn_indices(tn, 10), knn_indices(gn, 10)).double().mean() / 10)
    assert overlap10 < 0.5  # ...but the 10-NN sets mostly differ
    values = [float(L.dmnn_loss(t, g, k=10, tau=tau)) for tau in (0.1, 0.01, 1e-3)]
    assert values[0] > 0.01 and values[-1] < 1e-6 and values[0] > values[1] > values[2]


def test_soft_mutual_knn_tends_to_mutual_knn():
    x, y = pair(40, 6, 9, 11, mix=1.5)
    k = 5
    # precondition for an exact limit: no tie between the k-th and (k+1)-th neighbour
    for z in (x, y):
        from simkit.metrics.knn import clamp_normalize

        zn = clamp_normalize(z)
        s = (zn @ zn.T).fill_diagonal_(-torch.inf).topk(k + 1, dim=1).values
        assert float((s[:, k - 1] - s[:, k]).min()) > 1e-5
    target = mutual_knn(x, y, k=k)
    assert 0.2 < target < 0.9
    assert float(L.soft_mutual_knn(x, y, k=k, tau=1e-8)) == pytest.approx(target, abs=1e-12)
    assert abs(float(L.soft_mutual_knn(x, y, k=k, tau=0.1)) - target) > 1e-3  # not trivially equal


# ----------------------------------------------------------------------------------------- registry


def test_alignment_loss_registry():
    assert L.alignment_loss("cka") is L.cka_loss
    assert L.alignment_loss("unbiased_cka") is L.unbiased_cka_loss
    assert L.alignment_loss("dmnn") is L.dmnn_loss
    with pytest.raises(SimkitError, match=r"unknown alignment loss 'ckaa'; .*valid: cka, unbiased_cka, dmnn"):
        L.alignment_loss("ckaa")


def test_errors():
    a, b = torch.randn(100, 3), torch.randn(80, 3)
    for fn in (L.cka_loss, L.unbiased_cka_loss, L.dmnn_loss, L.soft_mutual_knn):
        with pytest.raises(SimkitError, match=r"found inconsistent numbers of samples: \[100, 80\]"):
            fn(a, b)
    with pytest.raises(SimkitError, match=r"cka_loss: target must be a tensor \(n, \.\.\.\) of n examples, got \(5,\)"):
        L.cka_loss(torch.randn(5), torch.randn(5, 2))
    with pytest.raises(SimkitError, match="unbiased_cka_loss needs at least 4 samples, got 3"):
        L.unbiased_cka_loss(torch.randn(3, 2), torch.randn(3, 2))
    with pytest.raises(SimkitError, match="`tau` must be a positive number, got 0"):
        L.dmnn_loss(a, a, tau=0)
    with pytest.raises(SimkitError, match="k=10 neighbours need at least 11 samples, got 8"):
        L.dmnn_loss(torch.randn(8, 2), torch.randn(8, 2))
    with pytest.raises(SimkitError, match="soft_mutual_knn with k=3 needs at least 5 samples, got 4"):
        L.soft_mutual_knn(torch.randn(4, 2), torch.randn(4, 2), k=3)
