"""Which layers to stitch: explicit name lists, or ``auto`` pairs matched by relative depth."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from simkit.errors import SimkitError
from simkit.layers import resolve_layers
from simkit.settings.stitch import StitchSettings, layer_names
from simkit.stitching.halves import check_layer


def auto_candidates(model: nn.Module) -> list[str]:
    """The model's blocks (the ``blocks`` preset of :mod:`simkit.layers`), in order, without the final
    one (the logits layer)."""
    names = list(resolve_layers(model, "blocks"))
    last_leaf = [name for name, m in model.named_modules() if name and not list(m.children())][-1:]
    return [name for name in names if name not in last_leaf]


def match_depths(names_a: list[str], names_b: list[str]) -> list[tuple[str, str]]:
    """Pair every layer of A with the layer of B at the nearest relative depth (k+1)/K."""
    if not names_a or not names_b:
        raise SimkitError("`layers` auto found no stitchable blocks in one of the models; "
                          "give `layer_a` and `layer_b` explicitly")
    pairs = []
    for i, name in enumerate(names_a):
        depth = (i + 1) / len(names_a)
        j = min(range(len(names_b)), key=lambda k: (abs((k + 1) / len(names_b) - depth), k))
        pairs.append((name, names_b[j]))
    return pairs


def layer_pairs(model_a: nn.Module, model_b: nn.Module, layer_a: str | Sequence[str] | None = None,
                layer_b: str | Sequence[str] | None = None, layers: str | None = None) -> list[tuple[str, str]]:
    """(layer of A, layer of B) pairs: zipped lists (a single name is repeated) or ``layers="auto"``; a
    choice that names no pairs is :class:`StitchSettings`' SimkitError."""
    StitchSettings(layer_a=layer_a, layer_b=layer_b, layers=layers).validate()
    if layers is not None:
        return match_depths(auto_candidates(model_a), auto_candidates(model_b))
    names_a, names_b = layer_names(layer_a), layer_names(layer_b)
    if len(names_a) == 1:
        names_a = names_a * len(names_b)
    if len(names_b) == 1:
        names_b = names_b * len(names_a)
    for name in names_a:
        check_layer(model_a, name, "A")
    for name in names_b:
        check_layer(model_b, name, "B")
    return list(zip(names_a, names_b, strict=True))
