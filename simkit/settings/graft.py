"""The settings of a graft suite (``simkit graft``): :class:`GraftSettings`, every option that changes its
results, declared once (torch-free: the command line reads it).

Also the vocabulary of the surgery that the settings check: the gates (:data:`GATES`), the built-in
branches (:data:`BRANCHES`) and the double-zero refusal (:data:`DOUBLE_ZERO`); ``simkit.surgery``
imports them from here, so each is written once. ``to_dict()`` is what ``inputs.json`` and
``meta.settings_given`` record; ``meta.settings`` records :meth:`GraftSettings.resolved`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simkit.errors import SimkitError
from simkit.options import (
    Choice,
    Flag,
    Integer,
    Optional,
    Real,
    Settings,
    Text,
    n_option,
    option,
    rule,
    seed_option,
)

#: the gates of a graft F(x) = x + a*R(x) (``simkit.surgery.graft_gated_residual``)
GATES = ("shadow", "net2net", "double_zero")
#: the built-in residual branches R (``simkit.surgery.build_branch``)
BRANCHES = ("mlp", "llama", "conv")
DOUBLE_ZERO = ("double-zero graft refused: with α = 0 and a zero branch output, ∂L/∂α = ⟨g, R(x)⟩ = 0 and "
               "every ∂L/∂θ is scaled by α = 0, so nothing would ever train; use gate 'shadow' (α = 0, random R) "
               "or 'net2net' (α = 1, zero output projections); pass `allow_double_zero` only to demonstrate it")
BUILTIN = "simkit:llama"
BUILTIN_AFTER = "blocks.1"
MIN_STEPS = 6  # F3 grafts mid-way, then must checkpoint before it is killed and resumed
USER_SAMPLES = 512  # samples of a user's data when `n` is None


@dataclass(frozen=True)
class GraftSettings(Settings):
    """One run of the exact-surgery suite (E1, E2, E3, F3); each field's declaration is its help.

    model / data: names recorded in the results (the CLI's spec strings; None: ``simkit:llama`` for the
    built-in model or the module's class name; the dataset's spec, or the seeded Markov-chain tokens of
    the built-in model). n: samples (of a user's data, default 512; Markov sequences of the built-in
    model, default 256). ``after`` and ``branch`` left None are filled in by :meth:`resolved`.
    """

    model: str | None = option(None, Optional(Text()), "Model spec (default: simkit:llama).", cli=False)
    data: str | None = option(None, Optional(Text()), "Data spec (required with MODEL; default for the built-in "
                              "model: seeded random token sequences).")
    n: int | None = n_option()
    seed: int = seed_option()
    after: str | None = option(None, Optional(Text()), "Module whose output gets the graft (default for the "
                               "built-in model: blocks.1).")
    branch: str | None = option(None, Optional(Choice(BRANCHES)), "Residual branch R (default: llama for the "
                                "built-in model, mlp otherwise).")
    gate: str = option("shadow", Choice(GATES), "shadow (a=0, random R) or net2net (a=1, zero output projections); "
                       "double_zero needs --allow-double-zero.")
    steps: int = option(600, Integer(ge=MIN_STEPS), "Training steps of each E2 arm and of F3.")
    batch_size: int = option(16, Integer(ge=1), "Samples per training batch.")
    seq_len: int = option(32, Integer(ge=2), "Token sequence length of the built-in model's data (next-token "
                          "targets: at least 2).", cli=False)
    e2_lr: float = option(0.05, Real(gt=0), "SGD learning rate of the E2 arms.", cli=False)
    f3_lr: float = option(1e-3, Real(gt=0), "AdamW learning rate of F3.", cli=False)
    allow_double_zero: bool = option(False, Flag(), "Allow the double-zero gate (only to demonstrate that nothing "
                                     "trains).")
    max_e3_sites: int = option(12, Integer(ge=1), "Graft depths timed by E3 on a user's model.", cli=False)
    e3_blocks: int | None = option(None, Optional(Integer(ge=1)), "E3 on a deeper built-in model: a fresh one "
                                   "like MODEL (same width, heads, vocabulary; seeded by --seed) with this many "
                                   "blocks, timed at each of its blocks + 1 depths (unset: MODEL itself).")
    threads: int = option(1, Integer(ge=1), "Torch intra-op threads of the suite and of each F3 worker process "
                          "(F3 runs two side by side; the count can change the last bits of reductions, so it is "
                          "recorded and a resume must keep it).", cli=False)

    @rule
    def _double_zero_allowed(self) -> None:
        """The double-zero gate trains nothing: refused unless ``allow_double_zero``."""
        if self.gate == "double_zero" and not self.allow_double_zero:
            raise SimkitError(DOUBLE_ZERO)

    def resolved(self, builtin: bool) -> GraftSettings:
        """Validated, with the defaults that depend on the model filled in: after = blocks.1 and branch =
        llama for the built-in model, branch = mlp otherwise (``meta.settings``; ``to_dict()`` of the
        settings as given is ``inputs.json`` and ``meta.settings_given``).

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
