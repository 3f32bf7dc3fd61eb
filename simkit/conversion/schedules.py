"""Conversion schedules (spec §1) and the guide-activation cache they all share.

Slots are numbered 0..S−1 in forward order. A schedule is a list of :class:`Stage`:

- progressive: stage s swaps in module s; trains modules 0..s; loss = mean_{l≤s} d(T_l, G_l);
  the hybrid's forward pass stops right after module s (nothing downstream enters the loss).
- sequential: like progressive, but only module s trains and only d(T_s, G_s) is the loss (the
  frozen earlier terms carry no gradient).
- independent: module l trains alone on the guide's own input to it, d(T_l(G_in_l), G_l); after the
  last stage every module is swapped in together.
- joint: every module swapped in at once, all train, loss over all layers; S × the stage budget
  (``stage_steps``: the same alignment budget as the staged schedules).

The guide is frozen: :func:`guide_cache` runs it once over the data (one forward pass per batch) and
keeps every slot's output (and, for independent, input) for all samples; every stage of every
schedule and metric reads the cache by sample index. Nothing in a stage recomputes the guide.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from simkit.conversion.plans import Slot, install
from simkit.conversion.task import Inputs, logits_of, rows, run_model, take
from simkit.errors import SimkitError, unknown_name_error
from simkit.forward import eval_mode
from simkit.layers import select_output
from simkit.settings.convert import SCHEDULES
from simkit.training import TrainHistory


@dataclass(frozen=True)
class Stage:
    """install: slots swapped into the hybrid at the start; train: slots whose modules train; align:
    slots in the loss; stop_after: slot after which the forward stops (None: full pass); isolated:
    modules run on cached guide inputs instead of inside the hybrid; steps: the step budget."""

    name: str
    install: tuple[int, ...]
    train: tuple[int, ...]
    align: tuple[int, ...]
    stop_after: int | None
    isolated: bool
    steps: int


def plan_stages(schedule: str, n_slots: int, stage_steps: int) -> list[Stage]:
    """The stages of ``schedule`` for ``n_slots`` modules.

    stage_steps: the step budget of one stage, ``ConvertSettings.stage_steps`` (validated there): the
    fixed ``steps_per_stage``, or the cap ``max_stage_steps`` of an automatic stage; joint's one stage
    gets it times ``n_slots``."""
    if schedule not in SCHEDULES:
        raise unknown_name_error("schedule", schedule, SCHEDULES, f"valid: {', '.join(SCHEDULES)}")
    every = tuple(range(n_slots))
    if schedule == "joint":
        return [Stage("joint", every, every, every, n_slots - 1, False, stage_steps * n_slots)]
    stages = []
    for s in range(n_slots):
        if schedule == "progressive":
            stages.append(Stage(f"stage{s + 1}", (s,), every[:s + 1], every[:s + 1], s, False, stage_steps))
        elif schedule == "sequential":
            stages.append(Stage(f"stage{s + 1}", (s,), (s,), (s,), s, False, stage_steps))
        else:
            stages.append(Stage(f"stage{s + 1}", (), (s,), (s,), None, True, stage_steps))
    return stages


@dataclass
class GuideCache:
    """The frozen guide's activations for every sample, computed once.

    outputs[l]: (n, *out_shape) output of slot l; inputs[l]: (n, *in_shape) its input (or None);
    logits: (n, ...) guide output (or None); batches: guide forward passes made (= ceil(n / batch)).
    """

    outputs: list[Tensor]
    inputs: list[Tensor] | None
    logits: Tensor | None
    batches: int = 0


class _Recorder:
    """Hooks recording each slot's aligned representation in one forward pass of ``model``.

    For a slot aligned on its ``output`` that is the output of ``slot.output_name``; for ``delta``
    (residual blocks) it is that output minus the input of ``slot.site``. With ``inputs=True`` the
    input of every slot's site is kept too. ``stop_after``: a slot whose output ends the pass.

    Not ``simkit.layers.record_layers``: this records module *inputs* too, keeps outputs whole
    (b, *shape) and attached to the graph during training, and can stop the forward pass.
    """

    def __init__(self, model: nn.Module, slots: Sequence[Slot], *, inputs: bool = False,
                 stop_after: Slot | None = None) -> None:
        self.slots = list(slots)
        self.outputs: dict[str, Tensor] = {}
        self.inputs: dict[str, Tensor] = {}
        self.handles: list[Any] = []
        for slot in self.slots:
            if inputs or slot.align == "delta":
                module = model.get_submodule(slot.site)
                self.handles.append(module.register_forward_pre_hook(self._pre(slot.site)))
            module = model.get_submodule(slot.output_name)
            self.handles.append(module.register_forward_hook(
                self._hook(slot.output_name, stop_after is not None and slot.output_name == stop_after.output_name)))

    def _hook(self, name: str, stop: bool) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            self.outputs[name] = select_output(output, layer=name)
            if stop:
                raise _StopForward
        return hook

    def _pre(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple) -> None:
            self.inputs[name] = select_output(args, layer=name)
        return hook

    def value(self, slot: Slot) -> Tensor:
        """(b, *out_shape) the slot's aligned representation from the last pass."""
        return aligned(slot, self.outputs[slot.output_name], self.inputs.get(slot.site))

    def clear(self) -> None:
        self.outputs.clear()
        self.inputs.clear()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


def aligned(slot: Slot, output: Tensor, inputs: Tensor | None) -> Tensor:
    """The representation a slot is aligned on: its output, or output − input for ``delta``, without its
    first ``skip_tokens`` tokens (b, T, d) → (b, T − skip, d)."""
    if slot.align == "delta":
        if inputs is None:
            raise SimkitError(f"internal: no input recorded for {slot.label!r}, aligned on output − input")
        output = output - inputs
    return output[:, slot.skip_tokens:] if slot.skip_tokens else output


class _StopForward(Exception):
    """Raised by a hook to end a hybrid forward pass after the newest module."""


def run_until(model: nn.Module, inputs: Inputs, recorder: _Recorder) -> None:
    """Run ``model`` on ``inputs``; a stop hook in ``recorder`` may end the pass early."""
    recorder.clear()
    try:
        run_model(model, inputs)
    except _StopForward:
        pass


@torch.no_grad()
def guide_cache(guide: nn.Module, slots: Sequence[Slot], inputs: Inputs, batch_size: int, *,
                want_inputs: bool = False, want_logits: bool = False) -> GuideCache:
    """One eval-mode pass of the frozen guide over ``inputs`` (n, ...), keeping every slot's aligned
    representation (and its input when ``want_inputs``) and the guide's logits when ``want_logits``."""
    recorder = _Recorder(guide, slots, inputs=want_inputs)
    outs: list[list[Tensor]] = [[] for _ in slots]
    ins: list[list[Tensor]] = [[] for _ in slots]
    logits: list[Tensor] = []
    batches = 0
    try:
        with eval_mode(guide):
            for start in range(0, rows(inputs), batch_size):
                recorder.clear()
                out = run_model(guide, take(inputs, slice(start, start + batch_size)))
                batches += 1
                for i, slot in enumerate(slots):
                    outs[i].append(recorder.value(slot).detach().clone())
                    if want_inputs:
                        ins[i].append(recorder.inputs[slot.site].detach().clone())
                if want_logits:
                    logits.append(logits_of(out).detach().clone())
    finally:
        recorder.close()
    return GuideCache(outputs=[torch.cat(o) for o in outs],
                      inputs=[torch.cat(i) for i in ins] if want_inputs else None,
                      logits=torch.cat(logits) if want_logits else None, batches=batches)


@dataclass
class StageOutcome:
    """What one stage did: its history, and the names of the trainable and of the changed parameters."""

    stage: Stage
    history: TrainHistory
    trainable: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)


def set_trainable(model: nn.Module, modules: Sequence[nn.Module]) -> list[nn.Parameter]:
    """Freeze every parameter of ``model``, then unfreeze those of ``modules``; returns the trainable."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = []
    for module in modules:
        for p in module.parameters():
            if not p.requires_grad:
                p.requires_grad_(True)
                params.append(p)
    return params


def _snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _changed(model: nn.Module, before: dict[str, Tensor]) -> list[str]:
    return [name for name, p in model.named_parameters()
            if name not in before or before[name].shape != p.shape or not torch.equal(before[name], p.detach())]


def run_stage(hybrid: nn.Module, slots: Sequence[Slot], modules: list[nn.Module], stage: Stage,
              cache: GuideCache, inputs: Inputs, loss: Callable[[Tensor, Tensor], Tensor],
              fit_stage: Callable[..., TrainHistory]) -> StageOutcome:
    """Install this stage's modules, train what it trains against the cached guide activations.

    modules[l]: slot l's target module (the object installed in the hybrid). fit_stage(model,
    loss_fn, data, params) runs the shared training loop (with the run's config, names, resume).
    """
    for j in stage.install:
        install(hybrid, slots[j], modules[j])
    if stage.isolated:
        (j,) = stage.train
        module = modules[j]
        params = set_trainable(module, [module])
        before = _snapshot(module)
        if cache.inputs is None:
            raise SimkitError("internal: the independent schedule needs the guide inputs cache")
        guide_in, guide_out = cache.inputs[j], cache.outputs[j]

        def isolated_loss(batch: tuple[Tensor, ...]) -> Tensor:
            (idx,) = batch
            x = guide_in[idx]
            return loss(aligned(slots[j], module(x), x), guide_out[idx])

        module.train()
        history = fit_stage(module, isolated_loss, (torch.arange(len(guide_out)),), params)
        prefix = slots[j].site
        trainable = [f"{prefix}.{n}" for n, p in module.named_parameters() if p.requires_grad]
        changed = [f"{prefix}.{n}" for n in _changed(module, before)]
        for p in module.parameters():
            p.requires_grad_(False)
        return StageOutcome(stage, history, trainable, changed)

    params = set_trainable(hybrid, [modules[j] for j in stage.train])
    before = _snapshot(hybrid)
    stop = slots[stage.stop_after] if stage.stop_after is not None else None
    recorder = _Recorder(hybrid, [slots[j] for j in stage.align], stop_after=stop)

    def hybrid_loss(batch: tuple[Tensor, ...]) -> Tensor:
        (idx,) = batch
        run_until(hybrid, take(inputs, idx), recorder)
        terms = [loss(recorder.value(slots[j]), cache.outputs[j][idx]) for j in stage.align]
        return torch.stack(terms).mean()

    hybrid.train()
    try:
        history = fit_stage(hybrid, hybrid_loss, (torch.arange(rows(inputs)),), params)
    finally:
        recorder.close()
    trainable = [n for n, p in hybrid.named_parameters() if p.requires_grad]
    changed = _changed(hybrid, before)
    for p in hybrid.parameters():
        p.requires_grad_(False)
    return StageOutcome(stage, history, trainable, changed)


@torch.no_grad()
def hybrid_outputs(hybrid: nn.Module, slots: Sequence[Slot], inputs: Inputs, batch_size: int) -> list[Tensor]:
    """Eval-mode aligned representations (n, *out_shape) of every slot in the hybrid, full passes."""
    recorder = _Recorder(hybrid, slots)
    outs: list[list[Tensor]] = [[] for _ in slots]
    try:
        with eval_mode(hybrid):
            for start in range(0, rows(inputs), batch_size):
                run_until(hybrid, take(inputs, slice(start, start + batch_size)), recorder)
                for i, slot in enumerate(slots):
                    outs[i].append(recorder.value(slot).detach().clone())
    finally:
        recorder.close()
    return [torch.cat(o) for o in outs]


@torch.no_grad()
def isolated_output(slot: Slot, module: nn.Module, guide_inputs: Tensor, batch_size: int) -> Tensor:
    """Eval-mode aligned representation of one target module on the guide's inputs: (n, *in) → (n, *out)."""
    with eval_mode(module):
        parts = [guide_inputs[s:s + batch_size] for s in range(0, len(guide_inputs), batch_size)]
        return torch.cat([aligned(slot, module(x), x) for x in parts])


def fresh_modules(slots: Sequence[Slot]) -> list[nn.Module]:
    """Independent copies of every slot's initial target module (each arm starts from the same init)."""
    return [copy.deepcopy(s.target) for s in slots]
