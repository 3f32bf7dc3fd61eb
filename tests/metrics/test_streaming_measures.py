"""The measures beyond CKA in the streaming accumulators: every batch split equals the one-shot functions
(themselves checked against the numpy references of tests/reference.py in test_shape / test_rsa / test_predictivity), every path
is named, the null is the measure recomputed on permuted samples, ranks combine, the default costs nothing."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from simkit.errors import SimkitError
from simkit.metrics import (
    cca,
    jaccard_knn,
    procrustes,
    procrustes_angle,
    pwcca,
    ridge_r2,
    rsa,
    shape_metric,
    svcca,
)
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator, stored_samples_bytes
from simkit.metrics.streaming.common import draw_perms, perm_generator
from simkit.metrics.streaming.folds import fold_path_bytes
from tests import reference

pytestmark = pytest.mark.filterwarnings("ignore:rsa is undefined:RuntimeWarning")  # A[0] has p = 1
N = 31
NEW = ["procrustes", "procrustes_angle", "cca", "svcca", "pwcca", "shape_metric", "rsa", "ridge_r2", "jaccard_knn"]
OPTS = {"shape_alpha": 0.3, "svcca_keep": 0.9, "ridge_lambda": 0.05, "ridge_folds": 4, "knn_k": 4}


def one_shot(m, x, y):
    fns = {"procrustes": procrustes, "procrustes_angle": procrustes_angle, "cca": cca, "pwcca": pwcca,
           "svcca": lambda a, b: svcca(a, b, svcca_keep=OPTS["svcca_keep"]),
           "shape_metric": lambda a, b: shape_metric(a, b, shape_alpha=OPTS["shape_alpha"]),
           "rsa": rsa, "ridge_r2": lambda a, b: ridge_r2(a, b, ridge_lambda=OPTS["ridge_lambda"], ridge_folds=4),
           "jaccard_knn": lambda a, b: jaccard_knn(a, b, k=4)}
    return fns[m](x, y)


def make_layers(n=N, seed=0, dtype=np.float64):
    """A: widths 1, 5 (large mean), 12; B: widths 3, 7, related to A."""
    rng = np.random.default_rng(seed)
    a0 = rng.normal(size=(n, 1))
    a1 = rng.normal(size=(n, 5)) + 300.0
    a2 = np.tanh(rng.normal(size=(n, 12)))
    b0 = a1[:, :3] @ rng.normal(size=(3, 3)) + 0.5 * rng.normal(size=(n, 3))
    b1 = np.tanh(np.concatenate([a2, a0], 1) @ rng.normal(size=(13, 7))) + 0.3 * rng.normal(size=(n, 7)) - 7.0
    return [z.astype(dtype) for z in (a0, a1, a2)], [z.astype(dtype) for z in (b0, b1)]


XA, XB = make_layers()
with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    REF = {m: np.array([[one_shot(m, a, b) for b in XB] for a in XA]) for m in NEW}


def feed(acc, xa, xb, sizes, start_index=0, offset=0):
    start = 0
    for k, b in enumerate(sizes):
        acc.update([torch.as_tensor(x[start:start + b]) for x in xa], [torch.as_tensor(y[start:start + b]) for y in xb],
                   batch_index=start_index + k, row_offset=offset + start)
        start += b
    return acc


def split_sizes(n, cuts):
    edges = [0, *sorted({c for c in cuts if 0 < c < n}), n]
    return [b - a for a, b in zip(edges[:-1], edges[1:], strict=True)]


def build(metrics=NEW, mode="exact", expected_n=None, **kw):
    return make_accumulator(CompareSettings(metrics=metrics, mode=mode, **{"null": 0, **OPTS, **kw}),
                            [x.shape[1] for x in XA], [y.shape[1] for y in XB], expected_n=expected_n)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, N - 1), max_size=6), mode=st.sampled_from(["exact", "minibatch"]))
def test_streamed_values_equal_one_shot_for_any_batch_split(cuts, mode):
    acc = feed(build(mode=mode), XA, XB, split_sizes(N, cuts))
    values = acc.compute()
    for m in NEW:
        np.testing.assert_allclose(values[m]["value"], REF[m], atol=1e-8, rtol=0, err_msg=m)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cuts=st.lists(st.integers(1, N - 1), max_size=4))
def test_stored_paths_equal_one_shot_for_any_batch_split(cuts):
    metrics = [m for m in NEW if m != "rsa"]  # rsa is always stored; its RDMs alone need more than 9000 bytes
    acc = feed(build(metrics, memory_budget_bytes=9000), XA, XB, split_sizes(N, cuts))
    paths = {m: d["path"] for m, d in acc.describe().items()}
    assert paths["cca"] == "stored-cov" and paths["ridge_r2"] == "stored-folds"
    assert "memory_budget_bytes=9000" in acc.describe()["cca"]["reason"]
    values = acc.compute()
    for m in metrics:
        np.testing.assert_allclose(values[m]["value"], REF[m], atol=1e-8, rtol=0, err_msg=m)


def test_every_result_names_its_path():
    method = feed(build(), XA, XB, [10, 21]).describe()
    expected = {"procrustes": "features", "procrustes_angle": "features", "cca": "features", "svcca": "features",
                "pwcca": "features", "shape_metric": "features", "rsa": "stored-rdm", "ridge_r2": "folds",
                "jaccard_knn": "stored-knn"}
    assert {m: d["path"] for m, d in method.items()} == expected
    assert method["ridge_r2"]["directional"] is True and "not symmetric" in method["ridge_r2"]["note"]
    assert method["shape_metric"]["shape_alpha"] == 0.3 and method["svcca"]["svcca_keep"] == 0.9
    assert method["rsa"]["max_n"] > N and method["rsa"]["rsa_compare"] == "spearman"
    with_null = feed(build(null=2), XA, XB, [31]).describe()
    assert {m: d["path"] for m, d in with_null.items()} == {
        **expected, **{m: "stored-cov" for m in NEW[:6]}, "ridge_r2": "stored-folds"}
    assert all(d["null"] == 2 for d in with_null.values())


def test_ridge_stores_its_samples_when_they_fit_the_budget_and_streams_its_folds_otherwise():
    dims_a, dims_b = [x.shape[1] for x in XA], [y.shape[1] for y in XB]
    stored = stored_samples_bytes(dims_a, dims_b, N)
    assert stored == 4 * N * (sum(dims_a) + sum(dims_b))
    roomy = max(stored, fold_path_bytes(dims_a, dims_b, OPTS["ridge_folds"]))
    too_many = N * (roomy // stored + 1)   # their stored samples would exceed the budget, the fold sums do not
    paths = {}
    for case, (expected_n, max_n) in {"known, fits": (N, 50_000), "unknown n": (None, 50_000),
                                      "over the budget": (too_many, 50_000), "over max_stored_n": (N, N - 1)}.items():
        acc = make_accumulator(CompareSettings(metrics=["ridge_r2"], mode="exact", null=0, **OPTS,
                                               memory_budget_bytes=roomy),
                               dims_a, dims_b, expected_n=expected_n, max_stored_n=max_n)
        paths[case] = acc.describe()["ridge_r2"]["path"]
        if case != "over max_stored_n":   # a stored path would refuse more than max_stored_n samples
            np.testing.assert_allclose(feed(acc, XA, XB, [N]).compute()["ridge_r2"]["value"], REF["ridge_r2"],
                                       atol=1e-8, rtol=0, err_msg=case)
    assert paths == {"known, fits": "stored-folds", "unknown n": "folds", "over the budget": "folds",
                     "over max_stored_n": "folds"}
    known = build(["ridge_r2"], expected_n=N)
    assert f"its {N} samples fit" in known.describe()["ridge_r2"]["reason"]
    assert "faster than streaming the per-fold sums" in known.describe()["ridge_r2"]["reason"]


def wide_layers(n: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Layers wider than ``n`` (P = 120, Q = 105), one of them constant."""
    rng = np.random.default_rng(3)
    a = [rng.normal(size=(n, 40)), rng.normal(size=(n, 3)) @ rng.normal(size=(3, 50)) + 4.0, np.full((n, 30), 2.0)]
    b = [rng.normal(size=(n, 60)), a[0] @ rng.normal(size=(40, 45)) + 0.1 * rng.normal(size=(n, 45))]
    return a, b


@pytest.mark.parametrize("rows", ["whole Grams", "blocks of rows"])
def test_exact_cka_on_stored_grams_without_a_null_has_the_feature_paths_values_and_closed_form_chance(rows):
    """Sent to the stored Grams by the memory budget with ``null=0``, exact linear and unbiased CKA keep the
    feature path's values and its closed-form chance level (before, no chance level at all), whether the
    Grams are made whole (one ``X̃X̃ᵀ`` per layer for both measures) or in blocks of rows."""
    n = 24
    xa, xb = wide_layers(n)
    dims_a, dims_b = [x.shape[1] for x in xa], [y.shape[1] for y in xb]
    stored = stored_samples_bytes(dims_a, dims_b, n)
    # _chunk: rows per block = budget // (4 · 8 · layers · n): all n rows, or 3 + a few
    budgets = {"sums": "auto", "grams": 4 * 8 * 5 * n * (n if rows == "whole Grams" else 3) + stored}
    out, method = {}, {}
    for case, budget in budgets.items():
        acc = make_accumulator(CompareSettings(metrics=["linear_cka", "unbiased_cka"], mode="exact", null=0,
                                               memory_budget_bytes=budget), dims_a, dims_b, expected_n=n)
        method[case] = acc.describe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # the constant layer
            out[case] = feed(acc, xa, xb, [10, 14]).compute()
    for m in ("linear_cka", "unbiased_cka"):
        assert method["sums"][m]["path"] == "features" and method["grams"][m]["path"] == "stored-gram"
        assert method["grams"][m]["null"] == 0
        assert set(out["grams"][m]) == set(out["sums"][m]) == {"value", "chance"}   # no permutations drawn
        for key in ("value", "chance"):
            np.testing.assert_allclose(out["grams"][m][key], out["sums"][m][key], rtol=0, atol=1e-12, err_msg=key)
        assert np.isnan(out["grams"][m]["value"][2]).all() and np.isfinite(out["grams"][m]["value"][:2]).all()
        expected = [[reference.cka(a, b, m) for b in xb] for a in xa[:2]]
        np.testing.assert_allclose(out["grams"][m]["value"][:2], expected, rtol=0, atol=1e-10)
    assert (out["grams"]["unbiased_cka"]["chance"][:2] == 0).all()


def test_exact_cka_and_shape_measures_share_the_feature_sums():
    acc = build(["linear_cka", "unbiased_cka", "cca", "procrustes"])
    assert [type(p).__name__ for p in acc.parts] == ["FeaturePart"]
    acc = build(["linear_cka", "cca"], mode="minibatch")
    assert [type(p).__name__ for p in acc.parts] == ["MinibatchPart", "FeaturePart"]


@pytest.mark.parametrize("mode", ["exact", "minibatch"])
def test_default_metrics_build_exactly_what_they_did(mode):
    """A measure not chosen costs nothing: the default accumulator has the CKA parts only, same sums."""
    acc = build(["linear_cka", "unbiased_cka"], mode=mode)
    if mode == "minibatch":
        assert [type(p).__name__ for p in acc.parts] == ["MinibatchPart"]
        assert len(acc.state()) == 3 + 2 * 3
    else:
        assert [type(p).__name__ for p in acc.parts] == ["FeaturePart"]
        assert acc.parts[0].metrics == ["linear_cka", "unbiased_cka"]


def test_null_is_each_measure_recomputed_on_permuted_samples():
    null = 3
    acc = feed(build(null=null, seed=7), XA, XB, [12, 19])
    values = acc.compute()
    perms = draw_perms(null, N, perm_generator(7, -1), "cpu").numpy()
    for m in NEW:
        assert values[m]["null"].shape == (null, 3, 2)
        np.testing.assert_allclose(values[m]["value"], REF[m], atol=1e-8, rtol=0, err_msg=m)
        for k in range(null):
            want = np.array([[one_shot(m, a, b[perms[k]]) for b in XB] for a in XA])
            np.testing.assert_allclose(values[m]["null"][k], want, atol=1e-8, rtol=0, err_msg=f"{m} draw {k}")
        np.testing.assert_allclose(values[m]["null_mean"], values[m]["null"].mean(0), atol=1e-12)


def test_null_separates_related_from_independent():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(80, 4))
    y = x @ rng.normal(size=(4, 4)) + 0.1 * rng.normal(size=(80, 4))
    acc = make_accumulator(CompareSettings(metrics=NEW, mode="exact", null=20, knn_k=5), [4], [4])
    acc.update([torch.as_tensor(x)], [torch.as_tensor(y)])
    values = acc.compute()
    for m in NEW:
        v, p95 = values[m]["value"][0, 0], values[m]["null_p95"][0, 0]
        if m in ("procrustes_angle", "shape_metric"):   # distances: smaller than every draw
            assert v < values[m]["null"][:, 0, 0].min(), m
        else:
            assert v > p95, m


def test_two_ranks_combined_by_shifts_sums_and_payloads_equal_one_accumulator():
    whole = feed(build(), XA, XB, [8, 8, 8, 7]).compute()
    ranks = [build(), build()]
    for k, start in enumerate(range(0, N, 8)):  # rank k % 2 takes global batch k, with its global offset
        stop = min(N, start + 8)
        ranks[k % 2].update([torch.as_tensor(x[start:stop]) for x in XA], [torch.as_tensor(y[start:stop]) for y in XB],
                            batch_index=k, row_offset=start)
    shifts = ranks[0].shifts()
    assert len(shifts) == 4                           # feature path and fold path: x and y each
    for acc in ranks:
        acc.rebase(shifts)
    for mine, theirs in zip(ranks[0].state(), ranks[1].state(), strict=True):
        total = mine + theirs
        mine.copy_(total)
        theirs.copy_(total)
    payloads = [acc.stored_payload() for acc in ranks]
    for acc in ranks:
        acc.load_stored(payloads)
        got = acc.compute()
        for m in NEW:
            np.testing.assert_allclose(got[m]["value"], whole[m]["value"], atol=1e-9, rtol=0, err_msg=m)


def test_merge_with_global_offsets_equals_whole():
    first = feed(build(), [x[:13] for x in XA], [y[:13] for y in XB], [13])
    second = feed(build(), [x[13:] for x in XA], [y[13:] for y in XB], [9, 9], start_index=1, offset=13)
    got = first.merge(second).compute()
    for m in NEW:
        np.testing.assert_allclose(got[m]["value"], REF[m], atol=1e-9, rtol=0, err_msg=m)


def test_float32_activations_agree_with_float64():
    xa, xb = make_layers(dtype=np.float32)
    got = feed(build(), xa, xb, [16, 15]).compute()
    for m in ("procrustes", "procrustes_angle", "cca", "svcca", "shape_metric", "ridge_r2", "rsa"):
        np.testing.assert_allclose(got[m]["value"], REF[m], atol=2e-3, rtol=0, err_msg=m)


def test_degenerate_cca_warns_naming_the_layer_and_ridge_avoids_it():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(12, 3)), rng.normal(size=(12, 15))
    acc = make_accumulator(CompareSettings(metrics=["cca", "procrustes", "svcca"], mode="exact", null=0), [3], [15], names_b=["'fc' (model_b)"])
    acc.update([torch.as_tensor(x)], [torch.as_tensor(y)])
    with pytest.warns(RuntimeWarning, match=r"cca is undefined for layer 'fc' \(model_b\): it has 15 features"):
        values = acc.compute()
    assert math.isnan(values["cca"]["value"][0, 0]) and not math.isnan(values["procrustes"]["value"][0, 0])
    acc = make_accumulator(CompareSettings(metrics=["cca"], mode="exact", cca_eps=0.1, null=0), [3], [15])
    acc.update([torch.as_tensor(x)], [torch.as_tensor(y)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert 0 < acc.compute()["cca"]["value"][0, 0] < 1


@pytest.mark.parametrize("metrics", [["cca", "procrustes"], ["ridge_r2"], ["rsa", "jaccard_knn"]])
def test_constant_layer_is_nan_with_a_warning_naming_it(metrics):
    x = np.random.default_rng(0).normal(size=(20, 3))
    acc = make_accumulator(CompareSettings(metrics=metrics, mode="exact", ridge_folds=2, knn_k=3, null=0), [3, 2], [3], names_a=["good", "flat"])
    acc.update([torch.as_tensor(x), torch.ones(20, 2, dtype=torch.float64)], [torch.as_tensor(x)])
    with pytest.warns(RuntimeWarning, match="constant layer.*flat"):
        values = acc.compute()
    for m in metrics:
        assert math.isnan(values[m]["value"][1, 0]) and not math.isnan(values[m]["value"][0, 0])


def test_rsa_refuses_an_n_above_its_stated_limit():
    acc = make_accumulator(CompareSettings(metrics=["rsa"], mode="exact", memory_budget_bytes=100_000, null=0), [3], [3])
    x = torch.randn(100, 3, dtype=torch.float64)
    acc.update([x], [x])
    limit = acc.describe()["rsa"]["max_n"]
    assert limit < 100
    with pytest.raises(SimkitError, match=rf"use at most n={limit} \(`n`\)"):
        acc.compute()


def test_bad_settings_are_errors_naming_the_argument():
    with pytest.raises(SimkitError, match="`shape_alpha`"):
        build(shape_alpha=-0.1)
    with pytest.raises(SimkitError, match="`rsa_distance` must be one of correlation, euclidean, cosine, got 'l1'"):
        build(rsa_distance="l1")
    with pytest.raises(SimkitError, match="unknown metric 'netrep'"):
        build(["netrep"])


# ----------------------------------------------------------------------------------------- engine


def test_engine_compare_passes_the_settings_and_the_global_folds():
    from simkit.engine import compare

    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 4)).double()
    b = nn.Sequential(nn.Linear(6, 3), nn.Tanh()).double()
    x = torch.randn(45, 6, dtype=torch.float64)
    result = compare(a, b, x, layers_a="1,2", layers_b="1", metrics=["ridge_r2", "shape_metric", "rsa"],
                     batch_size=8, ridge_folds=3, shape_alpha=0.2, rsa_compare="pearson", progress=False)
    assert result.meta["settings"]["ridge_folds"] == 3 and result.meta["settings"]["shape_alpha"] == 0.2
    assert "svcca_keep" not in result.meta["settings"]   # only the settings of the chosen measures
    with torch.no_grad():
        h = a[1](a[0](x))
        acts_a, act_b = [h, a[2](h)], b(x)
    for i, act in enumerate(acts_a):
        assert result.matrix("ridge_r2").iloc[i, 0] == pytest.approx(ridge_r2(act, act_b, ridge_folds=3), abs=1e-9)
        assert result.matrix("shape_metric").iloc[i, 0] == pytest.approx(
            shape_metric(act, act_b, shape_alpha=0.2), abs=1e-9)
        assert result.matrix("rsa").iloc[i, 0] == pytest.approx(rsa(act, act_b, rsa_compare="pearson"), abs=1e-9)
    with pytest.raises(SimkitError, match="`ridge_folds` must be an integer >= 2"):
        compare(a, b, x, metrics=["ridge_r2"], ridge_folds=1, progress=False)


@pytest.mark.parametrize("null", [0, 2])
def test_self_similarity_on_the_diagonal(null):
    xs = [XA[1], XA[2], XB[1]]
    acc = make_accumulator(CompareSettings(metrics=NEW, mode="exact", null=null, ridge_lambda=0.0, knn_k=4, rsa_distance="euclidean"), [x.shape[1] for x in xs], [x.shape[1] for x in xs])
    feed(acc, xs, xs, [20, 11])
    values = acc.compute()
    for m in NEW:
        want = 0.0 if m in ("procrustes_angle", "shape_metric") else 1.0
        np.testing.assert_allclose(np.diag(values[m]["value"]), want, atol=1e-6, err_msg=m)
