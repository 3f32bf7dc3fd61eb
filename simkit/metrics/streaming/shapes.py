"""All pairs of the shape measures (Procrustes, CCA family, shape metric) from per-layer spectra.

Shared by the feature path (spectra of the streamed covariances, ``T0 = VᵀC_xyW``) and the stored path
(spectra from the stored samples, ``T0 = EₓᵀE_y``): each layer's eigendecomposition is done once, every
pair only multiplies and takes one SVD (:func:`simkit.metrics.shape.pair_values`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from simkit.metrics.settings import MeasureSettings
from simkit.metrics.shape import (
    Spectrum,
    degenerate_message,
    is_degenerate,
    joint_message,
    jointly_degenerate,
    nuclear_norm,
    nuclear_norm_of_draw,
    pair_values,
    used_directions,
)
from simkit.metrics.streaming.common import Names


def shape_settings(measures: Sequence[str], settings: MeasureSettings) -> dict[str, Any]:
    """The settings that change each measure's value, for ``describe()``."""
    out: dict[str, Any] = {}
    if any(m in measures for m in ("cca", "svcca", "pwcca", "shape_metric")):
        out["cca_eps"] = settings.cca_eps
    if "svcca" in measures:
        out["svcca_keep"] = settings.svcca_keep
    if "shape_metric" in measures:
        out["shape_alpha"] = settings.shape_alpha
    return out


def shape_notes(measure: str) -> str:
    """One line on what a shape measure (procrustes, cca, svcca, pwcca, shape_metric, ...) computes."""
    return {
        "procrustes": "orthogonal Procrustes similarity ||X'Y||_* / (||X||_F ||Y||_F)",
        "procrustes_angle": "arccos of the Procrustes similarity (angular shape distance, alpha = 1)",
        "cca": "mean squared canonical correlation, whitened on the numerical rank",
        "svcca": "mean canonical correlation of the top principal components (svcca_keep of the variance)",
        "pwcca": "projection-weighted CCA, weights from the narrower layer (A's on equal widths, then not symmetric)",
        "shape_metric": "netrep angular shape distance, both sides scaled to unit variance",
    }[measure]


def shape_values(measures: Sequence[str], spec_a: Sequence[Spectrum], spec_b: Sequence[Spectrum],
                 cross: Callable[[int], list[Tensor]], n: int, settings: MeasureSettings, names: Names,
                 const_a: Tensor, const_b: Tensor, warn: bool = True, null_draw: bool = False
                 ) -> dict[str, Tensor]:
    """``{measure: (L_a, L_b)}`` float64; ``cross(i)`` gives ``T0`` of A layer ``i`` with every B layer;
    ``null_draw``: a permutation null's draw, whose nuclear norms take
    :func:`~simkit.metrics.shape.nuclear_norm_of_draw` (never an SVD, within ``min(r, s)·3e-8·‖t‖₂``).

    Constant layers and degenerate whitening give NaN, by the rules of the one-shot functions: a layer
    that whitens ``n − 1`` directions (:func:`~simkit.metrics.shape.is_degenerate`) and a pair whose
    whitened directions add up to more than ``n − 1`` (:func:`~simkit.metrics.shape.jointly_degenerate`).
    With ``warn`` a warning names each degenerate layer, and one per measure names every degenerate pair
    with its ``r_x + r_y`` and ``n`` (constant layers are warned about by the caller).
    """
    la, lb = len(spec_a), len(spec_b)
    dev = const_a.device
    out = {m: torch.full((la, lb), float("nan"), dtype=torch.float64, device=dev) for m in measures}
    bad = {m: ([is_degenerate(s, n, m, settings) for s in spec_a], [is_degenerate(s, n, m, settings) for s in spec_b])
           for m in measures}
    if warn:
        for m, (bad_a, bad_b) in bad.items():
            for flags, specs, layer_names, const in ((bad_a, spec_a, names.a, const_a),
                                                     (bad_b, spec_b, names.b, const_b)):
                for k, flag in enumerate(flags):
                    if flag and not bool(const[k]):
                        warnings.warn(degenerate_message(m, layer_names[k], specs[k], n, settings),
                                      RuntimeWarning, stacklevel=5)
    joint: dict[str, list[tuple[str, int, int]]] = {m: [] for m in measures}
    norm = nuclear_norm_of_draw if null_draw else nuclear_norm
    for i in range(la):
        if bool(const_a[i]) or spec_a[i].rank == 0:  # rank 0: no variance above rounding, as constant
            continue
        wanted = [j for j in range(lb) if not bool(const_b[j]) and spec_b[j].rank > 0]
        if not wanted:
            continue
        t0s: list[Tensor] | None = None
        for j in wanted:
            chosen = []
            for m in measures:
                if bad[m][0][i] or bad[m][1][j]:
                    continue
                if jointly_degenerate(spec_a[i], spec_b[j], n, m, settings):
                    joint[m].append((f"{names.a[i]} x {names.b[j]}", used_directions(spec_a[i], m, settings),
                                     used_directions(spec_b[j], m, settings)))
                    continue
                chosen.append(m)
            if not chosen:
                continue
            if t0s is None:
                t0s = cross(i)
            values = pair_values(spec_a[i], spec_b[j], t0s[j], chosen, settings, norm)
            for m, v in values.items():
                out[m][i, j] = v
    if warn:
        for m, pairs in joint.items():
            if pairs:
                warnings.warn(joint_message(m, pairs, n), RuntimeWarning, stacklevel=5)
    return out
