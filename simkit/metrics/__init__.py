"""simkit.metrics: pure torch similarity functions (no models, no I/O).

* ``cka``: Grams, centering, HSIC estimators, ``linear_cka``, ``unbiased_cka``, ``rbf_cka``.
* ``knn``: exact chunked ``knn_indices``, the ``mutual_knn`` score and the ``jaccard_knn`` overlap.
* ``shape``: ``procrustes``, ``procrustes_angle``, ``cca``, ``svcca``, ``pwcca``, ``shape_metric`` (netrep).
* ``rsa``: ``rsa`` (RDMs compared by rank correlation) and ``rdm``.
* ``predictivity``: ``ridge_r2``, cross-validated linear predictivity (directional).
* ``pairs``: ``cknna``, ``cycle_knn`` (directional), ``distance_correlation``, ``information_imbalance``
  (directional) and ``bures_similarity``: each layer prepared once, then every pair (plug-ins likewise).
* ``settings``: ``MeasureSettings``, the validated settings of the measures beyond CKA.
* ``losses``: differentiable ``cka_loss``, ``unbiased_cka_loss``, ``dmnn_loss``, ``soft_mutual_knn``,
  ``alignment_loss(name)``.
* ``streaming``: accumulators over all layer pairs (dataset-level exact and minibatch modes), a package
  with one module per strategy (``minibatch``, ``features``, ``stored``) whose estimators are ``cka``'s.

Layering: this package imports only torch, numpy, scipy, ``simkit.errors`` and itself (never
``torch.distributed``: the engine combines ranks through the accumulators' sums and payloads).

Activations are ``x (n, p)``, ``y (n, q)``: the same ``n`` examples, flattened per example.
"""

from __future__ import annotations

from simkit.metrics.cka import (
    center_gram,
    gram_linear,
    gram_rbf,
    hsic_biased,
    hsic_unbiased,
    linear_cka,
    rbf_cka,
    u_center_gram,
    unbiased_cka,
)
from simkit.metrics.knn import jaccard_knn, knn_indices, mutual_knn
from simkit.metrics.losses import alignment_loss, cka_loss, dmnn_loss, soft_mutual_knn, unbiased_cka_loss
from simkit.metrics.pairs import (
    bures_similarity,
    cknna,
    cycle_knn,
    distance_correlation,
    information_imbalance,
)
from simkit.metrics.predictivity import ridge_r2
from simkit.metrics.rsa import rdm, rsa
from simkit.metrics.settings import MeasureSettings
from simkit.metrics.shape import cca, procrustes, procrustes_angle, pwcca, shape_metric, svcca

__all__ = [
    "MeasureSettings",
    "alignment_loss",
    "bures_similarity",
    "cca",
    "center_gram",
    "cka_loss",
    "cknna",
    "cycle_knn",
    "distance_correlation",
    "dmnn_loss",
    "gram_linear",
    "gram_rbf",
    "hsic_biased",
    "hsic_unbiased",
    "information_imbalance",
    "jaccard_knn",
    "knn_indices",
    "linear_cka",
    "mutual_knn",
    "procrustes",
    "procrustes_angle",
    "pwcca",
    "rbf_cka",
    "rdm",
    "ridge_r2",
    "rsa",
    "shape_metric",
    "soft_mutual_knn",
    "svcca",
    "u_center_gram",
    "unbiased_cka",
    "unbiased_cka_loss",
]
