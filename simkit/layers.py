"""Choose layers, hook them, reduce their outputs to (batch, features) matrices.

Selectors (a comma string or a list; results in the model's module order, without duplicates):

- an exact module name (``layer1.0``); a glob over names where ``*`` and ``?`` stay within one
  dotted part and ``**`` crosses dots (``layer*.?`` → ``layer1.0`` … ``layer4.1``, not
  ``layer2.0.downsample.0``; ``**.conv*`` → every ``conv*`` at any depth); ``[...]`` as in fnmatch;
- ``type:ClassName`` (every module of that class, e.g. ``type:Conv2d``),
- the preset ``blocks``: residual blocks (``RESIDUAL_BLOCKS``: torchvision/timm ``BasicBlock``,
  ``Bottleneck``, ``InvertedResidual``, ...) together with the modules beside them on the way down
  (stem and head: 14 layers for ResNet-18); else
  transformer layers (the children of a ModuleList/Sequential named ``layers``/``h``/``blocks``/``layer``
  that hold an attention module); else the ``blocks.*`` of the simkit zoo; else the top-level children.

Reductions of one output ``t`` (b, ...) → (b, d):

- ``auto`` (the default): ``mean`` for a token sequence (b, L, d), masked by the attention mask, so
  padding positions never dominate; ``flatten`` for everything else;
- ``flatten``: ``t.reshape(b, -1)``, a view when possible;
- ``mean``: average over spatial axes of a channel-first map (b, c, ...) or over the tokens of a
  sequence (b, L, d) (masked by the attention mask when one is known);
- ``cls`` / ``last``: token 0 / the last (real) token of a sequence (b, L, d) → (b, d).

A 3-D output is read as a token sequence (b, L, d) when the model holds an attention module or an
embedding, or is called with integer token ids; else as a channel-first map (b, c, L); ``layout=``
overrides this. 2-D outputs (b, d) are kept as they are
(recorded as ``flatten``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from simkit.errors import SimkitError, closest, unknown_name_error
from simkit.forward import eval_mode, run_model, take
from simkit.settings.compare import REDUCTIONS

LAYOUTS = ("channels", "tokens")
LAYERS_HINT = "run `simkit layers MODEL` to list them"
# Residual building blocks by class name (torchvision and timm): ResNet/ResNeXt, MobileNet, EfficientNet,
# RegNet, ConvNeXt, Swin.
RESIDUAL_BLOCKS = ("BasicBlock", "Bottleneck", "InvertedResidual", "MBConv", "FusedMBConv",
                   "ResBottleneckBlock", "CNBlock", "SwinTransformerBlock", "SwinTransformerBlockV2")
SEQUENCE_CONTAINERS = ("layers", "h", "blocks", "layer")


# -------------------------------------------------------------------------------------------- selection

def layer_names(model: nn.Module) -> list[str]:
    """Every named submodule of ``model`` in module order (the root, named "", excluded)."""
    return [name for name, _ in model.named_modules() if name]


def _is_attention(module: nn.Module) -> bool:
    return isinstance(module, nn.MultiheadAttention) or "attention" in type(module).__name__.lower()


def _has_attention(module: nn.Module) -> bool:
    return any(_is_attention(m) for m in module.modules())


def _is_sequence_model(model: nn.Module) -> bool:
    """A model with attention or token embeddings: its 3-D outputs are (b, L, d) sequences."""
    return any(_is_attention(m) or isinstance(m, nn.Embedding) for m in model.modules())


def _residual_blocks(model: nn.Module) -> list[str]:
    """Residual blocks plus the modules beside them on the path down (stem, pooling, head)."""

    def is_block(module: nn.Module) -> bool:
        return type(module).__name__ in RESIDUAL_BLOCKS

    def holds_block(module: nn.Module) -> bool:
        return any(is_block(m) for m in module.modules())

    if not holds_block(model):
        return []
    out: list[str] = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module.named_children():
            full = f"{prefix}{name}"
            if is_block(child):
                out.append(full)
            elif holds_block(child):
                walk(child, full + ".")
            else:
                out.append(full)

    walk(model, "")
    return out


def _transformer_layers(model: nn.Module) -> list[str]:
    out: list[str] = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in SEQUENCE_CONTAINERS and isinstance(module, nn.ModuleList | nn.Sequential):
            children = list(module.named_children())
            if children and all(_has_attention(child) for _, child in children):
                out.extend(f"{name}.{child}" for child, _ in children)
    return out


def preset_blocks(model: nn.Module) -> list[str]:
    """The ``blocks`` preset (see the module docstring), in module order."""
    for finder in (_residual_blocks, _transformer_layers):
        found = finder(model)
        if found:
            return found
    zoo = getattr(model, "blocks", None)
    if isinstance(zoo, nn.ModuleList | nn.Sequential) and len(zoo):
        return [f"blocks.{name}" for name, _ in zoo.named_children()]
    return [name for name, _ in model.named_children()]


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regex for a dotted-name glob: ``**`` any text, ``*`` any text without dots, ``?`` one
    character other than a dot, ``[...]`` a character class (fnmatch syntax)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append(r"[^.]*")
            i += 1
        elif pattern[i] == "?":
            out.append(r"[^.]")
            i += 1
        elif pattern[i] == "[" and pattern.find("]", i + 2) > 0:
            end = pattern.find("]", i + 2)
            body = pattern[i + 1:end]
            body = "^" + body[1:] if body.startswith("!") else body
            out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def _split(selector: str | Sequence[str]) -> list[str]:
    items = [selector] if isinstance(selector, str) else list(selector)
    return [part.strip() for item in items for part in str(item).split(",") if part.strip()]


def resolve_layers(model: nn.Module, selector: str | Sequence[str]) -> list[str]:
    """Module names chosen by ``selector`` (names, globs, ``type:Class``, ``blocks``), in module order.

    Raises SimkitError for a name, glob or type that matches nothing (listing the closest names).
    """
    names = layer_names(model)
    order = {name: i for i, name in enumerate(names)}
    modules = dict(model.named_modules())
    chosen: set[str] = set()
    parts = _split(selector)
    if not parts:
        raise SimkitError("no layers selected; give names, globs, type:Class or blocks")
    for part in parts:
        if part == "blocks":
            found = preset_blocks(model)
        elif part.startswith("type:"):
            wanted = part[5:].strip()
            found = [n for n in names if type(modules[n]).__name__ == wanted
                     or f"{type(modules[n]).__module__}.{type(modules[n]).__name__}" == wanted]
            if not found:
                types = sorted({type(modules[n]).__name__ for n in names})
                raise unknown_name_error("module type", wanted, types, LAYERS_HINT)
        elif any(ch in part for ch in "*?["):
            pattern = glob_regex(part)
            found = [n for n in names if pattern.fullmatch(n)]
            if not found:
                near = ", ".join(closest(part.replace("*", "").replace("?", ""), names))
                raise SimkitError(f"layer pattern {part!r} matches no module; closest: {near}; {LAYERS_HINT}")
        elif part in order:
            found = [part]
        else:
            raise unknown_name_error("layer", part, names, LAYERS_HINT)
        chosen.update(found)
    return sorted(chosen, key=order.__getitem__)


# -------------------------------------------------------------------------------------------- reductions

def select_output(output: Any, output_index: int | str | None = None, layer: str = "") -> Tensor:
    """The tensor inside a module's output.

    ``output_index`` None: the output itself, the first tensor of a tuple/list, ``last_hidden_state``
    (else the first tensor value) of a dict-like output. An int: that position (of a dict's values
    too). A string: a key, or a dotted path of keys and positions (``"hidden_states.3"``); digit parts
    are positions unless the dict has that key. An index given for a plain Tensor output is a
    SimkitError (it would otherwise be ignored without a word).
    """
    if isinstance(output, Tensor):  # the common case, first; an index chooses inside tuples and dicts only
        if output_index is not None:
            raise SimkitError(f"layer {layer!r}: `output_index` {output_index!r} selects inside a tuple or dict "
                              "output, but this layer outputs a plain Tensor; leave `output_index` out, or "
                              "choose layers whose outputs are tuples or dicts")
        return output
    picked = _default_output(output) if output_index is None else _indexed_output(output, output_index, layer)
    if not isinstance(picked, Tensor):
        raise SimkitError(f"layer {layer!r} outputs {type(picked).__name__}, not a tensor; choose another "
                          "layer or an `output_index`")
    return picked


def _default_output(output: Any) -> Any:
    """What :func:`select_output` picks without an index: a dict-like's ``last_hidden_state`` (else its
    first tensor value), a tuple/list's first tensor (None when there is none), anything else itself."""
    if isinstance(output, Mapping):
        return output["last_hidden_state"] if "last_hidden_state" in output else \
            next((v for v in output.values() if isinstance(v, Tensor)), None)
    if isinstance(output, list | tuple):
        return next((v for v in output if isinstance(v, Tensor)), None)
    return output


def _indexed_output(output: Any, output_index: int | str, layer: str) -> Any:
    """The element of ``output`` that ``output_index`` (an int, a key or a dotted path) selects
    (:func:`select_output`); SimkitError for a part that indexes nothing or is out of range."""
    parts = output_index.split(".") if isinstance(output_index, str) else [output_index]
    picked = output
    for part in parts:
        if isinstance(picked, Mapping):
            keys = list(picked)
            if part in picked:
                picked = picked[part]
                continue
            what = f"a {type(picked).__name__} with keys {', '.join(map(repr, keys[:8]))}"
        elif isinstance(picked, list | tuple):
            keys = list(range(len(picked)))
            what = f"a {type(picked).__name__} of {len(picked)} (indices 0 to {len(picked) - 1})"
        else:
            raise SimkitError(f"layer {layer!r}: output index {output_index!r} does not select a tensor "
                              f"from its {type(output).__name__} output: {part!r} indexes into a "
                              f"{type(picked).__name__}, which has no elements; choose a shorter index")
        try:
            position = int(part)
        except (TypeError, ValueError):
            position = None
        if position is None or not -len(keys) <= position < len(keys):
            raise SimkitError(f"layer {layer!r}: output index {output_index!r} does not select a tensor "
                              f"from its {type(output).__name__} output: {part!r} is out of range of {what}; "
                              "choose a valid index or key")
        picked = list(picked.values())[position] if isinstance(picked, Mapping) else picked[position]
    return picked


def reduce_activation(t: Tensor, how: str = "auto", *, layout: str = "channels",
                      mask: Tensor | None = None) -> Tensor:
    """(b, ...) → (b, d). ``layout``: how a 3-D output is read ("channels" (b, c, L) or "tokens"
    (b, L, d)); ``mask``: (b, L) attention mask for ``mean``/``last`` over tokens. See the module
    docstring for the reductions."""
    how = _check_reduce(how)
    if t.dim() == 0:
        raise SimkitError("cannot reduce a scalar output; choose a layer with a batch axis")
    tokens = layout == "tokens" and t.dim() == 3
    if how == "auto":
        how = "mean" if tokens else "flatten"
    if t.dim() <= 2 or how == "flatten":
        return t.reshape(t.shape[0], -1)
    if how == "mean":
        if tokens:
            if mask is not None and mask.shape == t.shape[:2]:
                weights = mask.to(t.dtype).unsqueeze(-1)
                return (t * weights).sum(1) / weights.sum(1).clamp_min(1)
            return t.mean(1)
        return t.mean(dim=tuple(range(2, t.dim())))
    if not tokens:
        raise SimkitError(f"reduction {how!r} needs a token sequence (b, L, d); got an output of shape "
                          f"{tuple(t.shape)}; use flatten or mean")
    if how == "cls":
        return t[:, 0].clone()
    if mask is not None and mask.shape == t.shape[:2]:
        positions = torch.arange(t.shape[1], device=t.device)
        last = (mask.to(torch.long) * positions).argmax(1)
        return t[torch.arange(t.shape[0], device=t.device), last]
    return t[:, -1].clone()


def _check_reduce(how: str) -> str:
    how = getattr(how, "value", how)  # a str Enum from the command line → its plain string
    if how not in REDUCTIONS:
        raise SimkitError(f"unknown reduction {how!r}; choose one of {', '.join(REDUCTIONS)}")
    return how


def _recorded(how: str, t: Tensor, layout: str) -> str:
    """The reduction a layer's output ``t`` actually got (``auto`` resolved)."""
    if t.dim() <= 2:
        return "flatten"
    if how == "auto":
        return "mean" if layout == "tokens" and t.dim() == 3 else "flatten"
    return how


# -------------------------------------------------------------------------------------------- record_layers

class record_layers:  # noqa: N801  (used as a context manager: `with record_layers(model, layers) as rec`)
    """Forward hooks on the chosen layers; ``pop()`` returns one (b, d) tensor per layer.

    ::

        with record_layers(model, "blocks", reduce="mean") as cap:
            model(x)                     # x: (b, ...)
            acts = cap.pop()             # {name: Tensor (b, d)} in selection order

    While active: grad mode off (unless ``grad=True``), outputs detached, the model in eval mode
    (unless ``eval_mode=False``); on exit (errors included) the hooks are removed and every module's
    train/eval flag and the grad mode are restored. After each ``pop``: ``shapes`` (raw output shape
    (b, ...) per layer), ``reductions`` (the reduction applied per layer), ``dims`` (d per layer).

    ``output_index``: int or key choosing the tensor in tuple/dict outputs (default: the first tensor,
    ``last_hidden_state`` for dicts). ``layout``: "channels" | "tokens" | None (auto) for 3-D outputs.
    Copies are avoided: ``flatten`` keeps a view of the output, except for layers whose output the
    model later changes in place (detected with the tensor version counter on the first forward).
    """

    def __init__(self, model: nn.Module, layers: str | Sequence[str], *, reduce: str | Mapping[str, str] = "auto",
                 output_index: int | str | None = None, layout: str | None = None, grad: bool = False,
                 eval_mode: bool = True):
        self.model = model
        self.layers = resolve_layers(model, layers)
        if isinstance(reduce, Mapping):
            self.how = {name: _check_reduce(reduce.get(name, "auto")) for name in self.layers}
        else:
            self.how = dict.fromkeys(self.layers, _check_reduce(reduce))
        if layout is not None and layout not in LAYOUTS:
            raise SimkitError(f"unknown layout {layout!r}; choose channels or tokens")
        self._fixed_layout = layout
        self.layout = layout or ("tokens" if _is_sequence_model(model) else "channels")
        self.output_index = output_index
        self.grad, self.eval_mode = grad, eval_mode
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.reductions: dict[str, str] = {}
        self.dims: dict[str, int] = {}
        self.mutated: set[str] = set()  # layers whose output the model changes in place later
        self._checked = False  # the first forward clones every view and checks version counters
        self._store: dict[str, list[tuple[Tensor, Tensor | None, int]]] = {}
        self._handles: list[Any] = []
        self._modes: dict[nn.Module, bool] = {}
        self._grad_mode: torch.no_grad | None = None
        self._mask: Tensor | None = None
        modules = dict(model.named_modules())
        for name in self.layers:
            if isinstance(modules[name], torch.jit.ScriptModule):
                raise SimkitError(f"layer {name!r} is inside a TorchScript model, whose layers cannot be "
                                  "hooked; load the model as a state dict with file:PATH,arch=SPEC")

    # -- context management
    def __enter__(self) -> record_layers:
        modules = dict(self.model.named_modules())
        self._modes = {m: m.training for m in self.model.modules()}
        try:
            self._handles.append(self.model.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            for name in self.layers:
                self._handles.append(modules[name].register_forward_hook(self._hook_for(name)))
            if self.eval_mode:
                self.model.eval()
            if not self.grad:
                self._grad_mode = torch.no_grad()
                self._grad_mode.__enter__()
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module, mode in self._modes.items():
            module.training = mode
        if self._grad_mode is not None:
            self._grad_mode.__exit__(None, None, None)
            self._grad_mode = None
        self._store.clear()
        self._mask = None

    # -- hooks
    def _pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask")
        if mask is None and args and isinstance(args[0], Mapping):
            mask = args[0].get("attention_mask")
        if mask is None and len(args) > 1 and isinstance(args[1], Tensor) and args[1].dim() == 2 \
                and not args[1].is_floating_point():
            mask = args[1]
        self._mask = mask if isinstance(mask, Tensor) else None
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, Mapping):
            ids = ids.get("input_ids")
        if self._fixed_layout is None and isinstance(ids, Tensor) and not ids.is_floating_point() \
                and ids.dim() == 2:
            self.layout = "tokens"  # token ids in: 3-D outputs are (b, L, d) sequences

    def _attention_mask(self) -> Tensor | None:
        wrapper_mask = getattr(self.model, "simkit_attention_mask", None)
        return wrapper_mask if isinstance(wrapper_mask, Tensor) else self._mask

    def _hook_for(self, name: str):
        how = self.how[name]

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            t = select_output(output, self.output_index, name)
            if not self.grad:
                t = t.detach()
            reduced = reduce_activation(t, how, layout=self.layout, mask=self._attention_mask())
            self.shapes[name] = tuple(t.shape)
            self.reductions[name] = _recorded(how, t, self.layout)
            aliased = reduced.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() \
                if reduced.numel() and t.numel() else False
            if not aliased:
                self._store.setdefault(name, []).append((reduced, None, 0))
            elif not self._checked or name in self.mutated:
                # a clone now; the original stays to check whether the model changes it in place
                self._store.setdefault(name, []).append((reduced.clone(), t, t._version))
            else:
                self._store.setdefault(name, []).append((reduced, t, t._version))

        return hook

    # -- results
    def pop(self) -> dict[str, Tensor]:
        """{layer: Tensor (b, d)} from the forward pass since the last pop, in selection order."""
        out: dict[str, Tensor] = {}
        try:
            for name in self.layers:
                calls = self._store.get(name, [])
                if not calls:
                    raise SimkitError(f"layer {name!r} did not run in the forward pass; choose layers that "
                                      f"the model uses ({LAYERS_HINT})")
                if len(calls) > 1:
                    raise SimkitError(f"layer {name!r} ran {len(calls)} times in one forward pass (a shared "
                                      "module); choose a layer that runs once, or pop after each forward")
                value, original, version = calls[0]
                if original is not None and original._version != version:
                    if self._checked and name not in self.mutated:
                        raise SimkitError(f"layer {name!r}: the model changed this output in place after "
                                          "it was captured, only on some batches; capture another layer or "
                                          "use `reduce` mean (which copies)")
                    self.mutated.add(name)
                self.dims[name] = int(value.shape[1])
                out[name] = value
            self._checked = True
        finally:
            self._store.clear()
        return out


# -------------------------------------------------------------------------------------------- table

def layer_table(model: nn.Module, sample: Tensor | Mapping[str, Tensor] | None = None):
    """Every named module with its type, output shape on one sample, parameter count, and whether the
    ``blocks`` preset picks it → pandas DataFrame (name, type, shape, params, blocks).

    ``sample``: inputs whose first axis is samples (only the first is used); without it the shape
    column is empty. The dry run is in eval mode without grad; hooks and modes are restored.
    """
    import pandas as pd

    named = [(n, m) for n, m in model.named_modules() if n]
    in_blocks = set(preset_blocks(model))
    shapes: dict[str, str] = {}
    if sample is not None:
        one = take(dict(sample) if isinstance(sample, Mapping) else sample, slice(0, 1))
        handles = []

        def hook_for(name: str):
            def hook(module: nn.Module, args: tuple, output: Any) -> None:
                if name in shapes:
                    return
                try:
                    t = select_output(output, None, name)
                    shapes[name] = "x".join(str(s) for s in t.shape[1:]) or "scalar"
                except SimkitError:
                    shapes[name] = type(output).__name__
            return hook

        try:
            for name, module in named:
                if not isinstance(module, torch.jit.ScriptModule):
                    handles.append(module.register_forward_hook(hook_for(name)))
            with eval_mode(model), torch.no_grad():
                run_model(model, one)
        finally:
            for handle in handles:
                handle.remove()
    def missing(module: nn.Module) -> str:
        if sample is None:
            return ""
        return "(container)" if isinstance(module, nn.ModuleList | nn.ModuleDict) else "not run"

    rows = [{"name": name, "type": type(module).__name__, "shape": shapes.get(name) or missing(module),
             "params": sum(p.numel() for p in module.parameters()),
             "blocks": name in in_blocks} for name, module in named]
    return pd.DataFrame(rows, columns=["name", "type", "shape", "params", "blocks"])


