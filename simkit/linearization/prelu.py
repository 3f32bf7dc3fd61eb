"""Swap every ReLU of a network for a learnable-slope activation and keep the freeze rule.

Channel-wise slopes have one α per channel (dim 1 of the input, PyTorch's PReLU convention; the
count comes from a dry run), layer-wise slopes one α per activation site. Every call site of a ReLU
gets its own module, even when the original module object is shared (torchvision's BasicBlock calls
``self.relu`` twice) or the ReLU is functional (``F.relu``, ``torch.relu``, ``x.relu()``): the model
is traced with torch.fx and each site becomes a ``call_module`` node of its own.

The slope activation itself, its penalty and the freeze rule: :mod:`simkit.linearization.slope`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.layers import record_layers
from simkit.linearization.slope import SlopeReLU
from simkit.linearization.trace import dry_run, trace
from simkit.settings.linearize import GRANULARITIES
from simkit.surgery import printable_name, replace_module

RELU_FUNCTIONS = {F.relu: False, torch.relu: False, torch.relu_: True, F.relu_: True}
RELU_METHODS = {"relu": False, "relu_": True}


@dataclass
class ReluSite:
    """One ReLU call site: its module name in the rewritten graph, and where it came from."""

    name: str
    origin: str      # the original module name, or "F.relu" / "Tensor.relu" for functional calls
    channels: int = 0


def _scope(node: fx.Node) -> str:
    """The qualified name of the module whose forward made ``node`` ('' at the top level)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    key, value = list(stack.items())[-1]
    return value[0] if isinstance(value, tuple) else str(key)


def _relu_call(node: fx.Node, gm: fx.GraphModule) -> tuple[bool, str] | None:
    """(in_place, origin) when ``node`` applies a ReLU, else None."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if type(module) is nn.ReLU:
            return module.inplace, str(node.target)
    elif node.op == "call_function" and node.target in RELU_FUNCTIONS:
        inplace = RELU_FUNCTIONS[node.target] or bool(node.kwargs.get("inplace", False)) or (
            len(node.args) > 1 and node.args[1] is True)
        return inplace, f"{getattr(node.target, '__name__', 'relu')}()"
    elif node.op == "call_method" and node.target in RELU_METHODS:
        return RELU_METHODS[node.target], f"Tensor.{node.target}()"
    return None


def _unique_name(base: str, taken: set[str], gm: nn.Module) -> str:
    def free(name: str) -> bool:
        if name in taken:
            return False
        parent_name, _, leaf = name.rpartition(".")
        try:
            parent = gm.get_submodule(parent_name) if parent_name else gm
        except AttributeError:
            return True
        return not hasattr(parent, leaf)

    name, k = base, 1
    while not free(name):
        name, k = f"{base}_{k}", k + 1
    return name


def explicit_relus(model: nn.Module) -> tuple[fx.GraphModule, list[ReluSite]]:
    """A traced copy of ``model`` in which every ReLU call site is its own ``nn.ReLU`` module.

    Returns (graph module, sites in graph order). The copy computes the same function (in-place ReLUs
    become out-of-place; later uses of their input are rewired to the output). ``model`` is untouched.
    Raises SimkitError when the model cannot be traced or has no ReLU.
    """
    gm = trace(copy.deepcopy(model))
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    taken = {name for name, _ in gm.named_modules()}
    seen_targets: set[str] = set()
    sites: list[ReluSite] = []
    for node in list(gm.graph.nodes):
        found = _relu_call(node, gm)
        if found is None:
            continue
        inplace, origin = found
        if node.op == "call_module" and node.target not in seen_targets:
            name = str(node.target)
            seen_targets.add(name)
        else:
            base = str(node.target) if node.op == "call_module" else \
                printable_name(".".join(p for p in (_scope(node), "relu") if p))
            name = _unique_name(base, taken, gm)
        taken.add(name)
        gm.add_submodule(name, nn.ReLU())
        source = node.args[0]
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(name, (source,))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        if inplace and isinstance(source, fx.Node):
            for user in list(source.users):
                if user is not new and user is not node and order.get(user, -1) > order[node]:
                    user.replace_input_with(source, new)
        gm.graph.erase_node(node)
        sites.append(ReluSite(name=name, origin=origin))
    if not sites:
        raise SimkitError(f"{type(model).__name__} has no ReLU (nn.ReLU, F.relu, torch.relu or "
                          "Tensor.relu) to linearize; linearization needs a ReLU network")
    gm.graph.lint()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm, sites


def site_channels(gm: nn.Module, sites: list[ReluSite], example: Tensor | dict[str, Tensor]) -> None:
    """Fill ``site.channels`` (size of dim 1 of each site's input) from one dry run in eval mode.

    example: a batch the model accepts, Tensor (N, C, ...) or dict of tensors. A ReLU keeps the shape
    of its input, so the recorded output shapes are the input shapes.
    """
    with record_layers(gm, [site.name for site in sites], reduce="flatten") as recorder:
        if isinstance(example, dict):
            dry_run(lambda *_: gm(**example), example)
        else:
            dry_run(gm, example)
        shapes = dict(recorder.shapes)
    for site in sites:
        shape = shapes.get(site.name)
        if shape is None:
            raise SimkitError(f"ReLU site {site.name} did not run on the example batch; "
                              "pass an input that reaches every activation")
        site.channels = shape[1] if len(shape) >= 2 else 1


def swap_relus(model: nn.Module, granularity: str, example) -> tuple[fx.GraphModule, list[ReluSite]]:
    """A copy of ``model`` with every ReLU site replaced by a SlopeReLU with α = 0.

    granularity: "channel" (one α per channel of dim 1) or "layer" (one α per site).
    example: a batch (Tensor (N, C, ...) or dict) for the dry run that finds channel counts.
    The copy's outputs equal the original's bit for bit (for finite inputs) until it is trained.
    """
    if granularity not in GRANULARITIES:
        raise SimkitError(f"unknown granularity {granularity!r}; use channel or layer")
    gm, sites = explicit_relus(model)
    site_channels(gm, sites, example)
    # slopes live where the model's weights live (device, floating dtype)
    ref = next((p for p in gm.parameters() if p.is_floating_point()), None)
    for site in sites:
        channels = site.channels if granularity == "channel" else 1
        slope = SlopeReLU(channels)
        if ref is not None:
            slope.to(device=ref.device, dtype=ref.dtype)
        replace_module(gm, site.name, slope)
    gm.recompile()
    return gm, sites


__all__ = ["GRANULARITIES", "ReluSite", "explicit_relus", "site_channels", "swap_relus"]
