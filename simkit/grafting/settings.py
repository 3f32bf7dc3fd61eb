"""The settings of a graft suite (``simkit graft``): every option that changes its results.

Fields are named as the command's parameters and default to its defaults (``model`` and ``data`` are
the names of the model and the data: the spec strings when the CLI made the run); ``seq_len``,
``e2_lr``, ``f3_lr``, ``max_e3_sites`` and ``threads`` have no flag (library callers only). ``to_dict()`` is what
``inputs.json`` and ``meta.settings_given`` record; ``meta.settings`` records :meth:`GraftSettings.resolved`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from simkit.errors import SimkitError
from simkit.surgery.branches import BRANCHES
from simkit.surgery.ops import DOUBLE_ZERO, GATES

BUILTIN = "simkit:llama"
BUILTIN_AFTER = "blocks.1"
MIN_STEPS = 6  # F3 grafts mid-way, then must checkpoint before it is killed and resumed
BUILTIN_SEQUENCES = 256  # Markov-chain sequences of the built-in model when `n` is None
USER_SAMPLES = 512  # samples of a user's data when `n` is None
E1_MIN_VALUES = 1600  # the paper's E1: 0/1600 logit bit mismatches (spec §4)
BUILTIN_PROBE = 8  # probe sequences of the built-in model, more when needed to reach E1_MIN_VALUES outputs
USER_PROBE = 64  # probe samples of a user's data, more when needed to reach E1_MIN_VALUES outputs


@dataclass
class GraftSettings:
    """One run of the exact-surgery suite (E1, E2, E3, F3).

    model / data: names recorded in the results (the CLI's spec strings; None: ``simkit:llama`` for
    the built-in model or the module's class name; the dataset's spec, or the seeded Markov-chain
    tokens of the built-in model). n: samples (of a user's
    data, default 512; Markov sequences of the built-in model, default 256). after: the module whose
    output gets the graft (default for the built-in model: ``blocks.1``); branch: mlp | llama | conv
    (default: llama for the built-in model, mlp otherwise); gate: shadow | net2net | double_zero (the
    last only with ``allow_double_zero``). steps: training steps of each E2 arm and of F3 (at least
    6); batch_size: samples per training batch; seq_len: token sequence length of the built-in data;
    e2_lr / f3_lr: SGD / AdamW learning rates; max_e3_sites: graft depths timed by E3 on a user's
    model; seed: model-independent randomness (branches, data order, targets); threads: torch
    intra-op threads of the suite and of each F3 worker process (F3 runs two processes side by side;
    the thread count can change the last bits of reductions, so it is recorded and a resume must keep it).
    """

    model: str | None = None
    data: str | None = None
    n: int | None = None
    seed: int = 0
    after: str | None = None
    branch: str | None = None
    gate: str = "shadow"
    steps: int = 600
    batch_size: int = 16
    seq_len: int = 32
    e2_lr: float = 0.05
    f3_lr: float = 1e-3
    allow_double_zero: bool = False
    max_e3_sites: int = 12
    threads: int = 1

    def validate(self) -> GraftSettings:
        """The one place the rules of these settings live: a validated copy (``self`` when it was validated
        and has not changed since, so the rules run once per run whichever entry point receives it); a
        SimkitError names the first field that cannot run (in backticks). The one rule that needs the
        model (a user's model needs ``after``) is :meth:`resolved`'s, which fills in the defaults."""
        if vars(self).get("_validated_as") == self.to_dict():
            return self
        self._validate_choices()
        self._validate_numbers()
        out = replace(self)
        vars(out)["_validated_as"] = out.to_dict()
        return out

    def _validate_choices(self) -> None:
        """The checks of ``gate`` and ``branch`` (:meth:`validate`)."""
        if self.gate not in GATES:
            raise SimkitError(f"`gate`: unknown gate {self.gate!r}; use shadow, net2net or double_zero")
        if self.gate == "double_zero" and not self.allow_double_zero:
            raise SimkitError(DOUBLE_ZERO)
        if self.branch is not None and self.branch not in BRANCHES:
            raise SimkitError(f"`branch`: unknown branch {self.branch!r}; use one of {', '.join(BRANCHES)}")

    def _validate_numbers(self) -> None:
        """The checks of the counts, learning rates and seed (:meth:`validate`)."""
        for name in ("steps", "batch_size", "seq_len", "max_e3_sites", "threads"):
            if not _integer(getattr(self, name)) or getattr(self, name) < 1:
                raise SimkitError(f"`{name}` must be a positive integer, got {getattr(self, name)!r}")
        if self.steps < MIN_STEPS:
            raise SimkitError(f"`steps` must be at least {MIN_STEPS} (F3 grafts mid-way, checkpoints, is killed "
                              f"and resumed), got {self.steps}")
        if self.n is not None and (not _integer(self.n) or self.n < 1):
            raise SimkitError(f"`n` must be a positive integer, got {self.n!r}")
        if self.seq_len < 2:
            raise SimkitError(f"`seq_len` must be at least 2 (next-token targets), got {self.seq_len}")
        for name in ("e2_lr", "f3_lr"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value)
                                                                                     and value > 0):
                raise SimkitError(f"`{name}` must be a finite number > 0, got {value!r}")
        if not _integer(self.seed):
            raise SimkitError(f"`seed` must be an integer, got {self.seed!r}")

    def resolved(self, builtin: bool) -> GraftSettings:
        """Validated (:meth:`validate`), with the defaults that depend on the model filled in: after =
        blocks.1 and branch = llama for the built-in model, branch = mlp otherwise (``meta.settings``;
        ``to_dict()`` of the settings as given is ``inputs.json`` and ``meta.settings_given``).

        builtin: whether the model is the built-in one; a user's model has no default ``after``."""
        given = self.validate()
        if not builtin and given.after is None:
            raise SimkitError("`after` is required with a MODEL; run `simkit layers MODEL` to list module names")
        return replace(given, after=given.after or BUILTIN_AFTER,
                       branch=given.branch or ("llama" if builtin else "mlp"))

    def site(self) -> tuple[str, str]:
        """(after, branch) of :meth:`resolved` settings."""
        if self.after is None or self.branch is None:
            raise SimkitError("`after` and `branch` are not filled in yet; use settings.resolved(builtin)")
        return self.after, self.branch

    def samples(self, builtin: bool) -> int | None:
        """How many samples of the data to load (None: all of them)."""
        return self.n if builtin else (self.n or USER_SAMPLES)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
