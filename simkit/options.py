"""Every option declared once: its default, its constraint, its help and its flag.

A settings class is a frozen dataclass deriving from :class:`Settings` whose fields are made with
:func:`option`::

    @dataclass(frozen=True)
    class FitSettings(Settings):
        epochs: float = option(5.0, Real(gt=0), "Post-training epochs per run.")
        lr: float = option(1e-3, Real(gt=0), "AdamW learning rate.")

        @rule
        def _lr_below_one(self) -> None:
            '''A cross-field rule (run by ``validate`` after every field's constraint).'''

From that one declaration come: validation (:meth:`Settings.validate`, the one mechanism: every field's
constraint, then the class's :func:`rule` methods, returning a frozen normalised copy marked validated,
so the rules run once per run), the record (:meth:`Settings.to_dict`), and the command's typer options
(``simkit.cli.options`` reads :func:`declarations`). Messages have one shape, "`name` must be …, got …",
naming the library argument in backticks (the CLI turns it into the flag).

The constraints (:class:`Integer`, :class:`Real`, :class:`Choice`, :class:`Names`, :class:`Text`,
:class:`Flag`, :class:`Auto`, :class:`Optional`, :class:`Numbers`) check and normalise a value, say what
they accept (:meth:`Constraint.describe`), generate an invalid value for the generated tests
(:meth:`Constraint.invalid`) and name the type the command line parses (:meth:`Constraint.cli_type`).
Torch-free: the catalogue declares the measures' own settings with it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal, TypeVar

from simkit.errors import SimkitError, unknown_name_error

S = TypeVar("S", bound="Settings")
#: the metadata key of a declared field
OPTION = "simkit_option"


class Constraint:
    """What values a field accepts: :meth:`check` returns the normalised value or raises a SimkitError."""

    def check(self, value: Any, name: str) -> Any:
        """``value`` normalised, or a SimkitError "`name` must be …, got …"."""
        raise NotImplementedError

    def describe(self) -> str:
        """What it accepts, in words ("an integer >= 1")."""
        raise NotImplementedError

    def invalid(self) -> Any:
        """A value it refuses (the generated option test feeds it to every field)."""
        raise NotImplementedError

    def cli_type(self) -> Any:
        """The Python type the command line parses into (typer reads it)."""
        raise NotImplementedError

    def refuse(self, value: Any, name: str) -> SimkitError:
        """The one message shape: "`name` must be <describe>, got <value>"."""
        return SimkitError(f"`{name}` must be {self.describe()}, got {value!r}")


def is_integer(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A finite real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


@dataclass(frozen=True)
class Integer(Constraint):
    """An integer (not a bool) in ``[ge, le]`` (None: unbounded)."""

    ge: int | None = None
    le: int | None = None

    def check(self, value: Any, name: str) -> int:
        if not is_integer(value) or (self.ge is not None and value < self.ge) or (
                self.le is not None and value > self.le):
            raise self.refuse(value, name)
        return int(value)

    def describe(self) -> str:
        if self.ge is not None and self.le is not None:
            return f"an integer in [{self.ge}, {self.le}]"
        words = {0: "0 or a positive integer", 1: "a positive integer", None: "an integer"}
        return words.get(self.ge, f"an integer >= {self.ge}") if self.le is None else f"an integer <= {self.le}"

    def invalid(self) -> Any:
        return (self.ge - 1) if self.ge is not None else (self.le + 1 if self.le is not None else 1.5)

    def cli_type(self) -> Any:
        return int


@dataclass(frozen=True)
class Real(Constraint):
    """A finite number (an int is read as a float) within the given bounds (``gt``/``ge``, ``lt``/``le``)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def check(self, value: Any, name: str) -> float:
        if not is_real(value) or not self._within(float(value)):
            raise self.refuse(value, name)
        return float(value)

    def _within(self, x: float) -> bool:
        return ((self.ge is None or x >= self.ge) and (self.gt is None or x > self.gt)
                and (self.le is None or x <= self.le) and (self.lt is None or x < self.lt))

    def describe(self) -> str:
        low = (f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None)
        high = (f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None)
        if low and high:
            return f"a number in {low}, {high}"
        if low:
            return f"a number {'>=' if self.ge is not None else '>'} {low[1:]}"
        if high:
            return f"a number {'<=' if self.le is not None else '<'} {high[:-1]}"
        return "a finite number"

    def invalid(self) -> Any:
        for bound, step in ((self.ge, -1.0), (self.gt, 0.0), (self.le, 1.0), (self.lt, 0.0)):
            if bound is not None:
                return bound + step
        return math.nan

    def cli_type(self) -> Any:
        return float


def _num(x: float | None) -> str:
    return f"{x:g}"


@dataclass(frozen=True)
class Choice(Constraint):
    """One of ``values`` (an Enum member stands for its value)."""

    values: tuple[str, ...]

    def check(self, value: Any, name: str) -> str:
        value = getattr(value, "value", value)
        if value not in self.values:
            raise self.refuse(value, name)
        return str(value)

    def describe(self) -> str:
        return "one of " + ", ".join(self.values)

    def invalid(self) -> Any:
        return "not-a-choice"

    def cli_type(self) -> Any:
        return Literal[self.values]


@dataclass(frozen=True)
class Names(Constraint):
    """A list of names out of ``values`` (a comma string or one name is read as a list), duplicates dropped,
    ``aliases`` read as the name they stand for; ``empty``: whether no name at all is allowed."""

    values: Sequence[str]   # a live sequence stays live (the catalogue's names, plug-ins included)
    kind: str = "name"
    empty: bool = False
    aliases: tuple[tuple[str, str], ...] = ()

    def check(self, value: Any, name: str) -> list[str]:
        given = split_names(value) if isinstance(value, str) else value
        if not isinstance(given, list | tuple):
            raise self.refuse(value, name)
        aliases = dict(self.aliases)
        names = [aliases.get(str(v), str(v)) for v in given]
        for original, resolved in zip(given, names, strict=True):
            if resolved not in self.values:
                error = unknown_name_error(self.kind, str(original), (*self.values, *aliases),
                                           "valid: " + ", ".join(self.values))
                raise SimkitError(f"`{name}`: {error}")
        if not names and not self.empty:
            raise SimkitError(f"`{name}` is empty; pass at least one of {', '.join(self.values)}")
        return list(dict.fromkeys(names))

    def describe(self) -> str:
        return "a list of " + ", ".join(self.values)

    def invalid(self) -> Any:
        return ["not-a-name"]

    def cli_type(self) -> Any:
        return list[str]


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty string (a spec, a file, a name)."""

    def check(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.refuse(value, name)
        return value

    def describe(self) -> str:
        return "a non-empty text"

    def invalid(self) -> Any:
        return ""

    def cli_type(self) -> Any:
        return str


@dataclass(frozen=True)
class Flag(Constraint):
    """True or False."""

    def check(self, value: Any, name: str) -> bool:
        if not isinstance(value, bool):
            raise self.refuse(value, name)
        return value

    def describe(self) -> str:
        return "true or false"

    def invalid(self) -> Any:
        return "yes"

    def cli_type(self) -> Any:
        return bool


@dataclass(frozen=True)
class Optional(Constraint):
    """None (or, on the command line, ``none_word``) or a value ``inner`` accepts."""

    inner: Constraint
    none_word: str | None = None

    def check(self, value: Any, name: str) -> Any:
        if value is None or (self.none_word is not None and _word(value) == self.none_word):
            return None
        try:
            return self.inner.check(value, name)
        except SimkitError:
            raise self.refuse(value, name) from None

    def describe(self) -> str:
        return f"{self.inner.describe()} or {self.none_word or 'None'}"

    def invalid(self) -> Any:
        return self.inner.invalid()

    def cli_type(self) -> Any:
        return self.inner.cli_type() | None


@dataclass(frozen=True)
class Auto(Constraint):
    """``word`` (kept as it is: the runner says what it resolves to) or a value ``inner`` accepts; on the
    command line a text, a number in it read as one (``"3"`` → 3)."""

    inner: Constraint
    word: str = "auto"

    def check(self, value: Any, name: str) -> Any:
        if _word(value) == self.word:
            return self.word
        try:
            return self.inner.check(_number_in(value), name)
        except SimkitError:
            raise self.refuse(value, name) from None

    def describe(self) -> str:
        return f"'{self.word}' or {self.inner.describe()}"

    def invalid(self) -> Any:
        return "not-" + self.word

    def cli_type(self) -> Any:
        return str


@dataclass(frozen=True)
class Numbers(Constraint):
    """A non-empty list of values ``item`` accepts (a comma string is read as one); ``scalar``: one value
    given alone (not in a list) stays a scalar."""

    item: Constraint
    scalar: bool = False

    def check(self, value: Any, name: str) -> Any:
        given = [value] if isinstance(value, str) or not isinstance(value, list | tuple) else list(value)
        items = [_number_in(part) for v in given for part in (split_names(v) if isinstance(v, str) else [v])]
        if not items or (not self.scalar and not isinstance(value, str | list | tuple)):
            raise self.refuse(value, name)
        try:
            out = [self.item.check(v, name) for v in items]
        except SimkitError:
            raise self.refuse(value, name) from None
        return out[0] if self.scalar and len(out) == 1 and not isinstance(value, list | tuple) else out

    def describe(self) -> str:
        return f"a non-empty list of values, each {self.item.describe()}"

    def invalid(self) -> Any:
        return [self.item.invalid()]

    def cli_type(self) -> Any:
        return list[str]


def _word(value: Any) -> str | None:
    return value.strip().lower() if isinstance(value, str) else None


def _number_in(value: Any) -> Any:
    """A number written as text read as one ("3" → 3, "1e-3" → 0.001); anything else as it is."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lstrip("+-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return value


def split_names(value: str) -> list[str]:
    """A comma string as its parts: ``"a, b,,c"`` → ``["a", "b", "c"]``."""
    return [part.strip() for part in value.split(",") if part.strip()]


@dataclass(frozen=True)
class Declaration:
    """One option: its constraint, its help, its flag (None: ``--`` + the field name with dashes), whether
    the command line has it (``cli``), how help shows its default (``show_default``: None from the default)
    and the type column (``metavar``)."""

    constraint: Constraint
    help: str
    flag: str | None = None
    cli: bool = True
    show_default: str | bool | None = None
    metavar: str | None = None
    aliases: tuple[str, ...] = ()
    note: str = ""

    def check(self, value: Any, name: str) -> Any:
        """``value`` checked by the constraint; a refusal ends with the declaration's ``note`` (what the
        value means, an example)."""
        try:
            return self.constraint.check(value, name)
        except SimkitError as exc:
            if not self.note:
                raise
            raise SimkitError(f"{exc}; {self.note}") from None


def option(default: Any, constraint: Constraint, help: str, *, flag: str | None = None, cli: bool = True,
           show_default: str | bool | None = None, metavar: str | None = None,
           aliases: tuple[str, ...] = (), note: str = "") -> Any:
    """A dataclass field declared once: ``default`` (a list default is copied per instance), its
    ``constraint``, its ``help`` and, where it differs from the field name, its ``flag``; ``cli=False``
    for library-only settings; ``note``: what a refused value should be, added to the message
    ("a confidence level, e.g. 0.95")."""
    meta = {OPTION: Declaration(constraint, help, flag, cli, show_default, metavar, aliases, note)}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def declaration(f: dataclasses.Field) -> Declaration | None:
    """The declaration of a dataclass field (None for an undeclared field)."""
    return f.metadata.get(OPTION)


def declarations(cls: type) -> dict[str, tuple[dataclasses.Field, Declaration]]:
    """Every declared field of the settings class ``cls``, by name, in declaration order."""
    out = {}
    for f in fields(cls):
        decl = declaration(f)
        if decl is not None:
            out[f.name] = (f, decl)
    return out


def default_of(f: dataclasses.Field) -> Any:
    """The default a field declares (its factory's value for a list)."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def rule(method: Callable[[S], dict[str, Any] | None]) -> Callable[[S], dict[str, Any] | None]:
    """Mark a method of a settings class as a cross-field rule: ``validate`` runs every rule (in definition
    order, after the fields' constraints) on the normalised copy; a rule raises a SimkitError, or returns
    None, or a dict of fields it normalises (e.g. a recipe that a plan makes moot)."""
    method.__simkit_rule__ = True  # type: ignore[attr-defined]
    return method


@dataclass(frozen=True)
class Settings:
    """The base of every settings class: one generic :meth:`validate`, :meth:`to_dict`, :meth:`updated`."""

    _VALIDATED: ClassVar[str] = "_simkit_validated"

    def validate(self: S) -> S:
        """A validated, normalised, frozen copy (``self`` when already validated): every declared field's
        constraint, then every :func:`rule`; a SimkitError names the first bad argument in backticks."""
        if self.is_validated:
            return self
        values = {name: decl.check(getattr(self, name), name)
                  for name, (_, decl) in declarations(type(self)).items()}
        out = replace(self, **values)
        for method in _rules(type(self)):
            changes = method(out)
            if changes:
                out = replace(out, **changes)
        object.__setattr__(out, Settings._VALIDATED, True)
        return out

    @property
    def is_validated(self) -> bool:
        """Whether this object came out of :meth:`validate` (a replaced copy has to be validated again)."""
        return bool(vars(self).get(Settings._VALIDATED))

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, JSON-ready (tuples as lists): the record in ``inputs.json`` and ``meta``."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self)}

    def updated(self: S, **changes: Any) -> S:
        """A copy with ``changes`` (field names; any other name is a SimkitError), to be validated again."""
        known = [f.name for f in fields(self)]
        for name in changes:
            if name not in known:
                raise unknown_name_error("setting", name, known, "settings: " + ", ".join(known))
        return replace(self, **changes) if changes else self

    def seed_list(self) -> list[int]:
        """The seeds of the repeats: ``seed``, ``seed`` + 1, ..., ``seeds`` of them (classes with both)."""
        seed, seeds = getattr(self, "seed"), getattr(self, "seeds")  # noqa: B009
        return [seed + i for i in range(seeds)]


def _rules(cls: type) -> list[Callable[[Any], dict[str, Any] | None]]:
    """The :func:`rule` methods of ``cls`` and its bases, bases first, each in definition order."""
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if getattr(value, "__simkit_rule__", False):
                out[name] = value
    return list(out.values())


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


def seed_option(help: str = "Seed for model init and training (not the data: --data-seed).") -> Any:
    """The ``seed`` option every runner declares alike."""
    return option(0, Integer(), help)


def seeds_option(help: str) -> Any:
    """The ``seeds`` option (repeats for ``seed``, ``seed`` + 1, ...) of the runners that repeat."""
    return option(1, Integer(ge=1), help)


def n_option(help: str = "Use at most this many samples (--num-samples under torchrun).") -> Any:
    """The ``n`` option (a sample cap, None: all) every runner declares alike."""
    return option(None, Optional(Integer(ge=1)), help, aliases=("--num-samples",))


def cli_default_text(default: Any) -> str:
    """A default as a user types it on the command line: lists as comma lists, None as nothing."""
    if isinstance(default, list | tuple):
        return ",".join(str(v) for v in default)
    if isinstance(default, bool):
        return str(default).lower()
    return "" if default is None else f"{default:g}" if isinstance(default, float) else str(default)
