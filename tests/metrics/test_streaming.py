"""Streaming all-pairs accumulators (simkit.metrics.streaming) against float64 numpy references.

The references (tests/reference.py) are written from the formulas of spec §0.1–0.4 with numpy only (Gram forms,
explicit HSIC_1 trace formula), independent of simkit.metrics.cka / knn.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simkit.errors import SimkitError
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from simkit.metrics.streaming.common import draw_perms, perm_generator
from tests import reference

# ------------------------------------------------------------------------------------------ data


def make_layers(n: int, seed: int = 0, dtype=np.float64):
    """A: widths 1, 5, 40 (40 > n at small n; one with a large mean); B: widths 3, 50, related to A."""
    rng = np.random.default_rng(seed)
    a0 = rng.normal(size=(n, 1))
    a1 = rng.normal(size=(n, 5)) + 300.0           # large mean: tests cancellation handling
    a2 = np.tanh(rng.normal(size=(n, 40)))
    b0 = a1[:, :3] @ rng.normal(size=(3, 3)) + 0.5 * rng.normal(size=(n, 3))
    b1 = np.concatenate([a2, a0], 1) @ rng.normal(size=(41, 50)) + rng.normal(size=(n, 50)) - 7.0
    return [z.astype(dtype) for z in (a0, a1, a2)], [z.astype(dtype) for z in (b0, b1)]


def feed(acc, xa, xb, sizes):
    start = 0
    for b in sizes:
        acc.update([torch.as_tensor(x[start:start + b]) for x in xa],
                   [torch.as_tensor(y[start:start + b]) for y in xb])
        start += b
    return acc


def dims(xs):
    return [x.shape[1] for x in xs]


def split_sizes(n: int, cuts: list[int]) -> list[int]:
    points = sorted({c for c in cuts if 0 < c < n})
    edges = [0, *points, n]
    return [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]


N = 23
XA, XB = make_layers(N)
REF = {m: reference.matrix(XA, XB, lambda a, b, m=m: reference.cka(a, b, m))
       for m in ("linear_cka", "unbiased_cka", "rbf_cka")}
REF["mutual_knn"] = reference.matrix(XA, XB, lambda a, b: reference.mutual_knn(a, b, 5))

# ----------------------------------------------------------------------------------- exact mode


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, N - 1), max_size=6))
def test_exact_features_equal_one_shot_for_any_batching(cuts):
    sizes = split_sizes(N, cuts)
    acc = feed(make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="exact", null=0), dims(XA), dims(XB)), XA, XB, sizes)
    assert {d["path"] for d in acc.describe().values()} == {"features"}
    out = acc.compute()
    for m in ("linear_cka", "unbiased_cka"):
        np.testing.assert_allclose(out[m]["value"], REF[m], rtol=0, atol=1e-10)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, 59), min_size=1, max_size=6))
def test_exact_features_of_float32_activations_do_not_depend_on_the_batches(cuts):
    # float32 activations with large means: centring and every product run in float64 on the exact
    # float32 values, so any batch split gives the one-shot sums to float64 rounding (not float32's)
    xa, xb = make_layers(60, seed=3, dtype=np.float32)
    xa[1] += np.float32(1e3)
    one = feed(make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="exact", null=0), dims(xa), dims(xb)), xa, xb, [60]).compute()
    got = feed(make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="exact", null=0), dims(xa), dims(xb)), xa, xb,
               split_sizes(60, cuts)).compute()
    ref = {m: reference.matrix([a.astype(np.float64) for a in xa], [b.astype(np.float64) for b in xb],
                        lambda a, b, m=m: reference.cka(a, b, m)) for m in ("linear_cka", "unbiased_cka")}
    for m in ("linear_cka", "unbiased_cka"):
        np.testing.assert_allclose(got[m]["value"], one[m]["value"], rtol=0, atol=1e-12)
        np.testing.assert_allclose(got[m]["value"], ref[m], rtol=0, atol=1e-10)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, N - 1), max_size=4))
def test_exact_stored_paths_equal_one_shot_for_any_batching(cuts):
    sizes = split_sizes(N, cuts)
    metrics = ["linear_cka", "unbiased_cka", "rbf_cka", "mutual_knn"]
    # a budget too small for the feature-space sums forces the stored Gram path for linear CKA
    acc = make_accumulator(CompareSettings(metrics=metrics, mode="exact", knn_k=5, memory_budget_bytes=40_000, null=0), dims(XA), dims(XB))
    out = feed(acc, XA, XB, sizes).compute()
    desc = acc.describe()
    assert desc["linear_cka"]["path"] == "stored-gram" and "bytes" in desc["linear_cka"]["reason"]
    assert desc["mutual_knn"]["path"] == "stored-knn"
    for m in metrics:
        rows = slice(1, None) if m == "mutual_knn" else slice(None)  # width 1 after normalising: all ties
        np.testing.assert_allclose(out[m]["value"][rows], REF[m][rows], rtol=0, atol=1e-10, err_msg=m)


def test_exact_gram_kept_whole_equals_gram_rows_per_block_with_their_null():
    """A budget that holds each whole Gram (made once, the null reads it permuted) and one that makes
    rows block by block give the same values and the same null draws."""
    metrics = ["linear_cka", "unbiased_cka", "rbf_cka"]
    outs = []
    for budget in (2**30, 40_000):
        acc = make_accumulator(CompareSettings(metrics=metrics, mode="exact", memory_budget_bytes=budget, null=3,
                                               seed=4), dims(XA), dims(XB))
        outs.append(feed(acc, XA, XB, [9, 14]).compute())
    whole, blocks = outs
    for m in metrics:
        np.testing.assert_allclose(whole[m]["value"], REF[m], rtol=0, atol=1e-10, err_msg=m)
        for key in ("value", "null"):
            np.testing.assert_allclose(whole[m][key], blocks[m][key], rtol=0, atol=1e-12, err_msg=f"{m} {key}")


def test_exact_edge_shapes_n4_p1():
    xa, xb = make_layers(4, seed=3)
    for budget in (2**30, 5_000):
        acc = feed(make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="exact", memory_budget_bytes=budget, null=0), dims(xa), dims(xb)), xa, xb, [1, 3])
        out = acc.compute()
        for m in ("linear_cka", "unbiased_cka"):
            ref = reference.matrix(xa, xb, lambda a, b, m=m: reference.cka(a, b, m))
            np.testing.assert_allclose(out[m]["value"], ref, rtol=0, atol=1e-10)


def test_exact_self_similarity_is_one():
    acc = feed(make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="exact", null=0), dims(XA), dims(XA)), XA, XA, [10, 13])
    for m in ("linear_cka", "unbiased_cka"):
        np.testing.assert_allclose(np.diag(acc.compute()[m]["value"]), 1.0, atol=1e-12)


# ------------------------------------------------------------------------------- minibatch mode


@pytest.mark.parametrize("metric", ["linear_cka", "unbiased_cka", "rbf_cka"])
def test_minibatch_equals_mean_of_hsic_reference(metric):
    sizes = [8, 8, 5, 2]  # unequal sizes; the last batch is skipped by HSIC_1 (b < 4)
    acc = make_accumulator(CompareSettings(metrics=[metric], mode="minibatch", rbf_factor=0.7, null=0), dims(XA), dims(XB))
    feed(acc, XA, XB, sizes)
    if metric == "unbiased_cka":
        with pytest.warns(RuntimeWarning, match="skipped 1 batch"):
            out = acc.compute()
        assert acc.describe()[metric]["skipped_batches"] == 1
    else:
        out = acc.compute()
    ref = reference.matrix(XA, XB, lambda a, b: reference.minibatch_cka(a, b, metric, sizes, 0.7))
    np.testing.assert_allclose(out[metric]["value"], ref, rtol=0, atol=1e-10)
    assert acc.describe()[metric] | {"path": "gram", "mode": "minibatch", "n": N} == acc.describe()[metric]


def test_minibatch_differs_from_exact():
    acc = feed(make_accumulator(CompareSettings(metrics=["linear_cka"], mode="minibatch", null=0), dims(XA), dims(XB)), XA, XB, [8, 8, 7])
    assert np.abs(acc.compute()["linear_cka"]["value"] - REF["linear_cka"]).max() > 1e-3


def test_minibatch_unbiased_needs_a_batch_of_four():
    acc = feed(make_accumulator(CompareSettings(metrics=["unbiased_cka"], mode="minibatch", null=0), dims(XA), dims(XB)), XA, XB, [3] * 7 + [2])
    with pytest.raises(SimkitError, match="at least 4 samples and got none; raise `batch_size`"):
        acc.compute()


# --------------------------------------------------------------------------- splitting over ranks


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_state_of_two_halves_adds_up_to_the_whole(mode):
    metrics = ["linear_cka", "unbiased_cka"] + (["rbf_cka"] if mode == "minibatch" else [])
    kw = dict(null=3) if mode == "minibatch" else {}
    sizes = [6, 6, 6, 5]

    def build():
        return make_accumulator(CompareSettings(metrics=metrics, mode=mode, **{"null": 0, **kw}), dims(XA), dims(XB))

    whole = feed(build(), XA, XB, sizes)
    first, second = build(), build()
    # rank 0 takes batches 0 and 2, rank 1 batches 1 and 3 (global batch indices seed the null)
    starts = np.cumsum([0, *sizes])
    for i, b in enumerate(sizes):
        target = first if i % 2 == 0 else second
        sl = slice(starts[i], starts[i] + b)
        target.update([torch.as_tensor(x[sl]) for x in XA], [torch.as_tensor(y[sl]) for y in XB], batch_index=i)
    if mode == "exact":  # rank 1 took its reference shift from another first batch: align it to rank 0's
        assert not all(torch.equal(s, t) for s, t in zip(first.shifts(), second.shifts(), strict=True))
        second.rebase(first.shifts())
    for mine, theirs, full in zip(first.state(), second.state(), whole.state(), strict=True):
        mine += theirs  # what all_reduce does, in place
        np.testing.assert_allclose(mine.numpy(), full.numpy(), rtol=1e-12, atol=1e-13 * float(full.abs().max()))
    got, want = first.compute(), whole.compute()
    for m in metrics:
        for key in want[m]:
            np.testing.assert_allclose(got[m][key], want[m][key], rtol=0, atol=1e-10)


def combine_like_ranks(accs):
    """What the engine does over ranks, in one process: rank 0's shifts for all, every state summed (an
    all_reduce), every stored payload given to every accumulator (an all_gather)."""
    shifts = accs[0].shifts()
    if shifts:
        for acc in accs:
            acc.rebase([t.clone() for t in shifts])
    for tensors in zip(*(acc.state() for acc in accs), strict=True):
        total = sum(t.clone() for t in tensors)
        for t in tensors:
            t.copy_(total)
    payloads = [acc.stored_payload() for acc in accs]
    for acc in accs:
        acc.load_stored(payloads, "cpu")


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_ranks_combined_by_sums_shifts_and_payloads_equal_one_accumulator(mode):
    metrics = ["linear_cka", "unbiased_cka", "rbf_cka", "mutual_knn"]
    sizes = [6, 6, 6, 5]
    null = 3 if mode == "minibatch" else 0

    def build():
        return make_accumulator(CompareSettings(metrics=metrics, mode=mode, null=null, seed=4, knn_k=5), dims(XA), dims(XB))

    whole = feed(build(), XA, XB, sizes)
    ranks = [build(), build()]
    starts = np.cumsum([0, *sizes])
    for i in range(len(sizes)):  # round-robin: rank 0 gets batches 0 and 2, rank 1 batches 1 and 3
        sl = slice(starts[i], starts[i + 1])
        ranks[i % 2].update([torch.as_tensor(x[sl]) for x in XA], [torch.as_tensor(y[sl]) for y in XB],
                            batch_index=i)
    assert ranks[0].needs_gather
    combine_like_ranks(ranks)
    want = whole.compute()
    for acc in ranks:
        got = acc.compute()
        for m in metrics:
            for key in want[m]:
                np.testing.assert_allclose(got[m][key], want[m][key], rtol=0, atol=1e-10, err_msg=f"{m} {key}")


def test_feature_path_merge_rebases_and_equals_whole():
    metrics = ["linear_cka", "unbiased_cka"]
    whole = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", null=0), dims(XA), dims(XB)), XA, XB, [5, 7, 11])
    first = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", null=0), dims(XA), dims(XB)), [x[12:] for x in XA],
                 [y[12:] for y in XB], [11])
    second = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", null=0), dims(XA), dims(XB)), [x[:12] for x in XA],
                  [y[:12] for y in XB], [5, 7])
    got = first.merge(second).compute()
    for m in metrics:
        np.testing.assert_allclose(got[m]["value"], whole.compute()[m]["value"], rtol=0, atol=1e-10)
        np.testing.assert_allclose(got[m]["value"], REF[m], rtol=0, atol=1e-10)


def test_stored_paths_merge_equals_whole():
    metrics = ["rbf_cka", "mutual_knn"]
    whole = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", knn_k=5, null=0), dims(XA), dims(XB)), XA, XB, [12, 11])
    first = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", knn_k=5, null=0), dims(XA), dims(XB)),
                 [x[:12] for x in XA], [y[:12] for y in XB], [12])
    second = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", knn_k=5, null=0), dims(XA), dims(XB)),
                  [x[12:] for x in XA], [y[12:] for y in XB], [11])
    assert first.needs_gather and first.state() == []
    got = first.merge(second).compute()
    for m in metrics:
        np.testing.assert_allclose(got[m]["value"], whole.compute()[m]["value"], atol=1e-12)


# ---------------------------------------------------------------------------------------- null


def related_and_independent(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 30))
    related = x[:, :10] @ rng.normal(size=(10, 20)) + 2.0 * rng.normal(size=(n, 20))
    independent = rng.normal(size=(n, 20))
    return [x], [related, independent]


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
@pytest.mark.parametrize("metric", ["linear_cka", "unbiased_cka", "mutual_knn"])
def test_null_separates_real_from_independent(mode, metric):
    xa, xb = related_and_independent(64)
    acc = feed(make_accumulator(CompareSettings(metrics=[metric], mode=mode, null=20, seed=1, knn_k=5), dims(xa), dims(xb)),
               xa, xb, [16] * 4)
    out = acc.compute()[metric]
    assert out["null"].shape == (20, 1, 2)
    assert out["null_mean"].shape == out["null_p95"].shape == (1, 2)
    np.testing.assert_allclose(out["null_mean"], out["null"].mean(0))
    np.testing.assert_allclose(out["null_p95"], np.percentile(out["null"], 95, axis=0))
    assert out["value"][0, 0] > out["null_p95"][0, 0]      # real relationship: above the null
    assert out["value"][0, 1] <= out["null_p95"][0, 1]     # independent data: inside the null


def test_exact_null_equals_recomputation_on_permuted_samples():
    n, k = 20, 4
    xa, xb = [XA[1][:n], XA[2][:n]], [XB[0][:n]]
    metrics = ["linear_cka", "unbiased_cka", "rbf_cka", "mutual_knn"]
    acc = feed(make_accumulator(CompareSettings(metrics=metrics, mode="exact", null=k, seed=5, knn_k=3), dims(xa), dims(xb)), xa, xb, [7, 13])
    out = acc.compute()
    desc = acc.describe()
    assert desc["linear_cka"]["path"] == "stored-gram"
    assert desc["linear_cka"]["reason"] == "a permutation null needs stored activations"
    perms = draw_perms(k, n, perm_generator(5, -1), "cpu").numpy()
    for m in metrics:
        fn = (lambda a, b: reference.mutual_knn(a, b, 3)) if m == "mutual_knn" else (lambda a, b, m=m: reference.cka(a, b, m))
        ref = np.stack([reference.matrix(xa, [y[p] for y in xb], fn) for p in perms])
        np.testing.assert_allclose(out[m]["null"], ref, atol=1e-10, err_msg=m)


def test_minibatch_null_permutes_within_each_batch():
    sizes, k = [8, 8, 7], 3
    acc = feed(make_accumulator(CompareSettings(metrics=["unbiased_cka"], mode="minibatch", null=k, seed=2), dims(XA), dims(XB)), XA, XB, sizes)
    null = acc.compute()["unbiased_cka"]["null"]
    perms = [draw_perms(k, b, perm_generator(2, i), "cpu").numpy()
             for i, b in enumerate(sizes)]
    starts = np.cumsum([0, *sizes])
    for t in range(k):
        order = np.concatenate([starts[i] + perms[i][t] for i in range(len(sizes))])
        ref = reference.matrix(XA, [y[order] for y in XB], lambda a, b: reference.minibatch_cka(a, b, "unbiased_cka", sizes))
        np.testing.assert_allclose(null[t], ref, atol=1e-10)


# ------------------------------------------------------------------------------ float32 precision


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_float32_agrees_with_float64(mode):
    xa, xb = make_layers(96, seed=4)
    metrics = ["linear_cka", "unbiased_cka", "rbf_cka"]
    out64 = feed(make_accumulator(CompareSettings(metrics=metrics, mode=mode, null=0), dims(xa), dims(xb)), xa, xb, [32] * 3).compute()
    xa32, xb32 = [x.astype(np.float32) for x in xa], [y.astype(np.float32) for y in xb]
    out32 = feed(make_accumulator(CompareSettings(metrics=metrics, mode=mode, null=0), dims(xa), dims(xb)), xa32, xb32, [32] * 3).compute()
    for m in metrics:
        np.testing.assert_allclose(out32[m]["value"], out64[m]["value"], rtol=0, atol=2e-5, err_msg=m)


# -------------------------------------------------------------------------- constant layers, errors


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_constant_layer_gives_nan_and_a_warning_naming_it(mode):
    xa = [XA[0], np.full((N, 4), 3.7)]
    metrics = ["linear_cka", "unbiased_cka", "rbf_cka"]
    acc = feed(make_accumulator(CompareSettings(metrics=metrics, mode=mode, null=0), dims(xa), dims(XB), names_a=["stem", "flat"]), xa, XB, [8, 8, 7])
    with pytest.warns(RuntimeWarning, match="constant layer.*flat"):
        out = acc.compute()
    for m in metrics:
        assert np.isnan(out[m]["value"][1]).all()
        assert np.isfinite(out[m]["value"][0]).all()


def test_bad_input_errors():
    with pytest.raises(SimkitError, match="unknown metric 'cka'"):
        make_accumulator(CompareSettings(metrics=["cka"], mode="exact", null=0), [2], [2])
    with pytest.raises(SimkitError, match="`mode` must be one of exact, minibatch, got 'full'"):
        make_accumulator(CompareSettings(metrics=["linear_cka"], mode="full", null=0), [2], [2])
    with pytest.raises(SimkitError, match="`null` must be 0 or a positive integer or None"):
        make_accumulator(CompareSettings(metrics=["linear_cka"], mode="exact", null=-1), [2], [2])
    acc = make_accumulator(CompareSettings(metrics=["linear_cka"], mode="exact", null=0), [2], [3])
    with pytest.raises(SimkitError, match=r"inconsistent numbers of samples in one batch: \[4, 5\]"):
        acc.update([torch.zeros(4, 2)], [torch.zeros(5, 3)])
    with pytest.raises(SimkitError, match=r"model B layer 0 has shape \(4, 2\), expected \(b, 3\)"):
        acc.update([torch.zeros(4, 2)], [torch.zeros(4, 2)])
    small = feed(make_accumulator(CompareSettings(metrics=["unbiased_cka"], mode="exact", null=0), [1], [1]), [XA[0][:3]], [XB[0][:3, :1]], [3])
    with pytest.raises(SimkitError, match="unbiased CKA needs at least 4 samples, got 3"):
        small.compute()
    capped = make_accumulator(CompareSettings(metrics=["rbf_cka"], mode="exact", null=0), dims(XA), dims(XB), max_stored_n=10)
    feed(capped, [x[:8] for x in XA], [y[:8] for y in XB], [8])
    with pytest.raises(SimkitError, match="exceed `max_stored_n`=10; use `mode`=minibatch"):
        feed(capped, [x[8:16] for x in XA], [y[8:16] for y in XB], [8])


@pytest.mark.parametrize(("mode", "metric"), [("minibatch", "unbiased_cka"), ("exact", "linear_cka"),
                                              ("exact", "rbf_cka")])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_activations_are_an_error_naming_the_layer(mode, metric, bad):
    xb = [XB[0], XB[1].copy()]
    xb[1][3, 7] = bad
    acc = make_accumulator(CompareSettings(metrics=[metric], mode=mode, null=0), dims(XA), dims(xb), names_b=["stem", "layer4.1"])
    with pytest.raises(SimkitError, match=r"non-finite activations \(NaN or Inf\) in layer layer4.1 of model B"):
        feed(acc, XA, xb, [N])


# ---------------------------------------------------------------------------- real two-process run


def _rank_main(rank: int, world: int, init: str, out: str, sizes: list[int]) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        xa, xb = [x.astype(np.float32) for x in XA], [y.astype(np.float32) for y in XB]
        starts = np.cumsum([0, *sizes])
        results = {}
        for mode, metrics in (("exact", ["linear_cka", "unbiased_cka", "rbf_cka", "mutual_knn"]),
                              ("minibatch", ["linear_cka", "unbiased_cka", "rbf_cka"])):
            acc = make_accumulator(CompareSettings(metrics=metrics, mode=mode, null=3 if mode == "minibatch" else 0, knn_k=5), dims(xa), dims(xb))
            for i in range(rank, len(sizes), world):  # simkit.engine.batches' round-robin split
                sl = slice(starts[i], starts[i + 1])
                acc.update([torch.as_tensor(x[sl]) for x in xa], [torch.as_tensor(y[sl]) for y in xb],
                           batch_index=i)
            shifts = acc.shifts()  # the rank reduction, as the engine does it
            for t in shifts:
                dist.broadcast(t, src=0)
            if shifts:
                acc.rebase(shifts)
            for t in acc.state():
                dist.all_reduce(t, op=dist.ReduceOp.SUM)
            if acc.needs_gather:
                payloads = [None] * world
                dist.all_gather_object(payloads, acc.stored_payload())
                acc.load_stored(payloads)
            results[mode] = acc.compute()
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
@pytest.mark.slow
def test_rank_reduction_with_two_processes_equals_one(tmp_path):
    import torch.multiprocessing as mp

    sizes = [6, 6, 6, 5]
    out = tmp_path / "two.pt"
    mp.spawn(_rank_main, args=(2, f"file://{tmp_path / 'rendezvous'}", str(out), sizes), nprocs=2)
    two = torch.load(out, weights_only=False)
    xa, xb = [x.astype(np.float32) for x in XA], [y.astype(np.float32) for y in XB]
    for mode, parts in two.items():
        one = feed(make_accumulator(CompareSettings(metrics=list(parts), mode=mode, null=3 if mode == "minibatch" else 0, knn_k=5), dims(xa), dims(xb)), xa, xb, sizes).compute()
        for m in parts:
            for key in one[m]:  # float32 inputs, yet equal to float64 rounding: the split changes no product
                np.testing.assert_allclose(parts[m][key], one[m][key], rtol=0, atol=1e-12, err_msg=f"{mode} {m} {key}")


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
@pytest.mark.parametrize("metric", ["linear_cka", "unbiased_cka", "mutual_knn"])
def test_layer_constant_up_to_float32_rounding_is_constant(mode, metric):
    """Rows equal up to float32 rounding (one sum of 64 terms added in a different order per row, plus a
    per-column offset) are a constant layer: NaN and a warning, not a similarity of rounding noise. A
    genuinely varying small-variance layer (1 ± 1e-3) next to it keeps a finite value."""
    gen = torch.Generator().manual_seed(0)
    terms = torch.randn(64, generator=gen)
    sums = torch.stack([terms[torch.randperm(64, generator=gen)].sum() for _ in range(N)])
    assert sums.unique().numel() > 1
    rounded = (sums[:, None] + torch.tensor([0.5, -2.0, 7.0, 1e3])).numpy().astype(np.float32)
    small = (1.0 + 1e-3 * np.random.default_rng(0).normal(size=(N, 6))).astype(np.float32)
    xb = [x.astype(np.float32) for x in XB]
    acc = feed(make_accumulator(CompareSettings(metrics=[metric], mode=mode, null=0), [4, 6], dims(xb), names_a=["rounded", "small"]),
               [rounded, small], xb, [8, 8, 7])
    with pytest.warns(RuntimeWarning, match="constant layer.*rounded"):
        out = acc.compute()
    assert np.isnan(out[metric]["value"][0]).all()
    assert np.isfinite(out[metric]["value"][1]).all()
