"""Locality of a graft (spec §4): the downstream cone in a torch.fx graph and a runner that, after a
graft, recomputes exactly that cone from cached activations.

Cone of a node n: every node whose value can change when n's value changes, i.e. n's transitive users
(n itself excluded), in graph order. For a graft inserted after node u, the recomputed nodes are the
new gate node plus its cone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from simkit.errors import SimkitError, unknown_name_error


class _LeafTracer(fx.Tracer):
    def __init__(self, leaves: Iterable[str], leaf_types: tuple[type, ...] = ()) -> None:
        super().__init__()
        self.leaves = set(leaves)
        self.leaf_types = leaf_types

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or isinstance(m, self.leaf_types) or super().is_leaf_module(m, qualname)


# what fx's generated code cannot hold in a module name: it writes getattr(self, "NAME") with NAME as is
_UNPRINTABLE = re.compile(r'["\\\x00-\x1f\x7f-\x9f\u2028\u2029]')
_ORIGINAL = "simkit_original_targets"  # GraphModule.meta key: sanitised target → the model's own name

TRACE_HINT = ("cones and cached recomputation need a traceable model: graft after a whole submodule and pass "
              "the untraceable part as a leaf, or skip locality (the graft itself still works)")


def printable_name(name: str) -> str:
    """``name`` with every character that fx's generated code cannot hold (quotes, backslashes, control
    characters) replaced by ``_``; other names are returned unchanged."""
    return _UNPRINTABLE.sub("_", name)


def trace(model: nn.Module, leaves: Iterable[str] = (), *, leaf_types: tuple[type, ...] = (),
          hint: str = TRACE_HINT, class_name: str = "GraphModule",
          message: str = "torch.fx cannot trace {model} ({detail}); {hint}") -> fx.GraphModule:
    """``model`` as an fx GraphModule sharing its modules and parameters (the one fx tracer of simkit:
    stitching's cut, linearization and graft's cone all trace through here).

    leaves: qualified names that stay single call_module nodes; leaf_types: module classes that do.
    Module names fx cannot print in its generated code (a double quote, a backslash) are sanitised in
    the graph (``printable_name``, made unique) and mapped back by :func:`original_target` and
    :func:`find_node`, so such models trace. An untraceable forward is a SimkitError: ``message`` with
    ``{model}`` (its class), ``{detail}`` (fx's error) and ``{hint}``.
    """
    tracer = _LeafTracer(leaves, tuple(leaf_types))
    try:
        graph = tracer.trace(model)
    except Exception as exc:  # fx raises many types for untraceable Python
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SimkitError(message.format(model=type(model).__name__, detail=f"{type(exc).__name__}: {first[:160]}",
                                         hint=hint)) from None
    root = tracer.root
    renamed = _sanitise_targets(graph, root)
    if not renamed:
        gm = fx.GraphModule(root, graph, class_name)
    else:
        objects = {new: _lookup(root, old) for new, old in renamed.items()}
        for node in graph.nodes:  # unchanged targets come from the model as they are
            if node.op in ("call_module", "get_attr") and str(node.target) not in objects:
                objects[str(node.target)] = _lookup(root, str(node.target))
        gm = fx.GraphModule(objects, graph, class_name)
        gm.training = root.training
        gm.meta[_ORIGINAL] = dict(renamed)
    return gm


def _lookup(root: nn.Module, target: str) -> Any:
    value: Any = root
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _sanitise_targets(graph: fx.Graph, root: nn.Module) -> dict[str, str]:
    """Rewrite the call_module/get_attr targets of ``graph`` whose names fx cannot print; returns
    {new target: original target} for the rewritten ones (each path prefix renamed consistently,
    unique among its siblings)."""
    prefixes: dict[str, str] = {}  # original path prefix → new prefix
    taken: dict[str, set[str]] = {}  # new parent path → names used there

    def rename(path: str) -> str:
        if path in prefixes:
            return prefixes[path]
        parent, _, leaf = path.rpartition(".")
        new_parent = rename(parent) if parent else ""
        names = taken.setdefault(new_parent, set())
        if not names:
            try:
                owner = _lookup(root, parent) if parent else root
                names.update(name for name, _ in owner.named_children())
                names.update(name for name, _ in owner.named_parameters(recurse=False))
                names.update(name for name, _ in owner.named_buffers(recurse=False))
            except AttributeError:
                pass
        new_leaf = leaf
        if _UNPRINTABLE.search(leaf):
            base = new_leaf = printable_name(leaf)
            k = 1
            while new_leaf in names:
                new_leaf, k = f"{base}_{k}", k + 1
            names.add(new_leaf)
        prefixes[path] = f"{new_parent}.{new_leaf}" if new_parent else new_leaf
        return prefixes[path]

    renamed: dict[str, str] = {}
    for node in graph.nodes:
        if node.op in ("call_module", "get_attr") and _UNPRINTABLE.search(str(node.target)):
            old = str(node.target)
            node.target = rename(old)
            renamed[str(node.target)] = old
    return renamed


def original_target(gm: fx.GraphModule, target: Any) -> str:
    """The model's own name of a call_module/get_attr ``target`` of a GraphModule made by :func:`trace`
    (sanitised targets mapped back; others unchanged)."""
    return getattr(gm, "meta", {}).get(_ORIGINAL, {}).get(str(target), str(target))


def graph_target(gm: fx.GraphModule, name: str) -> str:
    """The inverse of :func:`original_target`: the target in ``gm`` of the model's module ``name``."""
    renamed = getattr(gm, "meta", {}).get(_ORIGINAL, {})
    return next((new for new, old in renamed.items() if old == name), name)


def keep_original_targets(source: fx.GraphModule, gm: fx.GraphModule) -> fx.GraphModule:
    """Give ``gm`` (a GraphModule built from nodes of ``source``) the name mapping of ``source``."""
    if _ORIGINAL in getattr(source, "meta", {}):
        gm.meta[_ORIGINAL] = dict(source.meta[_ORIGINAL])
    return gm


def find_node(gm: fx.GraphModule, module_name: str) -> fx.Node:
    """The call_module node of ``module_name`` (the model's own name; it must be called exactly once)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_module" and original_target(gm, n.target) == module_name]
    if not nodes:
        names = [original_target(gm, n.target) for n in gm.graph.nodes if n.op == "call_module"]
        raise unknown_name_error("graph module", module_name, names,
                                 "trace with leaves=[name] to keep a submodule as one node")
    if len(nodes) > 1:
        raise SimkitError(f"module {module_name!r} is called {len(nodes)} times in the graph; pick one call site")
    return nodes[0]


def downstream_cone(gm: fx.GraphModule, node: fx.Node | str) -> list[fx.Node]:
    """The transitive users of ``node`` (a Node or a module name), in graph order, ``node`` excluded."""
    if isinstance(node, str):
        node = find_node(gm, node)
    cone: set[fx.Node] = set()
    stack = list(node.users)
    while stack:
        n = stack.pop()
        if n not in cone:
            cone.add(n)
            stack.extend(n.users)
    return [n for n in gm.graph.nodes if n in cone]


class CachedRunner(fx.Interpreter):
    """Runs a GraphModule once, caching every node's value; after :meth:`graft` it recomputes only the
    new node and its downstream cone (``recomputed`` lists the node names of the last run; ``gm`` is
    the interpreted GraphModule).

    Values are cached per node name, so the cache is valid for the inputs of the first run only.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.gm = gm  # the same object as ``self.module``, typed as the GraphModule it is
        self.cache: dict[str, Any] = {}
        self.dirty: set[str] = set()
        self.recomputed: list[str] = []

    def run_node(self, n: fx.Node) -> Any:
        stale = (n.name not in self.cache or n.name in self.dirty
                 or any(a.name in self.dirty for a in n.all_input_nodes))
        if n.op == "placeholder" or stale:
            value = super().run_node(n)
            if n.op != "placeholder":
                self.recomputed.append(n.name)
                self.dirty.add(n.name)
            self.cache[n.name] = value
            return value
        return self.cache[n.name]

    @torch.no_grad()
    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.recomputed = []
        out = super().run(*args, **kwargs)
        self.dirty = set()
        return out

    def graft(self, after: str, module: nn.Module, name: str, consumers: Iterable[str] | None = None) -> fx.Node:
        """Insert ``module`` (registered as ``name``) on the output of module ``after``.

        consumers: names of the nodes that should read the new output (default: every user of ``after``),
        so a graft can feed only the consumer that used u's output.
        """
        gm = self.gm
        u = find_node(gm, after)
        wanted = None if consumers is None else set(consumers)
        users = [n for n in u.users if wanted is None or n.name in wanted]
        if wanted is not None and len(users) != len(wanted):
            raise unknown_name_error("consumer node", sorted(wanted - {n.name for n in users})[0],
                                     [n.name for n in u.users], f"the users of {after!r}")
        gm.add_submodule(name, module)
        with gm.graph.inserting_after(u):
            new = gm.graph.call_module(name, (u,))
        for user in users:
            user.replace_input_with(u, new)
        gm.recompile()
        self.dirty = {new.name}
        return new
