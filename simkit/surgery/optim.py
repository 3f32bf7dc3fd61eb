"""Optimizer continuity: new parameters join the existing optimizer; old state is never touched."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim import Optimizer

from simkit.errors import SimkitError

SUPPORTED = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def add_new_params(optimizer: Optimizer, params: Iterable[nn.Parameter], *,
                   warm_start_second_moment: bool = False) -> dict:
    """Add ``params`` to ``optimizer`` as one new param group; returns that group.

    The new group copies the hyper-parameters of the first group (including its current and initial
    LR, so LR control treats it alike). Existing groups and the state of existing parameters are not
    modified. With ``warm_start_second_moment`` (Adam/AdamW only) each new parameter starts with
    exp_avg = 0, exp_avg_sq filled with the mean second moment of all existing parameters, and their
    step count, so its first updates are not inflated by bias correction of an empty estimate [ours].
    """
    if not isinstance(optimizer, SUPPORTED):
        raise SimkitError(f"add_new_params supports SGD, Adam and AdamW, got {type(optimizer).__name__}; "
                          "rebuild the optimizer yourself for other kinds")
    params = list(params)
    known = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if any(id(p) in known for p in params):
        raise SimkitError("some parameters are already in the optimizer; pass only the new ones")
    if not params:
        raise SimkitError("add_new_params got no parameters")
    group = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    group["params"] = params
    optimizer.add_param_group(group)
    if warm_start_second_moment:
        _warm_start(optimizer, params)
    return optimizer.param_groups[-1]


@torch.no_grad()
def _warm_start(optimizer: Optimizer, params: list[nn.Parameter]) -> None:
    if isinstance(optimizer, torch.optim.SGD):
        raise SimkitError("warm_start_second_moment needs Adam or AdamW (SGD keeps no second moments)")
    states = [s for s in optimizer.state.values() if "exp_avg_sq" in s]
    if not states:
        raise SimkitError("warm_start_second_moment needs an optimizer that has stepped (no second moments yet)")
    total = sum(float(s["exp_avg_sq"].double().sum()) for s in states)
    count = sum(s["exp_avg_sq"].numel() for s in states)
    mean = total / count
    step = states[0]["step"]
    amsgrad = optimizer.param_groups[-1].get("amsgrad", False)
    for p in params:
        state = {"step": step.clone() if torch.is_tensor(step) else step,
                 "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                 "exp_avg_sq": torch.full_like(p, mean, memory_format=torch.preserve_format)}
        if amsgrad:
            state["max_exp_avg_sq"] = state["exp_avg_sq"].clone()
        optimizer.state[p] = state
