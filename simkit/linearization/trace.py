"""torch.fx tracing for linearization: one tracer, one clear error for untraceable forwards.

The tracer (simkit's one, ``simkit.surgery.trace``) keeps every ``torch.nn`` module as a leaf (fx's
default) and also :class:`SlopeReLU`, so a traced graph shows each activation site as one node.
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
from simkit.surgery import trace as surgery_trace

UNTRACEABLE_HINT = (
    "NAPL and linearization need a torch.fx-traceable forward: replace Python `if`/`for` on tensor "
    "values with tensor ops (torch.where, masking), or move the data-dependent part out of forward()"
)


def trace(model: nn.Module) -> fx.GraphModule:
    """The model as an fx GraphModule sharing its parameters (a GraphModule is re-traced the same way),
    every ``torch.nn`` module and :class:`SlopeReLU` one node; through simkit's one tracer
    (``simkit.surgery.trace``: module names fx cannot print are sanitised in the graph, see
    ``simkit.surgery.original_target``).

    Raises SimkitError naming the failure when the forward cannot be traced symbolically.
    """
    return surgery_trace(model, leaf_types=(SlopeReLU,), hint=UNTRACEABLE_HINT, class_name=type(model).__name__,
                         message="cannot trace {model} with torch.fx ({detail}); {hint}")


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
