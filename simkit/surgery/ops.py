"""The mutations: replace a submodule, insert a module after one, graft a gated residual block.

Structure after ``insert_after(model, "u", new)`` and after a graft: the module at ``u`` becomes
``nn.Sequential(old_u, new)``, so old parameter names gain a ``.0`` (``u.weight`` → ``u.0.weight``)
and the new module lives at ``u.1``. A graft after ``u`` therefore reroutes exactly the edge from u to
the consumer that used u's output; u must run once per forward pass (checked on the probe batch).
Probe passes run under a forked RNG (grafting changes no RNG) in the model's current modes: call
it under ``simkit.forward.eval_mode(model)`` so that they change no running statistic either (the
graft runner does). The new gate takes the train/eval mode of the module it follows.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from simkit.errors import SimkitError, unknown_name_error
from simkit.settings.graft import DOUBLE_ZERO, GATES
from simkit.surgery.branches import (
    GatedResidual,
    branch_spec,
    build_branch,
    zero_output_projections,
)
from simkit.surgery.exact import flatten_tensors, output_mismatches, preconditions
from simkit.surgery.optim import add_new_params


def get_module(model: nn.Module, name: str) -> nn.Module:
    """The submodule called ``name``; SimkitError listing the closest names when there is none."""
    names = [n for n, _ in model.named_modules() if n]
    if name not in names:
        raise unknown_name_error("module", name, names, "run `simkit layers MODEL` to list them")
    return model.get_submodule(name)


def _module_class(module: nn.Module) -> str:
    return f"{type(module).__module__}.{type(module).__qualname__}"


def replace_module(model: nn.Module, name: str, new: nn.Module, *, log: Any = None) -> nn.Module:
    """Put ``new`` at ``name``; returns the old module."""
    old = get_module(model, name)
    model.set_submodule(name, new)
    if log is not None:
        log.append({"op": "replace", "name": name, "module": _module_class(new)})
    return old


def insert_after(model: nn.Module, name: str, new: nn.Module, *, log: Any = None) -> nn.Module:
    """Run ``new`` on the output of module ``name``: it becomes ``Sequential(old, new)``; returns it."""
    old = get_module(model, name)
    chain = nn.Sequential(old, new)
    model.set_submodule(name, chain)
    if log is not None:
        log.append({"op": "insert_after", "name": name, "module": _module_class(new)})
    return chain


@dataclass
class Graft:
    """What a graft did and what the exactness checks found.

    name: where the gate lives (``after + ".1"``); preconditions: counts from the probe batch
    (see :func:`simkit.surgery.exact.preconditions`); values_compared / mismatches: bits of the model's
    outputs on the probe before vs after; site_mismatches: the same at the graft site;
    bookkeeping_s: seconds spent mutating the model, the optimizer and the log (no forward passes).
    """

    after: str
    name: str
    gate: GatedResidual
    record: dict[str, Any]
    preconditions: dict[str, int] = field(default_factory=dict)
    values_compared: int = 0
    mismatches: int = 0
    site_mismatches: int = 0
    bookkeeping_s: float = 0.0


@torch.no_grad()
def _probe(model: nn.Module, module: nn.Module, probe: Any, name: str) -> tuple[list[Tensor], Tensor, int]:
    """Run ``model(probe)`` (modes as they are, RNG forked); return (flattened outputs, output of
    ``module``, its call count)."""
    seen: list[Any] = []
    handle = module.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.random.fork_rng(devices=[]):
            out = model(*probe) if isinstance(probe, tuple) else model(probe)
    finally:
        handle.remove()
    if not seen:
        return [t.clone() for t in flatten_tensors(out)], torch.empty(0), 0
    site = seen[0]
    if not isinstance(site, Tensor):
        children = [n for n, _ in module.named_children()]
        hint = f" (e.g. {name}.{children[-1]})" if children else ""
        raise SimkitError(f"the output of {name!r} is a {type(site).__name__}, not one tensor: this edge cannot "
                          f"carry a gated residual; graft after a submodule that returns a tensor{hint}")
    if not site.is_floating_point():
        raise SimkitError(f"the output of {name!r} has dtype {site.dtype}; a gated residual needs a floating "
                          "point stream, graft after a later module")
    return [t.clone() for t in flatten_tensors(out)], site.clone(), len(seen)


def graft_gated_residual(model: nn.Module, after: str,  # noqa: C901
                         branch: str | nn.Module = "mlp", gate: str = "shadow", *,
                         probe: Any = None, allow_double_zero: bool = False, seed: int = 0,
                         optimizer: Optimizer | None = None, warm_start_second_moment: bool = False,
                         log: Any = None) -> Graft:
    """Graft F(x) = x + α·R(x) on the output of module ``after``.

    branch: "mlp" | "llama" | "conv" (built from the probe's stream shape, initialised from ``seed``)
        or any module mapping the stream (b, ...) to the same shape.
    gate: "shadow" (α = 0, R random: exact identity, α gets gradient at step 1), "net2net" (α = 1, R's
        output projections zero), "double_zero" (both; refused unless ``allow_double_zero``).
    probe: a model input (or tuple of inputs) for the checks; required for built-in branches.
        Checked: ``after`` runs once, its output is one floating tensor, R keeps its shape, the paper's
        preconditions (finite, no −0.0), the double-zero case, and bit mismatches of the outputs.
        The probe runs in the model's current modes (see the module docstring).
    optimizer: the new parameters (α and R's) join it via :func:`add_new_params`.
    log: a :class:`simkit.surgery.GraftLog` that records the graft.
    """
    if gate not in GATES:
        raise SimkitError(f"unknown gate {gate!r}; use 'shadow' or 'net2net'")
    if gate == "double_zero" and not allow_double_zero:
        raise SimkitError(DOUBLE_ZERO)
    target = get_module(model, after)
    if probe is None and isinstance(branch, str):
        raise SimkitError(f"a built-in branch ({branch!r}) is sized from a probe batch; pass probe=<model input>")
    before: list[Tensor] = []
    site: Tensor | None = None
    if probe is not None:
        before, site, calls = _probe(model, target, probe, after)
        if calls != 1:
            raise SimkitError(f"module {after!r} ran {calls} times in one forward pass; a graft after it would "
                              "change every use; graft after a module that runs exactly once")
    start = time.perf_counter()
    if isinstance(branch, str):
        if site is None:
            raise SimkitError(f"a built-in branch ({branch!r}) is sized from a probe batch; pass probe=<model input>")
        spec = branch_spec(branch, tuple(site.shape[1:]), seed, site.dtype)
        module = build_branch(spec).to(site.device)
    else:
        spec, module = {"kind": "module", "class": _module_class(branch)}, branch
    alpha = 1.0 if gate == "net2net" else 0.0
    if gate in ("net2net", "double_zero"):
        zero_output_projections(module)
    dtype = site.dtype if site is not None else next((p.dtype for p in module.parameters()), torch.float32)
    gated = GatedResidual(module, alpha=alpha, dtype=dtype)
    if site is not None:
        gated = gated.to(site.device)
    gated.train(target.training)  # a new module, in the mode of the one it follows
    elapsed = time.perf_counter() - start
    checks: dict[str, int] = {}
    if site is not None:
        with torch.no_grad():
            r = module(site)
        if r.shape != site.shape:
            raise SimkitError(f"branch output shape {tuple(r.shape)} differs from the stream shape {tuple(site.shape)} "
                              f"after {after!r}; the branch must map the stream to its own shape")
        checks = preconditions(site, r)
        if alpha == 0.0 and bool((r == 0).all()) and not allow_double_zero:
            raise SimkitError(DOUBLE_ZERO)
    start = time.perf_counter()
    insert_after(model, after, gated)
    record = {"op": "graft", "after": after, "branch": spec, "gate": gate, "alpha": alpha,
              "optimizer": optimizer is not None, "warm_start_second_moment": bool(warm_start_second_moment)}
    if optimizer is not None:
        add_new_params(optimizer, gated.parameters(), warm_start_second_moment=warm_start_second_moment)
    if log is not None:
        log.append(record)
    elapsed += time.perf_counter() - start
    result = Graft(after=after, name=f"{after}.1", gate=gated, record=record, preconditions=checks,
                   bookkeeping_s=elapsed)
    if probe is not None and site is not None:
        after_out, new_site, _ = _probe(model, model.get_submodule(after), probe, after)
        result.values_compared, result.mismatches = output_mismatches(before, after_out)
        result.site_mismatches = output_mismatches([site], [new_site])[1]
    return result


def attach_graft(model: nn.Module, record: dict[str, Any], module: nn.Module | None = None,
                 optimizer: Optimizer | None = None) -> GatedResidual:
    """Redo a logged graft without checks (used by :meth:`GraftLog.replay`); returns the gate."""
    spec = record["branch"]
    if spec["kind"] == "module":
        if module is None:
            raise SimkitError(f"the graft after {record['after']!r} used a user branch ({spec['class']}); "
                              "pass it to replay(modules={index: module})")
        branch = module
    else:
        branch = build_branch(spec)
    if record["gate"] in ("net2net", "double_zero"):
        zero_output_projections(branch)
    target = get_module(model, record["after"])
    device = next((p.device for p in target.parameters()), torch.device("cpu"))
    dtype = getattr(torch, spec["dtype"]) if "dtype" in spec else torch.float32
    gated = GatedResidual(branch, alpha=record["alpha"], dtype=dtype).to(device)
    insert_after(model, record["after"], gated)
    if optimizer is not None and record.get("optimizer"):
        add_new_params(optimizer, gated.parameters())
    return gated
