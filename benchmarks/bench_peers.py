"""simkit against its peer libraries on the same activations: values side by side and seconds (issue #27).

Synthetic float32 activations of two "models" (``--layers`` layers each, widths from ``--widths``, every
layer a noisy nonlinear map of one shared latent, so the pairs are related), ``--n`` samples. simkit
computes each measure for all ``La × Lb`` pairs in ONE accumulator (exact mode, no null: what one
``compare`` does after the forwards, fed ``--batch-size`` rows at a time); each peer loops over the pairs
as its users do (a layer's RDM, where the peer's API allows it, is made once). For each measure and peer
the line gives both times, their ratio (``peer / simkit``: above 1 means simkit is faster) and the
largest difference of the values over the pairs (after the stated conversion; where the peer defines the
measure differently the difference is printed and the note says why it is not 0).

The peers live in the benchmark's own environment, never in simkit's dependencies::

    python3 -m venv /work/peers-venv
    /work/peers-venv/bin/pip install -e /work/main ckatorch rsatoolbox scikit-learn repsim deep-reps dcor \
        calibrated_similarity
    /work/peers-venv/bin/python benchmarks/bench_peers.py            # n = 2000, 4 x 4 layers, 256-512 wide

(``deep-reps`` imports ``open_clip`` in its package ``__init__`` for a CLIP wrapper the measures do not
use; the script loads its measure modules without it.) A peer that is not installed is skipped with a
line saying so. Not on PyPI, so not compared: netrep (shape metric, Procrustes), ReSi, platonic-rep
(mutual k-NN, cknna, cycle_knn) and Google's svcca code; ``shape_metric``, ``mutual_knn``, ``cknna``,
``cycle_knn``, ``information_imbalance`` and ``bures_similarity`` have no installable peer here (the tests
check the last four against float64 references written from their papers). The last line compares
p-values and the calibrated score with the calibrated-similarity package (Gröger et al.) fed simkit's own
permutations (:func:`calibration_agreement`).

Usage: python benchmarks/bench_peers.py [--n 2000] [--layers 4] [--widths 256,320,384,512] [--threads 2]
                                        [--measures linear_cka,...] [--results benchmarks/results/bench_peers.txt]
A quick check that it runs: ``--n 200 --widths 16,24 --results /tmp/bench_peers.txt``. Wall seconds; on a
shared machine compare ratios measured in one run, not absolute numbers.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import os
import sys
import time
import types
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

KNN_K = 10
RIDGE_LAMBDA, RIDGE_FOLDS = 1e-2, 5

#: measure → [(peer, module to import, note on how its value relates to simkit's)]
PEERS: dict[str, list[tuple[str, str, str]]] = {
    "linear_cka": [("ckatorch", "ckatorch", "same definition")],
    "unbiased_cka": [("ckatorch", "ckatorch", "same definition (unbiased HSIC)")],
    "rbf_cka": [("ckatorch", "ckatorch", "bandwidth: median of all n^2 squared distances (simkit: of the pairs i<j)")],
    "rsa": [("rsatoolbox", "rsatoolbox", "correlation RDMs, Spearman comparison: same definition")],
    "ridge_r2": [("scikit-learn", "sklearn", "Ridge(alpha = lambda tr(C)/p) per fold i mod 5: same definition")],
    "procrustes": [("deep-reps", "deep_reps", "1 - d^2/2 of its Procrustes distance on centred, unit-norm inputs")],
    "cca": [("deep-reps", "deep_reps", "Yanai CCA (sum rho^2 / p_x) rescaled by p_x / min(p_x, p_y)"),
            ("repsim", "repsim", "Yanai's GCD (sum rho^2 / min(p_x, p_y)): same definition; all pairs in one call")],
    "svcca": [("repsim", "repsim", "mean rho^2 (Yanai) of its SVCCA: not simkit's mean rho, so not 0")],
    "pwcca": [("repsim", "repsim", "its PWCCA weighting")],
    "distance_correlation": [("dcor", "dcor", "u_distance_correlation_sqr (bias-corrected squared dCor*): same "
                                              "definition")],
    "jaccard_knn": [("deep-reps", "deep_reps", f"k = {KNN_K} Euclidean neighbours of the raw rows (simkit: of "
                                               "Huh et al.'s normalised rows)")],
}
MEASURES = list(PEERS)


def activations(n: int, layers: int, widths: list[int], seed: int = 0):
    """Two models' float32 layers ``[(n, w)]``, each a noisy tanh map of one shared 32-d latent."""
    import torch

    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 32, generator=g)

    def layer(k: int) -> torch.Tensor:
        w = widths[k % len(widths)]
        return torch.tanh(z @ torch.randn(32, w, generator=g) / 4 + 0.5 * torch.randn(n, w, generator=g))

    return [layer(k) for k in range(layers)], [layer(k + 1) for k in range(layers)]


def simkit_values(xa, xb, measure: str, batch: int):
    """One exact accumulator of ``measure`` over every pair, fed in batches: ``(La, Lb)`` numpy."""
    from simkit.metrics.settings import CompareSettings
    from simkit.metrics.streaming import make_accumulator

    settings = CompareSettings(metrics=[measure], mode="exact", null=0, knn_k=KNN_K, ridge_lambda=RIDGE_LAMBDA,
                               ridge_folds=RIDGE_FOLDS, memory_budget_bytes=8 * 2**30)
    acc = make_accumulator(settings, [x.shape[1] for x in xa], [y.shape[1] for y in xb])
    for s in range(0, len(xa[0]), batch):
        acc.update([x[s:s + batch] for x in xa], [y[s:s + batch] for y in xb])
    return acc.compute()[measure]["value"]


@functools.cache
def load_deep_reps() -> types.ModuleType:
    """deep-reps' measure modules without its package ``__init__`` (which imports open_clip)."""
    spec = importlib.util.find_spec("deep_reps")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("deep_reps")
    pkg = types.ModuleType("deep_reps")
    pkg.__spec__ = spec
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["deep_reps"] = pkg
    utils = importlib.import_module("deep_reps.utils")
    pkg.get_knn_indices_and_ranks = utils.get_knn_indices_and_ranks  # type: ignore[attr-defined]
    for name in ("alignment_measures", "cca_measures", "neighbors_measures"):
        setattr(pkg, name, importlib.import_module(f"deep_reps.{name}"))
    return pkg


def pairs(fn: Callable, xa, xb):
    """``fn(x, y)`` over every pair → ``(La, Lb)`` numpy."""
    import numpy as np

    return np.array([[float(fn(x, y)) for y in xb] for x in xa])


def ridge_sklearn(x, y):
    """Cross-validated ridge R² as simkit defines it, with scikit-learn's Ridge per fold."""
    import numpy as np
    from sklearn.linear_model import Ridge

    x, y = x.double().numpy(), y.double().numpy()
    fold = np.arange(len(x)) % RIDGE_FOLDS
    sse = sst = 0.0
    for f in range(RIDGE_FOLDS):
        train, test = fold != f, fold == f
        xt = x[train] - x[train].mean(0)
        alpha = RIDGE_LAMBDA * float((xt * xt).sum()) / x.shape[1]
        pred = Ridge(alpha=alpha).fit(x[train], y[train]).predict(x[test])
        sse += float(((y[test] - pred) ** 2).sum())
        sst += float(((y[test] - y[train].mean(0)) ** 2).sum())
    return 1 - sse / sst


def rsa_toolbox(xa, xb):
    """rsatoolbox: each layer's correlation RDM once, Spearman comparison of every pair."""
    import numpy as np
    import rsatoolbox

    def rdm(x):
        return rsatoolbox.rdm.calc_rdm(rsatoolbox.data.Dataset(x.double().numpy()), method="correlation")

    ra, rb = [rdm(x) for x in xa], [rdm(y) for y in xb]
    return np.array([[float(rsatoolbox.rdm.compare(a, b, method="spearman")[0, 0]) for b in rb] for a in ra])


def repsim_block(fn_name: str, xa, xb, **kw):
    """repsim's all-pairs call on the A and B layers together; the A × B block."""
    import repsim

    mats = [x.double().numpy() for x in (*xa, *xb)]
    return getattr(repsim, fn_name)(mats, **kw)[:len(xa), len(xa):]


def peer_values(measure: str, peer: str, xa, xb):
    """The peer's ``(La, Lb)`` values of ``measure``, converted to simkit's definition where one exists."""
    import torch

    if peer == "ckatorch":
        from ckatorch.core import cka_base

        kernel = "rbf" if measure == "rbf_cka" else "linear"
        return pairs(lambda x, y: cka_base(x, y, kernel=kernel, unbiased=measure == "unbiased_cka"), xa, xb)
    if peer == "rsatoolbox":
        return rsa_toolbox(xa, xb)
    if peer == "scikit-learn":
        return pairs(ridge_sklearn, xa, xb)
    if peer == "repsim":
        return repsim_block(measure, xa, xb)
    if peer == "dcor":
        import dcor

        return pairs(lambda x, y: dcor.u_distance_correlation_sqr(x.double().numpy(), y.double().numpy()), xa, xb)
    dr = load_deep_reps()

    def unit(x):
        xc = x.double() - x.double().mean(0)
        return xc / torch.linalg.norm(xc)

    if measure == "procrustes":
        return pairs(lambda x, y: 1 - dr.alignment_measures.orthogonal_procrustes(unit(x), unit(y)) ** 2 / 2, xa, xb)
    if measure == "cca":
        return pairs(lambda x, y: dr.cca_measures.compute_yanai_cca(x.double(), y.double()) * x.shape[1]
                     / min(x.shape[1], y.shape[1]), xa, xb)
    return pairs(lambda x, y: dr.neighbors_measures.knn_jaccard_similarity(x, y, KNN_K), xa, xb)


def calibration_agreement(xa, xb, batch: int, say, permutations: int = 199) -> None:
    """p-values and the calibrated score against the calibrated-similarity package (Gröger et al.,
    ``calibrate``; issue #36): procrustes on every pair, the package fed simkit's own permutations, so both
    sides see the same null draws and only the calibration differs. Times: simkit's accumulator with its
    null (every pair in one pass) against the package's loop over pairs with the same measure function."""
    try:
        import calibrated_similarity
        from calibrated_similarity import calibrate
    except ImportError:
        say("calibrated-similarity: not installed (pip install calibrated_similarity): p-value agreement skipped")
        return
    import numpy as np

    from simkit.engine.significance import p_value_columns
    from simkit.metrics import procrustes
    from simkit.metrics.settings import CompareSettings
    from simkit.metrics.streaming import make_accumulator
    from simkit.metrics.streaming.common import draw_perms, perm_generator

    settings = CompareSettings(metrics=["procrustes"], mode="exact", null=permutations, p_values=True,
                               correction="none", seed=0)
    started = time.perf_counter()
    acc = make_accumulator(settings, [x.shape[1] for x in xa], [y.shape[1] for y in xb])
    for s in range(0, len(xa[0]), batch):
        acc.update([x[s:s + batch] for x in xa], [y[s:s + batch] for y in xb])
    ours = p_value_columns("procrustes", acc.compute()["procrustes"], "none")
    t_ours = time.perf_counter() - started
    perms = draw_perms(permutations, len(xa[0]), perm_generator(0, -1), "cpu")
    p_theirs, score_theirs = np.empty((len(xa), len(xb))), np.empty((len(xa), len(xb)))
    started = time.perf_counter()
    for i, x in enumerate(xa):
        for j, y in enumerate(xb):
            draws = iter(perms)
            score, p, _ = calibrate(x.double(), y.double(), procrustes, K=permutations, alpha=0.05, smax=1.0,
                                    perm_fn=lambda n, device, draws=draws: next(draws))
            p_theirs[i, j], score_theirs[i, j] = float(p), float(score)
    t_theirs = time.perf_counter() - started
    dp = np.abs(ours["p_value"] - p_theirs).max()
    dc = np.abs(ours["calibrated"] - score_theirs).max()
    say(f"{'calibration':<14} {'calibrated-similarity ' + calibrated_similarity.__version__:<24} simkit {t_ours:8.2f} s  "
        f"peer {t_theirs:8.2f} s  ratio {t_theirs / t_ours:7.1f}  max |p diff| {dp:.2e}  max |calibrated diff| {dc:.2e}"
        f"  (procrustes, K = {permutations} shared permutations; the package keeps values in float32)")


def timed(fn: Callable):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--layers", type=int, default=4, help="layers per model")
    parser.add_argument("--widths", default="256,320,384,512")
    parser.add_argument("--batch-size", type=int, default=250)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measures", default=",".join(MEASURES))
    parser.add_argument("--skip", default="", help="calibration: skip the p-value agreement with calibrated-similarity")
    parser.add_argument("--results", type=Path, default=Path(__file__).parent / "results" / "bench_peers.txt")
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)   # the peers' numpy/scipy BLAS, as torch's threads
    import warnings

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    widths = [int(w) for w in args.widths.split(",")]
    xa, xb = activations(args.n, args.layers, widths)
    lines = [f"== {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  n={args.n}, {args.layers} x {args.layers} layers "
             f"of widths {widths}, threads={args.threads}, load average {os.getloadavg()[0]:.1f}"]

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    with warnings.catch_warnings():  # imports and first calls outside the timings
        warnings.simplefilter("ignore")
        for measure in MEASURES:
            simkit_values([x[:60] for x in xa], [y[:60] for y in xb], measure, args.batch_size)
        if importlib.util.find_spec("deep_reps") is not None:
            load_deep_reps()
    say(f"{'measure':13s} {'peer':13s} {'simkit s':>9s} {'peer s':>9s} {'peer/simkit':>11s} {'max |diff|':>11s}  note")
    for measure in [m for m in args.measures.split(",") if m]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ours, ours_s = timed(lambda m=measure: simkit_values(xa, xb, m, args.batch_size))
        for peer, module, note in PEERS[measure]:
            if importlib.util.find_spec(module) is None:
                say(f"{measure:13s} {peer:13s} {ours_s:9.2f} {'-':>9s} {'-':>11s} {'-':>11s}  skipped: {peer} is "
                    f"not installed (pip install {peer} in the benchmark's environment)")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                theirs, theirs_s = timed(lambda m=measure, p=peer: peer_values(m, p, xa, xb))
            diff = float(np.nanmax(np.abs(np.asarray(theirs, dtype=float) - ours)))
            say(f"{measure:13s} {peer:13s} {ours_s:9.2f} {theirs_s:9.2f} {theirs_s / ours_s:11.1f} {diff:11.2e}  {note}")
    if "calibration" not in args.skip:
        calibration_agreement(xa, xb, args.batch_size, say)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
