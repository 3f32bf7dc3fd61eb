"""Cutting frozen models at a layer: A's front half (input → layer i) and B's back half (layer j → logits).

Both halves work on private frozen copies (``copy.deepcopy``, eval mode, ``requires_grad=False``), so
the user's models are never changed, not even their ``.grad`` fields.

* :class:`FrontHalf` runs A and stops at the layer (a forward hook raises once the layer's output is
  recorded), so no later layer of A is computed.
* :class:`BackHalf` is a real cut made with ``torch.fx``: a new graph whose input is the layer's
  output and which holds only the nodes the logits need, so none of B's earlier layers is computed.
  When the model cannot be traced, or a skip connection bypasses the layer (so the output does not
  depend on the input through the layer alone), it falls back to *output replacement* (run all of B
  and overwrite the layer's output), says so with a warning and records ``mode = "replace"``.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.fx
from torch import Tensor, nn

from simkit.errors import SimkitError, unknown_name_error

# Modules that only reshape or pass through their input add no layer of their own to FuLA.
PASS_THROUGH = (nn.Flatten, nn.Unflatten, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Identity)


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy of ``model`` in eval mode with every parameter frozen."""
    clone = copy.deepcopy(model).eval()
    for param in clone.parameters():
        param.requires_grad_(False)
    return clone


def check_layer(model: nn.Module, name: str, which: str) -> nn.Module:
    """The submodule ``name`` of ``model``; SimkitError listing close names when there is none."""
    modules = dict(model.named_modules())
    if not name or name not in modules:
        raise unknown_name_error(f"layer of model {which}", name, [n for n in modules if n],
                                 "run `simkit layers MODEL` to list them")
    return modules[name]


def first_tensor(output) -> Tensor:
    """A module's output as one tensor (the first element of a tuple/list output)."""
    if isinstance(output, tuple | list):
        output = output[0]
    if not isinstance(output, Tensor):
        raise SimkitError(f"a stitch needs a layer whose output is a tensor, got {type(output).__name__}; "
                          "pick another layer")
    return output


class _Stop(Exception):
    """Raised by the front half's hook once the stitch layer's output is recorded."""


class FrontHalf(nn.Module):
    """A's computation from the input to the output of ``layer``: ``x (b, ...) → a(x) (b, *shape)``."""

    def __init__(self, model: nn.Module, layer: str):
        super().__init__()
        check_layer(model, layer, "A")
        self.model = frozen_copy(model)
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        found: list[Tensor] = []

        def hook(module, inputs, output):
            found.append(first_tensor(output))
            raise _Stop

        handle = self.model.get_submodule(self.layer).register_forward_hook(hook)
        try:
            self.model(x)
        except _Stop:
            pass
        finally:
            handle.remove()
        if not found:
            raise SimkitError(f"layer {self.layer!r} of model A is never called in its forward pass; "
                              "pick a layer the model uses")
        return found[0]


@contextmanager
def record(model: nn.Module, names: list[str]) -> Iterator[dict[str, Tensor]]:
    """Record the outputs of the submodules ``names`` (as computed, gradients kept) into a dict."""
    outputs: dict[str, Tensor] = {}
    handles = []
    for name in names:
        def hook(module, inputs, output, name=name):
            outputs[name] = first_tensor(output)
        handles.append(model.get_submodule(name).register_forward_hook(hook))
    try:
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def _cut_graph(model: nn.Module, layer: str) -> tuple[torch.fx.GraphModule | None, str]:
    """The back half as a GraphModule taking the layer's output, or (None, reason) when impossible."""
    from simkit.surgery import find_node, trace

    try:
        traced = trace(model, leaves=[layer])  # the layer stays one call, even a custom block
        cut = find_node(traced, layer)
    except SimkitError as exc:
        return None, str(exc).split(";")[0]
    graph = traced.graph
    output = next(n for n in graph.nodes if n.op == "output")
    needed: set[torch.fx.Node] = set()
    stack = [output]
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        if node is cut:
            continue
        if node.op == "placeholder":
            return None, f"a path from the input to the output bypasses {layer!r} (a skip connection)"
        stack.extend(node.all_input_nodes)
    back = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {cut: back.placeholder("h")}
    for node in graph.nodes:
        if node in needed and node is not cut:
            env[node] = back.node_copy(node, lambda n: env[n])
    module = torch.fx.GraphModule(model, back)
    return module, ""


class BackHalf(nn.Module):
    """B's computation from the output of ``layer`` to the logits: ``h (b, *shape) → logits (b, k)``.

    ``mode``: ``"cut"`` (fx graph from the layer on) or ``"replace"`` (all of B runs, the layer's
    output is overwritten; needs the input ``x`` and computes B's earlier layers). ``reason`` says why
    a cut was impossible. ``later_layers``: names of B's layers after the stitch, in call order,
    ending with the one producing the logits (pass-through modules such as Flatten left out).
    """

    def __init__(self, model: nn.Module, layer: str, *, allow_replace: bool = True):
        super().__init__()
        check_layer(model, layer, "B")
        self.layer = layer
        self.model = frozen_copy(model)
        graph_module, reason = _cut_graph(self.model, layer)
        self.reason = reason
        if graph_module is None:
            if not allow_replace:
                raise SimkitError(f"cannot cut model B at {layer!r}: {reason}; pick a layer every path "
                                  "to the output goes through")
            warnings.warn(f"stitching into B at {layer!r} by output replacement (B's earlier layers are "
                          f"computed and discarded): {reason}", stacklevel=2)
            self.mode, self.back = "replace", None
            self.later_layers: list[str] = []  # found by :meth:`probe`
        else:
            self.mode, self.back = "cut", graph_module
            for param in graph_module.parameters():
                param.requires_grad_(False)
            names = [n.target for n in graph_module.graph.nodes if n.op == "call_module"]
            mods = dict(graph_module.named_modules())
            self.later_layers = [n for n in names if not isinstance(mods[n], PASS_THROUGH)]

    def probe(self, x: Tensor) -> None:
        """Replace mode: find the leaf layers called after the stitch layer on a sample batch ``x``."""
        if self.mode != "replace":
            return
        order: list[str] = []
        handles = [m.register_forward_hook(lambda mod, i, o, name=name: order.append(name))
                   for name, m in self.model.named_modules()
                   if name and (not list(m.children()) or name == self.layer)]
        try:
            with torch.no_grad():
                self.model(x)
        finally:
            for handle in handles:
                handle.remove()
        modules = dict(self.model.named_modules())
        after = order[order.index(self.layer) + 1:] if self.layer in order else []
        self.later_layers = [n for n in after if not n.startswith(self.layer + ".")
                             and not isinstance(modules[n], PASS_THROUGH)]

    @property
    def module(self) -> nn.Module:
        """The module whose submodule names :attr:`later_layers` refers to."""
        return self.back if self.mode == "cut" else self.model

    def forward(self, h: Tensor, x: Tensor | None = None) -> Tensor:
        if self.mode == "cut":
            return self.back(h)
        if x is None:
            raise SimkitError(f"B is stitched at {self.layer!r} by output replacement, which needs the input x")

        def hook(module, inputs, output):
            return h

        handle = self.model.get_submodule(self.layer).register_forward_hook(hook)
        try:
            return self.model(x)
        finally:
            handle.remove()
