"""What a stitching run is told: :class:`StitchSettings` and its IRI part :class:`IRISettings` (torch-free:
the CLI reads them).

Every field is declared once (``simkit.options``): the generic ``validate()`` applies the declarations and
the cross-field rules (:func:`~simkit.options.rule`), and ``simkit stitch``'s options are generated from
them. The ``iri_*`` fields of :class:`StitchSettings` are :class:`IRISettings`' declarations reused with
the prefix (:func:`iri_option`), so an IRI option's default, constraint and help are written once.
``inputs.json`` and ``meta.options`` are ``settings.to_dict()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simkit.errors import SimkitError
from simkit.options import (
    Choice,
    Flag,
    Integer,
    Names,
    Optional,
    Real,
    Settings,
    declarations,
    default_of,
    n_option,
    option,
    rule,
    seed_option,
    seeds_option,
    split_names,
)

#: the stitching objectives (``simkit.stitching.objectives`` describes them)
OBJECTIVES = ("hlm", "slm", "dm", "fula")
#: how a stitch layer starts: least squares, or PyTorch's default init (identity where it has one)
INITS = ("lstsq", "default")
#: where an IRI starts: another training input, or uniform noise over the data range
IRI_SEEDS = ("data", "noise")
#: how an IRI is optimised (``simkit.stitching.iri``)
IRI_OPTIMIZERS = ("sgd", "adam")
#: the norm of the ball a bounded IRI stays in around its seed (``IRISettings.radius``)
IRI_NORMS = ("linf", "l2")
#: the prefix of :class:`IRISettings`' fields in :class:`StitchSettings`
IRI_PREFIX = "iri_"
__all__ = ["INITS", "IRI_NORMS", "IRI_OPTIMIZERS", "IRI_PREFIX", "IRI_SEEDS", "OBJECTIVES", "IRISettings", "ModuleNames",
           "StitchSettings", "iri_option", "layer_names"]


@dataclass(frozen=True)
class IRISettings(Settings):
    """How IRIs are made (``simkit.stitching.iri.generate_iris``; its cache key hashes every field).
    steps: max updates per batch; tol: relative-error target; seed: 'data' (another training input) or
    'noise' (uniform over the data range); optimizer: 'adam' or 'sgd' (the spec's step); step_size: sgd
    step; lr: adam learning rate; batch_size: samples optimised together; restarts: new seeds for samples
    still above ``tol`` after ``steps`` updates. radius: None (unbounded search) or the radius of the ball
    (``norm`` linf or l2, data units) around its seed that each IRI stays in; radius_step: the step inside
    the ball as a fraction of the radius (Adam's learning rate, or the sgd step's length)."""

    steps: int = option(300, Integer(ge=0), "Max IRI optimisation steps per attempt.")
    tol: float = option(0.05, Real(ge=0), "IRI relative-error tolerance (early stop).")
    seed: str = option("data", Choice(IRI_SEEDS), "Start IRIs from another training input (data) or uniform "
                       "noise.")
    optimizer: str = option("adam", Choice(IRI_OPTIMIZERS), "adam: Adam on x (reaches the tolerance far more "
                            "often); sgd: x ← clamp(x − step·∇) (the spec's).")
    step_size: float = option(0.5, Real(gt=0), "sgd step on the inputs.")
    lr: float = option(0.1, Real(gt=0), "adam learning rate on the inputs.")
    batch_size: int = option(256, Integer(ge=1), "Inputs optimised together.")
    restarts: int = option(3, Integer(ge=0), "Restart inputs still above --iri-tol from a new seed, up to this "
                           "many times.")
    radius: float | None = option(None, Optional(Real(gt=0)), "Keep each IRI inside a ball of this radius around "
                                  "its seed (data units; projected steps; unset: unbounded search).")
    norm: str = option("linf", Choice(IRI_NORMS), "The ball's norm with --iri-radius: linf or l2.")
    radius_step: float = option(0.1, Real(gt=0, le=1), "With --iri-radius: the step as a fraction of the radius "
                                "(Adam's learning rate, or the sgd step's length).")

    @rule
    def _radius_needs_data_seed(self) -> None:
        """A ball is centred on a training input: ``radius`` needs ``seed`` data."""
        check_radius_seed(self.radius, self.seed, "")


def check_radius_seed(radius: float | None, seed: str, prefix: str) -> None:
    """Refuse a bounded search (``radius`` set) that starts from noise: the ball is centred on the training
    input an IRI starts from. ``prefix``: the fields' prefix in the settings class checked."""
    if radius is not None and seed != "data":
        raise SimkitError(f"`{prefix}radius` bounds IRIs around the training input they start from; "
                          f"use `{prefix}seed` data (or drop `{prefix}radius`)")


def iri_option(name: str) -> Any:
    """:class:`StitchSettings`' ``iri_<name>`` field: :class:`IRISettings`' declaration of ``name`` (its
    default, constraint and help) under the prefixed name."""
    f, decl = declarations(IRISettings)[name]
    return option(default_of(f), decl.constraint, decl.help)


@dataclass(frozen=True)
class ModuleNames(Names):
    """Module names of no fixed vocabulary (whether they exist is checked on the models): None, a comma
    string or a list of names, kept as given (``layer_names`` reads them); a list option on the command
    line."""

    values: tuple[str, ...] = ()
    kind: str = "layer"

    def check(self, value: Any, name: str) -> Any:
        if value is None or (isinstance(value, str) and value.strip()):
            return value
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return list(value)
        raise self.refuse(value, name)

    def describe(self) -> str:
        return "module names (a comma string or a list of them) or None"

    def invalid(self) -> Any:
        return [1]


def layer_names(value: str | Sequence[str] | None) -> list[str]:
    """The names a ``layer_a``/``layer_b`` value holds: ``"a, b"`` or ``["a", "b,c"]`` → a list, None → []."""
    if value is None:
        return []
    return [part for v in ([value] if isinstance(value, str) else value) for part in split_names(v)]


@dataclass(frozen=True)
class StitchSettings(Settings):
    """Everything that decides a stitching run's numbers (defaults are the command's; each field's
    declaration is its help).

    layer_a / layer_b: module names of A and B (a comma string or a list; the lists pair up, a single
    name pairs with all), or ``layers="auto"`` (blocks paired by relative depth).
    iri_*: how IRIs are made (:class:`IRISettings` with the ``iri_`` prefix; the default, Adam on the
    inputs at lr 0.1 with 3 restarts from new seeds, reaches the tolerance on far more inputs than the
    spec's plain gradient step ``sgd``).
    seeds: each seed gets its own models (built per seed from a factory, or trained per seed with
    ``train``), IRIs, stitch init order and batch order, on the one data split drawn by ``seed``.
    tokens / examples: library-only (see their declarations).
    """

    layer_a: str | Sequence[str] | None = option(
        None, ModuleNames(), "Layers of A (module names; repeatable or comma list; pairs up with --layer-b).")
    layer_b: str | Sequence[str] | None = option(
        None, ModuleNames(), "Layers of B (module names; repeatable or comma list).")
    layers: str | None = option(None, Optional(Choice(("auto",))), "'auto': pair the blocks of A and B by "
                                "relative depth.")
    objective: Sequence[str] | str = option(["fula"], Names(OBJECTIVES, kind="objective"),
                                            f"Comma list of {', '.join(OBJECTIVES)}.")
    iri: bool = option(False, Flag(), "Add the invariance-aware arm (train on IRIs).")
    steps: int = option(300, Integer(ge=0), "Stitch training steps (0 = least-squares init only).")
    batch_size: int = option(128, Integer(ge=1), "Stitch training batch size.")
    lr: float = option(1e-3, Real(gt=0), "Stitch learning rate (Adam).")
    init: str = option("lstsq", Choice(INITS), "Stitch init: least squares or PyTorch default.")
    iri_steps: int = iri_option("steps")
    iri_tol: float = iri_option("tol")
    iri_seed: str = iri_option("seed")
    iri_optimizer: str = iri_option("optimizer")
    iri_step_size: float = iri_option("step_size")
    iri_lr: float = iri_option("lr")
    iri_batch_size: int = iri_option("batch_size")
    iri_restarts: int = iri_option("restarts")
    iri_radius: float | None = iri_option("radius")
    iri_norm: str = iri_option("norm")
    iri_radius_step: float = iri_option("radius_step")
    n: int | None = n_option()
    seed: int = seed_option()
    tokens: bool = option(False, Flag(), "Read 2-D activations (T, d) as tokens (a linear stitch) rather than "
                          "(C, L) feature maps (a model with an nn.Embedding always does).", cli=False)
    examples: int = option(4, Integer(ge=0), "IRIs shown beside their originals in the report.", cli=False)
    train: float = option(0.0, Real(ge=0), "Train A and B on --data for this many epochs first (0 = use them "
                          "as they are).")
    seeds: int = seeds_option("Repeat for seeds --seed, --seed+1, ... (this many): models built (A with the "
                              "seed, B with seed+1) and trained per seed, IRIs and stitches per seed; "
                              "stitching_mean.csv and iri_differences.csv give means and 95 % t intervals "
                              "over seeds.")
    val_every: int = option(0, Integer(ge=0), "Score each stitch on a validation split of the stitching data "
                            "every this many steps (and at step 0) and keep the best step's stitch (0 = off: "
                            "keep the last).")
    val_fraction: float = option(0.1, Real(gt=0, lt=1), "Fraction of the stitching data held out for "
                                 "--val-every (drawn by --seed; never the evaluation set).")

    @rule
    def _layers_pair_up(self) -> None:
        """Where to stitch: ``layers`` auto alone, or names in both ``layer_a`` and ``layer_b`` (lists of
        one length, or one name to pair with all); whether the names exist is checked on the models."""
        names_a, names_b = layer_names(self.layer_a), layer_names(self.layer_b)
        if self.layers is not None:
            if names_a or names_b:
                raise SimkitError("give either `layers` auto or `layer_a`/`layer_b`, not both")
            return
        if not names_a or not names_b:
            raise SimkitError("say where to stitch: `layer_a` L `layer_b` L (comma lists pair up), or `layers` auto")
        if len(names_a) != len(names_b) and 1 not in (len(names_a), len(names_b)):
            raise SimkitError(f"`layer_a` has {len(names_a)} names and `layer_b` {len(names_b)}; "
                              "give lists of the same length (or one name to pair with all)")

    @rule
    def _iri_radius_needs_data_seed(self) -> None:
        """A ball is centred on a training input: ``iri_radius`` needs ``iri_seed`` data."""
        check_radius_seed(self.iri_radius, self.iri_seed, IRI_PREFIX)

    @property
    def objectives(self) -> list[str]:
        """The objectives as validated names, order kept, no duplicates."""
        return list(self.validate().objective)

    def iri_settings(self) -> IRISettings:
        """The IRI part as the :class:`IRISettings` that ``generate_iris`` (and its cache key) takes."""
        return IRISettings(**{name: getattr(self, IRI_PREFIX + name) for name in declarations(IRISettings)})
