"""Locality of a graft (spec §4): the downstream cone in a torch.fx graph and a runner that, after a
graft, recomputes exactly that cone from cached activations.

Cone of a node n: every node whose value can change when n's value changes, i.e. n's transitive users
(n itself excluded), in graph order. For a graft inserted after node u, the recomputed nodes are the
new gate node plus its cone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from simkit.errors import SimkitError, unknown_name_error


class _LeafTracer(fx.Tracer):
    def __init__(self, leaves: Iterable[str]) -> None:
        super().__init__()
        self.leaves = set(leaves)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return qualname in self.leaves or super().is_leaf_module(m, qualname)


def trace(model: nn.Module, leaves: Iterable[str] = ()) -> fx.GraphModule:
    """``model`` as an fx GraphModule; modules named in ``leaves`` stay single call_module nodes."""
    try:
        graph = _LeafTracer(leaves).trace(model)
    except Exception as exc:  # fx raises many types for untraceable Python
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SimkitError(f"torch.fx cannot trace {type(model).__name__} ({first}); cones and cached "
                          "recomputation need a traceable model: graft after a whole submodule and pass the "
                          "untraceable part as a leaf, or skip locality (the graft itself still works)") from None
    return fx.GraphModule(model, graph)


def find_node(gm: fx.GraphModule, module_name: str) -> fx.Node:
    """The call_module node of ``module_name`` (it must be called exactly once)."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_module" and n.target == module_name]
    if not nodes:
        names = [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]
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
