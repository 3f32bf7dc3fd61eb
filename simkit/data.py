"""Data specs → :class:`Dataset`.

``load_data(spec, n=..., seed=..., tokenizer=...)`` turns one string into samples:

============================  ==========================================================================
``mnist1d``                   generated locally by ``mnist1d.data.make_dataset`` (default args, its fixed
                              seed 42): 4000 train / 1000 test, inputs (n, 1, 40) float32, labels int64
``digits``                    scikit-learn's bundled 8×8 digits, inputs (n, 1, 8, 8) in [0, 1]; a fixed
                              stratified 80/20 split (split seed 0) gives 1437 train / 360 ``test``
``synthetic:3x64x64``         seeded standard Gaussian, default n 1024, no labels; generated per batch
                              (sample i is drawn from its own seed), so memory does not grow with n
``npy:PATH``, ``pt:PATH``     first axis = samples; options ``labels=PATH`` (a .npy/.pt of (n,) ints);
                              ``pt`` files load with ``weights_only=True`` and hold a tensor, a
                              ``(inputs, labels)`` pair or a dict with ``inputs`` (and ``labels``)
``imagefolder:DIR``           one sub-folder per class, RGB in [0, 1]; option ``size=S`` (resize the short
                              side to S, centre-crop S×S); a seeded shuffle before ``n`` caps it
``text:FILE``                 one text a line, tokenised by ``tokenizer="hf:DIR"`` (needs transformers)
                              or ``"bytes"`` (UTF-8 bytes, vocab 256, offline); options ``tokenizer=...``
                              (same values, so any command's --data can name it) and ``max_length=L``
                              (default 128); inputs = {input_ids, attention_mask} (n, L), right-padded;
                              ``info["texts_sha256"]``: one sha256 per line (what activation caches
                              record of their samples, whichever tokenizer read them)
============================  ==========================================================================

Options follow the path after commas: ``npy:x.npy,labels=y.npy``, ``imagefolder:imgs,size=64``.
Nothing here touches the network: names of datasets that would need a download fail at once with a
message saying how to supply the files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from simkit.errors import SimkitError
from simkit.forward import take as take_rows
from simkit.io import atomic_write
from simkit.models.loading import hf_tokenizer

DATA_SPEC_KINDS = ("mnist1d", "digits", "synthetic:SHAPE", "npy:PATH", "pt:PATH", "imagefolder:DIR", "text:FILE")
# Well-known datasets that exist only as downloads: refuse at once and say how to supply the files.
DOWNLOAD_ONLY = ("mnist", "fashionmnist", "fashion_mnist", "kmnist", "cifar10", "cifar100", "svhn",
                 "imagenet", "stl10", "celeba", "wikitext", "tinystories", "openwebtext")
SYNTHETIC_DEFAULT_N = 1024


class Dataset:
    """Samples as tensors, first axis = samples.

    ``inputs``: Tensor (n, ...) or dict[str, Tensor (n, L)] for tokenised text; ``labels``: (n,) int64
    or None; ``test``: the source's native held-out split (mnist1d, digits) or None; ``info``:
    ``num_classes``, ``input_shape`` (one sample), ``value_range`` (lo, hi) and source details.

    A dataset may be *lazy* (``synthetic``): its inputs are produced per batch by ``generate(start,
    stop)`` and only materialised when ``.inputs`` is read.
    """

    def __init__(self, inputs: Tensor | dict[str, Tensor] | None, labels: Tensor | None, spec: str,
                 test: Dataset | None = None, info: dict[str, Any] | None = None, *,
                 generate: Callable[[int, int], Tensor] | None = None, length: int | None = None):
        if inputs is None and generate is None:
            raise ValueError("Dataset needs inputs or a generate function")
        if inputs is None and length is None:
            raise ValueError("a lazy Dataset needs its length")
        self._inputs = inputs
        self._generate = generate
        self._length: int = _first_dim(inputs) if inputs is not None else int(length or 0)
        self.labels = labels
        self.spec = spec
        self.test = test
        self.info = dict(info or {})
        if labels is not None and len(labels) != self._length:
            raise SimkitError(f"data {spec!r}: {len(labels)} labels for {self._length} samples; "
                              "give one label per sample")

    @property
    def inputs(self) -> Tensor | dict[str, Tensor]:
        """All inputs (n, ...) (materialised once for a lazy dataset)."""
        if self._inputs is None:
            self._inputs = self._generated(0, self._length)
        return self._inputs

    def _generated(self, start: int, stop: int) -> Tensor:
        """Rows ``start`` … ``stop - 1`` of a lazy dataset, from its generate function."""
        if self._generate is None:
            raise ValueError("this Dataset holds its inputs; it has no generate function")
        return self._generate(start, stop)

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"Dataset({self.spec!r}, n={len(self)}, input_shape={self.info.get('input_shape')})"

    @property
    def is_lazy(self) -> bool:
        """True while the inputs are produced per batch and not held in memory."""
        return self._inputs is None

    def rows(self, start: int, stop: int) -> Tensor | dict[str, Tensor]:
        """Inputs of samples ``start`` … ``stop - 1`` ((stop - start, ...)), without materialising a lazy
        dataset: stream with this (or :meth:`batches`) rather than slicing ``.inputs``."""
        if self._inputs is None:
            return self._generated(start, stop)
        return take_rows(self._inputs, slice(start, stop))

    def take(self, index: Tensor | slice | np.ndarray | list[int]) -> Dataset:
        """The samples at ``index`` (a slice, (k,) integer indices or an (n,) bool mask) as a new Dataset;
        keeps ``test``."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step == 1 and self._inputs is None:  # stays lazy: a shifted window of the generator
                stop = max(start, stop)
                return Dataset(None, None if self.labels is None else self.labels[start:stop], self.spec,
                               self.test, self.info, length=stop - start,
                               generate=lambda a, b: self._generated(start + a, start + b))
            if step == 1:
                inputs = self.rows(start, max(start, stop))
            else:
                index = torch.arange(start, stop, step)
        if not isinstance(index, slice):
            index = torch.as_tensor(index)
            index = index.nonzero().flatten() if index.dtype == torch.bool else index.long()
            if self._inputs is None:
                rows = [self._generated(int(i), int(i) + 1) for i in index]
                inputs = torch.cat(rows) if rows else self._generated(0, 0)
            else:
                inputs = take_rows(self._inputs, index)
        labels = None if self.labels is None else self.labels[index]
        info = self.info
        if isinstance(info.get("texts_sha256"), list):  # the per-line digests follow the samples taken
            texts = info["texts_sha256"]
            info = {**info, "texts_sha256": texts[index] if isinstance(index, slice)
                    else [texts[int(i)] for i in index]}
        return Dataset(inputs, labels, self.spec, self.test, info)

    def batches(self, batch_size: int) -> Iterator[Tensor | dict[str, Tensor]]:
        """Inputs in order, ``batch_size`` samples at a time (the last batch may be smaller)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise SimkitError(f"`batch_size` must be a positive integer, got {batch_size!r}")
        for start in range(0, len(self), batch_size):
            yield self.rows(start, min(start + batch_size, len(self)))

    def train_test(self, test_fraction: float = 0.2, seed: int = 0) -> tuple[Dataset, Dataset]:
        """(train, test): the native split when ``test`` is set, else a seeded random split."""
        if self.test is not None:
            whole = Dataset(self._inputs, self.labels, self.spec, None, self.info,
                            generate=self._generate, length=self._length)
            return whole, self.test
        if not 0.0 < test_fraction < 1.0:
            raise SimkitError(f"`test_fraction` must be between 0 and 1, got {test_fraction}")
        n_test = int(round(len(self) * test_fraction))
        if n_test < 1 or n_test >= len(self):
            raise SimkitError(f"data {self.spec!r}: {len(self)} samples are too few for a "
                              f"{test_fraction:g} test split; use more samples")
        order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))
        train, test = self.take(order[n_test:].sort().values), self.take(order[:n_test].sort().values)
        train.test = test.test = None
        return train, test

    def with_test_split(self, seed: int = 0, test_fraction: float = 0.2) -> Dataset:
        """This dataset with a held-out ``test`` split: itself when it has one, else the training part of
        :meth:`train_test` (``seed``, ``test_fraction``) carrying the held-out part as its ``test``. A
        runner that splits its data then finds this split (drawn by the data's seed, ``--data-seed``)
        instead of drawing one from its own seed."""
        if self.test is not None:
            return self
        train, test = self.train_test(test_fraction, seed)
        train.test = test
        return train

    def cap(self, n: int | None) -> Dataset:
        """The first ``n`` samples (all when ``n`` is None or ≥ len); keeps ``test`` whole."""
        if n is None or n >= len(self):
            return self
        if n < 1:
            raise SimkitError(f"`n` must be at least 1, got {n}")
        return self.take(slice(0, n))


def check_finite(data: Dataset, arg: str = "data") -> None:
    """Refuse (SimkitError naming ``arg``) a dataset whose floating-point inputs hold NaN or ±inf, in
    its own samples or its ``test`` split: training on them gives NaN losses or silent garbage."""
    parts = [("", data)] + ([(" (its test split)", data.test)] if data.test is not None else [])
    for where, part in parts:
        if part.is_lazy:  # generated on the fly (synthetic): finite by construction
            continue
        inputs = part.inputs
        tensors = inputs.values() if isinstance(inputs, dict) else [inputs]
        for tensor in tensors:
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            bad = ~torch.isfinite(tensor.reshape(len(tensor), -1)).all(dim=1)
            if bool(bad.any()):
                first = int(bad.nonzero()[0])
                raise SimkitError(f"`{arg}` {part.spec!r}{where}: {int(bad.sum())} of {len(tensor)} samples hold "
                                  f"NaN or infinite inputs (the first is sample {first}); drop or fix them")


def _first_dim(inputs: Tensor | dict[str, Tensor]) -> int:
    if isinstance(inputs, dict):
        lengths = {len(v) for v in inputs.values()}
        if len(lengths) != 1:
            raise SimkitError("data: dict inputs have different numbers of samples; give equal lengths")
        return lengths.pop()
    return len(inputs)


# --------------------------------------------------------------------------------------------- parsing

def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """``"npy:x.npy,labels=y.npy"`` → ``("npy", "x.npy", {"labels": "y.npy"})``."""
    if not isinstance(spec, str) or not spec.strip():
        raise SimkitError(f"empty data spec; valid kinds: {', '.join(DATA_SPEC_KINDS)}")
    text = spec.strip()
    cut = min((i for i in (text.find(":"), text.find(",")) if i >= 0), default=len(text))
    kind, rest = text[:cut], text[cut + 1:]
    parts = rest.split(",") if rest else []
    target = parts[0] if parts and "=" not in parts[0] else ""
    options: dict[str, str] = {}
    for part in parts[1:] if target else parts:
        key, eq, value = part.partition("=")
        if not eq or not key.strip():
            raise SimkitError(f"data spec {spec!r}: option {part!r} is not key=value")
        options[key.strip()] = value.strip()
    return kind.strip().lower(), target.strip(), options


def local_paths(spec: str) -> list[Path]:
    """The local files and directories ``spec`` reads: the PATH/DIR/FILE of ``npy``, ``pt``,
    ``imagefolder`` and ``text``, a ``labels=PATH`` and a ``tokenizer=hf:DIR``; none for generated data."""
    kind, target, options = parse_spec(spec)
    paths = [Path(target).expanduser()] if target and kind in ("npy", "pt", "imagefolder", "text") else []
    if options.get("labels"):
        paths.append(Path(options["labels"]).expanduser())
    if options.get("tokenizer", "").startswith("hf:"):
        paths.append(Path(options["tokenizer"][3:]).expanduser())
    return paths


def load_data(spec: str, *, n: int | None = None, seed: int = 0, tokenizer: str | None = None) -> Dataset:
    """The dataset named by ``spec``, capped to its first ``n`` samples (see the module docstring)."""
    if n is not None and n < 1:
        raise SimkitError(f"`n` must be at least 1, got {n}")
    if "://" in spec:
        raise SimkitError(f"data spec {spec!r} is a URL; simkit never downloads: fetch the file "
                          "yourself and pass npy:PATH, pt:PATH, imagefolder:DIR or text:FILE")
    kind, target, options = parse_spec(spec)
    loaders: dict[str, Callable[..., Dataset]] = {
        "mnist1d": _mnist1d, "digits": _digits, "synthetic": _synthetic, "npy": _npy, "pt": _pt,
        "imagefolder": _imagefolder, "text": _text,
    }
    if kind in DOWNLOAD_ONLY:
        raise SimkitError(f"data {kind!r} would need a download and simkit never downloads; fetch it "
                          "yourself and pass it as npy:PATH (optionally ,labels=PATH) or imagefolder:DIR")
    if kind not in loaders:
        raise SimkitError(f"unknown data kind {kind!r}; valid kinds: {', '.join(DATA_SPEC_KINDS)}")
    dataset = loaders[kind](spec=spec, target=target, options=options, n=n, seed=seed, tokenizer=tokenizer)
    dataset.info["data_seed"] = seed  # recorded by simkit.compare in meta.seeds.data
    if n is not None and len(dataset) < n:
        _warn_fewer(dataset, n)
    return dataset


def _warn_fewer(dataset: Dataset, n: int) -> None:
    """Warn (once, one line) that ``n`` asked for more samples than ``dataset`` holds, so all are used."""
    split = "" if dataset.test is None else f" (its training split; its test split holds {len(dataset.test)} more)"
    warnings.warn(f"data {dataset.spec!r} holds {len(dataset)} samples{split}, fewer than `n` {n}; using all "
                  f"{len(dataset)}", UserWarning, stacklevel=3)


def _no_options(spec: str, options: dict[str, str], allowed: tuple[str, ...] = ()) -> None:
    extra = sorted(set(options) - set(allowed))
    if extra:
        valid = ", ".join(allowed) if allowed else "none"
        raise SimkitError(f"data spec {spec!r}: unknown option {extra[0]!r}; valid options: {valid}")


def _existing(spec: str, target: str, what: str) -> Path:
    if not target:
        raise SimkitError(f"data spec {spec!r} needs a {what}: write it after the colon")
    path = Path(target).expanduser()
    if not path.exists():
        raise SimkitError(f"data spec {spec!r}: {what} {str(path)!r} does not exist")
    return path


def _info(inputs: Tensor, labels: Tensor | None, **extra: Any) -> dict[str, Any]:
    info: dict[str, Any] = {"input_shape": tuple(inputs.shape[1:]),
                            "num_classes": None if labels is None or len(labels) == 0
                            else int(labels.max()) + 1}
    if inputs.numel() and inputs.is_floating_point():
        info["value_range"] = (float(inputs.min()), float(inputs.max()))
    info.update(extra)
    return info


# ------------------------------------------------------------------------------------------- sources

def cache_dir() -> Path:
    """Where generated datasets are cached: ``$SIMKIT_CACHE`` or ``~/.cache/simkit`` (never the repo)."""
    import os

    root = os.environ.get("SIMKIT_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                            os.path.expanduser("~/.cache"), "simkit")
    return Path(root)


@functools.lru_cache(maxsize=1)
def _mnist1d_arrays() -> dict[str, np.ndarray]:
    """mnist1d's default dataset (x (4000, 40), y, x_test (1000, 40), y_test), generated once and kept
    as a plain .npz (no pickle) in :func:`cache_dir`, keyed by the package version and arguments."""
    try:
        from mnist1d.data import get_dataset_args, make_dataset
    except ImportError:
        raise SimkitError("data 'mnist1d' needs the mnist1d package: pip install mnist1d") from None
    import hashlib
    import importlib.metadata
    import random

    args = get_dataset_args(as_dict=True)
    try:
        version = importlib.metadata.version("mnist1d")
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    key = hashlib.sha256(json.dumps([version, args], sort_keys=True,
                                    default=str).encode()).hexdigest()[:16]
    path = cache_dir() / f"mnist1d-{key}.npz"
    names = ("x", "y", "x_test", "y_test")
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as stored:
                return {k: stored[k] for k in names}
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache file is regenerated below
    # make_dataset reseeds the global Python and numpy generators; keep the caller's state.
    py_state, np_state = random.getstate(), np.random.get_state()
    try:
        raw = make_dataset()  # default args, generated locally (never the download path)
    finally:
        random.setstate(py_state)
        np.random.set_state(np_state)
    arrays: dict[str, Any] = {k: np.asarray(raw[k]) for k in names}
    try:
        def write(tmp: Path) -> None:
            with open(tmp, "wb") as handle:
                np.savez(handle, **arrays)

        atomic_write(path, write)
    except OSError:
        pass  # an unwritable cache directory only costs the regeneration next time
    return arrays


def _mnist1d(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    if target:
        raise SimkitError(f"data spec {spec!r}: mnist1d takes no path; write just 'mnist1d'")
    _no_options(spec, options)
    arrays = _mnist1d_arrays()

    def part(x: np.ndarray, y: np.ndarray, test: Dataset | None) -> Dataset:
        inputs = torch.from_numpy(x.astype(np.float32)).unsqueeze(1)  # (n, 1, 40)
        labels = torch.from_numpy(y.astype(np.int64))
        return Dataset(inputs, labels, spec, test, _info(inputs, labels, num_classes=10, source="mnist1d"))

    test = part(arrays["x_test"], arrays["y_test"], None)
    return part(arrays["x"], arrays["y"], test).cap(n)


def _digits(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    if target:
        raise SimkitError(f"data spec {spec!r}: digits takes no path; write just 'digits'")
    _no_options(spec, options)
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise SimkitError("data 'digits' needs scikit-learn: pip install scikit-learn") from None
    bunch = load_digits()  # bundled with scikit-learn: no download
    x = (bunch.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    y = bunch.target.astype(np.int64)
    # A fixed split (seed 0), so `digits` names the same train/test sets in every run.
    idx_train, idx_test = train_test_split(np.arange(len(y)), test_size=0.2, stratify=y, random_state=0)

    def part(idx: np.ndarray, test: Dataset | None) -> Dataset:
        inputs, labels = torch.from_numpy(x[idx]), torch.from_numpy(y[idx])
        return Dataset(inputs, labels, spec, test,
                       _info(inputs, labels, num_classes=10, value_range=(0.0, 1.0), source="digits"))

    return part(idx_train, part(idx_test, None)).cap(n)


def _parse_shape(spec: str, target: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in target.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or any(s < 1 for s in shape):
        raise SimkitError(f"data spec {spec!r}: synthetic needs a shape like synthetic:3x64x64")
    return shape


def _synthetic(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    _no_options(spec, options)
    shape = _parse_shape(spec, target)
    count = SYNTHETIC_DEFAULT_N if n is None else n
    gen = torch.Generator()

    def generate(start: int, stop: int) -> Tensor:
        out = torch.empty((max(stop - start, 0), *shape))
        if stop <= start:
            return out
        # sample i always comes from its own seed, mixed from (seed, i): any batch size agrees
        # (torch's CPU generator keeps only 32 bits of a seed, so the pair is hashed, not shifted)
        for i in range(start, stop):
            gen.manual_seed(int(np.random.SeedSequence([int(seed) & 0xFFFFFFFFFFFFFFFF, i])
                                .generate_state(1, np.uint32)[0]))
            torch.randn(shape, generator=gen, out=out[i - start])
        return out

    info = {"input_shape": shape, "num_classes": None, "value_range": None, "source": "synthetic",
            "distribution": "standard normal"}
    return Dataset(None, None, spec, None, info, generate=generate, length=count)


def _to_tensor(array: Any, spec: str, what: str) -> Tensor:
    """``array`` (Tensor, numpy array or nested lists) as a tensor; SimkitError for non-numeric data."""
    if isinstance(array, Tensor):
        return array
    try:
        return torch.as_tensor(np.asarray(array))
    except (TypeError, ValueError, RuntimeError):
        kind = getattr(array, "dtype", type(array).__name__)
        raise SimkitError(f"data {spec!r}: {what} of type {kind} are not numbers; save numeric arrays "
                          "(float inputs, integer labels)") from None


def _as_inputs(array: np.ndarray | Tensor, spec: str) -> Tensor:
    """Inputs ``(n, ...)`` as a tensor, floating point cast to float32."""
    tensor = _to_tensor(array, spec, "inputs")
    if tensor.dim() == 0:
        raise SimkitError(f"data {spec!r} holds a scalar; give an array whose first axis is samples")
    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        tensor = tensor.float()
    return tensor


def _as_labels(array: np.ndarray | Tensor, spec: str) -> Tensor:
    """Labels ``(n,)`` as int64 class indices."""
    tensor = _to_tensor(array, spec, "labels")
    if tensor.dim() != 1 or tensor.is_floating_point() and not torch.equal(tensor, tensor.round()):
        raise SimkitError(f"data {spec!r}: labels must be a 1-D array of integer classes")
    return tensor.long()


def _read_array(spec: str, path: Path) -> np.ndarray | Tensor | Any:
    if path.suffix in (".pt", ".pth"):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise SimkitError(f"data {spec!r}: cannot read {str(path)!r} as tensors ({exc}); "
                              "save plain tensors with torch.save") from None
    _check_npy_header(spec, path)
    try:
        return np.load(path, allow_pickle=False)
    except ValueError as exc:
        if "allow_pickle" not in str(exc):
            raise SimkitError(f"data {spec!r}: cannot read {str(path)!r} as a .npy array ({exc})") from None
        raise SimkitError(f"data {spec!r}: {str(path)!r} holds Python objects (an object array), which simkit "
                          "does not unpickle; save a numeric array with np.save") from None
    except Exception as exc:
        raise SimkitError(f"data {spec!r}: cannot read {str(path)!r} as a .npy array ({exc})") from None


def _check_npy_header(spec: str, path: Path) -> None:
    """Refuse a file that is neither a .npy array nor a .npz archive (a text or CSV file, say) with our
    own one line, before numpy reads it as a pickle and suggests ``allow_pickle``."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(6)
    except OSError as exc:
        raise SimkitError(f"data {spec!r}: cannot read {str(path)!r} ({exc.strerror})") from None
    if not head.startswith((b"\x93NUMPY", b"PK")):
        raise SimkitError(f"data {spec!r}: {str(path)!r} is not a .npy file (no NumPy header); save the array "
                          "with np.save (a text table: np.save('x.npy', np.loadtxt(FILE)))")


def _labels_option(spec: str, options: dict[str, str]) -> Tensor | None:
    if "labels" not in options:
        return None
    path = _existing(spec, options["labels"], "labels file")
    return _as_labels(_read_array(spec, path), spec)


def _tensor_dataset(spec: str, inputs: Tensor, labels: Tensor | None, n: int | None, **extra) -> Dataset:
    """A Dataset of ``inputs (n, ...)`` and optional ``labels (n,)``, capped at ``n`` samples."""
    if len(inputs) == 0:
        raise SimkitError(f"data {spec!r} holds no samples (shape {tuple(inputs.shape)}); "
                          "save an array whose first axis is samples")
    if labels is not None and len(labels) != len(inputs):
        raise SimkitError(f"data {spec!r}: {len(labels)} labels for {len(inputs)} samples; "
                          "give one label per sample")
    return Dataset(inputs, labels, spec, None, _info(inputs, labels, **extra)).cap(n)


def _npy(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    _no_options(spec, options, ("labels",))
    path = _existing(spec, target, "file")
    array = _read_array(spec, path)
    if not isinstance(array, np.ndarray):
        raise SimkitError(f"data {spec!r}: {str(path)!r} is not a single array; save it with np.save")
    return _tensor_dataset(spec, _as_inputs(array, spec), _labels_option(spec, options), n, source="npy")


def _pt(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    _no_options(spec, options, ("labels",))
    path = _existing(spec, target, "file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise SimkitError(f"data {spec!r}: cannot load {str(path)!r} with weights_only=True ({exc}); "
                          "save plain tensors with torch.save") from None
    labels = _labels_option(spec, options)
    if isinstance(obj, dict) and "inputs" in obj:
        inputs = obj["inputs"]
        if labels is None and obj.get("labels") is not None:
            labels = _as_labels(obj["labels"], spec)
    elif isinstance(obj, list | tuple) and len(obj) == 2 and all(isinstance(o, Tensor) for o in obj):
        inputs, pair_labels = obj
        labels = labels if labels is not None else _as_labels(pair_labels, spec)
    else:
        inputs = obj
    if isinstance(inputs, dict) and all(isinstance(v, Tensor) for v in inputs.values()):
        dataset = Dataset(inputs, labels, spec, None, {"input_shape": None, "num_classes": None,
                                                        "source": "pt"})
        return dataset.cap(n)
    if not isinstance(inputs, Tensor):
        raise SimkitError(f"data {spec!r}: {str(path)!r} holds {type(inputs).__name__}; save a tensor, "
                          "an (inputs, labels) pair or a dict with 'inputs' (and 'labels')")
    return _tensor_dataset(spec, _as_inputs(inputs, spec), labels, n, source="pt")


def _imagefolder(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    _no_options(spec, options, ("size",))
    root = _existing(spec, target, "directory")
    try:
        from torchvision import transforms
        from torchvision.datasets import ImageFolder
    except ImportError:
        raise SimkitError("data imagefolder needs torchvision: pip install torchvision") from None
    steps: list[Any] = []
    if "size" in options:
        try:
            size = int(options["size"])
        except ValueError:
            raise SimkitError(f"data spec {spec!r}: size must be an integer") from None
        steps += [transforms.Resize(size), transforms.CenterCrop(size)]
    steps.append(transforms.ToTensor())
    try:
        folder = ImageFolder(str(root), transform=transforms.Compose(steps),
                             loader=lambda p: _rgb(p))
    except (FileNotFoundError, RuntimeError) as exc:
        raise SimkitError(f"data {spec!r}: {exc}") from None
    order = torch.randperm(len(folder), generator=torch.Generator().manual_seed(seed))
    if n is not None:
        order = order[:n]
    images, labels = [], []
    for i in order.tolist():
        image, label = folder[i]
        images.append(image)
        labels.append(label)
    if len({tuple(im.shape) for im in images}) > 1:
        raise SimkitError(f"data {spec!r}: images differ in size; add ,size=S to resize them to S×S")
    inputs = torch.stack(images)
    label_tensor = torch.tensor(labels, dtype=torch.long)
    return Dataset(inputs, label_tensor, spec, None,
                   _info(inputs, label_tensor, num_classes=len(folder.classes), classes=folder.classes,
                         value_range=(0.0, 1.0), source="imagefolder"))


def _rgb(path: str):
    from PIL import Image

    with Image.open(path) as image:
        return image.convert("RGB")


def _text(*, spec, target, options, n, seed, tokenizer) -> Dataset:
    _no_options(spec, options, ("max_length", "tokenizer"))
    path = _existing(spec, target, "file")
    tokenizer = options.get("tokenizer", tokenizer)
    if tokenizer is None:
        raise SimkitError(f"data {spec!r} needs a tokenizer: pass `tokenizer`='hf:DIR' (a local Hugging Face "
                          "model directory) or 'bytes', or write text:FILE,tokenizer=hf:DIR")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SimkitError(f"data {spec!r}: {str(path)!r} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} "
                          f"at offset {exc.start}); give a text file with one sample per line") from None
    except OSError as exc:
        raise SimkitError(f"data {spec!r}: cannot read {str(path)!r} ({exc.strerror})") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise SimkitError(f"data {spec!r}: {str(path)!r} has no non-empty lines")
    if n is not None:
        lines = lines[:n]
    try:
        max_length = int(options.get("max_length", 128))
    except ValueError:
        raise SimkitError(f"data spec {spec!r}: max_length must be an integer") from None
    if tokenizer == "bytes":
        input_ids, attention_mask, vocab = _byte_tokens(lines, max_length)
    else:
        tok = hf_tokenizer(tokenizer)
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
        enc = tok(lines, padding="longest", truncation=True, max_length=max_length, return_tensors="pt")
        input_ids, attention_mask, vocab = enc["input_ids"], enc["attention_mask"], len(tok)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    # one sha256 per line: what a cache records of its samples, whichever tokenizer read them
    texts_sha256 = [hashlib.sha256(line.encode("utf-8")).hexdigest() for line in lines]
    info = {"input_shape": (input_ids.shape[1],), "num_classes": None, "tokenizer": tokenizer,
            "vocab_size": vocab, "source": "text", "texts_sha256": texts_sha256}
    return Dataset(inputs, None, spec, None, info)


def _byte_tokens(lines: list[str], max_length: int) -> tuple[Tensor, Tensor, int]:
    """UTF-8 bytes as token ids (vocab 256), right-padded with 0 to the longest line:
    input_ids (n, L) int64, attention_mask (n, L) int64."""
    rows = [list(line.encode("utf-8"))[:max_length] for line in lines]
    width = max(len(row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, :len(row)] = 1
    return ids, mask, 256
