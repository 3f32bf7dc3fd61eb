"""What makes a stitching run's numbers meaningless, said out loud: a model at chance, IRIs that missed
their tolerance.

* :func:`chance_accuracy`: the accuracy of always answering the most frequent label, ``labels (n,)``;
* :func:`at_chance`: an accuracy within three binomial standard errors of that level;
* :func:`run_warnings`: the run's warnings as one-line sentences (the runner puts them in
  ``summary["warnings"]`` and raises each as a Python warning; the CLI prints them; the report shows
  them among its cautions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

# IRIs count as usable when at least this fraction of them reached the tolerance at every stitch layer.
IRI_CONVERGED_TARGET = 0.95


def chance_accuracy(labels: Tensor) -> float:
    """The majority-class accuracy of ``labels (n,)`` int64 (1/k for balanced classes)."""
    counts = torch.bincount(labels.flatten().long())
    return float(counts.max()) / max(int(labels.numel()), 1)


def at_chance(accuracy: float, labels: Tensor) -> bool:
    """True when ``accuracy`` is within 3 binomial standard errors of :func:`chance_accuracy` (or below
    it) on ``labels (n,)``: what an untrained or collapsed model scores."""
    if math.isnan(accuracy) or not labels.numel():
        return False
    chance = chance_accuracy(labels)
    return accuracy <= chance + 3 * math.sqrt(chance * (1 - chance) / labels.numel())


def run_warnings(accuracies: Mapping[str, float], labels: Tensor | None, converged: Mapping[str, float],
                 medians: Mapping[str, float], tol: float, radius: float | None = None) -> list[str]:
    """One sentence per problem: each model (name → accuracy on the evaluation labels ``(n,)``) at
    chance, each layer of A (name → converged fraction, name → median relative error) whose IRIs
    reached ``tol`` on fewer than :data:`IRI_CONVERGED_TARGET` of the inputs (``radius``: the ball of a
    bounded search, where that may be the finding itself)."""
    found = []
    if labels is not None:
        chance = chance_accuracy(labels)
        for name, accuracy in accuracies.items():
            if at_chance(accuracy, labels):
                found.append(f"{name} is at chance ({accuracy:.3f} against {chance:.3f} for the majority class) "
                             "on the evaluation set: train it first (`train`) or load trained weights; "
                             "its stitching penalties mean nothing")
    for layer, fraction in converged.items():
        if fraction < IRI_CONVERGED_TARGET:
            found.append(f"IRIs at A.{layer} reached the tolerance {tol:g} on only {fraction:.1%} of inputs "
                         f"(median relative error {medians[layer]:.3g}): the invariance-aware arm there is "
                         "not trained on identically represented inputs; " + _iri_remedy(radius))
    return found


def _iri_remedy(radius: float | None) -> str:
    """What to do about IRIs that missed their tolerance: more steps, or (bounded) read it as the finding."""
    if radius is None:
        return "raise `iri_steps` or `iri_restarts` (or use `iri_optimizer` adam if sgd was chosen)"
    return (f"inside the ball of radius {radius:g} around their seeds this may be the finding (no such input "
            "lies that close); raise `iri_steps` or `iri_radius` to search further")
