"""Fold fully linear stretches of a linearized network into single linear maps.

After post-training, an activation site whose slopes are all frozen at α = 1 is the identity. The
maps around it can then be multiplied out, exactly:

- identity modules (all-linear SlopeReLU, nn.Identity, nn.Dropout in eval) are removed;
- BatchNorm (eval statistics) right after a Conv/Linear is folded into its weights and bias;
- Linear → Linear becomes one Linear (W = W₂W₁, b = W₂b₁ + b₂);
- Conv → Conv (same dimensionality, stride 1, dilation 1, groups 1, zero padding mode) becomes one
  Conv with kernel k₁ + k₂ − 1 when the second conv has no padding: with padding, the second conv
  would pad the first one's output (bias included) with zeros, which no single conv on the input
  reproduces at the borders ("padding issues"), so those pairs are left alone [ours].

Each fold needs the first map's output to feed only the second. The folded network is compared
with the original in the report (accuracy) and its effective depth (the most Conv/Linear maps on
any input-to-output path) and parameter count are reported.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch import nn

from simkit.linearization.slope import SlopeReLU
from simkit.linearization.trace import trace
from simkit.surgery import replace_module

CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
Conv = nn.Conv1d | nn.Conv2d | nn.Conv3d
BatchNorm = nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d


@dataclass
class FoldResult:
    """The folded network and what folding changed (depth = most Conv/Linear maps on a path)."""

    model: fx.GraphModule
    depth_before: int
    depth_after: int
    params_before: int
    params_after: int
    folds: int


def _is_identity(module: nn.Module) -> bool:
    if isinstance(module, SlopeReLU):
        return bool((module.effective_alpha() == 1).all())
    return isinstance(module, nn.Identity | nn.Dropout)


def weighted_depth(gm: fx.GraphModule) -> int:
    """The largest number of Conv/Linear modules on any path through the graph."""
    depth: dict[fx.Node, int] = {}
    best = 0
    for node in gm.graph.nodes:
        inputs = [depth[n] for n in node.all_input_nodes if n in depth]
        here = max(inputs, default=0)
        if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), CONVS + (nn.Linear,)):
            here += 1
        depth[node] = here
        best = max(best, here)
    return best


def count_params(model: nn.Module) -> int:
    """Total number of parameter entries of ``model`` (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


def _fold_bn(layer: Conv | nn.Linear, bn: BatchNorm) -> nn.Module | None:
    mean, var = bn.running_mean, bn.running_var
    if not bn.track_running_stats or mean is None or var is None:
        return None
    scale = bn.weight / torch.sqrt(var + bn.eps) if bn.affine else 1 / torch.sqrt(var + bn.eps)
    shift = bn.bias if bn.affine else torch.zeros_like(mean)
    out_features = layer.weight.shape[0]
    if scale.numel() != out_features:
        return None
    new = copy.deepcopy(layer)
    bias = layer.bias if layer.bias is not None else layer.weight.new_zeros(out_features)
    view = [-1] + [1] * (layer.weight.dim() - 1)
    new.weight = nn.Parameter((layer.weight * scale.view(view)).detach())
    new.bias = nn.Parameter(((bias - mean) * scale + shift).detach())
    return new


def _fold_linear(first: nn.Linear, second: nn.Linear) -> nn.Linear:
    new = nn.Linear(first.in_features, second.out_features, dtype=first.weight.dtype, device=first.weight.device)
    b1 = first.bias if first.bias is not None else first.weight.new_zeros(first.out_features)
    b2 = second.bias if second.bias is not None else first.weight.new_zeros(second.out_features)
    new.weight = nn.Parameter((second.weight @ first.weight).detach())
    new.bias = nn.Parameter((second.weight @ b1 + b2).detach())
    return new


def _plain_conv(conv: Conv) -> bool:
    return (all(s == 1 for s in conv.stride) and all(d == 1 for d in conv.dilation) and conv.groups == 1
            and conv.padding_mode == "zeros" and not isinstance(conv.padding, str))


def _tap(position: tuple[int, ...]) -> tuple[slice | int, ...]:
    """Index of one kernel position of a conv weight (out, in, *k): every (out, in) pair there."""
    return (slice(None), slice(None), *position)


def _fold_conv(first: Conv, second: Conv) -> nn.Module | None:
    if type(first) is not type(second) or not (_plain_conv(first) and _plain_conv(second)):
        return None
    if any(p != 0 for p in second.padding):
        return None
    w1, w2 = first.weight, second.weight          # (mid, in, *k1), (out, mid, *k2)
    k1, k2 = w1.shape[2:], w2.shape[2:]
    kernel = tuple(a + b - 1 for a, b in zip(k1, k2, strict=True))
    weight = w1.new_zeros(w2.shape[0], w1.shape[1], *kernel)
    for a in itertools.product(*(range(k) for k in k1)):
        for b in itertools.product(*(range(k) for k in k2)):
            t = tuple(i + j for i, j in zip(a, b, strict=True))
            weight[_tap(t)] += w2[_tap(b)] @ w1[_tap(a)]
    b1 = first.bias if first.bias is not None else w1.new_zeros(w1.shape[0])
    b2 = second.bias if second.bias is not None else w1.new_zeros(w2.shape[0])
    bias = b2 + torch.einsum("om...,m->o", w2, b1)
    build: Callable[..., Conv] = type(first)  # the same class as both convs: kernel has its dimensionality
    new = build(w1.shape[1], w2.shape[0], kernel, padding=first.padding, bias=True, dtype=w1.dtype,
                device=w1.device)
    new.weight = nn.Parameter(weight.detach())
    new.bias = nn.Parameter(bias.detach())
    return new


def _merge(first: nn.Module, second: nn.Module) -> nn.Module | None:
    if isinstance(first, CONVS + (nn.Linear,)) and isinstance(second, BATCHNORMS):
        return _fold_bn(first, second)
    if isinstance(first, nn.Linear) and isinstance(second, nn.Linear):
        return _fold_linear(first, second)
    if isinstance(first, CONVS) and isinstance(second, CONVS):
        return _fold_conv(first, second)
    return None


def _targets_used_once(gm: fx.GraphModule) -> set[str]:
    counts: dict[str, int] = {}
    for node in gm.graph.nodes:
        if node.op == "call_module":
            counts[str(node.target)] = counts.get(str(node.target), 0) + 1
    return {t for t, c in counts.items() if c == 1}


def fold_linear_stretches(model: nn.Module) -> FoldResult:
    """A folded copy of ``model`` (eval mode) computing the same function up to float rounding.

    model: a (linearized) network torch.fx can trace; it is not changed.
    """
    gm = trace(copy.deepcopy(model).eval())
    depth_before, params_before = weighted_depth(gm), count_params(gm)
    folds = 0
    with torch.no_grad():
        for node in list(gm.graph.nodes):
            if node.op == "call_module" and _is_identity(gm.get_submodule(node.target)):
                node.replace_all_uses_with(node.args[0])
                gm.graph.erase_node(node)
                folds += 1
        changed = True
        while changed:
            changed = False
            once = _targets_used_once(gm)
            for node in gm.graph.nodes:
                users = list(node.users)
                if node.op != "call_module" or len(users) != 1 or users[0].op != "call_module":
                    continue
                user = users[0]
                if node.target not in once or user.target not in once or user.args[0] is not node \
                        or len(user.args) != 1 or user.kwargs:
                    continue
                merged = _merge(gm.get_submodule(node.target), gm.get_submodule(user.target))
                if merged is None:
                    continue
                replace_module(gm, node.target, merged)
                user.replace_all_uses_with(node)
                gm.graph.erase_node(user)
                folds += 1
                changed = True
                break
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return FoldResult(model=gm, depth_before=depth_before, depth_after=weighted_depth(gm),
                      params_before=params_before, params_after=count_params(gm), folds=folds)
