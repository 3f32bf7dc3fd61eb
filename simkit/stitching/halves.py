"""Cutting frozen models at a layer: A's front half (input → layer i) and B's back half (layer j → logits).

Both halves work on private frozen copies (``copy.deepcopy``, eval mode, ``requires_grad=False``), so
the user's models are never changed, not even their ``.grad`` fields. The copies stay in eval mode
whatever ``train()`` is called on a half or on a model holding it (a stitched model being trained or
evaluated): a frozen half shared by several stitches never runs its BatchNorm in training mode.

* :class:`FrontHalf` runs A and stops at the layer (a forward hook raises once the layer's output is
  recorded), so no later layer of A is computed.
* :class:`BackHalf` is a real cut made with ``torch.fx``: a new graph whose input is the layer's
  output and which holds only the nodes the logits need, so none of B's earlier layers is computed.
  When the model cannot be traced, or a skip connection bypasses the layer (so the output does not
  depend on the input through the layer alone), it falls back to *output replacement* (run all of B
  and overwrite the layer's output), says so with a warning and records ``mode = "replace"``.
* :class:`record` records layer outputs (with their shapes, gradients kept) through
  :class:`simkit.layers.record_layers`.
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
from torch import Tensor, nn

from simkit.errors import SimkitError, unknown_name_error
from simkit.layers import record_layers, select_output
from simkit.surgery import find_node, graph_target, keep_original_targets, original_target, trace

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


def layer_output(output: Any, layer: str = "") -> Tensor:
    """The tensor of a module's output (``simkit.layers.select_output``: the output itself, the first
    tensor of a tuple/list); a SimkitError saying a stitch needs a tensor when there is none."""
    try:
        return select_output(output, None, layer)
    except SimkitError:
        raise SimkitError(f"a stitch needs a layer whose output is a tensor, got {type(output).__name__}; "
                          "pick another layer") from None


def once_called(names: Sequence[str]) -> list[str]:
    """``names`` (layers in call order) without those called more than once (a shared module, e.g. one
    ReLU used twice: its output in one forward pass is not one activation)."""
    counts = Counter(names)
    return [name for name in names if counts[name] == 1]


class record:  # noqa: N801  (a context manager: `with record(model, names) as outputs`)
    """Record the outputs of the submodules ``names`` of ``model`` as computed (shapes kept, gradients
    kept, train/eval modes untouched) through :class:`simkit.layers.record_layers`::

        with record(model, ["layer1", "layer2"]) as outputs:
            model(x)
        outputs["layer1"]   # (b, *shape), filled when the block ends

    Each layer must run exactly once inside the block (record_layers says so otherwise).
    """

    def __init__(self, model: nn.Module, names: Sequence[str]):
        self.names = list(dict.fromkeys(names))
        self.outputs: dict[str, Tensor] = {}
        self._recorder = record_layers(model, self.names, reduce="flatten", grad=True, eval_mode=False) \
            if self.names else None

    def __enter__(self) -> dict[str, Tensor]:
        if self._recorder is not None:
            self._recorder.__enter__()
        return self.outputs

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        recorder = self._recorder
        if recorder is None:
            return
        try:
            if exc_type is None:
                flat = recorder.pop()
                self.outputs.update({name: flat[name].reshape(recorder.shapes[name]) for name in self.names})
        finally:
            recorder.__exit__(exc_type, *exc)


class _FrozenHalf(nn.Module):
    """A half around a frozen copy ``self.model`` that stays in eval mode under ``train()``."""

    model: nn.Module

    def train(self, mode: bool = True) -> _FrozenHalf:
        super().train(mode)
        for module in self.frozen_modules():
            module.eval()
        return self

    def frozen_modules(self) -> list[nn.Module]:
        return [self.model]


class _Stop(Exception):
    """Raised by the front half's hook once the stitch layer's output is recorded."""


class FrontHalf(_FrozenHalf):
    """A's computation from the input to the output of ``layer``: ``x (b, ...) → a(x) (b, *shape)``."""

    def __init__(self, model: nn.Module, layer: str):
        super().__init__()
        check_layer(model, layer, "A")
        self.model = frozen_copy(model)
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        found: list[Tensor] = []

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            found.append(layer_output(output, self.layer))
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


def _cut_graph(model: nn.Module, layer: str) -> tuple[torch.fx.GraphModule | None, str]:
    """The back half as a GraphModule taking the layer's output, or (None, reason) when impossible."""
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
    module = torch.fx.GraphModule(traced, back)  # traced: its module names are the graph's (printable)
    keep_original_targets(traced, module)
    return module, ""


class BackHalf(_FrozenHalf):
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
        self.back: torch.fx.GraphModule | None = graph_module
        self.later_layers: list[str] = []  # replace mode: found by :meth:`probe`
        if graph_module is None:
            if not allow_replace:
                raise SimkitError(f"cannot cut model B at {layer!r}: {reason}; pick a layer every path "
                                  "to the output goes through")
            warnings.warn(f"stitching into B at {layer!r} by output replacement (B's earlier layers are "
                          f"computed and discarded): {reason}", stacklevel=2)
            self.mode = "replace"
        else:
            self.mode = "cut"
            for param in graph_module.parameters():
                param.requires_grad_(False)
            names = [str(n.target) for n in graph_module.graph.nodes if n.op == "call_module"]
            mods = dict(graph_module.named_modules())
            self.later_layers = [original_target(graph_module, n) for n in names  # B's own module names
                                 if not isinstance(mods[n], PASS_THROUGH)]

    def probe(self, x: Tensor) -> None:
        """Replace mode: find the leaf layers called after the stitch layer on a sample batch ``x``."""
        if self.mode != "replace":
            return
        order: list[str] = []  # the call order of B's leaves: a hook that records names, not outputs

        def called(name: str) -> Any:
            return lambda module, inputs, output: order.append(name)

        handles = [m.register_forward_hook(called(name))
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

    def frozen_modules(self) -> list[nn.Module]:
        return [self.model] if self.back is None else [self.model, self.back]

    @property
    def module(self) -> nn.Module:
        """The module that runs the back half (its submodules named as :meth:`module_names` says)."""
        return self.back if self.back is not None else self.model

    def module_names(self, names: Sequence[str]) -> list[str]:
        """B's module ``names`` (as :attr:`later_layers`) as :attr:`module` names them: the cut's graph
        renames modules whose names torch.fx cannot print (``simkit.surgery.graph_target``)."""
        return [graph_target(self.back, n) if self.back is not None else n for n in names]

    def forward(self, h: Tensor, x: Tensor | None = None) -> Tensor:
        if self.back is not None:
            return self.back(h)
        if x is None:
            raise SimkitError(f"B is stitched at {self.layer!r} by output replacement, which needs the input x")

        def hook(module: nn.Module, inputs: Any, output: Any) -> Tensor:
            return h

        handle = self.model.get_submodule(self.layer).register_forward_hook(hook)
        try:
            return self.model(x)
        finally:
            handle.remove()
