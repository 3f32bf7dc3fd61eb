"""Every measure through every path agrees with its function to 1e-8 (issue #22).

The same float32 tensors go through the ``simkit.metrics`` function of each measure (one pair at a time)
and through every streaming accumulator path reachable without the engine: the feature/fold sums, the
stored activations, and both of those split over two accumulators merged with ``.merge`` (what two ranks
do). The cases hold a layer wider than the sample (``p > n``), rank-deficient layers, pairs with
``rank_x + rank_y > n − 1`` (CCA family NaN), a large feature mean and a decaying spectrum whose weak
directions are real in float64 (dropped by the old float32 rank rule). The CKA family is also checked
against the independent float64 numpy implementation of ``tests/reference.py``. (A direction
near the rank threshold is resolved only to about ``eps · λ_max / λ``, far from 1e-8: the per-layer
tolerance is tested on its own in ``tests/metrics/test_streaming_measures.py``.)

A path is one entry of :data:`PATHS` (name → function of the case returning every measure's ``(La, Lb)``
matrix); the engine's ``compare`` / ``compare_caches`` paths are added there.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from simkit import metrics as M
from simkit.metrics._checks import rank_rtol
from simkit.metrics.settings import CompareSettings
from simkit.metrics.streaming import make_accumulator
from tests import reference

MEASURES = ("procrustes", "procrustes_angle", "cca", "svcca", "pwcca", "shape_metric", "ridge_r2", "mutual_knn",
            "jaccard_knn", "rsa", "linear_cka", "unbiased_cka", "rbf_cka")
CKA = ("linear_cka", "unbiased_cka", "rbf_cka")
TOL = 1e-8
KNN_K = 5


# ------------------------------------------------------------------------------------------------ cases


@dataclass
class Case:
    """Float32 layers of two models on the same ``n`` samples, fed in ``batch``-row batches."""

    xa: list[torch.Tensor]
    xb: list[torch.Tensor]
    batch: int

    @property
    def n(self) -> int:
        return len(self.xa[0])


def _duplicated(base: torch.Tensor, width: int) -> torch.Tensor:
    """``width`` columns that repeat ``base``'s with signs and power-of-two scales: exactly its rank in float32."""
    reps = [base * (2.0 ** (k % 3)) * (-1) ** k for k in range(-(-width // base.shape[1]))]
    return torch.cat(reps, 1)[:, :width]


def mixed() -> Case:
    """n = 80: A = [6, 24 of rank 8, 100 (p > n), 30], B = [10 (depends on A[0]), 40 of rank 30, 60].

    A[2] (rank 79 = n − 1) makes cca/pwcca NaN one-sided; A[3] × B[2] (ranks 30 + 60 > 79) is jointly
    degenerate."""
    g = torch.Generator().manual_seed(0)
    n = 80
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    a0 = r(n, 6) + 3.0
    a1 = _duplicated(r(n, 8), 24)
    a2 = r(n, 100)
    a3 = r(n, 30) @ r(30, 30)
    b0 = a0 @ r(6, 10) + 0.5 * r(n, 10)
    b1 = _duplicated(r(n, 30), 40) - 1.0
    b2 = r(n, 60) + a3[:, :1]
    return Case([t.float() for t in (a0, a1, a2, a3)], [t.float() for t in (b0, b1, b2)], batch=16)


def spectrum() -> Case:
    """n = 120: A[0] (16 features, singular values 1 … 1e-4: directions the float32 rule dropped, real in
    float64), A[1] (12 features about a mean of 100, three of them 100 times narrower), A[2] (300 features,
    p > n); B[0] (8) depends on every direction of A[0], B[1] (3) on A[1]'s narrow columns."""
    g = torch.Generator().manual_seed(1)
    n = 120
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, _ = torch.linalg.qr(r(16, 16))
    a0 = (r(n, 16) * torch.logspace(0, -4, 16, dtype=torch.float64)) @ q.T
    b0 = (a0 / a0.std(0)) @ r(16, 8) + 2.0 * r(n, 8)
    a1 = r(n, 12)
    a1[:, :3] *= 1e-2
    b1 = a1[:, :3] * 100 + 0.3 * r(n, 3)
    a1 = a1 + 100.0
    a2 = r(n, 300)
    return Case([a0.float(), a1.float(), a2.float()], [b0.float(), b1.float()], batch=25)


CASES: dict[str, Callable[[], Case]] = {"mixed": mixed, "spectrum": spectrum}

#: settings of the measures (the accumulator's keyword arguments), each a parametrize entry
SETTINGS: dict[str, dict[str, object]] = {
    "defaults": {},
    "unregularised": {"shape_alpha": 0.0, "ridge_lambda": 0.0, "svcca_keep": 0.9, "rsa_distance": "euclidean",
                      "rsa_compare": "pearson"},
    "ridged": {"cca_eps": 0.1, "shape_alpha": 0.7, "ridge_lambda": 1.0, "ridge_folds": 3, "rsa_distance": "cosine",
               "rsa_compare": "kendall_tau_a"},
}
DEFAULTS: dict[str, object] = {"shape_alpha": 0.5, "cca_eps": 0.0, "svcca_keep": 0.99, "ridge_lambda": 1e-2,
                               "ridge_folds": 5, "rsa_distance": "correlation", "rsa_compare": "spearman"}


@functools.cache
def case(name: str) -> Case:
    return CASES[name]()


# ------------------------------------------------------------------------------------------------ paths


def function_value(measure: str, x: torch.Tensor, y: torch.Tensor, st: dict[str, object]) -> float:
    """One pair through the ``simkit.metrics`` function with the settings ``st``."""
    eps, alpha, keep = st["cca_eps"], st["shape_alpha"], st["svcca_keep"]
    calls: dict[str, Callable[[], float]] = {
        "procrustes": lambda: M.procrustes(x, y),
        "procrustes_angle": lambda: M.procrustes_angle(x, y),
        "cca": lambda: M.cca(x, y, cca_eps=eps),
        "svcca": lambda: M.svcca(x, y, svcca_keep=keep, cca_eps=eps),
        "pwcca": lambda: M.pwcca(x, y, cca_eps=eps),
        "shape_metric": lambda: M.shape_metric(x, y, shape_alpha=alpha, cca_eps=eps),
        "ridge_r2": lambda: M.ridge_r2(x, y, ridge_lambda=st["ridge_lambda"], ridge_folds=st["ridge_folds"]),
        "mutual_knn": lambda: M.mutual_knn(x, y, k=KNN_K),
        "jaccard_knn": lambda: M.jaccard_knn(x, y, k=KNN_K),
        "rsa": lambda: M.rsa(x, y, rsa_distance=st["rsa_distance"], rsa_compare=st["rsa_compare"]),
        "linear_cka": lambda: M.linear_cka(x, y),
        "unbiased_cka": lambda: M.unbiased_cka(x, y),
        "rbf_cka": lambda: M.rbf_cka(x, y),
    }
    return calls[measure]()


def by_function(c: Case, st: dict[str, object]) -> dict[str, np.ndarray]:
    out = {m: np.empty((len(c.xa), len(c.xb))) for m in MEASURES}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for m in MEASURES:
            for i, x in enumerate(c.xa):
                for j, y in enumerate(c.xb):
                    out[m][i, j] = function_value(m, x, y, st)
    return out


def _accumulator(c: Case, st: dict[str, object], stored: bool):
    """An exact-mode accumulator of every measure; ``stored``: every measure on its stored path (a
    permutation null of one draw routes them there; the values do not depend on it)."""
    settings = CompareSettings(metrics=MEASURES, mode="exact", knn_k=KNN_K, null=1 if stored else 0,
                               **st)  # type: ignore[arg-type]
    return make_accumulator(settings, [x.shape[1] for x in c.xa], [y.shape[1] for y in c.xb])


def _feed(acc, c: Case, starts: list[int]) -> None:
    for s in starts:
        rows = slice(s, s + c.batch)
        acc.update([x[rows] for x in c.xa], [y[rows] for y in c.xb], batch_index=s // c.batch, row_offset=s)


def _values(acc) -> dict[str, np.ndarray]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = acc.compute()
    return {m: np.asarray(v["value"], dtype=np.float64) for m, v in out.items()}


def by_accumulator(stored: bool, merged: bool) -> Callable[[Case, dict[str, object]], dict[str, np.ndarray]]:
    def run(c: Case, st: dict[str, object]) -> dict[str, np.ndarray]:
        starts = list(range(0, c.n, c.batch))
        acc = _accumulator(c, st, stored)
        paths = {m: d["path"] for m, d in acc.describe().items()}
        if stored:
            assert all(p.startswith("stored") for p in paths.values()), paths
        else:
            assert paths["cca"] == "features" and paths["linear_cka"] == "features", paths
            assert paths["ridge_r2"] == "folds", paths
        if not merged:
            _feed(acc, c, starts)
            return _values(acc)
        other = _accumulator(c, st, stored)
        _feed(acc, c, starts[1::2])   # two "ranks", interleaved batches, merged in one process
        _feed(other, c, starts[0::2])
        return _values(acc.merge(other))
    return run


def by_reference(c: Case, st: dict[str, object]) -> dict[str, np.ndarray]:
    """The CKA family from the independent float64 numpy implementation (tests/reference.py)."""
    out = {}
    for m in CKA:
        values = np.empty((len(c.xa), len(c.xb)))
        for i, x in enumerate(c.xa):
            for j, y in enumerate(c.xb):
                xn, yn = x.double().numpy(), y.double().numpy()
                if m == "rbf_cka":
                    values[i, j] = reference.cka_of_grams(reference.rbf_gram(xn), reference.rbf_gram(yn), reference.hsic_biased)
                else:
                    values[i, j] = reference.cka_of_grams(xn @ xn.T, yn @ yn.T, reference.hsic_biased if m == "linear_cka" else reference.hsic_unbiased)
        out[m] = values
    return out


class Lookup(torch.nn.Module):
    """A layer whose output for sample indices ``(b,)`` is those rows of a stored table ``(n, p)``."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("table", table)

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return self.table[index]


class Tables(torch.nn.Module):
    """A "model" whose layers ``l0``, ``l1``, ... output a case's activations for the samples asked for."""

    def __init__(self, tables: list[torch.Tensor]):
        super().__init__()
        self.layers = torch.nn.ModuleDict({f"l{i}": Lookup(t) for i, t in enumerate(tables)})

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        return [layer(index) for layer in self.layers.values()][-1]


def _refused(c: Case, st: dict[str, object]) -> set[str]:
    """The measures the engine refuses up front for this case (a layer with n − 1 features or more)."""
    from simkit.metrics.shape import cca_refusal

    dims_a, dims_b = [x.shape[1] for x in c.xa], [y.shape[1] for y in c.xb]
    return {m for m in MEASURES if cca_refusal([m], dims_a, dims_b, c.n, float(st["cca_eps"]),
                                               shape_alpha=float(st["shape_alpha"]))}


def by_engine(mode: str, caches: bool) -> Callable[[Case, dict[str, object]], dict[str, np.ndarray]]:
    """``simkit.compare`` on models that output the case's tensors (or ``compare_caches`` on their
    captured caches): the measures it refuses up front are checked to be refused, the others compared
    (in minibatch mode the CKA family is Nguyen et al.'s estimator, not the full-data function: left out)."""
    import tempfile

    import simkit
    from simkit.errors import SimkitError

    def run(c: Case, st: dict[str, object]) -> dict[str, np.ndarray]:
        index = torch.arange(c.n)
        models = Tables(c.xa), Tables(c.xb)
        layers = [[f"layers.l{i}" for i in range(len(xs))] for xs in (c.xa, c.xb)]
        refused = _refused(c, st)
        skip = set(CKA) if mode == "minibatch" else set()
        chosen = [m for m in MEASURES if m not in refused | skip]
        settings = CompareSettings(metrics=chosen, mode=mode, knn_k=KNN_K, batch_size=c.batch, null=0,
                                   **st)  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            if refused:
                with pytest.raises(SimkitError, match="would be undefined"):
                    simkit.compare(*models, index, settings.updated(metrics=sorted(refused)),
                                   layers_a=layers[0], layers_b=layers[1], progress=False)
            if not caches:
                result = simkit.compare(*models, index, settings, layers_a=layers[0], layers_b=layers[1],
                                        progress=False)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    paths = [simkit.capture(model, index, f"{tmp}/{side}", layers=names, batch_size=c.batch,
                                            progress=False) for side, model, names in zip("ab", models, layers, strict=True)]
                    result = simkit.compare_caches(*paths, settings, layers_a=layers[0], layers_b=layers[1],
                                                   progress=False)
        return {m: result.matrix(m).to_numpy(dtype=float, na_value=np.nan) for m in chosen}
    return run


#: every path besides the functions: the accumulator's strategies, merged halves (two ranks), the engine
PATHS: dict[str, Callable[[Case, dict[str, object]], dict[str, np.ndarray]]] = {
    "features": by_accumulator(stored=False, merged=False),
    "features-merged": by_accumulator(stored=False, merged=True),
    "stored": by_accumulator(stored=True, merged=False),
    "stored-merged": by_accumulator(stored=True, merged=True),
    "compare-exact": by_engine("exact", caches=False),
    "compare-minibatch": by_engine("minibatch", caches=False),
    "compare-caches": by_engine("exact", caches=True),
}


@functools.cache
def expected(case_name: str, settings_name: str) -> dict[str, np.ndarray]:
    return by_function(case(case_name), {**DEFAULTS, **SETTINGS[settings_name]})


def assert_agree(got: dict[str, np.ndarray], want: dict[str, np.ndarray], what: str) -> None:
    bad = []
    for m, g in got.items():
        w = want[m]
        if not (np.array_equal(np.isnan(g), np.isnan(w))
                and np.allclose(np.nan_to_num(g), np.nan_to_num(w), rtol=0, atol=TOL)):
            bad.append(f"{m}:\n got  {g.tolist()}\n want {w.tolist()}")
    assert not bad, f"{what} disagrees with the functions:\n" + "\n".join(bad)


# ------------------------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("settings_name", SETTINGS)
@pytest.mark.parametrize("path", PATHS)
def test_every_path_agrees_with_the_functions(path, settings_name, case_name):
    st = {**DEFAULTS, **SETTINGS[settings_name]}
    got = PATHS[path](case(case_name), st)
    assert_agree(got, expected(case_name, settings_name), f"path {path!r}, {case_name}, {st}")


@pytest.mark.parametrize("case_name", CASES)
def test_functions_of_the_cka_family_agree_with_the_float64_reference(case_name):
    assert_agree({m: expected(case_name, "defaults")[m] for m in CKA}, by_reference(case(case_name), DEFAULTS),
                 f"the CKA functions on {case_name}")


def test_the_cases_cover_what_they_claim():
    """p > n, rank deficiency, one-sided and joint degeneracy, and a weak direction between two layers'
    tolerances are all present (so a path cannot pass by missing them)."""
    c = case("mixed")
    f = expected("mixed", "defaults")
    assert c.xa[2].shape[1] > c.n                       # p > n
    assert np.isnan(f["cca"][2]).all()                  # one-sided: rank n − 1
    assert np.isnan(f["cca"][3, 2])                     # joint: 30 + 60 > 79
    assert not np.isnan(f["cca"][1, 1]) and not np.isnan(f["cca"][0, 0])
    assert not np.isnan(f["shape_metric"][3, 2])        # alpha > 0 stays defined
    assert np.isnan(expected("mixed", "unregularised")["shape_metric"][3, 2])
    assert not np.isnan(expected("mixed", "ridged")["cca"]).any()   # cca_eps > 0: all defined
    x = case("spectrum").xa[0].double()
    lam = torch.linalg.eigvalsh((x - x.mean(0)).T @ (x - x.mean(0)))
    assert lam[0] / lam[-1] < 100 * 1.2e-7 * 1e-2       # weak directions the float32 rule dropped, kept now
    assert expected("spectrum", "defaults")["cca"][0, 0] > 0


# ------------------------------------------------------------------------------------ targeted cases


def _streamed(metrics, xa, xb, batch, stored=False, names=None, **kw):
    """``compute()`` of an exact accumulator fed ``batch``-row batches, and the RuntimeWarnings it gave."""
    settings = CompareSettings(metrics=metrics, mode="exact", null=1 if stored else 0, **kw)
    acc = make_accumulator(settings, [x.shape[1] for x in xa], [y.shape[1] for y in xb],
                           names_a=None if names is None else names[0], names_b=None if names is None else names[1])
    for s in range(0, len(xa[0]), batch):
        acc.update([x[s:s + batch] for x in xa], [y[s:s + batch] for y in xb])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        out = acc.compute()
    return {m: np.asarray(v["value"]) for m, v in out.items()}, [str(w.message) for w in caught]


def test_ridge_pseudo_inverse_uses_each_layers_own_tolerance_on_every_path():
    """A[0] (12 features) has a direction with eigenvalue ratio ≈ 3.8e-14: above its own tolerance
    (100·eps = 2.2e-14), below that of the 300-feature layer beside it (6.7e-14). B depends on that
    direction only, so least squares (ridge_lambda = 0) predicts B well exactly when it is kept. A pair's
    value must not depend on the other layers compared (the fold path used the widest A layer's rule)."""
    g = torch.Generator().manual_seed(5)
    n = 100
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    a0 = r(n, 12)
    a0c = torch.cat([torch.ones(n, 1, dtype=torch.float64), a0], 1)
    weak = r(n)
    weak = weak - a0c @ torch.linalg.lstsq(a0c, weak[:, None]).solution[:, 0]   # orthogonal to the others
    c = a0 - a0.mean(0)
    top = float(torch.linalg.eigvalsh(c.T @ c)[-1])
    ratio = math.sqrt(rank_rtol(12) * rank_rtol(300))
    a0[:, 5] = weak * math.sqrt(ratio * top / float(weak @ weak))
    b = (weak / weak.std())[:, None] + 0.1 * r(n, 1)
    xa, xb = [a0.float(), r(n, 300).float()], [b.float()]
    function = M.ridge_r2(xa[0], xb[0], ridge_lambda=0.0)
    assert function > 0.9                        # the weak direction is kept: it predicts B
    for stored in (False, True):
        alone, _ = _streamed(["ridge_r2"], xa[:1], xb, 20, stored=stored, ridge_lambda=0.0)
        beside, _ = _streamed(["ridge_r2"], xa, xb, 20, stored=stored, ridge_lambda=0.0)
        # the direction is near the rank threshold, so resolved only to about eps·λ_max/λ ≈ 1 %
        assert abs(alone["ridge_r2"][0, 0] - function) < 1e-2
        assert abs(beside["ridge_r2"][0, 0] - function) < 1e-2


@pytest.mark.parametrize("stored", [False, True])
def test_streamed_pairs_whose_ranks_exceed_n_minus_1_are_nan_with_one_warning_naming_them(stored):
    g = torch.Generator().manual_seed(6)
    n = 60
    xa = [torch.randn(n, k, generator=g) for k in (20, 25, 5)]
    xb = [torch.randn(n, k, generator=g) for k in (45, 10)]
    names = (["enc.0", "enc.1", "enc.2"], ["dec.0", "dec.1"])
    got, caught = _streamed(["cca", "pwcca", "svcca", "shape_metric", "procrustes"], xa, xb, 16, stored=stored,
                            names=names, svcca_keep=1.0, shape_alpha=0.0)
    joint = np.array([[True, False], [True, False], [False, False]])   # 20 + 45, 25 + 45 > 59; 5 + 45 is not
    for m in ("cca", "pwcca", "svcca", "shape_metric"):
        assert (np.isnan(got[m]) == joint).all(), m
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for i, j in zip(*np.nonzero(~joint), strict=True):
                want = function_value(m, xa[i], xb[j], {**DEFAULTS, "svcca_keep": 1.0, "shape_alpha": 0.0})
                assert abs(got[m][i, j] - want) < TOL, (m, i, j)
    assert not np.isnan(got["procrustes"]).any()
    cca_warning = [w for w in caught if w.startswith("cca is undefined")]
    assert len(cca_warning) == 1, caught
    assert ("2 layer pairs whose rank_x + rank_y > n - 1 = 59" in cca_warning[0]
            and "enc.0 x dec.0 (20 + 45 = 65)" in cca_warning[0] and "enc.1 x dec.0 (25 + 45 = 70)" in cca_warning[0])
    assert any(w.startswith("svcca is undefined") and "kept components k_x + k_y" in w for w in caught)
    assert not any("shape_metric" in w for w in _streamed(["shape_metric"], xa, xb, 16, stored=stored)[1])


@pytest.mark.parametrize("stored", [False, True])
def test_a_layer_wider_than_the_sample_makes_the_cca_family_nan_in_the_accumulator_too(stored):
    """The issue's 1024 × 512 pair at n = 500, smaller: decaying spectra (real activations) whose weak
    directions the float32 rule dropped, so compare returned values; now NaN with the layer named."""
    g = torch.Generator().manual_seed(7)
    n = 100

    def wide(p):
        q, _ = torch.linalg.qr(torch.randn(p, p, generator=g, dtype=torch.float64))
        return ((torch.randn(n, p, generator=g, dtype=torch.float64)
                 * torch.logspace(0, -3, p, dtype=torch.float64)) @ q.T).float()

    xa, xb = [wide(200)], [wide(120)]
    got, caught = _streamed(["cca", "pwcca", "svcca"], xa, xb, 25, stored=stored, names=(["wide_a"], ["wide_b"]))
    assert np.isnan(got["cca"]).all() and np.isnan(got["pwcca"]).all()
    assert any("wide_a" in w and "every canonical correlation is 1" in w for w in caught)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert math.isnan(M.cca(xa[0], xb[0])) and math.isnan(M.pwcca(xa[0], xb[0]))
        svcca = M.svcca(xa[0], xb[0])
    assert (math.isnan(svcca) and np.isnan(got["svcca"]).all()) or abs(got["svcca"][0, 0] - svcca) < TOL
