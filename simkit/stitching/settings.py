"""What a stitching run is told: :class:`StitchSettings`, one field per option that changes results.

Fields are named as the options of ``simkit stitch`` (``iri_steps`` is ``--iri-steps``) and default to
the command's defaults, so ``inputs.json`` and ``meta.options`` are ``settings.to_dict()`` and the
command line maps a library message's backticked field names to its flags.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from simkit.errors import SimkitError, check_real
from simkit.stitching.iri import IRISettings
from simkit.stitching.objectives import parse_objectives
from simkit.stitching.pairs import check_layer_choice

INITS = ("lstsq", "default")


@dataclass
class StitchSettings:
    """Everything that decides a stitching run's numbers.

    layer_a / layer_b: module names of A and B (a comma string or a list; the lists pair up, a single
    name pairs with all), or ``layers="auto"`` (blocks paired by relative depth).
    objective: hlm, slm, dm, fula (a comma string or a list). iri: add the invariance-aware arm.
    steps / batch_size / lr: stitch training (Adam; ``steps=0`` keeps the init). init: ``lstsq`` (least
    squares) or ``default`` (PyTorch init / identity).
    iri_steps / iri_tol / iri_seed / iri_optimizer / iri_step_size / iri_lr / iri_batch_size /
    iri_restarts: how IRIs are made (:class:`~simkit.stitching.iri.IRISettings` without the ``iri_``
    prefix; the default, Adam on the inputs at lr 0.1 with 3 restarts from new seeds, reaches the
    tolerance on far more inputs than the spec's plain gradient step ``sgd``).
    train: epochs of cross-entropy training of (copies of) A and B on the stitching data first (0: use
    them as they are).
    n: use at most the first ``n`` samples of the data. seed: data split, stitch training, IRIs.
    seeds: repeat the run for seeds ``seed``, ``seed`` + 1, ... (``seeds`` of them): each seed gets its
    own models (built per seed from a factory, or trained per seed with ``train``), IRIs, stitch init
    order and batch order, on the one data split drawn by ``seed``; 1 (the default) is a single run.
    val_every / val_fraction: with ``val_every`` K > 0, ``val_fraction`` of the stitching data (never
    the evaluation set; drawn by ``seed``) is held out as a validation split, each stitch is scored
    there at step 0 (its init) and every K steps (and at the last), and the best-scoring step's stitch
    is kept (``chosen_step``); 0 (the default) keeps the stitch after all ``steps`` on all the data.
    tokens: read 2-D activations (T, d) as tokens (linear stitch) rather than (C, L) feature maps (a
    model with an ``nn.Embedding`` always does). examples: IRIs beside their originals in the report.
    """

    layer_a: str | list[str] | None = None
    layer_b: str | list[str] | None = None
    layers: str | None = None
    objective: str | list[str] = field(default_factory=lambda: ["fula"])
    iri: bool = False
    steps: int = 300
    batch_size: int = 128
    lr: float = 1e-3
    init: str = "lstsq"
    iri_steps: int = 300
    iri_tol: float = 0.05
    iri_seed: str = "data"
    iri_optimizer: str = "adam"
    iri_step_size: float = 0.5
    iri_lr: float = 0.1
    iri_batch_size: int = 256
    iri_restarts: int = 3
    n: int | None = None
    seed: int = 0
    tokens: bool = False
    examples: int = 4
    train: float = 0.0
    seeds: int = 1
    val_every: int = 0
    val_fraction: float = 0.1

    @property
    def objectives(self) -> list[str]:
        """The objectives as validated lower-case names, order kept, no duplicates."""
        return parse_objectives(self.objective)

    def seed_list(self) -> list[int]:
        """The seeds of the repeats: ``seed``, ``seed`` + 1, ..., ``seeds`` of them."""
        return [self.seed + i for i in range(self.seeds)]

    def iri_settings(self) -> IRISettings:
        """The IRI part as the :class:`IRISettings` that ``generate_iris`` (and its cache key) takes."""
        return IRISettings(steps=self.iri_steps, tol=self.iri_tol, seed=self.iri_seed,
                           optimizer=self.iri_optimizer, step_size=self.iri_step_size, lr=self.iri_lr,
                           batch_size=self.iri_batch_size, restarts=self.iri_restarts)

    def validate(self) -> StitchSettings:
        """The one place the rules of a stitching run's settings live (the ``iri_*`` fields'
        are :meth:`IRISettings.validate`'s): a validated copy (``self`` when it was validated and has not
        changed since, so the rules run once per run whichever entry point receives it); a SimkitError
        names the first field that cannot run (in backticks)."""
        if vars(self).get("_validated_as") == self.to_dict():
            return self
        check_layer_choice(self.layer_a, self.layer_b, self.layers)
        self.objectives  # noqa: B018  (parsing is the check)
        if self.init not in INITS:
            raise SimkitError(f"`init` must be 'lstsq' (least squares) or 'default', got {self.init!r}")
        _at_least("steps", self.steps, 0)
        _at_least("batch_size", self.batch_size, 1)
        check_real("lr", self.lr, 0, strict=True)
        self.iri_settings().validate(prefix="iri_")
        if self.n is not None:
            _at_least("n", self.n, 1)
        _at_least("examples", self.examples, 0)
        check_real("train", self.train, 0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise SimkitError(f"`seed` must be an integer, got {self.seed!r}")
        _at_least("seeds", self.seeds, 1)
        _at_least("val_every", self.val_every, 0)
        check_real("val_fraction", self.val_fraction, 0, strict=True)
        if not self.val_fraction < 1:
            raise SimkitError(f"`val_fraction` must be a fraction in (0, 1), e.g. 0.1, got {self.val_fraction}")
        out = replace(self)
        vars(out)["_validated_as"] = out.to_dict()
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _at_least(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SimkitError(f"`{name}` must be an integer >= {low}, got {value!r}")

