"""Built-in conversion recipes and plans loaded from a Python file.

- ``conv-to-mlp``: every Conv1d/Conv2d/Conv3d becomes a rank-r :class:`LowRankLinear` over the
  flattened feature map (norms, activations and residual adds stay) [paper: "low-rank linear bridges"].
- ``deep-to-shallow``: the guide's blocks (``blocks``, ``layers`` or ``features`` container) are cut
  into groups of ``group`` consecutive blocks; each group becomes one fresh block of the same design as
  the group's first block [ours: the sources give no block design]. A group of residual blocks (each
  with ``residual = True``, as ``simkit:cnn1d:residual=true`` after its first block and every
  ``simkit:vit`` block) is aligned on output − input, the sum of its residual branches, for the
  reason given under ``attention-to-rnn``; other groups on their output [ours].
- ``attention-to-mlp``: every transformer block's attention module (the block's submodule called
  ``attn``, ``attention`` or ``self_attn``) becomes a :class:`~simkit.models.vit.TokenMLP` applied to
  each token alone, so nothing mixes tokens any more; everything else stays (patch embedding, norms,
  the blocks' own MLPs, residual adds, head). The hidden width is that of the block's own MLP (its
  first Linear outside the attention that reads the token width; 4·d without one). Aligned on the
  attention module's output (its residual branch) at the patch tokens only: the class token is left
  out of the aligned map (a token-wise target's class token is a constant) [ours]. Readout: without token mixing the class
  token never sees the patches, so a class-token :class:`~simkit.models.vit.Readout` (``simkit:vit``)
  becomes the mean of the patch tokens (the Patch-MLP readout), keeping the guide's final LayerNorm
  weights, and is aligned to the guide's class-token feature (b, d). This is part of the target
  architecture: the scratch baseline reads out the same way. A guide with a class token but no such
  Readout is refused (its readout would read a constant).
- ``attention-to-rnn``: every transformer block of a causal LM (the ``blocks`` container) becomes a
  :class:`RecurrentBlock` (GRU by default) with the block's residual; aligned on the residual branch
  (block output − block input) [ours].
- ``file.py:make_plan``: ``make_plan(guide) -> ReplacementPlan | dict`` from the user's file
  (:func:`load_plan_file`; the CLI's ``--plan``, since it runs the file's code).
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

from torch import nn

from simkit.conversion.modules import LowRankLinear, RecurrentBlock, fresh_copy
from simkit.conversion.plans import Replacement, ReplacementPlan, Slot
from simkit.errors import SimkitError, unknown_name_error
from simkit.models.vit import Readout, TokenMLP
from simkit.seeding import derive_seed
from simkit.settings.convert import RECIPES

ATTENTION_NAMES = ("attn", "attention", "self_attn")
BLOCK_CONTAINERS = ("blocks", "layers", "features", "model.layers")


def conv_to_mlp(guide: nn.Module, rank: int = 256) -> ReplacementPlan:
    """Every convolution → LowRankLinear(in_shape, out_shape, rank)."""
    convs = [name for name, m in guide.named_modules() if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d)]
    if not convs:
        raise SimkitError("recipe conv-to-mlp found no Conv1d/Conv2d/Conv3d module in the guide; "
                          "pick another `recipe` or pass a `plan`")

    def factory(slot: Slot) -> nn.Module:
        return LowRankLinear(slot.in_shape, slot.out_shape, rank)

    return ReplacementPlan([Replacement(name, factory) for name in convs],
                           description=f"conv-to-mlp: {len(convs)} convolutions → rank-{rank} linear maps")


def find_blocks(guide: nn.Module) -> str:
    """Name of the guide's block container (a ModuleList/Sequential called blocks, layers or features)."""
    modules = dict(guide.named_modules())
    for name in BLOCK_CONTAINERS:
        found = modules.get(name)
        if isinstance(found, nn.ModuleList | nn.Sequential) and len(found) > 0:
            return name
    raise SimkitError("the guide has no block container (a ModuleList or Sequential named "
                      f"{', '.join(BLOCK_CONTAINERS)}); pass a `plan` instead")


def block_count(guide: nn.Module, container: str) -> int:
    """Number of blocks in the container ``find_blocks`` named."""
    found = guide.get_submodule(container)
    return len(found) if isinstance(found, nn.ModuleList | nn.Sequential) else 0


def deep_to_shallow(guide: nn.Module, group: int = 2, seed: int = 0) -> ReplacementPlan:
    """Consecutive blocks in groups of ``group`` → one fresh block shaped like the group's first."""
    if group < 2:
        raise SimkitError(f"deep-to-shallow needs `group` of at least 2 blocks per target block, got {group}")
    container = find_blocks(guide)
    count = block_count(guide, container)
    if count < group:
        raise SimkitError(f"deep-to-shallow: the guide has {count} blocks in {container!r}, fewer than "
                          f"`group` {group}; lower `group`")
    names = [f"{container}.{i}" for i in range(count)]
    groups = [tuple(names[i:i + group]) for i in range(0, count, group)]
    groups = [g for g in groups if len(g) > 1]  # a trailing single block stays as it is

    def factory(slot: Slot) -> nn.Module:
        # a seed of its own: a zoo guide built from `seed` would otherwise get its own first block back
        return fresh_copy(slot.guide_modules[0], derive_seed(seed, "deep-to-shallow", names.index(slot.site)))

    modules = dict(guide.named_modules())

    def align(names: tuple[str, ...]) -> str:
        residual = all(getattr(modules[n], "residual", False) is True for n in names)
        return "delta" if residual else "output"

    return ReplacementPlan([Replacement(g, factory, align=align(g)) for g in groups],
                           description=f"deep-to-shallow: {count} blocks → {len(groups)} target blocks "
                                       f"(groups of {group})")


def attention_to_rnn(guide: nn.Module, cell: str = "gru") -> ReplacementPlan:
    """Every transformer block → RecurrentBlock(d, cell) with a residual; input/output (b, T, d)."""
    container = find_blocks(guide)
    count = block_count(guide, container)

    def factory(slot: Slot) -> nn.Module:
        if len(slot.in_shape) != 2:
            raise SimkitError(f"attention-to-rnn expects block inputs of shape (T, d), got {slot.in_shape} "
                              f"at {slot.label!r}; the guide must be a sequence model")
        return RecurrentBlock(slot.in_shape[-1], cell=cell)

    # aligned on the residual branch (block output − input): the full output is dominated by the
    # residual stream, whose CKA with the guide's is near 1 before any training [ours]
    return ReplacementPlan([Replacement(f"{container}.{i}", factory, align="delta") for i in range(count)],
                           description=f"attention-to-rnn: {count} transformer blocks → {cell.upper()} layers")


def attention_module(block: nn.Module) -> str | None:
    """Name (inside ``block``) of its attention: the first submodule called attn, attention or self_attn."""
    for name, _ in block.named_modules():
        if name and name.rsplit(".", 1)[-1] in ATTENTION_NAMES:
            return name
    return None


def mlp_width(block: nn.Module, attention: str, d: int) -> int:
    """Hidden width of ``block``'s own MLP: out_features of its first Linear outside ``attention`` that
    reads width ``d``; 4·d when there is none."""
    for name, module in block.named_modules():
        inside = name == attention or name.startswith(attention + ".")
        if not inside and isinstance(module, nn.Linear) and module.in_features == d:
            return module.out_features
    return 4 * d


def attention_to_mlp(guide: nn.Module) -> ReplacementPlan:
    """Every block's attention → TokenMLP(d, hidden) (no token mixing); a class-token Readout → the mean
    of the patch tokens. Attention input/output (b, T, d); readout (b, T, d) → (b, d)."""
    container = find_blocks(guide)
    blocks = guide.get_submodule(container)
    sites: dict[str, tuple[nn.Module, str]] = {}  # attention module name → (its block, name inside it)
    for i, block in enumerate(blocks.children()):
        inner = attention_module(block)
        if inner is not None:
            sites[f"{container}.{i}.{inner}"] = (block, inner)
    if not sites:
        raise SimkitError(f"recipe attention-to-mlp found no attention module (a submodule called "
                          f"{', '.join(ATTENTION_NAMES)}) in the blocks of {container!r}; pick another "
                          "`recipe` or pass a `plan`")

    def mlp_factory(slot: Slot) -> nn.Module:
        if len(slot.in_shape) != 2 or slot.in_shape != slot.out_shape:
            raise SimkitError(f"attention-to-mlp expects attention inputs and outputs of shape (T, d), got "
                              f"{slot.in_shape} → {slot.out_shape} at {slot.label!r}")
        d = slot.in_shape[-1]
        block, inner = sites[slot.site]
        return TokenMLP(d, mlp_width(block, inner, d))

    readouts = [name for name, m in guide.named_modules() if isinstance(m, Readout) and m.pool == "cls"]
    # the class token(s) left out of the attention slots' aligned maps: a token-wise target's class token is
    # a constant, which can never reproduce the guide's (its CKA would be capped)
    prefix = int(getattr(guide.get_submodule(readouts[0]), "prefix", 1)) if readouts else 0
    replacements = [Replacement(name, mlp_factory, skip_tokens=prefix) for name in sites]

    def readout_factory(slot: Slot) -> nn.Module:
        kept = slot.guide_modules[0]
        if not isinstance(kept, Readout):
            raise SimkitError(f"internal: {slot.label!r} is not a Readout")
        return Readout(copy.deepcopy(kept.norm), pool="mean", prefix=kept.prefix)

    replacements += [Replacement(name, readout_factory) for name in readouts]
    has_cls = any(name.rsplit(".", 1)[-1] == "cls_token" for name, _ in guide.named_parameters())
    if has_cls and not readouts and not any(isinstance(m, Readout) for m in guide.modules()):
        raise SimkitError("attention-to-mlp: the guide has a class token but no simkit Readout to turn into "
                          "a mean over the patch tokens; without attention its class token would carry no "
                          "information. Pass a `plan` that also replaces the readout")
    readout_text = f", {len(readouts)} class-token readout → patch-token mean" if readouts else ""
    return ReplacementPlan(replacements, description=f"attention-to-mlp: {len(sites)} attention modules → "
                                                     f"token-wise MLPs{readout_text}")


def plan_file(spec: str) -> tuple[Path, str]:
    """``path/to/file.py:make_plan`` → (the file, the function name); SimkitError for another form."""
    path_text, sep, func = spec.rpartition(":")
    if not sep or not path_text.endswith(".py") or not func:
        raise SimkitError(f"`plan` expects FILE.py:FUNCTION, got {spec!r}")
    return Path(path_text), func


def load_plan_file(spec: str, guide: nn.Module) -> ReplacementPlan:
    """``path/to/file.py:make_plan`` → ``make_plan(guide)`` as a ReplacementPlan (this runs the file)."""
    path, func = plan_file(spec)
    if not path.is_file():
        raise SimkitError(f"`plan` file {path} does not exist")
    module_spec = importlib.util.spec_from_file_location(f"simkit_plan_{path.stem}", path)
    if module_spec is None or module_spec.loader is None:
        raise SimkitError(f"`plan` file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    make = getattr(module, func, None)
    if not callable(make):
        raise SimkitError(f"`plan` file {path} has no function {func!r}")
    return ReplacementPlan.coerce(make(guide))


def make_plan(recipe: str | None, guide: nn.Module, *, rank: int = 256, group: int = 2, cell: str = "gru",
              seed: int = 0) -> ReplacementPlan:
    """The plan of the named built-in recipe (a plan file: :func:`load_plan_file`)."""
    if recipe == "conv-to-mlp":
        return conv_to_mlp(guide, rank)
    if recipe == "deep-to-shallow":
        return deep_to_shallow(guide, group, seed)
    if recipe == "attention-to-rnn":
        return attention_to_rnn(guide, cell)
    if recipe == "attention-to-mlp":
        return attention_to_mlp(guide)
    raise unknown_name_error("recipe", str(recipe), RECIPES, "or pass a `plan`")
