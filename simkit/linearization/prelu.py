"""Swap every ReLU of a network for a learnable-slope activation and keep the freeze rule.

:class:`SlopeReLU` computes ``y = relu(x) - α·relu(-x)``: x where x > 0, α·x where x < 0. With α = +0
it returns exactly ``torch.relu(x)`` bit for bit for every finite x and NaN [ours]: ``α·relu(-x)`` is
then +0, and ``r - (+0) == r`` for every float r, including relu's own signed zero (torch.relu(-0.0)
is -0.0). The naive ``torch.where(x >= 0, x, α·x)`` would give -0.0 for negative x; PyTorch's PReLU
starts at α = 0.25. Only x = -inf differs (0·inf is NaN), as it does for nn.PReLU.

Channel-wise slopes have one α per channel (dim 1 of the input, PyTorch's PReLU convention; the
count comes from a dry run), layer-wise slopes one α per activation site. Every call site of a ReLU
gets its own module, even when the original module object is shared (torchvision's BasicBlock calls
``self.relu`` twice) or the ReLU is functional (``F.relu``, ``torch.relu``, ``x.relu()``): the model
is traced with torch.fx and each site becomes a ``call_module`` node of its own.

Freeze rule: once |α − 1| < ``tol`` (0.01), or when an optimizer step carries α across 1, that α is set
to exactly 1 and marked in the persistent ``frozen`` buffer (saved in the state dict). Frozen slopes
never move again: the forward reads 1 for them (so their gradient is exactly zero, the gradient
hook) and :class:`FreezeRule` resets them to 1 after every optimizer step (momentum cannot move them).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import Tensor, nn

from simkit.errors import SimkitError
from simkit.linearization.trace import dry_run, trace

GRANULARITIES = ("channel", "layer")
FREEZE_TOL = 0.01

RELU_FUNCTIONS = {F.relu: False, torch.relu: False, torch.relu_: True, F.relu_: True}
RELU_METHODS = {"relu": False, "relu_": True}


class SlopeReLU(nn.Module):
    """PReLU-like activation with slope α on negative inputs and a persistent freeze mask.

    channels: number of slopes (1 = layer-wise; C = channel-wise, broadcast along dim 1).
    Input (N, C, *) or (N, C); output the same shape. ``alpha`` (channels,) starts at 0 (= ReLU).
    """

    def __init__(self, channels: int = 1) -> None:
        super().__init__()
        if channels < 1:
            raise SimkitError(f"SlopeReLU needs at least one slope, got {channels}")
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.register_buffer("frozen", torch.zeros(channels, dtype=torch.bool))

    @property
    def channels(self) -> int:
        return self.alpha.numel()

    def effective_alpha(self) -> Tensor:
        """(channels,) slopes as the forward uses them: exactly 1 where frozen (zero gradient there)."""
        return torch.where(self.frozen, torch.ones_like(self.alpha), self.alpha)

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.effective_alpha().to(x.dtype)
        if alpha.numel() > 1:
            if x.dim() < 2 or x.shape[1] != alpha.numel():
                raise SimkitError(f"SlopeReLU has {alpha.numel()} channel slopes but got input of shape "
                                  f"{tuple(x.shape)}; channel-wise slopes need (N, C, ...) inputs")
            alpha = alpha.view([1, -1] + [1] * (x.dim() - 2))
        return torch.relu(x) - alpha * torch.relu(-x)

    def nonlinear_fraction(self) -> float:
        """Fraction of slopes with α ≠ 1 (the activation's p_l)."""
        return float((self.effective_alpha() != 1).float().mean())

    @torch.no_grad()
    def freeze(self, previous: Tensor | None = None, tol: float = FREEZE_TOL) -> int:
        """Freeze slopes with |α − 1| < tol or (given the slopes before a step) that crossed 1.

        previous: (channels,) α before the step, or None. Sets frozen α to exactly 1; returns how
        many slopes were newly frozen.
        """
        alpha = self.alpha
        newly = (alpha - 1).abs() < tol
        if previous is not None:
            newly |= (previous - 1) * (alpha - 1) < 0
        newly &= ~self.frozen
        self.frozen |= newly
        alpha[self.frozen] = 1.0
        return int(newly.sum())

    def extra_repr(self) -> str:
        return f"channels={self.channels}"


def slope_modules(model: nn.Module) -> Iterator[tuple[str, SlopeReLU]]:
    """(name, module) for every SlopeReLU of ``model``, in registration order."""
    for name, module in model.named_modules():
        if isinstance(module, SlopeReLU):
            yield name, module


def slope_penalty(modules: Iterable[SlopeReLU], eps: float) -> Tensor:
    """Σ over slopes not yet frozen of (|1 − α| + eps)^0.5 (a scalar tensor; frozen slopes add 0)."""
    total = None
    for module in modules:
        term = ((1 - module.alpha).abs() + eps).sqrt()
        term = torch.where(module.frozen, torch.zeros_like(term), term).sum()
        total = term if total is None else total + term
    if total is None:
        raise SimkitError("model has no SlopeReLU activations to regularise; swap its ReLUs first")
    return total


class FreezeRule:
    """Applies the freeze rule around every ``optimizer.step()`` (step pre/post hooks).

    Before a step it remembers each α; after it, freezes slopes that reached 1 or crossed it and
    resets frozen slopes to exactly 1. Use as a context manager around training.
    """

    def __init__(self, modules: list[SlopeReLU], optimizer: torch.optim.Optimizer,
                 tol: float = FREEZE_TOL) -> None:
        self.modules, self.optimizer, self.tol = modules, optimizer, tol
        self._before: list[Tensor] = []
        self._handles: list = []

    def _pre(self, *_args) -> None:
        self._before = [m.alpha.detach().clone() for m in self.modules]

    def _post(self, *_args) -> None:
        for module, before in zip(self.modules, self._before, strict=True):
            module.freeze(before, self.tol)

    def __enter__(self) -> FreezeRule:
        self._handles = [self.optimizer.register_step_pre_hook(self._pre),
                         self.optimizer.register_step_post_hook(self._post)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# ---------------------------------------------------------------------------------------------------
# finding and swapping ReLU sites


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
        module = gm.get_submodule(node.target)
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
            base = str(node.target) if node.op == "call_module" else ".".join(p for p in (_scope(node), "relu") if p)
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


def _run(model: nn.Module, example) -> None:
    modes = {m: m.training for m in model.modules()}
    model.eval()
    try:
        if isinstance(example, dict):
            dry_run(lambda *_: model(**example), example)
        else:
            dry_run(model, example)
    finally:
        for module, mode in modes.items():
            module.training = mode


def site_channels(gm: nn.Module, sites: list[ReluSite], example) -> None:
    """Fill ``site.channels`` (size of dim 1 of each site's input) from one dry run in eval mode.

    example: a batch the model accepts, Tensor (N, C, ...) or dict of tensors.
    """
    shapes: dict[str, tuple[int, ...]] = {}
    handles = []
    for site in sites:
        def hook(_module, args, name=site.name):
            shapes[name] = tuple(args[0].shape)
        handles.append(gm.get_submodule(site.name).register_forward_pre_hook(hook))
    try:
        _run(gm, example)
    finally:
        for handle in handles:
            handle.remove()
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
    from simkit.surgery import replace_module

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
