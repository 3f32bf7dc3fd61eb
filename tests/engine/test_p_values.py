"""p-values per cell (issue #36): exact permutation moments, the p-values against float64 permutation
references, the corrections, restricted permutations, and agreement across paths, caches and ranks.

The calibration over repeated draws (family-wise rate, false discovery rate, the max null's uniformity,
power) is in ``test_p_value_calibration.py``.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import false_discovery_control

import simkit
from simkit.errors import SimkitError
from simkit.metrics.inference import benjamini_hochberg, best_pair, correct, holm, permutation_p
from simkit.metrics.permutation_moments import block_traces, cumulants, enumerated_cumulants, matrix_traces
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from simkit.metrics.streaming.common import draw_perms, perm_generator
from simkit.metrics.streaming.gram_moments import cube_trace
from simkit.metrics.streaming.stored import GramRows
from tests import reference

pytestmark = pytest.mark.usefixtures("one_thread")


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def u_centred(k: np.ndarray) -> np.ndarray:
    """Song et al.'s U-centring, written out: diagonal zeroed, offsets from the row sums over n − 2."""
    n = len(k)
    kt = k - np.diag(np.diag(k))
    rows = kt.sum(1)
    out = kt - rows[:, None] / (n - 2) - rows[None, :] / (n - 2) + rows.sum() / ((n - 1) * (n - 2))
    np.fill_diagonal(out, 0.0)
    return out


def grams(kind: str, rng: np.random.Generator, n: int, widths: tuple[int, ...]) -> np.ndarray:
    """One symmetric zero-row-sum matrix per width: centred linear, U-centred linear or centred RBF Grams."""
    h = reference.centring_matrix(n)
    out = []
    for w in widths:
        x = rng.normal(size=(n, w)) ** 2 * rng.uniform(0.5, 3, size=w)
        out.append({"linear": reference.linear_gram, "unbiased": lambda z: u_centred(z @ z.T),
                    "rbf": lambda z: h @ reference.rbf_gram(z) @ h}[kind](x))
    return np.stack(out)


def every_permutation(fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """The mean, variance and third central moment of ⟨fa_i, fb_j[π, π]⟩ over all π: (3, La, Lb)."""
    n = fa.shape[-1]
    t = np.array([[[np.sum(a * b[np.ix_(p, p)]) for p in itertools.permutations(range(n))] for b in fb] for a in fa])
    mean = t.mean(-1)
    return np.stack([mean, ((t - mean[..., None]) ** 2).mean(-1), ((t - mean[..., None]) ** 3).mean(-1)])


# ---------------------------------------------------------------------------------- exact moments


@pytest.mark.parametrize("kind", ["linear", "unbiased", "rbf"])
def test_the_moment_formulas_are_the_moments_over_every_permutation(kind):
    rng = _rng({"linear": 0, "unbiased": 1, "rbf": 2}[kind])
    fa, fb = grams(kind, rng, 7, (2, 3)), grams(kind, rng, 7, (1, 4))
    want = every_permutation(fa, fb)
    got = cumulants(matrix_traces(torch.tensor(fa)), matrix_traces(torch.tensor(fb)), 7).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * np.abs(want).max())


def test_below_six_samples_the_cumulants_come_from_every_permutation():
    rng = _rng(3)
    fa, fb = grams("linear", rng, 5, (2,)), grams("linear", rng, 5, (3, 2))
    got = enumerated_cumulants(torch.tensor(fa), torch.tensor(fb)).numpy()
    np.testing.assert_allclose(got, every_permutation(fa, fb), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind, width", [("biased", 5), ("unbiased", 5), ("biased", 60), ("unbiased", 60), ("rbf", 5)])
def test_traces_in_row_blocks_and_the_cube_trace_equal_those_of_the_whole_gram(kind, width):
    """The stored path's traces: summed over blocks of rows, tr W³ in feature space (factorised for the
    U-centred Gram) or from the Gram when the layer is wider than the sample."""
    x = torch.tensor(_rng(4).normal(size=(40, width)) + 2.0)
    g = GramRows(x, kind, 1.0, chunk=16, constant=False)
    whole = g.rows(torch.arange(40))
    want = matrix_traces(whole[None])[0]
    diag = torch.diagonal(whole)[None]
    got = sum(block_traces(g.rows(idx)[None], diag[:, idx], diag)[0] for idx in torch.arange(40).split(16))
    got[2] = cube_trace(g)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-6)


# ----------------------------------------------------------------- p-values against references


def related_layers(seed: int, n: int = 40) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Two layers per side, float32-exact float64 arrays: A[0] and B[0] share a weak common factor (a p-value
    between 0.01 and 0.5), the others are unrelated."""
    rng = _rng(seed)
    z = rng.normal(size=(n, 1))
    xa = [rng.normal(size=(n, 3)) + 0.4 * z, rng.normal(size=(n, 5)) ** 2]
    xb = [rng.normal(size=(n, 4)) + 0.4 * z, rng.normal(size=(n, 2))]
    return [a.astype(np.float32).astype(np.float64) for a in xa], [b.astype(np.float32).astype(np.float64) for b in xb]


def accumulate(metrics, xa, xb, batch=None, **settings):
    acc = make_accumulator(CompareSettings(metrics=metrics, p_values=True, **settings), [x.shape[1] for x in xa],
                           [y.shape[1] for y in xb])
    n = len(xa[0])
    step = batch or n
    for s in range(0, n, step):
        acc.update([torch.tensor(x[s:s + step], dtype=torch.float32) for x in xa],
                   [torch.tensor(y[s:s + step], dtype=torch.float32) for y in xb], batch_index=s // step, row_offset=s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return acc.compute(), acc.describe()


def procrustes_with_reference_null(seed: int):
    """Exact-mode procrustes with its default null on ``related_layers(seed)``: (the accumulator's arrays, its
    description, per pair (observed, draws) recomputed by the float64 reference over the permutations simkit
    drew)."""
    xa, xb = related_layers(seed)
    out, described = accumulate(["procrustes"], xa, xb, mode="exact")
    perms = draw_perms(described["procrustes"]["null"], len(xa[0]), perm_generator(0, -1), "cpu").numpy()
    pairs = {(i, j): (reference.procrustes(x, y), np.array([reference.procrustes(x, y[p]) for p in perms]))
             for i, x in enumerate(xa) for j, y in enumerate(xb)}
    return out, described, pairs


def test_permutation_p_values_reproduce_a_float64_permutation_reference():
    """procrustes' p-values: (1 + #{null ≥ value}) / (1 + K) over the same permutations, each permuted pair
    recomputed by the float64 reference."""
    out, described, pairs = procrustes_with_reference_null(7)
    count = described["procrustes"]["null"]
    want = np.empty((2, 2))
    for (i, j), (observed, null) in pairs.items():
        want[i, j] = (1 + np.sum(null >= observed - 1e-12)) / (1 + count)
    np.testing.assert_array_equal(out["procrustes"]["p_value"], want)
    assert count == 199 and described["procrustes"]["smallest_p"] == 1 / 200
    assert 0.005 < want[0, 0] < 0.5  # the reference exercises a p-value between the extremes


def test_the_calibrated_score_is_the_calibrated_similarity_packages_over_the_same_permutations():
    """calibrated = clamp((v − τ) / (1 − τ), 0, 1), τ the ⌈(1 − α)(K + 1)⌉-th smallest of the value and its K
    draws (Gröger et al.'s ``calibrate``: the score is 0 under the null at level α), every permuted pair
    recomputed by the float64 reference over the permutations simkit drew."""
    from simkit.engine.significance import p_value_columns

    out, described, pairs = procrustes_with_reference_null(7)
    count = described["procrustes"]["null"]
    want = np.empty((2, 2))
    for (i, j), (observed, null) in pairs.items():
        combined = np.sort(np.r_[observed, null])
        tau = combined[int(np.ceil(0.95 * (count + 1))) - 1]
        want[i, j] = np.clip((observed - tau) / (1.0 - tau), 0.0, 1.0)
    got = p_value_columns("procrustes", out["procrustes"], "holm")["calibrated"]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    assert (want > 0).any() and (want < 1).all()  # the reference reaches a score between the extremes


def monte_carlo_p(xa, xb, metric: str, draws: int, rng: np.random.Generator, batch: int | None = None) -> np.ndarray:
    """A float64 permutation reference of the CKA family: the share of random permutations of B's samples
    (within each batch, for the minibatch estimator) whose summed HSIC reaches the observed one."""
    kind, hsic = ("rbf" if metric == "rbf_cka" else "linear",
                  reference.hsic_unbiased if metric == "unbiased_cka" else reference.hsic_biased)
    n = len(xa[0])
    starts = range(0, n, batch or n)
    out = np.empty((len(xa), len(xb)))
    for i, x in enumerate(xa):
        for j, y in enumerate(xb):
            pairs = [(reference.gram(x[s:s + (batch or n)], kind), reference.gram(y[s:s + (batch or n)], kind))
                     for s in starts]
            observed = sum(hsic(k, lg) for k, lg in pairs)
            null = np.zeros(draws)
            for k, lg in pairs:
                m = len(k)
                null += [hsic(k, lg[np.ix_(p, p)]) for p in (rng.permutation(m) for _ in range(draws))]
            out[i, j] = (1 + np.sum(null >= observed)) / (1 + draws)
    return out


@pytest.mark.parametrize("metric, mode", [("linear_cka", "exact"), ("unbiased_cka", "exact"), ("rbf_cka", "exact"),
                                          ("linear_cka", "minibatch"), ("unbiased_cka", "minibatch")])
def test_moment_matched_p_values_agree_with_a_float64_permutation_reference(metric, mode):
    xa, xb = related_layers(7)
    batch = 20 if mode == "minibatch" else None
    out, described = accumulate([metric], xa, xb, batch=batch, mode=mode, batch_size=batch or 64)
    assert described[metric]["p_value"].startswith("Pearson type III") and described[metric]["smallest_p"] is None
    want = monte_carlo_p(xa, xb, metric, 2000, _rng(8), batch)
    got = out[metric]["p_value"]
    assert np.abs(got - want).max() < 0.025, (got, want)       # Monte Carlo error ≈ 0.01 at p ≈ 0.5
    assert 0.005 < want[0, 0] < 0.5


def test_the_chance_level_with_p_values_is_the_exact_permutation_mean():
    xa, xb = related_layers(9, n=12)
    out, _ = accumulate(["linear_cka"], xa, xb, mode="exact")
    rng = _rng(10)
    draws = [[np.mean([reference.cka(x, y[rng.permutation(12)], "linear_cka") for _ in range(3000)]) for y in xb]
             for x in xa]
    assert np.abs(out["linear_cka"]["chance"] - np.array(draws)).max() < 0.01


# ------------------------------------------------------------------------------------ corrections


def holm_by_steps(p: np.ndarray, alpha: float) -> np.ndarray:
    """Holm's procedure as he wrote it: reject the smallest p-values in turn while p_(k) ≤ α/(m − k + 1)."""
    order = np.argsort(p)
    reject = np.zeros(len(p), dtype=bool)
    for k, index in enumerate(order):
        if p[index] > alpha / (len(p) - k):
            break
        reject[index] = True
    return reject


def test_holm_and_bh_decide_as_their_definitions():
    rng = _rng(11)
    for _ in range(200):
        p = np.concatenate([rng.uniform(size=rng.integers(1, 30)), rng.uniform(0, 0.01, size=rng.integers(0, 5))])
        for alpha in (0.01, 0.05, 0.2):
            np.testing.assert_array_equal(holm(p) <= alpha, holm_by_steps(p, alpha))
        np.testing.assert_allclose(benjamini_hochberg(p), false_discovery_control(p))
    grid = np.array([[0.001, np.nan], [0.02, 0.5]])
    corrected = correct(grid, "holm", np.array([[True, True], [False, True]]))
    np.testing.assert_allclose(corrected, [[0.002, np.nan], [np.nan, 0.5]])


def test_the_best_pair_and_its_max_corrected_p_value():
    value = np.array([[0.9, 0.2], [0.1, 0.3]])
    draws = np.array([[[0.95, 0.1], [0.1, 0.1]], [[0.1, 0.2], [0.3, 0.1]], [[0.5, 0.5], [np.nan, 0.5]]])
    best = best_pair(value, draws, similarity=True)
    assert (best["row"], best["col"], best["p_max"]) == (0, 0, 2 / 4)
    distance = best_pair(value, draws, similarity=False, family=~np.eye(2, dtype=bool))
    assert (distance["row"], distance["col"], distance["p_max"]) == (1, 0, 2 / 4)
    np.testing.assert_allclose(permutation_p(value, draws, False), [[3 / 4, 3 / 4], [2 / 3, 3 / 4]])


# ------------------------------------------------------------------------- restricted permutations


def test_group_restricted_permutations_move_samples_only_within_groups():
    codes = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0])
    perms = draw_perms(500, 8, perm_generator(0, 3), "cpu", codes)
    assert (codes[perms] == codes).all()
    seen = {tuple(p) for p in perms[:, codes == 0].tolist()}
    assert len(seen) == 6                                  # every order of group 0's three samples occurs


def test_a_shared_group_effect_beats_free_permutations_but_not_those_within_groups():
    """A and B both carry their samples' class (nothing else in common): free permutations call every
    pair similar; permutations within classes test similarity beyond the class, and find none."""
    rng = _rng(12)
    labels = np.repeat(np.arange(6), 20)
    centres = rng.normal(size=(6, 8)) * 3
    xa = {"a": (centres[labels] + rng.normal(size=(120, 8))).astype(np.float32)}
    xb = {"b": (centres[labels] @ rng.normal(size=(8, 5)) + rng.normal(size=(120, 5))).astype(np.float32)}
    kw = {"metrics": ["unbiased_cka", "procrustes"], "mode": "exact", "p_values": True, "progress": False}
    free = simkit.compare_arrays(xa, xb, **kw).to_frame()
    within = simkit.compare_arrays(xa, xb, groups=[str(v) for v in labels], **kw)
    assert free["beats_chance"].all()
    assert not within.to_frame()["beats_chance"].any()
    assert within.summary["p_values"]["groups"] == 6
    assert within.meta["settings"]["groups"]["groups"] == 6


def test_groups_from_a_file_and_bad_group_files(tmp_path):
    xa = {"a": np.arange(40, dtype=np.float32).reshape(20, 2) ** 1.5}
    xb = {"b": np.arange(20, dtype=np.float32).reshape(20, 1) % 7}
    path = tmp_path / "groups.txt"
    path.write_text("\n".join("x" if i < 10 else "y" for i in range(20)) + "\n")
    result = simkit.compare_arrays(xa, xb, metrics=["linear_cka"], p_values=True, groups=str(path), progress=False)
    assert result.summary["p_values"]["groups"] == 2 and result.meta["settings"]["groups"] == str(path)
    for text, message in [("x\n" * 19, "gives 19 labels"), ("x\ny\n" * 11, "22 labels for 20 samples"),
                          ("x\n\ny\n" * 7, "line 2 is blank"),
                          ("\n".join(map(str, range(20))), "a group of its own")]:
        path.write_text(text)
        with pytest.raises(SimkitError, match=message):
            simkit.compare_arrays(xa, xb, metrics=["linear_cka"], p_values=True, groups=str(path), progress=False)


# ------------------------------------------------------------------- settings and unchanged outputs


def test_correction_needs_p_values_and_p_values_need_enough_permutations():
    with pytest.raises(SimkitError, match="`correction` 'bh' corrects p-values"):
        CompareSettings(correction="bh").validate()
    with pytest.raises(SimkitError, match="`null` must be at least 19 with `p_values`"):
        CompareSettings(p_values=True, null=10).validate()
    assert CompareSettings(p_values=True).validate().correction == "holm"


def test_without_p_values_nothing_changes():
    xa, xb = related_layers(13)
    arrays = [{f"l{i}": x.astype(np.float32) for i, x in enumerate(xs)} for xs in (xa, xb)]
    for mode in ("exact", "minibatch"):
        plain = simkit.compare_arrays(*arrays, metrics=["linear_cka", "unbiased_cka", "mutual_knn"], knn_k=3,
                                      mode=mode, batch_size=20, progress=False)
        frame = plain.to_frame()
        assert not {"p_value", "p_corrected", "calibrated"} & set(frame.columns)
        assert "p_values" not in plain.summary
        assert not {"p_values", "correction", "groups"} & set(plain.meta["settings"])
        assert not any("p_value" in d for d in plain.meta["method"].values())


# ------------------------------------------------------------------------ paths, caches and ranks


def two_ranks(metrics, xa, xb, batch, **settings):
    """The accumulator fed all batches, and two fed alternate batches then merged (what two ranks do)."""
    def build():
        return make_accumulator(CompareSettings(metrics=metrics, p_values=True, batch_size=batch, **settings),
                                [x.shape[1] for x in xa], [y.shape[1] for y in xb])
    one, first, second = build(), build(), build()
    for k, s in enumerate(range(0, len(xa[0]), batch)):
        acts = ([torch.tensor(x[s:s + batch], dtype=torch.float32) for x in xa],
                [torch.tensor(y[s:s + batch], dtype=torch.float32) for y in xb])
        one.update(*acts, batch_index=k, row_offset=s)
        (first if k % 2 else second).update(*acts, batch_index=k, row_offset=s)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return one.compute(), first.merge(second).compute()


@pytest.mark.parametrize("mode", ["minibatch", "exact"])
def test_two_ranks_give_the_p_values_of_one(mode):
    xa, xb = related_layers(14, n=60)
    one, merged = two_ranks(["unbiased_cka", "linear_cka", "jaccard_knn"], xa, xb, 16, mode=mode, knn_k=3)
    for metric in one:
        np.testing.assert_allclose(merged[metric]["p_value"], one[metric]["p_value"], rtol=1e-9, atol=1e-15)
        np.testing.assert_allclose(merged[metric]["null"], one[metric]["null"], rtol=1e-9, atol=1e-12)


def test_models_caches_and_arrays_give_the_same_p_values(tmp_path):
    from tests.engine.test_every_path import Tables

    xa, xb = related_layers(15, n=48)
    tables = [[torch.tensor(x, dtype=torch.float32) for x in xs] for xs in (xa, xb)]
    models = Tables(tables[0]), Tables(tables[1])
    layers = [[f"layers.l{i}" for i in range(len(t))] for t in tables]
    index = torch.arange(48)
    settings = CompareSettings(metrics=["linear_cka", "rsa"], mode="exact", p_values=True, batch_size=16)
    direct = simkit.compare(*models, index, settings, layers_a=layers[0], layers_b=layers[1], progress=False)
    paths = [simkit.capture(m, index, tmp_path / side, layers=names, batch_size=16, progress=False)
             for side, m, names in zip("ab", models, layers, strict=True)]
    cached = simkit.compare_caches(*paths, settings, layers_a=layers[0], layers_b=layers[1], progress=False)
    arrays = simkit.compare_arrays(*[{n: t.numpy() for n, t in zip(names, ts, strict=True)}
                                     for names, ts in zip(layers, tables, strict=True)], settings, progress=False)
    for other in (cached, arrays):
        for column in ("p_value", "p_corrected", "calibrated", "beats_chance"):
            np.testing.assert_allclose(other.to_frame()[column].to_numpy(dtype=float),
                                       direct.to_frame()[column].to_numpy(dtype=float), rtol=1e-9)
    assert direct.summary["p_values"]["metrics"]["rsa"]["method"] == "permutations"
    assert direct.summary["p_values"]["metrics"]["linear_cka"]["method"] == "pearson3"


# ------------------------------------------------------------------ study, report, terminal and CLI


def study_sources(related: bool, seed: int) -> list[dict[str, np.ndarray]]:
    """Three "models" of the same 80 samples, one layer each: the first two related or not, the third apart."""
    rng = _rng(seed)
    base = rng.normal(size=(80, 6))
    first = base if related else rng.normal(size=(80, 6))
    return [{"out": (first @ rng.normal(size=(6, 5)) + 0.3 * rng.normal(size=(80, 5))).astype(np.float32)},
            {"out": (base @ rng.normal(size=(6, 4)) + 0.3 * rng.normal(size=(80, 4))).astype(np.float32)},
            {"out": rng.normal(size=(80, 7)).astype(np.float32)}]


def test_a_study_names_its_most_similar_pair_only_when_it_beats_the_null_of_the_best_pair():
    from simkit.report.headline import study_headline

    kw = {"metrics": ["unbiased_cka"], "mode": "exact", "p_values": True, "progress": False,
          "names": ["m0", "m1", "m2"]}
    related = simkit.study(study_sources(True, 16), **kw)
    best = related.summary["p_values"]["metrics"]["unbiased_cka"]["best"]
    assert {best["model_a"], best["model_b"]} == {"m0", "m1"} and best["beats_max_null"]
    assert related.summary["p_values"]["metrics"]["unbiased_cka"]["cells"] == 6   # each model with itself left out
    assert study_headline(related).startswith("most similar pair: m")
    unrelated = simkit.study(study_sources(False, 17), **kw)
    best = unrelated.summary["p_values"]["metrics"]["unbiased_cka"]["best"]
    line = study_headline(unrelated)
    assert best["beats_max_null"] == (best["p_max"] <= 0.05)
    assert line.startswith("most similar pair" if best["beats_max_null"] else "no pair of different models beats")


def test_the_report_and_the_terminal_line_state_the_corrected_rule_and_the_best_pair(tmp_path):
    from simkit.report.headline import compare_headline

    xa, xb = related_layers(18, n=60)
    arrays = [{f"l{i}": x.astype(np.float32) for i, x in enumerate(xs)} for xs in (xa, xb)]
    result = simkit.compare_arrays(*arrays, metrics=["unbiased_cka", "rsa"], p_values=True, correction="bh",
                                   null=19, mode="exact", progress=False)
    line = compare_headline(result)
    assert "Benjamini–Hochberg-corrected p ≤ 0.05" in line and "max-corrected p = " in line
    simkit.render_report(result, tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "max-corrected p" in html and "<h2>p-values</h2>" in html
    assert "rsa: with 19 permutations no p-value can go below 0.05" in html   # 1/20 > 0.05/4: a caution
    assert "Benjamini–Hochberg-corrected p ≤ 0.05 over 4 cells" in html


def test_the_command_line_writes_the_test_columns_and_refuses_a_correction_alone(tmp_path):
    from tests.helpers import invoke

    xa, xb = related_layers(19, n=50)
    np.save(tmp_path / "a.npy", xa[0].astype(np.float32))
    np.save(tmp_path / "b.npy", xb[0].astype(np.float32))
    (tmp_path / "groups.txt").write_text("\n".join(str(i % 5) for i in range(50)))
    out = tmp_path / "run"
    result = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--out", out, "--metric", "linear_cka",
                    "--p-values", "--groups", tmp_path / "groups.txt", "--no-report")
    assert result.exit_code == 0, result.output
    header = (out / "similarity.csv").read_text().splitlines()[0].split(",")
    assert header[-5:] == ["chance", "calibrated", "beats_chance", "p_value", "p_corrected"]
    assert "beat chance (Holm-corrected p ≤ 0.05)" in result.output
    refused = invoke("compare", tmp_path / "a.npy", tmp_path / "b.npy", "--out", tmp_path / "no", "--correction", "bh")
    assert refused.exit_code == 2 and "--correction" in refused.output and "--p-values" in refused.output
