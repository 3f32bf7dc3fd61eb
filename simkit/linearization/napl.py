"""Path-length statistics of a network's torch.fx graph: NAPL, the path-length distribution, APL.

A path runs from an input to the output along the traced graph; its length is the number of
nonlinear units on it. Dynamic programming over the nodes in topological order carries, per node,
the distribution of path lengths from the inputs to that node:

- input: length 0 with probability 1;
- activation (ReLU, SlopeReLU, PReLU, GELU, ...): convolve with Bernoulli(p_l), where p_l is the
  fraction of channels with α ≠ 1 (with ``threshold`` > 0: with |1 − α| > threshold) (an original ReLU
  or other activation counts 1);
- any other op with one path input (conv, linear, batch norm, pooling, reshape, ...): unchanged
  (linear ops add 0; max-pooling is counted as 0 too [ours]);
- a merge of several path inputs (add, cat, mul, ...): the mean of the branch distributions, so
  ``x + F(x)`` gives ½·F + ½·shortcut (the normalised average path length, NAPL);
- an in-place op (``x.relu_()``) also stands for its first argument from then on;
- shape queries (``x.size(0)``, ``x.shape``, ``x.dim()``) and anything computed only from them,
  constants (``torch.zeros_like(x)``, ``x.new_zeros(...)``) and parameters carry no path, so ``x.view(x.size(0), -1)`` is not a merge.

torch.nn modules that fx keeps whole but that hide nonlinearities (Transformer layers, RNNs, attention)
count as linear, with a warning naming them.

NAPL is the mean of the output's distribution; a plain network gives Σ p_l and n residual blocks
with one activation each give Binomial(n, ½). The *unnormalised* average path length (APL) weighs
every distinct input-to-output path equally instead of halving at each merge (merged branches are
weighted by how many paths they carry); it equals NAPL for ResNets and differs for networks whose
branches carry different numbers of paths.
"""

from __future__ import annotations

import builtins
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.fx as fx
import torch.nn.functional as F
from torch import nn

from simkit.errors import SimkitError
from simkit.forward import Batch, eval_mode
from simkit.linearization.prelu import RELU_FUNCTIONS, RELU_METHODS
from simkit.linearization.slope import SlopeReLU
from simkit.linearization.trace import dry_run, trace

ACTIVATION_MODULES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.SELU,
                      nn.CELU, nn.Softplus, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh,
                      nn.LeakyReLU, nn.GLU, nn.Softsign, nn.Tanhshrink)
ACTIVATION_FUNCTIONS = set(RELU_FUNCTIONS) | {
    F.relu6, F.gelu, F.silu, F.elu, F.selu, F.celu, F.softplus, F.mish, F.hardswish, F.hardsigmoid,
    F.hardtanh, F.leaky_relu, F.glu, torch.tanh, torch.sigmoid, F.tanh, F.sigmoid}
ACTIVATION_METHODS = set(RELU_METHODS) | {"tanh", "sigmoid", "tanh_", "sigmoid_"}
# torch.nn modules that fx keeps as one node although they contain nonlinearities of their own
OPAQUE_MODULES = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder,
                  nn.TransformerDecoder, nn.Transformer, nn.RNNBase, nn.MultiheadAttention)
SHAPE_METHODS = {"size", "dim", "numel", "nelement", "stride", "type", "get_device", "is_contiguous",
                 "is_floating_point", "element_size", "ndimension"}
SHAPE_ATTRIBUTES = {"shape", "ndim", "dtype", "device", "is_cuda", "requires_grad"}
CONSTANT_METHODS = {"new_zeros", "new_ones", "new_full", "new_empty", "new_tensor"}
CONSTANT_FUNCTIONS = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like,
                      torch.randn_like, torch.randint_like}


@dataclass
class Activation:
    """One activation node: its name, op, channel count and p (fraction of nonlinear channels)."""

    name: str
    op: str
    channels: int
    p: float


@dataclass
class PathLengths:
    """Path-length statistics of one network.

    napl: mean of ``distribution``; distribution: (L + 1,) P(length = k) with merges averaged;
    apl: mean of ``apl_distribution`` (every path weighted equally); num_paths: number of distinct
    input-to-output paths (float, may be huge); activations: per activation site, in graph order.
    """

    napl: float
    distribution: np.ndarray
    apl: float
    apl_distribution: np.ndarray
    num_paths: float
    activations: list[Activation] = field(default_factory=list)

    @property
    def nonlinear_fraction(self) -> float:
        """Fraction of all activation channels still nonlinear (channel-weighted)."""
        total = sum(a.channels for a in self.activations)
        return float(sum(a.p * a.channels for a in self.activations) / total) if total else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (strict JSON: an unknown nonlinear fraction is None, not NaN)."""
        fraction = self.nonlinear_fraction
        return {"napl": self.napl, "distribution": self.distribution.tolist(), "apl": self.apl,
                "apl_distribution": self.apl_distribution.tolist(), "num_paths": self.num_paths,
                "nonlinear_fraction": None if np.isnan(fraction) else fraction,
                "activations": [vars(a) for a in self.activations]}


def _activation_p(node: fx.Node, gm: fx.GraphModule, threshold: float = 0.0) -> tuple[float, int] | None:
    """(p, channels) when ``node`` is an activation, else None (channels 0 when unknown); slopes with
    |1 − α| ≤ ``threshold`` count as linear (0: only α = 1)."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if isinstance(module, SlopeReLU):
            return module.nonlinear_fraction(threshold), module.channels
        if isinstance(module, nn.PReLU):
            weight = module.weight
            nonlinear = weight != 1 if threshold == 0 else (1 - weight).abs() > threshold
            return float(nonlinear.float().mean()), weight.numel()
        if isinstance(module, nn.LeakyReLU) and module.negative_slope == 1:
            return 0.0, 0
        if isinstance(module, ACTIVATION_MODULES):
            return 1.0, 0
    elif node.op == "call_function" and node.target in ACTIVATION_FUNCTIONS:
        return 1.0, 0
    elif node.op == "call_method" and node.target in ACTIVATION_METHODS:
        return 1.0, 0
    return None


def _is_shape_query(node: fx.Node) -> bool:
    """Shape/type queries and constructors that only read a tensor's shape (``x.new_zeros``)."""
    if node.op == "call_method":
        return node.target in SHAPE_METHODS or node.target in CONSTANT_METHODS
    if node.op == "call_function":
        if node.target in CONSTANT_FUNCTIONS:
            return True
        if node.target is builtins.getattr:
            return len(node.args) > 1 and node.args[1] in SHAPE_ATTRIBUTES
        return node.target in (builtins.len, torch.numel)
    return False


def _tensor_nodes(gm: fx.GraphModule, example: Batch) -> set[fx.Node]:
    """Nodes whose value on ``example`` is a tensor (one run through fx's Interpreter, eval mode)."""
    found: set[fx.Node] = set()

    class Recorder(fx.Interpreter):
        def run_node(self, n: fx.Node) -> Any:
            value = super().run_node(n)
            if isinstance(value, torch.Tensor):
                found.add(n)
            return value

    with eval_mode(gm):
        dry_run(Recorder(gm).run, example)
    return found


def _in_place(node: fx.Node, gm: fx.GraphModule) -> bool:
    """Whether ``node`` overwrites its first argument (``x.relu_()``, ``ReLU(inplace=True)``, ...)."""
    if node.op == "call_module":
        return bool(getattr(gm.get_submodule(str(node.target)), "inplace", False))
    if node.op == "call_method":
        method = str(node.target)
        return method.endswith("_") and not method.startswith("__")
    if node.op == "call_function":
        name = getattr(node.target, "__name__", "")
        return bool(node.kwargs.get("inplace", False)) or (name.endswith("_") and not name.startswith("__"))
    return False


def _input_nodes(node: fx.Node) -> list[fx.Node]:
    """Distinct fx nodes among ``node``'s args and kwargs, in order."""
    seen: dict[fx.Node, None] = {}
    fx.node.map_arg((node.args, node.kwargs), lambda n: seen.setdefault(n, None))
    return list(seen)


def _bernoulli(dist: np.ndarray, p: float) -> np.ndarray:
    out = np.zeros(len(dist) + 1)
    out[:-1] += (1 - p) * dist
    out[1:] += p * dist
    return out


def _mix(dists: list[np.ndarray], weights: list[float]) -> np.ndarray:
    out = np.zeros(max(len(d) for d in dists))
    total = float(sum(weights))
    for dist, weight in zip(dists, weights, strict=True):
        out[: len(dist)] += (weight / total) * dist
    return out


def path_lengths(model: nn.Module, example: Batch | None = None, threshold: float = 0.0) -> PathLengths:
    """NAPL, path-length distributions and activation list of ``model``'s traced graph.

    example: optional batch (Tensor (N, ...) or dict); when given, nodes are classified as tensors or
    not from a real run instead of from the static shape-query rules alone. threshold: a slope counts
    as nonlinear only when |1 − α| exceeds it (0, the default: whenever α ≠ 1).
    Raises SimkitError when the model cannot be traced or no path reaches the output.
    """
    gm = model if isinstance(model, fx.GraphModule) else trace(model)
    tensors = _tensor_nodes(gm, example) if example is not None else None
    normalised: dict[fx.Node, np.ndarray] = {}
    counted: dict[fx.Node, tuple[np.ndarray, float]] = {}
    activations: list[Activation] = []
    output = None
    for node in gm.graph.nodes:
        if node.op == "output":
            output = node
            break
        if tensors is not None and node not in tensors:
            continue
        if node.op == "placeholder":
            normalised[node] = np.ones(1)
            counted[node] = (np.ones(1), 1.0)
            continue
        if node.op == "get_attr" or _is_shape_query(node):
            continue
        inputs = [n for n in _input_nodes(node) if n in normalised]
        if not inputs:
            continue
        dist = _mix([normalised[n] for n in inputs], [1.0] * len(inputs))
        counts = [counted[n][1] for n in inputs]
        apl_dist = _mix([counted[n][0] for n in inputs], counts)
        opaque = gm.get_submodule(str(node.target)) if node.op == "call_module" else None
        if isinstance(opaque, OPAQUE_MODULES):
            warnings.warn(f"{node.target} ({type(opaque).__name__}) is one torch.fx node; "
                          "the nonlinearities inside it are not counted in NAPL", RuntimeWarning, stacklevel=2)
        found = _activation_p(node, gm, threshold)
        if found is not None:
            p, channels = found
            dist, apl_dist = _bernoulli(dist, p), _bernoulli(apl_dist, p)
            activations.append(Activation(name=str(node.target) if node.op == "call_module" else node.name,
                                          op=node.op, channels=channels, p=p))
        normalised[node] = dist
        counted[node] = (apl_dist, float(sum(counts)))
        if _in_place(node, gm) and node.args and isinstance(node.args[0], fx.Node):
            # later readers of the overwritten tensor see this node's paths
            normalised[node.args[0]], counted[node.args[0]] = normalised[node], counted[node]
    ends = [] if output is None else [n for n in _input_nodes(output) if n in normalised]
    if not ends:
        raise SimkitError(f"no path from the inputs reaches the output of {type(model).__name__}; "
                          "NAPL needs a model whose output is computed from its input")
    dist = _mix([normalised[n] for n in ends], [1.0] * len(ends))
    counts = [counted[n][1] for n in ends]
    apl_dist = _mix([counted[n][0] for n in ends], counts)
    lengths = np.arange(len(dist))
    return PathLengths(napl=float(lengths @ dist), distribution=dist,
                       apl=float(np.arange(len(apl_dist)) @ apl_dist), apl_distribution=apl_dist,
                       num_paths=float(sum(counts)), activations=activations)


__all__ = ["Activation", "PathLengths", "path_lengths"]
