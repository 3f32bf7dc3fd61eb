"""Which layers to stitch: explicit name lists, or ``auto`` pairs matched by relative depth."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from simkit.errors import SimkitError
from simkit.layers import resolve_layers
from simkit.stitching.halves import check_layer


def _names(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    return [part.strip() for v in value for part in v.split(",") if part.strip()]


def check_layer_choice(layer_a: str | Sequence[str] | None, layer_b: str | Sequence[str] | None,
                       layers: str | None) -> None:
    """SimkitError unless the choice names pairs: ``layers="auto"`` alone, or lists of equal length
    (or one name) in both ``layer_a`` and ``layer_b``. Whether the names exist is checked on the models."""
    if layers is not None:
        if layers != "auto":
            raise SimkitError(f"`layers` takes only 'auto', got {layers!r}; list names with `layer_a`/`layer_b`")
        if _names(layer_a) or _names(layer_b):
            raise SimkitError("give either `layers` auto or `layer_a`/`layer_b`, not both")
        return
    names_a, names_b = _names(layer_a), _names(layer_b)
    if not names_a or not names_b:
        raise SimkitError("say where to stitch: `layer_a` L `layer_b` L (comma lists pair up), or `layers` auto")
    if len(names_a) != len(names_b) and 1 not in (len(names_a), len(names_b)):
        raise SimkitError(f"`layer_a` has {len(names_a)} names and `layer_b` {len(names_b)}; "
                          "give lists of the same length (or one name to pair with all)")


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
    """(layer of A, layer of B) pairs: zipped lists (a single name is repeated) or ``layers="auto"``."""
    check_layer_choice(layer_a, layer_b, layers)
    if layers is not None:
        return match_depths(auto_candidates(model_a), auto_candidates(model_b))
    names_a, names_b = _names(layer_a), _names(layer_b)
    if len(names_a) == 1:
        names_a = names_a * len(names_b)
    if len(names_b) == 1:
        names_b = names_b * len(names_a)
    for name in names_a:
        check_layer(model_a, name, "A")
    for name in names_b:
        check_layer(model_b, name, "B")
    return list(zip(names_a, names_b, strict=True))
