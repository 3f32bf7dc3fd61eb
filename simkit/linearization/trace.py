"""torch.fx tracing for linearization: one tracer, one clear error for untraceable forwards.

The tracer keeps every ``torch.nn`` module as a leaf (fx's default) and also :class:`SlopeReLU`, so a
traced graph shows each activation site as one node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from simkit.errors import SimkitError
from simkit.forward import forward_error
from simkit.linearization.slope import SlopeReLU

UNTRACEABLE_HINT = (
    "NAPL and linearization need a torch.fx-traceable forward: replace Python `if`/`for` on tensor "
    "values with tensor ops (torch.where, masking), or move the data-dependent part out of forward()"
)


class LeafTracer(fx.Tracer):
    """fx tracer that also treats simkit's slope activations as leaves (one node per call)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return isinstance(m, SlopeReLU) or super().is_leaf_module(m, module_qualified_name)


def trace(model: nn.Module) -> fx.GraphModule:
    """The model as an fx GraphModule sharing its parameters (a GraphModule is re-traced the same way).

    Raises SimkitError naming the failure when the forward cannot be traced symbolically.
    """
    tracer = LeafTracer()
    try:
        graph = tracer.trace(model)
    except Exception as exc:  # fx raises TraceError, TypeError, ... for control flow on proxies
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SimkitError(f"cannot trace {type(model).__name__} with torch.fx ({type(exc).__name__}: "
                          f"{first[:160]}); {UNTRACEABLE_HINT}") from None
    name = type(model).__name__
    return fx.GraphModule(tracer.root, graph, name)


def dry_run(run: Callable[..., Any], example: torch.Tensor | dict[str, torch.Tensor]) -> None:
    """Call ``run(*inputs)`` once on ``example`` (Tensor (N, ...) or dict of tensors) in eval mode
    without grad; the caller's model modes are its own business. A forward that fails on these inputs
    (wrong shape or dtype for the model) becomes a SimkitError naming the input shape."""
    args = list(example.values()) if isinstance(example, dict) else [example]
    try:
        with torch.no_grad():
            run(*args)
    except SimkitError:
        raise
    except (RuntimeError, TypeError, ValueError, IndexError) as exc:
        raise forward_error(exc, example, "the model") from None
