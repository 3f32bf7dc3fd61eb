"""A fuzz of the library: what a script can pass to simkit's public functions (issue #37, item 2).

The contract (:func:`check_call`, the one oracle): every call

1. returns finite values in the documented range (a catalogue measure: ``simkit.catalog.MEASURES[name].lo``
   to ``.hi``, up to a rounding of 1e-6; where the catalogue's range says "may be < 0", estimates built from
   U-statistics, down to −1), or
2. returns a documented NaN together with a warning naming the cause (its text says "undefined" or "NaN"), or
3. raises :class:`~simkit.errors.SimkitError` with one line that names the argument at fault (its name, in
   backticks or as a word; "samples" when the fault is their number; "layer" for an entry of a mapping of
   activations or a model's layer);

never another exception type, never a silent NaN or Inf. Exceptions raised by the caller's own objects
(an iterable whose ``__next__`` raises) propagate unchanged and are not fuzzed.

What is called: every name of ``simkit.metrics.__all__`` (a catalogue measure generically, with its settings
drawn, so new measures are fuzzed as they are added; the other names by the recipes in :data:`RECIPES`;
:func:`test_every_public_metric_is_fuzzed` fails for a public name that has neither); every public function
of ``simkit.stats``; ``simkit.compare``; ``simkit.capture`` followed by ``compare_caches`` and ``study`` on the
caches it wrote; ``study`` and ``compare_arrays`` on activations in memory; ``load_activations`` and
``compare_arrays`` on files (``.npy``, ``.npz``, ``.pt``, ``.safetensors``).

Input kinds (:func:`arrays`, :func:`datas`, :func:`seed_values`): 0 rows, 1 row, 2–3 rows (fewer than the
unbiased estimators' 4), more; 0, 1 or more features; dtypes float64, float32, float16, bfloat16, int64, int8,
uint8, bool, complex64; values Gaussian, with a NaN, with ±Inf, near float32's largest (±3e38), tiny (1e-40,
subnormal in float32), constant, duplicated rows; layouts contiguous, transposed, strided and expanded (stride 0); as a torch tensor,
a NumPy array (where tensors are expected too), a nested list or a tensor on the meta device; as data: a
tensor, a dict, iterables that stop early (no batch, fewer rows than ``n``) or yield batches of different
shapes, ranks or forms, a map-style dataset whose length lies; settings drawn valid and invalid (0,
negative, NaN, Inf, text, None, out of range). Not fuzzed: arguments of other Python types than these
(``verdict(None)``), ``dtype``/``backend``/``progress`` keywords, device placement beyond ``meta``.

Budget: the settings profile ``simkit-fuzz`` (the default; the same draws on every run where ``CI`` is set,
as ``.ci/run`` sets it, new ones otherwise) draws ``max_examples`` = 300 per test of the
metrics and stats, 120 per engine test (they run models and write files): about 15 s of CPU. The
profile ``simkit-fuzz-deep`` draws ten times as many (about 80 s); run it by hand with
``SIMKIT_FUZZ_PROFILE=deep pytest tests/reliability/test_library_fuzz.py``. ``SIMKIT_FUZZ_REPORT=1`` (with
``-s``) prints the tally of the cases, the outcomes and the kinds drawn (:data:`TALLY`);
``--hypothesis-show-statistics`` shows the same per test (each is recorded with ``hypothesis.event``).

Figures, measured (one run each; hypothesis draws anew every run):

* default profile: 1,857 cases, 2,099 library calls: 1,130 SimkitErrors of one line naming the argument, 760
  values in range, 209 documented NaN with a warning, 0 raw exceptions; 15 s of CPU (27 s wall on a loaded
  2-core machine). Cases per test: 322 catalogue measures on every kind, 300 on well-formed data, 310 other
  metric functions (14 recipes), 325 stats, 120 each for compare, capture → compare_caches → study,
  compare_arrays, study of arrays and activation files. Arrays drawn (of all tests, a few kinds each): 2,108
  tensors, 207 nested lists, 217 NumPy arrays, 122 on the meta device; 151 with 0 rows, 166 with 1, 710 with
  2–3, 1,881 with 4 or more; 364 with 0 features; 1,028 float32, 838 float64, 104 float16, 85 bfloat16, 114
  int64, 133 int8, 110 uint8, 92 bool, 104 complex64; 79 with a NaN, 59 with ±Inf, 137 near float32's
  largest, 120 tiny, 400 constant, 605 with duplicated rows; 254 transposed, 316 strided, 283 expanded; data:
  77 iterables (13 with no batch, 21 with a batch of another width or rank), 39 map-style datasets whose
  length lies, 15 dicts.
* deep profile: 19,939 cases, 20,635 calls (11,528 SimkitErrors, 7,401 values, 1,706 NaN with a warning),
  0 raw exceptions, 81 s.
"""

from __future__ import annotations

import inspect
import math
import os
import re
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from torch import nn

import simkit
import simkit.metrics as metrics
import simkit.stats as stats
from simkit.catalog import DCOR_ESTIMATORS, MEASURES, METRICS, RSA_COMPARES, RSA_DISTANCES
from simkit.errors import SimkitError
from tests import reference

pytestmark = pytest.mark.usefixtures("one_thread")

settings.register_profile("simkit-fuzz", max_examples=300, deadline=None, derandomize=bool(os.environ.get("CI")),
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.filter_too_much])
settings.register_profile("simkit-fuzz-deep", settings.get_profile("simkit-fuzz"), max_examples=3000,
                          derandomize=False)
PROFILE = settings.get_profile("simkit-fuzz-deep" if os.environ.get("SIMKIT_FUZZ_PROFILE") == "deep"
                               else "simkit-fuzz")
FUZZ = settings(PROFILE)
ENGINE = settings(PROFILE, max_examples=max(1, PROFILE.max_examples * 2 // 5))

# ------------------------------------------------------------------------------------------ the oracle

#: what this module's tests drew and how the calls ended, over the session (``SIMKIT_FUZZ_REPORT=1`` prints it)
TALLY: Counter[str] = Counter()


def note(text: str) -> None:
    """Count ``text`` (a kind drawn, an outcome) in :data:`TALLY` and record it for hypothesis's statistics."""
    TALLY[text] += 1
    if currently_in_test_context():  # (the witnesses call check_call outside hypothesis)
        event(text)


@pytest.fixture(scope="module", autouse=True)
def tally_report() -> Iterator[None]:
    """With ``SIMKIT_FUZZ_REPORT=1``: the calls by outcome and the kinds drawn, printed after the module."""
    yield
    if os.environ.get("SIMKIT_FUZZ_REPORT"):
        print("\nfuzz tally:", *(f"{count:6d}  {text}" for text, count in sorted(TALLY.items())), sep="\n")


#: rounding allowed beyond a documented bound (that of ``simkit.metrics.cka.RATIO_SLACK``)
TOLERANCE = 1e-6
UNDEFINED = re.compile(r"undefined|NaN")


def documented_range(name: str) -> tuple[float, float]:
    """The range of catalogue measure ``name`` (module docstring, point 1)."""
    measure = MEASURES[name]
    lo = -math.inf if measure.lo is None else measure.lo
    hi = math.inf if measure.hi is None else measure.hi
    if "may be < 0 or > 1" in measure.range_text:
        return -math.inf, math.inf      # cknna: its self terms keep other pairs than its cross term
    if "may be < 0" in measure.range_text:
        lo = -1.0                       # an inner product of U-centred matrices: Cauchy-Schwarz holds
    return lo, hi


def check_error(error: SimkitError, arguments: tuple[str, ...]) -> None:
    """One line that names one of ``arguments`` (module docstring, point 3)."""
    message = str(error)
    assert "\n" not in message, f"a SimkitError of several lines: {message!r}"
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", message))
    assert words & set(arguments), f"a SimkitError that names none of {arguments}: {message!r}"


def check_call(call: Callable[[], Any], arguments: tuple[str, ...], check: Callable[[Any, bool], None]) -> str:
    """Run ``call()`` under the contract; ``check(value, warned)`` checks what it returned (``warned``: a
    warning naming an undefined value or a NaN was given). Any other exception than SimkitError propagates
    (a raw exception fails the test). Returns the outcome, which is recorded as an event."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = call()
        except SimkitError as error:
            check_error(error, (*arguments, "samples", "sample"))
            outcome = "SimkitError"
        else:
            warned = any(UNDEFINED.search(str(w.message)) for w in caught)
            check(value, warned)
            outcome = "returned, with a warning" if warned else "returned"
    note(f"outcome: {outcome}")
    return outcome


def number_in(lo: float, hi: float) -> Callable[[Any, bool], None]:
    """A check: a Python float in ``[lo, hi]``, or NaN with a warning."""

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, float), f"returned {type(value).__name__}, not a float"
        check_numbers(np.array([value]), lo, hi, warned)

    return check


def check_numbers(values: np.ndarray, lo: float, hi: float, warned: bool, propagated: bool = False) -> None:
    """Finite entries in ``[lo, hi]`` (up to rounding); NaN only with a warning (or ``propagated`` from a
    non-finite input, where documented); never Inf."""
    values = np.asarray(values, dtype=np.float64)
    finite = values[np.isfinite(values)]
    if finite.size < values.size and not propagated:
        assert not np.isinf(values).any(), f"an infinite value: {values}"
        assert warned, f"a silent NaN: {values}"
    slack = TOLERANCE * max(1.0, abs(lo) if math.isfinite(lo) else 1.0, abs(hi) if math.isfinite(hi) else 1.0)
    assert ((finite >= lo - slack) & (finite <= hi + slack)).all(), f"values outside [{lo}, {hi}]: {finite}"


# ------------------------------------------------------------------------------------------ arrays

DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
          "complex64": torch.complex64}
VALUES = ("gaussian", "a NaN", "an Inf", "near float32 max", "tiny", "constant", "duplicate rows")
LAYOUTS = ("contiguous", "transposed", "strided", "expanded")
CONTAINERS = ("tensor", "numpy", "list", "meta")
ROWS = st.one_of(st.sampled_from([0, 1, 2, 3]), st.integers(4, 40))
FEATURES = st.one_of(st.sampled_from([0, 1]), st.integers(2, 6))


def one_in(count: int) -> st.SearchStrategy[bool]:
    """True one time in ``count`` (hypothesis draws small integers, 0 above all, far more often than others:
    a rare branch must not hang on ``integers(...) == 0``)."""
    return st.sampled_from([False] * (count - 1) + [True])


@dataclass
class Case:
    """One drawn input: ``value`` is passed; ``kinds`` say what it is; ``clean`` when it is a float32/float64
    tensor of finite, moderate values (a building block must then give finite values)."""

    value: Any
    kinds: tuple[str, ...]
    rows: int
    clean: bool


def _values(rng: np.random.Generator, rows: int, features: int, how: str) -> np.ndarray:
    """A float64 ``(rows, features)`` array of the ``how`` kind (:data:`VALUES`)."""
    base = rng.standard_normal((rows, features))
    if how == "constant":
        return np.full((rows, features), float(rng.integers(-3, 4)))
    if how == "duplicate rows" and rows > 1:
        base[rows // 2:] = base[0]
    if how == "near float32 max":
        base = base / max(1e-12, float(np.abs(base).max(initial=0.0))) * 3.0e38
    if how == "tiny":  # about 1e-40: subnormal in float32, 0 in float16
        base = base * 1e-40
    if base.size and how in ("a NaN", "an Inf"):
        spot = tuple(int(rng.integers(0, s)) for s in base.shape)
        base[spot] = math.nan if how == "a NaN" else float(rng.choice([-math.inf, math.inf]))
    return base


def _laid_out(array: np.ndarray, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """``array`` as a tensor of ``dtype`` with the ``layout`` (:data:`LAYOUTS`): the same values unless expanded."""
    def cast(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if dtype == torch.bool:
            return t > 0
        return (t if dtype.is_floating_point or dtype.is_complex else t.round()).to(dtype)

    if layout == "transposed":
        return cast(array.T).T
    if layout == "strided":
        doubled = np.repeat(array, 2, axis=0)
        return cast(doubled)[::2]
    if layout == "expanded" and array.size:
        return cast(array[:1]).expand(array.shape[0], array.shape[1])
    return cast(array)


def _contained(tensor: torch.Tensor, container: str) -> tuple[Any, str]:
    """``tensor`` in the ``container`` (:data:`CONTAINERS`); NumPy has no bfloat16 (kept a tensor)."""
    if container == "meta":
        return torch.empty(tensor.shape, dtype=tensor.dtype, device="meta"), container
    if container == "numpy" and tensor.dtype != torch.bfloat16:
        return tensor.numpy(), container
    if container == "list":
        return tensor.tolist(), container
    return tensor, "tensor"


@st.composite
def arrays(draw: st.DrawFn, rows: st.SearchStrategy[int] = ROWS, features: st.SearchStrategy[int] = FEATURES,
           square: bool = False, containers: tuple[str, ...] = CONTAINERS) -> Case:
    """A matrix of every kind in the module docstring (``square``: ``(n, n)``, a Gram)."""
    n = draw(rows)
    p = n if square else draw(features)
    dtype_name = draw(st.sampled_from(["float64", "float32", *DTYPES]))  # the common ones drawn more often
    dtype = DTYPES[dtype_name]
    how = draw(st.sampled_from(["gaussian"] * 3 + list(VALUES))) if dtype.is_floating_point or dtype.is_complex else \
        draw(st.sampled_from(["gaussian", "constant", "duplicate rows"]))
    layout = draw(st.sampled_from(LAYOUTS))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    array = _values(rng, n, p, how)
    tensor = _laid_out(array, layout, dtype)
    value, container = _contained(tensor, draw(st.sampled_from([containers[0]] * 2 + list(containers))))
    kinds = (f"rows={n if n < 4 else '4+'}", f"features={p if p < 2 else '2+'}", dtype_name, how, layout,
             container)
    clean = (container == "tensor" and dtype in (torch.float32, torch.float64) and how != "near float32 max"
             and bool(torch.isfinite(tensor).all()))
    return Case(value, kinds, n, clean)


def record(label: str, case: Case) -> None:
    """Record the kinds of one drawn input (``--hypothesis-show-statistics``)."""
    for kind in case.kinds:
        note(f"{label}: {kind}")


@st.composite
def pairs(draw: st.DrawFn) -> tuple[Case, Case]:
    """``x`` and ``y``: y of x's rows three times in four, each of its own kinds."""
    x = draw(arrays())
    y_rows = ROWS if draw(one_in(4)) else st.just(x.rows)
    return x, draw(arrays(rows=y_rows))


@st.composite
def well_formed(draw: st.DrawFn, rows: st.SearchStrategy[int] = st.integers(2, 40),
                features: st.SearchStrategy[int] = st.integers(1, 6)) -> Case:
    """A float32 or float64 tensor of Gaussian values, now and then with duplicated rows or constant: input
    the library must turn into numbers (the engine tests mix it with :func:`arrays`)."""
    n, p = draw(rows), draw(features)
    how = draw(st.sampled_from(["gaussian", "gaussian", "gaussian", "duplicate rows", "constant"]))
    dtype = draw(st.sampled_from(["float32", "float64"]))
    array = _values(np.random.default_rng(draw(st.integers(0, 2**16))), n, p, how)
    kinds = (f"rows={n if n < 4 else '4+'}", f"features={p if p < 2 else '2+'}", dtype, how, "contiguous", "tensor")
    return Case(torch.from_numpy(array).to(DTYPES[dtype]), kinds, n, True)


def mostly_well_formed(rows: st.SearchStrategy[int] | None = None, features: st.SearchStrategy[int] | None = None,
                       **options: Any) -> st.SearchStrategy[Case]:
    """:func:`well_formed` five times in six, else any kind of :func:`arrays` (of ``rows`` and ``features``)."""
    odd = arrays(ROWS if rows is None else rows, FEATURES if features is None else features, **options)
    good = well_formed(st.integers(2, 40) if rows is None else rows, st.integers(1, 6) if features is None else features)
    return one_in(6).flatmap(lambda rare: odd if rare else good)


# ------------------------------------------------------------------------------------------ settings

#: the valid values of each setting (``_choices`` records them)
VALID: dict[str, list[Any]] = {}


def _choices(valid: list[Any], invalid: list[Any], name: str | None = None) -> st.SearchStrategy[Any]:
    """Valid values three times as often as invalid ones."""
    if name is not None:
        VALID[name] = valid
    return st.sampled_from(valid * 3 + invalid)


NUMBER_EDGES = [0, -1, math.nan, math.inf, "1", None, True]
SETTINGS: dict[str, st.SearchStrategy[Any]] = {
    "k": _choices([1, 2, 3, 5, 10], [0, -1, 2.5, math.nan, math.inf, "3", None, 10**9], name="k"),
    "form": _choices(["auto", "features", "gram"], ["nope", None], name="form"),
    "factor": _choices([1.0, 0.5, 2.0], NUMBER_EDGES, name="factor"),
    "sigma": _choices([None, 1.0, 0.3], NUMBER_EDGES, name="sigma"),
    "cca_eps": _choices([0.0, 1e-3, 0.1], [-1, math.nan, math.inf, "0", None], name="cca_eps"),
    "svcca_keep": _choices([0.99, 0.5, 1.0], [0, 1.5, -1, math.nan, None], name="svcca_keep"),
    "shape_alpha": _choices([0.5, 0.0, 1.0], [-0.1, 1.1, math.nan, None], name="shape_alpha"),
    "ridge_lambda": _choices([1e-2, 0.0, 1.0], [-1, math.nan, math.inf, None], name="ridge_lambda"),
    "ridge_folds": _choices([2, 3, 5], [1, 0, 2.5, "5", None], name="ridge_folds"),
    "rsa_distance": _choices(list(RSA_DISTANCES), ["nope", None], name="rsa_distance"),
    "rsa_compare": _choices(list(RSA_COMPARES), ["nope", None], name="rsa_compare"),
    "dcor_estimator": _choices(list(DCOR_ESTIMATORS), ["nope", None], name="dcor_estimator"),
    "chunk": _choices([None, 1, 7], [0, -1, 2.5, math.nan], name="chunk"),
    "tau": _choices([0.1, 0.01, 1.0], NUMBER_EDGES, name="tau"),
    "q": _choices([0.95, None, 0.5], [-0.1, 1.5, math.nan], name="q"),
}


def keywords(fn: Callable[..., Any], skip: int) -> dict[str, st.SearchStrategy[Any]]:
    """The keyword parameters of ``fn`` after its first ``skip`` that the fuzz draws (:data:`SETTINGS`)."""
    names = list(inspect.signature(fn).parameters)[skip:]
    return {name: SETTINGS[name] for name in names if name in SETTINGS}


# ------------------------------------------------------------------------------------------ simkit.metrics

MEASURE_FUNCTIONS = sorted(name for name in metrics.__all__ if name in MEASURES)


@FUZZ
@given(st.data())
def test_catalogue_measures(data: st.DataObject) -> None:
    """Every catalogue measure of ``simkit.metrics.__all__`` on every kind of ``x`` and ``y``."""
    note("case: test_catalogue_measures")
    name = data.draw(st.sampled_from(MEASURE_FUNCTIONS), label="measure")
    fn = getattr(metrics, name)
    x, y = data.draw(pairs(), label="x, y")
    chosen = data.draw(st.fixed_dictionaries(keywords(fn, 2)), label="settings")
    note(f"measure: {name}")
    record("x", x)
    record("y", y)
    # a one-shot function's ``k`` is the catalogue's setting ``knn_k``, the name its refusal gives (checked by
    # the setting's declaration, as the CLI's --knn-k)
    arguments = ("x", "y", *chosen, *(["knn_k"] if "k" in chosen else []))
    check_call(lambda: fn(x.value, y.value, **chosen), arguments, number_in(*documented_range(name)))


@st.composite
def related_pairs(draw: st.DrawFn) -> tuple[Case, Case]:
    """Well-formed ``x`` and ``y`` (float64 or float32, 2–40 rows, 1–6 features), ``y`` independent of ``x``, a
    noisy linear map of it or ``x`` itself: values near both ends of a measure's range."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    n, p, q = draw(st.integers(2, 40)), draw(st.integers(1, 6)), draw(st.integers(1, 6))
    how = draw(st.sampled_from(["gaussian", "duplicate rows", "tiny", "near float32 max"]))
    x = _values(rng, n, p, how)
    relation = draw(st.sampled_from(["independent", "linear map", "noisy linear map", "same"]))
    noise = {"independent": 1.0, "linear map": 0.0, "noisy linear map": 0.1, "same": 0.0}[relation]
    mixed = x @ rng.standard_normal((p, q)) if relation != "independent" else np.zeros((n, q))
    y = x.copy() if relation == "same" else mixed + noise * rng.standard_normal((n, q)) * np.abs(x).max(initial=1.0)
    dtype = DTYPES[draw(st.sampled_from(["float64", "float32"]))]
    kinds = (f"rows={n if n < 4 else '4+'}", how, relation, str(dtype))
    return (Case(torch.from_numpy(x).to(dtype), kinds, n, True),
            Case(torch.from_numpy(y).to(dtype), kinds, n, True))


@FUZZ
@given(st.data())
def test_catalogue_measures_on_well_formed_data(data: st.DataObject) -> None:
    """Every catalogue measure of ``simkit.metrics.__all__`` on well-formed data, unrelated to identical, with
    valid settings: its values stay in the documented range (or NaN with a warning)."""
    note("case: test_catalogue_measures_on_well_formed_data")
    name = data.draw(st.sampled_from(MEASURE_FUNCTIONS), label="measure")
    fn = getattr(metrics, name)
    x, y = data.draw(related_pairs(), label="x, y")
    valid = {key: st.sampled_from(VALID[key]) for key in keywords(fn, 2)}
    chosen = data.draw(st.fixed_dictionaries(valid), label="settings")
    note(f"measure: {name}")
    record("x, y", x)
    arguments = ("x", "y", *chosen, *(["knn_k"] if "k" in chosen else []))
    check_call(lambda: fn(x.value, y.value, **chosen), arguments, number_in(*documented_range(name)))


def tensor_in(lo: float, hi: float, propagated: bool) -> Callable[[Any, bool], None]:
    """A check: a tensor (on the CPU) whose values lie in ``[lo, hi]``; NaN/Inf from a non-clean input may
    propagate (documented for the building blocks and the losses)."""

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, torch.Tensor), f"returned {type(value).__name__}, not a tensor"
        assert value.device.type != "meta", "a meta tensor returned: no values"
        check_numbers(value.detach().to(torch.float64).numpy(), lo, hi, warned, propagated)

    return check


def _gram_case(data: st.DataObject, label: str) -> Case:
    case = data.draw(arrays(square=True), label=label)
    record(label, case)
    return case


def _fuzz_gram(data: st.DataObject, fn: Callable[..., Any], name: str) -> None:
    """A building block of one matrix ``k (n, n)``: finite output for a clean input."""
    k = _gram_case(data, "k")
    check_call(lambda: fn(k.value), (name,), tensor_in(-math.inf, math.inf, not k.clean))


def _fuzz_hsic(data: st.DataObject, fn: Callable[..., Any]) -> None:
    """HSIC of two Grams ``K``, ``L``."""
    big_k, big_l = _gram_case(data, "K"), _gram_case(data, "L")
    check_call(lambda: fn(big_k.value, big_l.value), ("K", "L"),
               tensor_in(-math.inf, math.inf, not (big_k.clean and big_l.clean)))


def _fuzz_features(data: st.DataObject, fn: Callable[..., Any], lo: float = -math.inf) -> None:
    """A building block of ``x (n, p)`` with its drawn settings."""
    x = data.draw(arrays(), label="x")
    record("x", x)
    chosen = data.draw(st.fixed_dictionaries(keywords(fn, 1)), label="settings")
    check_call(lambda: fn(x.value, **chosen), ("x", *chosen), tensor_in(lo, math.inf, not x.clean))


def _fuzz_knn_indices(data: st.DataObject) -> None:
    """Neighbour indices: int64 ``(n, k)`` in ``[0, n)``, never the row itself."""
    x = data.draw(arrays(), label="x")
    record("x", x)
    k = data.draw(SETTINGS["k"], label="k")
    chunk = data.draw(SETTINGS["chunk"], label="chunk")

    def check(value: Any, warned: bool) -> None:
        n = x.rows
        assert value.dtype == torch.int64 and value.shape == (n, int(k))
        assert bool(((value >= 0) & (value < n)).all()) and not bool((value == torch.arange(n)[:, None]).any())

    check_call(lambda: metrics.knn_indices(x.value, k, chunk), ("x", "k", "chunk"), check)


def _fuzz_loss(data: st.DataObject, fn: Callable[..., Any]) -> None:
    """A loss of ``(target, guide)``: a 0-d tensor; values are not checked by the losses (documented: NaN
    from a NaN input propagates to the training loop), a NaN from clean inputs needs a warning."""
    target, guide = data.draw(pairs(), label="target, guide")
    record("target", target)
    record("guide", guide)
    chosen = data.draw(st.fixed_dictionaries(keywords(fn, 2)), label="settings")
    names = tuple(inspect.signature(fn).parameters)[:2]  # (target, guide), or (x, y) for soft_mutual_knn
    check_call(lambda: fn(target.value, guide.value, **chosen), (*names, *chosen),
               tensor_in(-math.inf, math.inf, not (target.clean and guide.clean)))


def _fuzz_alignment_loss(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(["cka", "unbiased_cka", "dmnn", "nope", "", "CKA"]), label="name")

    def check(value: Any, warned: bool) -> None:
        assert callable(value)

    check_call(lambda: metrics.alignment_loss(name), ("name", "loss"), check)


def _fuzz_measure_settings(data: st.DataObject) -> None:
    """``MeasureSettings(**fields).validate()`` with drawn measure settings (and metrics, n, batch_size)."""
    fields = {name: strategy for name, strategy in SETTINGS.items()
              if name in {"cca_eps", "svcca_keep", "shape_alpha", "ridge_lambda", "ridge_folds", "rsa_distance",
                          "rsa_compare", "dcor_estimator"}}
    fields["knn_k"] = SETTINGS["k"]
    fields["rbf_factor"] = SETTINGS["factor"]
    fields["metrics"] = st.sampled_from([["linear_cka"], "cca", [], ["nope"], "rsa,cknna", None])
    fields["batch_size"] = _choices([8, 64], [0, -1, 2.5, None])
    fields["n"] = _choices([None, 10], [0, -5, math.nan])
    chosen = data.draw(st.fixed_dictionaries({}, optional=fields), label="fields")

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, metrics.MeasureSettings)

    check_call(lambda: metrics.MeasureSettings(**chosen).validate(), tuple(chosen), check)


#: how each name of ``simkit.metrics.__all__`` that is not a catalogue measure is fuzzed
RECIPES: dict[str, Callable[[st.DataObject], None]] = {
    "gram_linear": lambda data: _fuzz_features(data, metrics.gram_linear),
    "gram_rbf": lambda data: _fuzz_features(data, metrics.gram_rbf, lo=0.0),
    "center_gram": lambda data: _fuzz_gram(data, metrics.center_gram, "k"),
    "u_center_gram": lambda data: _fuzz_gram(data, metrics.u_center_gram, "k"),
    "hsic_biased": lambda data: _fuzz_hsic(data, metrics.hsic_biased),
    "hsic_unbiased": lambda data: _fuzz_hsic(data, metrics.hsic_unbiased),
    "knn_indices": _fuzz_knn_indices,
    "rdm": lambda data: _fuzz_features(data, metrics.rdm, lo=0.0),
    "cka_loss": lambda data: _fuzz_loss(data, metrics.cka_loss),
    "unbiased_cka_loss": lambda data: _fuzz_loss(data, metrics.unbiased_cka_loss),
    "dmnn_loss": lambda data: _fuzz_loss(data, metrics.dmnn_loss),
    "soft_mutual_knn": lambda data: _fuzz_loss(data, metrics.soft_mutual_knn),
    "alignment_loss": _fuzz_alignment_loss,
    "MeasureSettings": _fuzz_measure_settings,
}


def test_every_public_metric_is_fuzzed() -> None:
    """A public name of ``simkit.metrics`` is a catalogue measure (fuzzed generically) or has a recipe."""
    missing = sorted(set(metrics.__all__) - set(MEASURE_FUNCTIONS) - set(RECIPES))
    assert not missing, f"add a fuzz recipe (RECIPES) for {missing}"
    assert not set(RECIPES) - set(metrics.__all__), "a recipe for a name that is no longer public"


@FUZZ
@given(st.data())
def test_other_metric_functions(data: st.DataObject) -> None:
    """Every other public function of ``simkit.metrics`` (building blocks, losses, settings) by its recipe."""
    note("case: test_other_metric_functions")
    name = data.draw(st.sampled_from(sorted(RECIPES)), label="function")
    note(f"function: {name}")
    RECIPES[name](data)


# ------------------------------------------------------------------------------------------ simkit.stats

SEED_ENTRIES = st.one_of(st.floats(-3.0e38, 3.0e38), st.sampled_from([math.nan, math.inf, -math.inf, None, 0.0]),
                         st.integers(-5, 5), st.booleans())
BAD_ENTRIES = st.sampled_from(["a", 1 + 2j, [1.0, 2.0]])


@st.composite
def seed_values(draw: st.DrawFn) -> tuple[Any, str]:
    """One value per seed: a list, a NumPy array, a tensor of any dtype (meta too), a generator or a scalar;
    entries finite, NaN, ±Inf, None, near float32's largest, and now and then not a number at all."""
    entries = draw(st.lists(SEED_ENTRIES, max_size=8))
    if draw(one_in(10)):
        entries.append(draw(BAD_ENTRIES))
    form = draw(st.sampled_from(["list", "numpy", "tensor", "meta tensor", "generator", "scalar"]))
    numbers = [math.nan if e is None else e for e in entries]
    if form == "scalar":
        return (entries[0] if entries else 1.0), form
    if form == "generator":
        return iter(entries), form
    try:
        if form == "numpy":
            return np.asarray(numbers), form
        if form in ("tensor", "meta tensor"):
            dtype = DTYPES[draw(st.sampled_from(list(DTYPES)))]
            tensor = torch.tensor(numbers, dtype=torch.float64).to(dtype)
            return (tensor.to("meta") if form == "meta tensor" else tensor), f"{form} {dtype}"
    except (TypeError, ValueError, RuntimeError):  # not representable: give the list as it is
        pass
    return entries, "list"


def interval_check(finite_count: int | None = None) -> Callable[[Any, bool], None]:
    """An Interval: NaN exactly where documented (mean with no finite value, std/low/high below two), else
    finite with ``low <= mean <= high``; ``n`` the number of finite values when known."""

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, stats.Interval)
        if finite_count is not None:
            assert value.n == finite_count
        spread = np.array([value.std, value.low, value.high])
        assert math.isnan(value.mean) == (value.n == 0)
        assert np.isnan(spread).all() if value.n < 2 else np.isfinite(spread).all()
        if value.n >= 2:
            assert value.low <= value.mean <= value.high and value.std >= 0

    return check


def _finite_count(values: Any) -> int | None:
    """How many of ``values`` are finite numbers, where NumPy reads them (else None: not checked)."""
    try:
        array = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError, RuntimeError):
        return None
    return int(np.isfinite(array).sum())


CONFIDENCES = _choices([0.95, 0.9, 0.5], [0, 1, 1.5, -0.1, math.nan, True, "0.9", None])


def _fuzz_t_interval(data: st.DataObject) -> None:
    values, form = data.draw(seed_values(), label="values")
    confidence = data.draw(CONFIDENCES, label="confidence")
    note(f"values: {form}")
    count = None if isinstance(values, Iterator) else _finite_count(values)  # (an iterator is read once)
    check_call(lambda: stats.t_interval(values, confidence), ("values", "confidence"), interval_check(count))


def _fuzz_paired_difference(data: st.DataObject) -> None:
    (a, form_a), (b, form_b) = data.draw(seed_values(), label="a"), data.draw(seed_values(), label="b")
    note(f"a: {form_a}")
    note(f"b: {form_b}")
    check_call(lambda: stats.paired_difference(a, b), ("a", "b"), interval_check())


def _interval(data: st.DataObject) -> stats.Interval:
    entries = data.draw(st.lists(st.floats(-1e6, 1e6), max_size=5), label="interval values")
    return stats.t_interval(entries)


def _fuzz_verdict(data: st.DataObject) -> None:
    interval = _interval(data)
    higher = data.draw(st.booleans(), label="higher")
    size = data.draw(_choices([0.0, 0.1, 1.0], [math.nan, math.inf, -math.inf, "0", None]), label="size")

    def check(value: Any, warned: bool) -> None:
        assert value in stats.VERDICTS

    check_call(lambda: stats.verdict(interval, higher, size), ("interval", "higher", "size"), check)


def _fuzz_beyond_noise(data: st.DataObject) -> None:
    interval = _interval(data)

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, bool)

    check_call(lambda: stats.beyond_noise(interval), ("interval",), check)


def _fuzz_binomial_se(data: st.DataObject) -> None:
    """A standard error in [0, 0.5]; NaN for a NaN (missing) accuracy without a warning (documented), else
    only with one."""
    accuracy = data.draw(_choices([0.0, 0.5, 1.0, 0.9], [math.nan, -0.1, 1.5, math.inf]), label="accuracy")
    n = data.draw(_choices([1, 10, 1000], [0, -1]), label="n")

    def check(value: Any, warned: bool) -> None:
        check_numbers(np.array([value]), 0.0, 0.5, warned, propagated=math.isnan(accuracy))

    check_call(lambda: stats.binomial_se(accuracy, n), ("accuracy", "n"), check)


RECORD_VALUES = st.one_of(st.floats(-1e6, 1e6), st.sampled_from([None, math.nan, math.inf, "x", [1.0], True]))


def _fuzz_interval_of(data: st.DataObject) -> None:
    """A flat record read back: each field the record's number, NaN where it is missing, None or NaN."""
    record_ = data.draw(st.fixed_dictionaries({}, optional={key: RECORD_VALUES for key in
                                                            ("gain", "gain_std", "gain_low", "gain_high")}),
                        label="record")
    n = data.draw(_choices([0, 1, 3], [-1, 2.5, math.nan, "3", None]), label="n")

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, stats.Interval) and value.n == n
        for key, got in (("gain", value.mean), ("gain_std", value.std), ("gain_low", value.low),
                         ("gain_high", value.high)):
            given = record_.get(key)
            assert (math.isnan(got) if given is None or given != given else got == float(given))

    check_call(lambda: stats.interval_of(record_, "gain", n), ("record", "n"), check)


def _fuzz_interval_methods(data: st.DataObject) -> None:
    interval = _interval(data)
    factor = data.draw(_choices([100.0, 0.5], NUMBER_EDGES), label="factor")
    digits = data.draw(_choices([0, 1, 3], [-1, 2.5, None]), label="digits")
    check_call(lambda: interval.scaled(factor), ("factor",), interval_check(interval.n))

    def is_text(value: Any, warned: bool) -> None:
        assert isinstance(value, str) and value

    check_call(lambda: interval.text(digits, " points"), ("digits",), is_text)


def _fuzz_check_confidence(data: st.DataObject) -> None:
    confidence = data.draw(CONFIDENCES, label="confidence")

    def check(value: Any, warned: bool) -> None:
        assert isinstance(value, float) and 0 < value < 1

    check_call(lambda: stats.check_confidence(confidence), ("confidence",), check)


STATS_RECIPES: dict[str, Callable[[st.DataObject], None]] = {
    "t_interval": _fuzz_t_interval,
    "paired_difference": _fuzz_paired_difference,
    "verdict": _fuzz_verdict,
    "beyond_noise": _fuzz_beyond_noise,
    "binomial_se": _fuzz_binomial_se,
    "interval_of": _fuzz_interval_of,
    "Interval": _fuzz_interval_methods,
    "check_confidence": _fuzz_check_confidence,
}


def test_every_public_stats_function_is_fuzzed() -> None:
    """Every public function and class of ``simkit.stats`` (defined there) has a recipe."""
    public = {name for name, value in vars(stats).items() if not name.startswith("_") and callable(value)
              and getattr(value, "__module__", None) == stats.__name__}
    assert public == set(STATS_RECIPES), f"fuzz recipes missing for {sorted(public - set(STATS_RECIPES))}"


@FUZZ
@given(st.data())
def test_stats_functions(data: st.DataObject) -> None:
    """Every public function of ``simkit.stats`` on every kind of per-seed values and settings."""
    note("case: test_stats_functions")
    name = data.draw(st.sampled_from(sorted(STATS_RECIPES)), label="function")
    note(f"function: {name}")
    STATS_RECIPES[name](data)


# ------------------------------------------------------------------------------------------ the engine

WIDTH = 3
torch.manual_seed(0)
#: two small models over WIDTH features (layers "0" and "2") and one of elementwise layers that takes any width
MODELS = {"linear": (nn.Sequential(nn.Linear(WIDTH, 5), nn.Tanh(), nn.Linear(5, 4)),
                     nn.Sequential(nn.Linear(WIDTH, 4), nn.ReLU(), nn.Linear(4, 3)), ["0", "2"]),
          "elementwise": (nn.Sequential(nn.Tanh(), nn.Softsign()), nn.Sequential(nn.ReLU(), nn.Tanh()), ["0", "1"])}
DATA_FEATURES = st.sampled_from([WIDTH] * 6 + [0, 1, 2, WIDTH + 1])


class LyingDataset:
    """A map-style dataset whose ``len`` claims more samples than ``__getitem__`` gives."""

    def __init__(self, x: torch.Tensor, claimed: int):
        self.x, self.claimed = x, claimed

    def __len__(self) -> int:
        return self.claimed

    def __getitem__(self, index: int) -> torch.Tensor:
        if index >= len(self.x):
            raise IndexError(index)
        return self.x[index]


@dataclass
class DataCase:
    """Data for a model: ``make()`` gives it afresh (iterables are used up), ``kinds`` say what it is."""

    make: Callable[[], Any]
    kinds: tuple[str, ...]


def _batches(shapes: list[tuple[int, ...]], seed: int, as_tuples: bool) -> Callable[[], Iterator[Any]]:
    def make() -> Iterator[Any]:
        generator = torch.Generator().manual_seed(seed)
        for shape in shapes:
            batch = torch.randn(*shape, generator=generator)
            yield (batch, torch.zeros(shape[0] if shape else 1)) if as_tuples else batch
    return make


@st.composite
def iterables(draw: st.DrawFn) -> DataCase:
    """Iterables of batches: ending at once or early, rows per batch drawn, now and then a batch of another
    width or rank; batches or ``(inputs, labels)`` tuples."""
    count = draw(st.integers(0, 5))
    rows = [draw(st.integers(0, 9)) for _ in range(count)]
    shapes: list[tuple[int, ...]] = [(r, WIDTH) for r in rows]
    odd = "same shapes"
    if shapes and draw(st.booleans()):
        spot = draw(st.integers(0, len(shapes) - 1))
        odd = draw(st.sampled_from(["another width", "another rank"]))
        shapes[spot] = (rows[spot], WIDTH + 1) if odd == "another width" else (rows[spot],)
    as_tuples = draw(st.booleans())
    kinds = (f"iterable of {count} batches", odd, "tuples" if as_tuples else "tensors")
    return DataCase(_batches(shapes, draw(st.integers(0, 2**16)), as_tuples), kinds)


@st.composite
def datas(draw: st.DrawFn) -> DataCase:
    """Data of every kind: a matrix of any kind above (as a tensor, NumPy array, list or on the meta device), a
    dict of it, an iterable of batches, or a map-style dataset whose length lies."""
    form = draw(st.sampled_from(["matrix"] * 4 + ["dict", "iterable", "iterable", "lying dataset"]))
    if form == "iterable":
        return draw(iterables())
    case = draw(mostly_well_formed(features=DATA_FEATURES))
    value = case.value
    if form == "dict":
        return DataCase(lambda: {"x": value}, ("dict", *case.kinds))
    if form == "lying dataset" and isinstance(value, torch.Tensor) and value.device.type != "meta":
        claimed = case.rows + draw(st.integers(1, 5))
        return DataCase(lambda: LyingDataset(value, claimed), ("map-style dataset, length lies", *case.kinds))
    return DataCase(lambda: value, case.kinds)


@st.composite
def compare_settings(draw: st.DrawFn) -> dict[str, Any]:
    """``compare``'s settings: one or two measures of the catalogue, either mode, small batches, a sample cap,
    a small null; one time in five with invalid values among them."""
    invalid_too = draw(one_in(5))

    def choose(valid: list[Any], invalid: list[Any]) -> Any:
        return draw(_choices(valid, invalid) if invalid_too else st.sampled_from(valid))

    first, second = draw(st.sampled_from(list(METRICS))), draw(st.sampled_from([None, *METRICS]))
    return {"metrics": list(dict.fromkeys([first] if second is None else [first, second])),
            "mode": draw(st.sampled_from(["minibatch", "exact"])), "batch_size": choose([4, 8, 16], [0, -1]),
            "n": choose([None, 6, 30], [0]), "null": choose([0, 2], [None, -1])}


def result_check() -> Callable[[Any, bool], None]:
    """A CompareResult or StudyResult: every value of a measure in its range or NaN with a warning; its
    chance level and null columns in the same range where present."""

    def check(result: Any, warned: bool) -> None:
        frame = result.to_frame()
        assert len(frame), "an empty result"
        for metric, rows in frame.groupby("metric"):
            lo, hi = documented_range(str(metric))
            check_numbers(rows["value"].to_numpy(), lo, hi, warned)
            for column in ("chance", "null_mean", "null_p95"):
                if column in rows:
                    check_numbers(rows[column].to_numpy(), lo, hi, warned, propagated=True)

    return check


ENGINE_ARGUMENTS = ("data", "model_a", "model_b", "model", "metrics", "mode", "batch_size", "n", "null", "layer",
                    "layers", "knn_k", "ridge_folds", "paths", "pairing", "out")


@ENGINE
@given(models=st.sampled_from(sorted(MODELS)), data=datas(), chosen=compare_settings())
def test_compare(models: str, data: DataCase, chosen: dict[str, Any]) -> None:
    """``simkit.compare`` of two small models on every kind of data and settings."""
    note("case: test_compare")
    model_a, model_b, layers = MODELS[models]
    for kind in data.kinds:
        note(f"data: {kind}")
    check_call(lambda: simkit.compare(model_a, model_b, data.make(), layers_a=layers, layers_b=layers,
                                      progress=False, **chosen), ENGINE_ARGUMENTS, result_check())


@ENGINE
@given(models=st.sampled_from(sorted(MODELS)), data=datas(), chosen=compare_settings(),
       pairing=st.sampled_from(["last", "first", "depth:0.5", "nope", "depth:2"]))
def test_capture_then_compare_caches_and_study(models: str, data: DataCase, chosen: dict[str, Any],
                                               pairing: str) -> None:
    """``simkit.capture`` of every kind of data; then ``compare_caches`` and ``study`` on the caches it wrote."""
    note("case: test_capture_then_compare_caches_and_study")
    model_a, model_b, layers = MODELS[models]
    for kind in data.kinds:
        note(f"data: {kind}")
    with tempfile.TemporaryDirectory() as folder:
        caches = [Path(folder) / name for name in ("a", "b", "c")]

        def capture_all() -> list[Path]:
            return [simkit.capture(model, data.make(), cache, layers=layers, batch_size=8, progress=False)
                    for model, cache in zip((model_a, model_b, model_a), caches, strict=True)]

        def paths_written(value: Any, warned: bool) -> None:
            assert all((path / "manifest.json").is_file() for path in value)

        if check_call(capture_all, ENGINE_ARGUMENTS, paths_written) == "SimkitError":
            return
        check_call(lambda: simkit.compare_caches(caches[0], caches[1], progress=False, **chosen),
                   ENGINE_ARGUMENTS, result_check())
        check_call(lambda: simkit.study(caches, pairing=pairing, progress=False, **chosen), ENGINE_ARGUMENTS,
                   result_check())


SHARED_ROWS = st.shared(st.integers(2, 40), key="rows")  # the samples of every source of one example


@st.composite
def activations(draw: st.DrawFn, label: str) -> tuple[Any, tuple[str, ...]]:
    """A mapping of one to three layers of every kind above (one row count for most, that of the other
    sources nine times in ten), or a tuple of them (Hugging Face ``hidden_states``)."""
    rows = draw(st.integers(2, 40)) if draw(one_in(10)) else draw(SHARED_ROWS)
    count = draw(st.integers(1, 3))
    cases = [draw(mostly_well_formed(rows=ROWS if draw(one_in(10)) else st.just(rows)))
             for _ in range(count)]
    for case in cases:
        record(label, case)
    if draw(one_in(5)):
        return tuple(case.value for case in cases), ("hidden_states tuple",)
    return {f"l{i}": case.value for i, case in enumerate(cases)}, ("mapping",)


IDS = one_in(4).flatmap(lambda rare: st.lists(st.sampled_from(["s0", "s1", "s2", "s3", "s4", "s5", "s6"]), max_size=8)
                        if rare else st.none())


@ENGINE
@given(a=activations("acts_a"), b=activations("acts_b"), chosen=compare_settings(), ids_a=IDS, ids_b=IDS)
def test_compare_arrays(a: tuple[Any, tuple[str, ...]], b: tuple[Any, tuple[str, ...]], chosen: dict[str, Any],
                        ids_a: list[str] | None, ids_b: list[str] | None) -> None:
    """``simkit.compare_arrays`` on activations in memory of every kind, with and without sample IDs."""
    note("case: test_compare_arrays")
    note(f"acts_a: {a[1][0]}")
    check_call(lambda: simkit.compare_arrays(a[0], b[0], ids_a=ids_a, ids_b=ids_b, progress=False, **chosen),
               (*ENGINE_ARGUMENTS, "acts_a", "acts_b", "ids_a", "ids_b", "min_overlap"), result_check())


@ENGINE
@given(sources=one_in(10).flatmap(lambda rare: st.lists(activations("paths"), min_size=1 if rare else 2, max_size=4)),
       chosen=compare_settings(),
       pairing=st.sampled_from(["last", "first", "depth:0.5", "l0", "l0=l1", "nope"]))
def test_study_of_arrays(sources: list[tuple[Any, tuple[str, ...]]], chosen: dict[str, Any], pairing: str) -> None:
    """``simkit.study`` on activations in memory of every kind."""
    note("case: test_study_of_arrays")
    check_call(lambda: simkit.study([s[0] for s in sources], pairing=pairing, progress=False, **chosen),
               (*ENGINE_ARGUMENTS, "min_overlap"), result_check())


def _write(path: Path, value: Any) -> Path:
    """``value`` (one layer, any kind above) written as ``path``; a kind the format cannot hold is written as
    ``.pt`` instead (torch.save holds every tensor)."""
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    try:
        if path.suffix == ".npy":
            np.save(path, value if isinstance(value, np.ndarray) else tensor.numpy())
        elif path.suffix == ".npz":
            np.savez(path, layer=value if isinstance(value, np.ndarray) else tensor.numpy())
        elif path.suffix == ".safetensors":
            from safetensors.torch import save_file

            save_file({"layer": tensor.contiguous()}, str(path))
        else:
            torch.save({"layer": tensor}, path)
        return path
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        path.unlink(missing_ok=True)
        fallback = path.with_suffix(".pt")
        torch.save({"layer": tensor}, fallback)
        return fallback


@ENGINE
@given(a=mostly_well_formed(SHARED_ROWS, containers=("tensor", "numpy", "meta")),
       b=mostly_well_formed(st.one_of(SHARED_ROWS, ROWS), containers=("tensor", "numpy")),
       formats=st.tuples(*[st.sampled_from([".npy", ".npz", ".pt", ".safetensors"])] * 2),
       chosen=compare_settings())
def test_activation_files(a: Case, b: Case, formats: tuple[str, str], chosen: dict[str, Any]) -> None:
    """``simkit.load_activations`` and ``compare_arrays`` on files holding every kind of array."""
    note("case: test_activation_files")
    record("file a", a)
    record("file b", b)
    with tempfile.TemporaryDirectory() as folder:
        path_a = _write(Path(folder) / f"a{formats[0]}", a.value)
        path_b = _write(Path(folder) / f"b{formats[1]}", b.value)
        note(f"file a: {path_a.suffix}")

        def loaded(value: Any, warned: bool) -> None:
            with value:
                assert value.rows == a.rows and value.layers

        check_call(lambda: simkit.load_activations(path_a), ("path", "layer"), loaded)
        check_call(lambda: simkit.compare_arrays(path_a, path_b, progress=False, **chosen),
                   (*ENGINE_ARGUMENTS, "acts_a", "acts_b"), result_check())


# ------------------------------------------------------------------------------------------ open breaches


def test_cknna_above_one_is_a_value_not_nan() -> None:
    """Found by the fuzz: cknna is not bounded by 1 (its self terms keep each layer's own neighbour pairs, as
    in platonic-rep), so the |ratio| ≤ 1 rule of cka_ratio turned defined values into NaN; its catalogue range
    now says it may exceed 1, and a value just above 1 comes back as it is."""
    x = torch.tensor([[0.1257], [-0.1321], [0.6404], [0.1049]], dtype=torch.float64)
    y = x @ torch.tensor([[-0.5355, 0.3618]], dtype=torch.float64)
    value = metrics.cknna(x, y, k=1)   # the same neighbours on both sides: about 1
    assert math.isfinite(value) and abs(value - 1.0) < 0.01
    assert MEASURES["cknna"].hi is None


def test_cknna_far_below_minus_one_is_platonic_reps_value() -> None:
    """Found by CI's fuzz run: with duplicate rows and k = 2 cknna is -9.86, as platonic-rep's dense-mask
    definition gives (the reference), not an error; its range is unbounded both ways, which the fuzz's
    documented range now reads from the catalogue's "may be < 0 or > 1"."""
    x = torch.tensor([[0.1257, -0.1321], [0.6404, 0.1049], [0.1257, -0.1321], [0.1257, -0.1321]],
                     dtype=torch.float64)
    y = torch.tensor([[0.0787], [-0.5834], [0.0787], [0.0787]], dtype=torch.float64)
    value = metrics.cknna(x, y, k=2)
    assert value < -9 and value == pytest.approx(reference.cknna(x.numpy(), y.numpy(), 2), rel=1e-12)
    assert documented_range("cknna") == (-math.inf, math.inf)


@pytest.mark.parametrize(("metric", "seed", "rows"), [("bures_similarity", 0, 12), ("unbiased_cka", 10, 4)])
def test_a_nan_from_the_engine_comes_with_a_warning(metric: str, seed: int, rows: int) -> None:
    """Found by the fuzz: NaN without a warning from compare's stored pairwise path (an RDM undefined for a
    sample that ReLU zeroed) and from the minibatch path (an unbiased self-HSIC of 0 at 4 samples)."""
    data = torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    model_a, model_b, _ = MODELS["elementwise"]  # B applies ReLU first: rows of zeros
    outcome = check_call(lambda: simkit.compare(model_a, model_b, data, metrics=[metric], layers_a=["0"],
                                                layers_b=["0"], null=0, batch_size=rows, progress=False),
                         ENGINE_ARGUMENTS, result_check())
    assert outcome == "returned, with a warning"

