"""Views of many networks at once, from a study's model × model table.

Both views start from one dissimilarity per pair of models: 1 − similarity (for a directional measure
such as ``ridge_r2`` the mean of both directions), or the value itself for a distance measure
(``procrustes_angle``, ``shape_metric``); each model is at 0 from itself.

- ``embedding``: classical (Torgerson) multidimensional scaling into two dimensions: the top two
  eigenvectors of the double-centred squared dissimilarities, scaled by the root of their eigenvalues.
  ``share`` is the part of the eigenvalue mass (absolute values, so a non-Euclidean dissimilarity counts
  against it) the two dimensions hold: near 1 the map's distances are the table's, low it distorts them.
- ``linkage``: average-linkage (UPGMA) hierarchical clustering (``scipy.cluster.hierarchy.linkage``),
  one row per merge in scipy's convention (models are clusters 0 … M−1, merge k makes cluster M + k).
  ``cophenetic`` is the correlation of the tree's merge heights with the dissimilarities (NaN below
  three models).

A measure with an undefined (NaN) value between two different models gets no rows.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from simkit.catalog import MEASURES

EMBEDDING_COLUMNS = ("metric", "model", "x", "y", "share")
LINKAGE_COLUMNS = ("metric", "step", "cluster", "left", "right", "left_label", "right_label", "distance", "size",
                   "cophenetic")


def dissimilarity(matrix: np.ndarray, metric: str) -> np.ndarray | None:
    """(M, M) symmetric, non-negative dissimilarity with a zero diagonal from ``metric``'s (M, M) values;
    None when a value between two different models is undefined."""
    values = np.asarray(matrix, dtype=np.float64)
    off = ~np.eye(len(values), dtype=bool)
    if not np.isfinite(values[off]).all():
        return None
    measure = MEASURES.get(metric)
    distance = 1.0 - values if measure is None or measure.similarity else values.copy()
    symmetric = (distance + distance.T) / 2.0
    np.fill_diagonal(symmetric, 0.0)
    return np.clip(symmetric, 0.0, None)


def classical_mds(distance: np.ndarray, dims: int = 2) -> tuple[np.ndarray, float]:
    """(M, dims) coordinates whose distances approximate ``distance`` (Torgerson's classical MDS) and the
    share of the eigenvalue mass they hold (NaN when every distance is 0). Each axis' sign is fixed so
    its largest coordinate is positive (the same table every run)."""
    size = len(distance)
    centring = np.eye(size) - 1.0 / size
    inner = -0.5 * centring @ (np.asarray(distance, dtype=np.float64) ** 2) @ centring
    eigenvalues, eigenvectors = np.linalg.eigh((inner + inner.T) / 2.0)
    order = np.argsort(eigenvalues)[::-1]
    eigenvalues, eigenvectors = eigenvalues[order], eigenvectors[:, order]
    top = np.clip(eigenvalues[:dims], 0.0, None)
    coords = np.zeros((size, dims))
    coords[:, :len(top)] = eigenvectors[:, :len(top)] * np.sqrt(top)
    for axis in range(dims):
        if coords[np.argmax(np.abs(coords[:, axis])), axis] < 0:
            coords[:, axis] *= -1.0
    total = float(np.abs(eigenvalues).sum())
    tolerance = 1e-12 * max(1.0, float(np.abs(inner).max(initial=0.0)))
    share = float(top.sum()) / total if total > tolerance else float("nan")
    return coords, share


def average_linkage(distance: np.ndarray) -> tuple[np.ndarray, float]:
    """scipy's (M − 1, 4) average-linkage matrix of ``distance`` and the cophenetic correlation (NaN
    below three models or when every distance is equal)."""
    from scipy.cluster.hierarchy import cophenet, linkage
    from scipy.spatial.distance import squareform

    condensed = squareform(distance, checks=False)
    tree = linkage(condensed, method="average")
    if len(distance) < 3 or np.ptp(condensed) == 0:
        return tree, float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        correlation = float(cophenet(tree, condensed)[0])
    return tree, correlation


def embedding_rows(metric: str, labels: Sequence[str], distance: np.ndarray) -> pd.DataFrame:
    """``embedding`` rows of one metric: each model's two coordinates and the share they hold."""
    coords, share = classical_mds(distance)
    return pd.DataFrame({"metric": metric, "model": list(labels), "x": coords[:, 0], "y": coords[:, 1],
                         "share": share}, columns=list(EMBEDDING_COLUMNS))


def linkage_rows(metric: str, labels: Sequence[str], distance: np.ndarray) -> pd.DataFrame:
    """``linkage`` rows of one metric: one per merge (scipy's convention), with readable member names."""
    tree, correlation = average_linkage(distance)
    size = len(labels)
    name = lambda k: str(labels[k]) if k < size else f"cluster {k}"  # noqa: E731
    left, right = tree[:, 0].astype(int), tree[:, 1].astype(int)
    return pd.DataFrame({
        "metric": metric, "step": np.arange(len(tree)), "cluster": size + np.arange(len(tree)),
        "left": left, "right": right, "left_label": [name(k) for k in left],
        "right_label": [name(k) for k in right], "distance": tree[:, 2], "size": tree[:, 3].astype(int),
        "cophenetic": correlation}, columns=list(LINKAGE_COLUMNS))


def study_views(matrices: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The ``embedding`` and ``linkage`` tables of a study from its (M, M) matrix per metric (rows and
    columns in the study's model order); a metric with an undefined value gets no rows."""
    embedding, tree = [], []
    for metric, frame in matrices.items():
        distance = dissimilarity(frame.to_numpy(dtype=float, na_value=np.nan), metric)
        if distance is None or len(distance) < 2:
            continue
        labels = [str(label) for label in frame.index]
        embedding.append(embedding_rows(metric, labels, distance))
        tree.append(linkage_rows(metric, labels, distance))
    join = lambda parts, columns: (pd.concat(parts, ignore_index=True) if parts  # noqa: E731
                                   else pd.DataFrame(columns=list(columns)))
    return {"embedding": join(embedding, EMBEDDING_COLUMNS), "linkage": join(tree, LINKAGE_COLUMNS)}
