"""Replacement plans: which guide modules become which target modules, with shapes from a dry run.

A :class:`ReplacementPlan` lists :class:`Replacement` entries. Each names one guide module, or a group
of consecutive guide modules forming a chain (the output of one is the input of the next), and a
factory that builds the target module from the resolved :class:`Slot` (names, per-example input and
output shapes, the guide modules themselves). :func:`resolve_plan` runs the guide once on a small
sample to infer the shapes and the forward order, builds every target module and checks that it maps
the guide's input shape to the guide's output shape. Errors name the missing module, or both shapes.

In the hybrid/target network the target module sits at the first name of its group; the others
become :class:`~simkit.conversion.modules.Passthrough` (spec §1: "groups map to one target block").
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from simkit.conversion.modules import Passthrough
from simkit.conversion.task import logits_of
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import eval_mode
from simkit.layers import select_output
from simkit.seeding import derive_seed
from simkit.surgery import replace_module


@dataclass
class Slot:
    """One resolved replacement.

    names: the guide modules replaced, in forward order. in_shape: input of ``names[0]`` per example;
    out_shape: output of ``names[-1]`` per example. guide_modules: the guide's modules (read only).
    align: what is aligned to the guide — ``output`` (the group's output) or ``delta`` (output − input,
    the residual branch of a residual block, whose output is otherwise dominated by its input).
    skip_tokens: leading tokens (rows of a (T, d) output) left out of the aligned map, e.g. a ViT's class
    token, which a token-wise target cannot reproduce (0: none).
    """

    names: tuple[str, ...]
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    guide_modules: tuple[nn.Module, ...]
    factory: Callable[[Slot], nn.Module] | None = None
    module: nn.Module | None = None
    align: str = "output"
    skip_tokens: int = 0

    @property
    def site(self) -> str:
        """Where the target module sits in the hybrid (the group's first module)."""
        return self.names[0]

    @property
    def output_name(self) -> str:
        """The guide module whose output the target reproduces (the group's last module)."""
        return self.names[-1]

    @property
    def label(self) -> str:
        return self.names[0] if len(self.names) == 1 else f"{self.names[0]}..{self.names[-1]}"

    @property
    def target(self) -> nn.Module:
        """The built target module (after :func:`resolve_plan`)."""
        if self.module is None:
            raise SimkitError(f"internal: slot {self.label!r} has no target module; resolve the plan first")
        return self.module


@dataclass
class Replacement:
    """guide: a module name or a tuple of consecutive names; factory: ``Slot -> nn.Module``;
    align: ``output`` or ``delta``; skip_tokens: leading tokens left out of the aligned map (see
    :class:`Slot`)."""

    guide: str | tuple[str, ...]
    factory: Callable[[Slot], nn.Module]
    align: str = "output"
    skip_tokens: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        return (self.guide,) if isinstance(self.guide, str) else tuple(self.guide)


@dataclass
class ReplacementPlan:
    """What to replace. head: the module whose output is the task output (retrained first in
    fine-tuning); None = the last module with parameters that runs in the dry run."""

    replacements: list[Replacement] = field(default_factory=list)
    head: str | None = None
    description: str = ""

    @classmethod
    def coerce(cls, plan: Any) -> ReplacementPlan:
        """A ReplacementPlan, or a dict ``{name or tuple of names: factory}`` as a plan file may return."""
        if isinstance(plan, ReplacementPlan):
            return plan
        if isinstance(plan, dict):
            return cls([Replacement(key, factory) for key, factory in plan.items()])
        raise SimkitError(f"a plan must be a ReplacementPlan or a dict of name -> factory, got "
                          f"{type(plan).__name__}; see simkit.conversion.plans")


def tensor_in(value: Any, layer: str = "") -> torch.Tensor | None:
    """The tensor of a module's output or positional arguments (``simkit.layers.select_output``), or
    None when it holds none."""
    try:
        return select_output(value, layer=layer)
    except SimkitError:
        return None


@dataclass
class DryRun:
    """What one guide forward pass showed: per module its inputs/outputs (first tensor), call order."""

    inputs: dict[str, torch.Tensor]
    args: dict[str, tuple[tuple, dict]]
    outputs: dict[str, torch.Tensor]
    order: list[str]
    model_output: Any


def dry_run(model: nn.Module, names: Sequence[str], run: Callable[[nn.Module], Any]) -> DryRun:
    """Run ``run(model)`` once (eval mode, no grad) recording each named module's first input tensor,
    its full call arguments, its output tensor and the order of first calls."""
    inputs: dict[str, torch.Tensor] = {}
    args: dict[str, tuple[tuple, dict]] = {}
    outputs: dict[str, torch.Tensor] = {}
    order: list[str] = []
    handles: list[Any] = []

    def pre_hook(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, a: tuple, kw: dict) -> None:
            if name not in args:
                args[name] = (a, kw)
                x = tensor_in(a, name)
                if x is not None:
                    inputs[name] = x
        return hook

    def post_hook(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, a: tuple, output: Any) -> None:
            if name not in order:
                order.append(name)
                y = tensor_in(output, name)
                if y is not None:
                    outputs[name] = y
        return hook

    try:
        for name in names:
            module = model.get_submodule(name)
            handles.append(module.register_forward_pre_hook(pre_hook(name), with_kwargs=True))
            handles.append(module.register_forward_hook(post_hook(name)))
        with eval_mode(model), torch.no_grad():
            result = run(model)
    finally:
        for handle in handles:
            handle.remove()
    return DryRun(inputs, args, outputs, order, result)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape[1:])


def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def resolve_plan(plan: ReplacementPlan, guide: nn.Module, run: Callable[[nn.Module], Any], *,
                 seed: int = 0) -> tuple[list[Slot], str]:
    """Slots in forward order, each with its target module built and shape-checked, plus the head name.

    run: ``model -> output`` on a small sample batch (b ≥ 2) of the task's inputs.
    Raises SimkitError for unknown modules, groups that are not chains, overlapping groups, modules
    that never run, targets whose output shape differs from the guide's (both shapes named), and a
    head whose output is not the model's output.
    """
    plan = ReplacementPlan.coerce(plan)
    if not plan.replacements:
        raise SimkitError("the replacement plan is empty; it must name at least one guide module")
    known = dict(guide.named_modules())
    candidates = [n for n in known if n]
    claimed = _claimed(plan, known, candidates)

    head = plan.head
    leaf_with_params = [n for n, m in guide.named_modules()
                        if n and not list(m.children()) and list(m.parameters(recurse=False))]
    watch = set(claimed) | set(leaf_with_params) | ({head} if head else set())
    if head is not None and head not in known:
        raise unknown_name_error("head module", head, candidates, "set plan.head to the output layer")
    probe = dry_run(guide, sorted(watch), run)

    slots = [_slot(rep, guide, probe) for rep in plan.replacements]
    slots.sort(key=lambda s: probe.order.index(s.site))
    for index, slot in enumerate(slots):
        slot.module = _build_target(slot, probe, derive_seed(seed, "plan", index))
    return slots, _head(head, probe, leaf_with_params, claimed)


def _claimed(plan: ReplacementPlan, known: dict[str, nn.Module], candidates: list[str]) -> dict[str, str]:
    """Every guide module the plan replaces → the first name of its group; unknown names, a module in two
    replacements and a module replaced along with its submodule are errors."""
    claimed: dict[str, str] = {}
    for rep in plan.replacements:
        for name in rep.names:
            if name not in known or not name:
                raise unknown_name_error("guide module", name, candidates,
                                         "run `simkit layers GUIDE` to list the module names")
            if name in claimed:
                raise SimkitError(f"guide module {name!r} appears in two replacements; each module can "
                                  "be replaced once")
            claimed[name] = rep.names[0]
    for name in claimed:
        for other in claimed:
            if other != name and other.startswith(name + "."):
                raise SimkitError(f"plan replaces both {name!r} and its submodule {other!r}; "
                                  "name only one of them")
    return claimed


def _slot(rep: Replacement, guide: nn.Module, probe: DryRun) -> Slot:
    """The slot of one replacement, its shapes from the dry run (no target module yet); its modules must
    have run on tensors, form a chain, and suit its ``align``."""
    for name in rep.names:
        if name not in probe.order or name not in probe.inputs or name not in probe.outputs:
            raise SimkitError(f"guide module {name!r} did not run on a tensor in the dry run; "
                              "replace a module on the forward path")
    for a, b in zip(rep.names, rep.names[1:], strict=False):
        if probe.outputs[a] is not probe.inputs[b]:
            raise SimkitError(f"group {rep.names} is not a chain: the output of {a!r} is not the "
                              f"input of {b!r}; list consecutive modules in forward order")
    slot = Slot(names=rep.names, in_shape=_shape(probe.inputs[rep.names[0]]),
                out_shape=_shape(probe.outputs[rep.names[-1]]),
                guide_modules=tuple(guide.get_submodule(n) for n in rep.names),
                factory=rep.factory, align=rep.align, skip_tokens=rep.skip_tokens)
    if slot.align not in ("output", "delta"):
        raise SimkitError(f"replacement {slot.label!r}: align must be 'output' or 'delta', got {slot.align!r}")
    skip = slot.skip_tokens
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0 \
            or (skip and (len(slot.out_shape) != 2 or skip >= slot.out_shape[0])):
        raise SimkitError(f"replacement {slot.label!r}: skip_tokens must be an integer from 0 to fewer than the "
                          f"tokens of a (T, d) output, got {skip!r} for output {_fmt(slot.out_shape)}")
    if slot.align == "delta" and slot.in_shape != slot.out_shape:
        raise SimkitError(f"replacement {slot.label!r} aligns on output − input but maps "
                          f"{_fmt(slot.in_shape)} to {_fmt(slot.out_shape)}; use align='output'")
    return slot


def _build_target(slot: Slot, probe: DryRun, seed: int) -> nn.Module:
    """The slot's target module, built by its factory under ``seed`` (the caller's RNG left alone), moved
    to the guide's device and checked to map the guide's input to the guide's output shape."""
    if slot.factory is None:
        raise SimkitError(f"replacement {slot.label!r} has no factory")
    with torch.random.fork_rng(devices=[]):  # seeded per slot; the caller's RNG is left alone
        torch.manual_seed(seed)
        module = slot.factory(slot)
    if not isinstance(module, nn.Module):
        raise SimkitError(f"the plan's factory for {slot.label!r} returned {type(module).__name__}, "
                          "not a torch.nn.Module")
    call_args, call_kwargs = probe.args[slot.site]
    ref = tensor_in(call_args, slot.site)
    if ref is not None:  # built on the CPU from a seeded generator, then moved to the guide's device
        module.to(ref.device)
    try:
        with torch.no_grad(), eval_mode(module):
            out = tensor_in(module(*call_args, **call_kwargs), slot.label)
    except SimkitError:
        raise
    except Exception as exc:  # a factory that built the wrong input size fails here
        raise SimkitError(f"the target for {slot.label!r} ({type(module).__name__}) fails on the "
                          f"guide's input of shape {_fmt(slot.in_shape)}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}; make the factory accept "
                          "that shape") from None
    got = _shape(out) if out is not None else None
    if got != slot.out_shape:
        raise SimkitError(f"shape mismatch for {slot.label!r}: the target {type(module).__name__} "
                          f"outputs {_fmt(got) if got is not None else 'no tensor'} but the guide "
                          f"outputs {_fmt(slot.out_shape)} (input {_fmt(slot.in_shape)}); make the "
                          "factory produce the guide's output shape")
    return module


def _head(head: str | None, probe: DryRun, leaf_with_params: list[str], claimed: dict[str, str]) -> str:
    """The head: ``head`` as given, else the last module with parameters that ran; it must not be
    replaced and must produce the model's output."""
    if head is None:
        ran = [n for n in probe.order if n in leaf_with_params]
        if not ran:
            raise SimkitError("cannot find the guide's head (no module with parameters ran); set plan.head")
        head = ran[-1]
    if any(head == n or head.startswith(n + ".") for n in claimed):
        raise SimkitError(f"the head {head!r} is replaced by the plan; keep the output layer and set "
                          "plan.head to it")
    try:
        final: torch.Tensor | None = logits_of(probe.model_output)
    except SimkitError:
        final = None
    if head not in probe.outputs or probe.outputs[head] is not final:
        raise SimkitError(f"the head {head!r} does not produce the model's output; set plan.head to the "
                          "module whose output is the model output")
    return head


def install(model: nn.Module, slot: Slot, module: nn.Module | None = None) -> nn.Module:
    """Put ``module`` (default: the slot's target) at ``slot.site`` in ``model`` through surgery; the
    rest of the group becomes Passthrough. Returns the installed module."""
    module = slot.module if module is None else module
    if module is None:
        raise SimkitError(f"internal: slot {slot.label!r} has no target module; resolve the plan first")
    replace_module(model, slot.site, module)
    for name in slot.names[1:]:
        replace_module(model, name, Passthrough())
    return module


def build_target(guide: nn.Module, slots: Sequence[Slot]) -> nn.Module:
    """A copy of ``guide`` with every slot's target installed (the converted architecture)."""
    target = copy.deepcopy(guide)
    for slot in slots:
        install(target, slot, copy.deepcopy(slot.target))
    return target
