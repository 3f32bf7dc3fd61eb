"""The float64 numpy references every measure is tested against, written once, from the formulas (spec
§0.1–0.5) with numpy and scipy only, independent of simkit.

Use it as ``from tests import reference`` and call ``reference.cka(x, y, "unbiased_cka")`` etc. Inputs
are float64 numpy arrays of shape ``(n, features)`` (Grams: ``(n, n)``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.spatial.distance import pdist, squareform
from scipy.stats import pearsonr, spearmanr

# ---------------------------------------------------------------------------------------- HSIC / CKA


def centring_matrix(n: int) -> np.ndarray:
    """``H = I − 11ᵀ/n``."""
    return np.eye(n) - np.ones((n, n)) / n


def centre_gram(k: np.ndarray) -> np.ndarray:
    """``H K H``."""
    h = centring_matrix(len(k))
    return h @ k @ h


def linear_gram(x: np.ndarray) -> np.ndarray:
    """``H x xᵀ H`` from column-centred data (exact for any mean; HSIC is shift-invariant, so centring
    first keeps the reference accurate for features with large means)."""
    xc = x - x.mean(0)
    return xc @ xc.T


def rbf_gram(x: np.ndarray, factor: float = 1.0) -> np.ndarray:
    """Gaussian Gram with σ = ``factor`` × the median pairwise distance."""
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    iu = np.triu_indices(len(x), 1)
    sigma = factor * np.median(np.sqrt(d2[iu]))
    return np.exp(-d2 / (2 * sigma**2))


def gram(x: np.ndarray, kind: str, factor: float = 1.0) -> np.ndarray:
    """The RBF Gram (``kind == "rbf"``) or the linear Gram of the column-centred data."""
    return rbf_gram(x, factor) if kind == "rbf" else linear_gram(x)


def hsic_biased(k: np.ndarray, lg: np.ndarray) -> float:
    """``tr(K H L H) / (n − 1)²``."""
    n = len(k)
    h = centring_matrix(n)
    return float(np.trace(k @ h @ lg @ h)) / (n - 1) ** 2


def hsic_unbiased(k: np.ndarray, lg: np.ndarray) -> float:
    """Song et al. (2012) HSIC_1, the explicit trace formula (n ≥ 4)."""
    n = len(k)
    kt, lt = k.copy(), lg.copy()
    np.fill_diagonal(kt, 0.0)
    np.fill_diagonal(lt, 0.0)
    one = np.ones(n)
    val = (np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
           - 2.0 / (n - 2) * (one @ kt @ lt @ one))
    return float(val / (n * (n - 3)))


def cka_of_grams(k: np.ndarray, lg: np.ndarray, hsic: Callable[[np.ndarray, np.ndarray], float]) -> float:
    """``hsic(K, L) / sqrt(hsic(K, K) · hsic(L, L))``."""
    return hsic(k, lg) / np.sqrt(hsic(k, k) * hsic(lg, lg))


def _kind_and_hsic(metric: str) -> tuple[str, Callable[[np.ndarray, np.ndarray], float]]:
    kind = "rbf" if metric == "rbf_cka" else "linear"
    return kind, hsic_unbiased if metric == "unbiased_cka" else hsic_biased


def cka(x: np.ndarray, y: np.ndarray, metric: str, factor: float = 1.0) -> float:
    """``linear_cka``, ``unbiased_cka`` (HSIC_1 of linear Grams) or ``rbf_cka`` of two representations."""
    kind, hsic = _kind_and_hsic(metric)
    return cka_of_grams(gram(x, kind, factor), gram(y, kind, factor), hsic)


def minibatch_cka(x: np.ndarray, y: np.ndarray, metric: str, sizes: list[int], factor: float = 1.0) -> float:
    """Nguyen et al.: the sum of per-batch HSIC over batches of ``sizes``, then the ratio (batches too
    small for their HSIC, b < 4 for HSIC_1 and b < 2 otherwise, are skipped)."""
    kind, hsic = _kind_and_hsic(metric)
    least = 4 if metric == "unbiased_cka" else 2
    sums = np.zeros(3)
    start = 0
    for b in sizes:
        xs, ys = x[start:start + b], y[start:start + b]
        start += b
        if b < least:
            continue
        k, lg = gram(xs, kind, factor), gram(ys, kind, factor)
        sums += [hsic(k, lg), hsic(k, k), hsic(lg, lg)]
    return sums[0] / np.sqrt(sums[1] * sums[2])


def matrix(xa: list[np.ndarray], xb: list[np.ndarray], fn: Callable[[np.ndarray, np.ndarray], float]) -> np.ndarray:
    """``fn`` over every (a layer, b layer) pair: rows follow ``xa``, columns ``xb``."""
    return np.array([[fn(a, b) for b in xb] for a in xa])


# ---------------------------------------------------------------------------------------------- k-NN


def knn(x: np.ndarray, k: int) -> np.ndarray:
    """Top-k rows by float64 inner product, self excluded; ties → lower index first (a stable sort)."""
    x = np.asarray(x, dtype=np.float64)
    s = x @ x.T
    np.fill_diagonal(s, -np.inf)
    return np.argsort(-s, axis=1, kind="stable")[:, :k]


def clamp_normalise(z: np.ndarray) -> np.ndarray:
    """The k-NN preprocessing: clip at the 95th percentile of |z|, then rows to unit length."""
    bound = np.quantile(np.abs(z), 0.95)
    z = np.clip(z, -bound, bound)
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def neighbours(z: np.ndarray, k: int) -> np.ndarray:
    """The k nearest neighbours of every row after the k-NN preprocessing (cosine after clipping)."""
    return knn(clamp_normalise(z), k)


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Mean over rows of |N_k(x_i) ∩ N_k(y_i)| / k."""
    a, b = neighbours(x, k), neighbours(y, k)
    return float(np.mean([len(set(a[i]) & set(b[i])) / k for i in range(len(x))]))


def jaccard_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """Mean over rows of |N_k(x_i) ∩ N_k(y_i)| / |N_k(x_i) ∪ N_k(y_i)|."""
    a, b = neighbours(x, k), neighbours(y, k)
    return float(np.mean([len(set(a[i]) & set(b[i])) / len(set(a[i]) | set(b[i])) for i in range(len(x))]))


# ----------------------------------------------------------------------------- alignment losses (§0.5)


def unit_rows(z: np.ndarray) -> np.ndarray:
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def cosine_distances(z: np.ndarray) -> np.ndarray:
    """``1 − cos`` between rows, with +∞ on the diagonal (a row is not its own neighbour)."""
    u = unit_rows(z)
    d = 1.0 - u @ u.T
    np.fill_diagonal(d, np.inf)
    return d


def dmnn(target: np.ndarray, guide: np.ndarray, k: int, tau: float) -> float:
    """Spec §0.5 row by row: S_i = top-k(guide) ∪ top-k(target), KL(P_i || Q_i) over S_i."""
    dg, dt = cosine_distances(guide), cosine_distances(target)
    total = 0.0
    for i in range(len(target)):
        s = sorted(set(np.argsort(dg[i], kind="stable")[:k]) | set(np.argsort(dt[i], kind="stable")[:k]))
        lp, lq = -dg[i, s] / tau, -dt[i, s] / tau
        logp = lp - (lp.max() + np.log(np.exp(lp - lp.max()).sum()))
        logq = lq - (lq.max() + np.log(np.exp(lq - lq.max()).sum()))
        total += np.sum(np.exp(logp) * (logp - logq))
    return total / len(target)


# ----------------------------------------------------------------------------------------------- RSA


def tau_a(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's τ_a by the explicit O(m²) sum over pairs."""
    m = len(a)
    s = np.sign(a[:, None] - a[None, :]) * np.sign(b[:, None] - b[None, :])
    return s[np.triu_indices(m, 1)].sum() / (m * (m - 1) / 2)


def rsa(x: np.ndarray, y: np.ndarray, distance: str = "correlation", compare: str = "spearman") -> float:
    """scipy's pdist RDMs compared by spearmanr / pearsonr / τ_a."""
    a, b = pdist(x, distance), pdist(y, distance)
    if compare == "spearman":
        return spearmanr(a, b)[0]
    if compare == "pearson":
        return pearsonr(a, b)[0]
    return tau_a(a, b)


# ------------------------------------------------------------------------------- shape (CCA family)


def centre(x: np.ndarray) -> np.ndarray:
    """Columns centred."""
    return x - x.mean(0)


def orth_basis(x: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the column space of centred x (SVD, numerical rank)."""
    u, s, _ = np.linalg.svd(centre(x), full_matrices=False)
    r = int((s > s[0] * 1e-10).sum())
    return u[:, :r]


def procrustes(x: np.ndarray, y: np.ndarray) -> float:
    xc, yc = centre(x), centre(y)
    return np.linalg.svd(xc.T @ yc, compute_uv=False).sum() / (np.linalg.norm(xc) * np.linalg.norm(yc))


def canonical_correlations(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The canonical correlations: singular values of Q_xᵀ Q_y (QR of the centred data)."""
    qx, _ = np.linalg.qr(centre(x))
    qy, _ = np.linalg.qr(centre(y))
    return np.linalg.svd(qx.T @ qy, compute_uv=False)


def cca(x: np.ndarray, y: np.ndarray) -> float:
    rho = canonical_correlations(x, y)
    return float((rho**2).sum() / min(x.shape[1], y.shape[1]))


def cca_ridge(x: np.ndarray, y: np.ndarray, eps: float) -> float:
    """Ridge CCA from its definition: (Cxx + εI)^{-1/2} Cxy (Cyy + εI)^{-1/2}, ε relative to the mean eigenvalue."""
    xc, yc = centre(x), centre(y)

    def inv_sqrt(c):
        lam, v = np.linalg.eigh(c)
        lam = np.clip(lam, 0, None) + eps * np.trace(c) / len(c)
        return v @ np.diag(lam**-0.5) @ v.T

    t = inv_sqrt(xc.T @ xc) @ xc.T @ yc @ inv_sqrt(yc.T @ yc)
    rank = min(np.linalg.matrix_rank(xc), np.linalg.matrix_rank(yc))
    return float((np.linalg.svd(t, compute_uv=False) ** 2).sum() / rank)


def svcca(x: np.ndarray, y: np.ndarray, keep: float = 0.99) -> float:
    def reduce(z):
        u, s, _ = np.linalg.svd(centre(z), full_matrices=False)
        share = np.cumsum(s**2) / (s**2).sum()
        k = int(np.searchsorted(share, keep * (1 - 1e-12))) + 1
        return u[:, :k] * s[:k]

    rx, ry = reduce(x), reduce(y)
    rho = canonical_correlations(rx, ry)
    return float(rho.sum() / min(rx.shape[1], ry.shape[1]))


def pwcca(x: np.ndarray, y: np.ndarray) -> float:
    """Morcos et al.: canonical variates of the narrower side, weights Σ_j |⟨h_i, x_j⟩| over its neurons."""
    if x.shape[1] > y.shape[1]:
        x, y = y, x
    xc = centre(x)
    qx, _ = np.linalg.qr(xc)
    qy, _ = np.linalg.qr(centre(y))
    u, rho, _ = np.linalg.svd(qx.T @ qy, full_matrices=False)
    m = min(x.shape[1], y.shape[1])
    h = qx @ u[:, :m]                                 # unit canonical variates of x
    weights = np.abs(h.T @ xc).sum(1)
    return float((weights / weights.sum() * rho[:m]).sum())


def shape_metric(x: np.ndarray, y: np.ndarray, alpha: float) -> float:
    """netrep's LinearMetric(alpha, angular) on columns centred and scaled to unit Frobenius norm."""
    def whiten(z):
        zc = centre(z)
        zc = zc / np.linalg.norm(zc)
        lam, v = np.linalg.eigh(zc.T @ zc)
        ok = lam > lam.max() * 1e-10
        d = np.where(ok, alpha + (1 - alpha) / np.sqrt(np.where(ok, lam, 1)), alpha)
        return zc @ (v * d) @ v.T

    xw, yw = whiten(x), whiten(y)
    # netrep: zero-pad to equal widths, align by orthogonal Procrustes, angle between the aligned matrices
    p = max(xw.shape[1], yw.shape[1])
    xw = np.pad(xw, ((0, 0), (0, p - xw.shape[1])))
    yw = np.pad(yw, ((0, 0), (0, p - yw.shape[1])))
    u, _, vt = np.linalg.svd(xw.T @ yw)
    aligned = xw @ u @ vt
    cos = (aligned * yw).sum() / (np.linalg.norm(aligned) * np.linalg.norm(yw))
    return float(np.arccos(np.clip(cos, -1, 1)))


# ---------------------------------------------------------------------------------------- predictivity


def ridge_r2(x: np.ndarray, y: np.ndarray, lam: float = 1e-2, folds: int = 5) -> float:
    """Out-of-fold R² of ridge regressions y ~ x (fold of row i: i mod ``folds``), λ relative to the mean
    eigenvalue of the training covariance (λ = 0: least squares)."""
    n = len(x)
    fold = np.arange(n) % folds
    sse = sst = 0.0
    for f in range(folds):
        train, test = fold != f, fold == f
        mx, my = x[train].mean(0), y[train].mean(0)
        xt, yt = x[train] - mx, y[train] - my
        c = xt.T @ xt
        if lam > 0:
            w = np.linalg.solve(c + lam * np.trace(c) / x.shape[1] * np.eye(x.shape[1]), xt.T @ yt)
        else:
            w = np.linalg.lstsq(xt, yt, rcond=None)[0]
        pred = (x[test] - mx) @ w
        sse += ((y[test] - my - pred) ** 2).sum()
        sst += ((y[test] - my) ** 2).sum()
    return 1 - sse / sst


# ------------------------------------------------------------------- measures computed pair by pair


def cknna(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """CKNNA as platonic-rep's ``AlignmentMetrics.cknna`` (unbiased, dense n × n masks) on the k-NN
    preprocessing, without its 1e-6 in the denominator."""
    a, b = clamp_normalise(x), clamp_normalise(y)
    n = len(a)
    masks = []
    for z in (a, b):
        m = np.zeros((n, n))
        m[np.arange(n)[:, None], knn(z, k)] = 1
        masks.append(m)
    ka, kb = a @ a.T, b @ b.T
    both = masks[0] * masks[1]
    hab = hsic_unbiased(both * ka, both * kb)
    haa = hsic_unbiased(masks[0] * ka, masks[0] * ka)
    hbb = hsic_unbiased(masks[1] * kb, masks[1] * kb)
    return float(hab / np.sqrt(haa * hbb))


def cycle_knn(x: np.ndarray, y: np.ndarray, k: int) -> float:
    """platonic-rep's ``cycle_knn``: for each i, is i among x's neighbours of one of its neighbours in y?"""
    a, b = neighbours(x, k), neighbours(y, k)
    return float(np.mean([any(i in set(a[j]) for j in b[i]) for i in range(len(x))]))


def distance_correlation(x: np.ndarray, y: np.ndarray, estimator: str = "bias_corrected") -> float:
    """Székely's dCor (``plain``, V-statistics, its square root) or the squared bias-corrected dCor* of
    U-centred distance matrices (Székely & Rizzo 2014), from scipy's distances."""
    def centred(z: np.ndarray) -> np.ndarray:
        d = squareform(pdist(z))
        n = len(d)
        if estimator == "plain":
            return d - d.mean(0) - d.mean(1)[:, None] + d.mean()
        u = d - d.sum(0) / (n - 2) - d.sum(1)[:, None] / (n - 2) + d.sum() / ((n - 1) * (n - 2))
        np.fill_diagonal(u, 0)
        return u

    a, b = centred(x), centred(y)
    ratio = (a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum())
    return float(np.sqrt(ratio)) if estimator == "plain" else float(ratio)


def information_imbalance(x: np.ndarray, y: np.ndarray) -> float:
    """Δ(x→y) = (2/n)·mean_i rank_y(i, nn_x(i)), ranks from a stable argsort of scipy's distances, as
    DADApy's ``_return_imbalance`` (rank 1 = the nearest other sample)."""
    dx, dy = squareform(pdist(x)), squareform(pdist(y))
    np.fill_diagonal(dx, np.inf)
    np.fill_diagonal(dy, np.inf)
    n = len(x)
    nearest = np.argmin(dx, axis=1)
    ranks = np.argsort(np.argsort(dy, axis=1, kind="stable"), axis=1, kind="stable") + 1
    return float(2 * ranks[np.arange(n), nearest].mean() / n)


def bures_similarity(x: np.ndarray, y: np.ndarray, distance: str = "correlation") -> float:
    """rsatoolbox's ``compare_bures_similarity`` (``_bures_similarity_first_way``) of the RDMs of x and y:
    ``G = −½·H·D·H``, ``Σ √eig(G_a^½ G_b G_a^½) / sqrt(tr G_a tr G_b)``; euclidean RDMs squared, as
    rsatoolbox's ``calc_rdm``."""
    def second_moment(z: np.ndarray) -> np.ndarray:
        d = squareform(pdist(z, "sqeuclidean" if distance == "euclidean" else distance))
        return centre_gram(-d / 2)

    a, b = second_moment(x), second_moment(y)
    va, ua = np.linalg.eigh(a)
    root = ua @ (np.sqrt(np.maximum(va[:, None], 0.0)) * ua.T)
    fidelity = np.sum(np.sqrt(np.maximum(np.linalg.eigvalsh(root @ b @ root), 0.0)))
    return float(fidelity / np.sqrt(np.trace(a) * np.trace(b)))
