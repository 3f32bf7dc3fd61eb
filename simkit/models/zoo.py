"""The built-in model zoo: ``simkit:NAME[:key=value,...]`` → a small plain-torch network.

Entries are ``"module:callable"`` strings imported on first use, so listing the zoo is free.
"""

from __future__ import annotations

import importlib
from typing import Any

from torch import nn

from simkit.errors import SimkitError, unknown_name_error

ZOO: dict[str, str] = {
    "mlp": "simkit.models.small:MLP",
    "cnn1d": "simkit.models.small:CNN1d",
    "cnn2d": "simkit.models.small:CNN2d",
    "llama": "simkit.models.llama:TinyLlama",
    "vit": "simkit.models.vit:ViT",
}


def parse_value(text: str) -> Any:
    """``"3"`` → 3, ``"0.5"`` → 0.5, ``"true"``/``"false"`` → bool, ``"none"`` → None, else the string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text.strip()


def parse_kwargs(text: str, spec: str) -> dict[str, Any]:
    """``"channels=32,layers=3"`` → ``{"channels": 32, "layers": 3}``."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip().isidentifier():
            raise SimkitError(f"model spec {spec!r}: {part!r} is not key=value")
        out[key.strip()] = parse_value(value)
    return out


def resolve(target: str) -> Any:
    """Import ``"package.module:attr"`` and return the attribute."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)


def build_zoo(name: str, kwargs: dict[str, Any], spec: str) -> nn.Module:
    """The zoo model ``name`` built with ``kwargs`` (unknown keyword → SimkitError naming the valid ones)."""
    import inspect

    if name not in ZOO:
        raise unknown_name_error("zoo model", name, ZOO, "valid: " + ", ".join(f"simkit:{k}" for k in ZOO))
    try:
        factory = resolve(ZOO[name])
    except (ImportError, AttributeError) as exc:
        raise SimkitError(f"zoo model simkit:{name} is not available in this install ({exc})") from None
    params = inspect.signature(factory).parameters
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        valid = ", ".join(p for p in params if p != "self")
        raise SimkitError(f"model spec {spec!r}: simkit:{name} has no option {unknown[0]!r}; valid: {valid}")
    for key, value in kwargs.items():
        _check_option_type(spec, key, value, params[key].default)
    return factory(**kwargs)


def _check_option_type(spec: str, key: str, value: Any, default: Any) -> None:
    """A zoo option's value has its default's kind: a number where the default is one (``mlp_ratio=1.5``
    where the default is 2), true/false for a flag; options whose default is None or text take anything."""
    kind = type(default)
    if default is None or kind not in (bool, int, float):
        return
    ok = isinstance(value, bool) if kind is bool else (isinstance(value, int | float) and not isinstance(value, bool))
    if not ok:
        what = "true or false" if kind is bool else "a number"
        raise SimkitError(f"model spec {spec!r}: option {key} must be {what} (default {default}), got {value!r}")
