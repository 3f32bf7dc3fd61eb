"""Arrays as the engine's third source, beside model taps and cache readers (``simkit.engine.sources``).

An :class:`ActivationSource` is the layers of one set of activations, each ``(n, ...)`` with one row per
sample: a mapping ``{layer: array}`` given in memory (torch tensors, NumPy arrays, anything with
``__array__``, dict-likes such as a TransformerLens ``ActivationCache``; a tuple or list of arrays, as
Hugging Face's ``hidden_states``, becomes ``hidden_states.0`` …), a file or directory
(``simkit.engine.array_files``), or an activation cache. Its rows are read batch by batch, never whole:
the engine streams ``(global batch index, acts_a, acts_b)`` from them exactly as from two caches, so every
measure, both modes, chance levels, intervals, the report and ``save_run`` work unchanged
(:func:`compare_arrays`; ``simkit.engine.studies.study`` takes sources too).

Samples are matched by ID when every source has IDs (an ``ids`` entry in the file, or ``ids`` given):
the samples present in all, in the first source's order, at least ``min_overlap`` of the smaller side.
Without IDs every source must have the same number of rows, aligned by position. Arrays with more than
two dimensions are reduced by the same rules as a model's outputs (``simkit.layers.reduce_activation``),
a 3-D array read as a token sequence ``(n, tokens, features)`` whose ``auto`` reduction is the mean over
tokens, weighted by an ``attention_mask`` entry when the source has one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open

from simkit import distributed
from simkit.engine.array_files import (
    IDS,
    MASK,
    RESERVED,
    Chunked,
    LayerArray,
    Rows,
    as_layer,
    flatten_mapping,
    read_file,
    read_id_lines,
)
from simkit.engine.assemble import Run, compare_result, selector
from simkit.engine.batches import steps
from simkit.engine.caches import CacheWriter, check_capture
from simkit.engine.measure import measure
from simkit.engine.samples import SampleRows
from simkit.engine.sources import FORMAT, check_same_samples, is_cache, read_manifest, select_names
from simkit.errors import SimkitError
from simkit.forward import resolve_device
from simkit.io import write_json
from simkit.layers import reduce_activation
from simkit.metrics.settings import CompareSettings, resolve_settings
from simkit.progress import progress_bar
from simkit.provenance import run_meta
from simkit.results import CompareResult
from simkit.rundir import check_run_path, sha256
from simkit.settings.compare import REDUCTIONS

#: what results say of activations that came from no file
MEMORY = "arrays given in memory"
#: ``manifest["source"]`` of a cache imported from activations (``simkit capture --from``)
IMPORTED = "arrays"
IDS_FILE = "ids.json"


# ------------------------------------------------------------------------------------------ sources


@dataclass
class ActivationSource:
    """Activations of one model (or brain, or recording): its layers of ``rows`` samples each, in order,
    the samples' IDs (None when it has none), the token mask of its 3-D layers, where it came from and
    what to close when done. Make one with :func:`load_activations` or :func:`as_source`."""

    label: str
    layers: dict[str, LayerArray]
    ids: list[str] | None = None
    mask: LayerArray | None = None
    path: Path | None = None
    format: str = "arrays"
    weights: str | None = None
    manifest: dict[str, Any] | None = None
    closers: list[Any] = field(default_factory=list)
    _digest: str | None = None

    @property
    def rows(self) -> int:
        """The number of samples."""
        return next(iter(self.layers.values())).shape[0]

    def sha256(self) -> str | None:
        """The sha256 of the file (or directory) it was read from; None for arrays in memory."""
        if self.path is not None and self._digest is None:
            self._digest = sha256(self.path)
        return self._digest

    def provenance(self) -> str:
        """What the activations are, for results (where a model pair names its weights)."""
        if self.weights is not None:
            return self.weights
        if self.path is None:
            return MEMORY
        return f"activations read from a file ({self.format}, sha256 {self.sha256()})"

    def origin(self) -> dict[str, Any]:
        """Where it came from, for ``meta.sources``: the file (path, format, sha256) or memory."""
        if self.path is None:
            return {"kind": "memory", "what": MEMORY}
        return {"kind": "cache" if self.format == "simkit cache" else "file", "path": str(self.path),
                "format": self.format, "sha256": self.sha256()}

    def manifest_view(self) -> dict[str, Any]:
        """Its layers as a cache manifest lists them (a study pairs layers by these)."""
        return {"model": self.label, "weights": self.provenance(), "layers": [{"name": n} for n in self.layers]}

    def close(self) -> None:
        """Close the files it reads."""
        while self.closers:
            self.closers.pop()()

    def __enter__(self) -> ActivationSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_activations(path: str | Path, *, trust: bool = False, ids: Sequence[Any] | str | Path | None = None,
                     ids_column: str | None = None) -> ActivationSource:
    """The activations in ``path``: ``.npy`` (one layer, named after the file), a directory of ``.npy`` files
    (a layer each), ``.npz`` / ``.safetensors`` (a layer per key), ``.pt`` (a dict of tensors, weights-only
    unless ``trust``), ``.h5`` / ``.hdf5`` (every dataset a layer, groups as dotted prefixes; needs the
    ``[h5]`` extra) or an activation cache. An ``ids`` entry holds the sample IDs and ``attention_mask`` the
    token mask of 3-D layers; ``ids`` given here (a sequence, or a file with one ID per line, or a CSV
    read at ``ids_column``) replace the file's. Rows are read on demand: close the source (or use it in a
    ``with`` block) when done."""
    path = Path(path).expanduser()
    if is_cache(path):
        source = cache_source(path)
    else:
        contents = read_file(path, trust=trust)
        source = build_source(str(path), contents.layers, contents.extra, path=path, format=contents.format,
                              closers=contents.closers)
    return with_ids(source, ids, ids_column, "ids")


def as_source(value: Any, argument: str, *, label: str, ids: Sequence[Any] | str | Path | None = None,
              ids_column: str | None = None, trust: bool = False) -> ActivationSource:
    """``value`` (a loaded source, a path, a mapping or dict-like of layers, or a tuple of arrays such as
    Hugging Face ``hidden_states``) as an :class:`ActivationSource`; ``label`` names arrays in memory."""
    if isinstance(value, ActivationSource):  # the caller's own: a copy with the IDs given, closing nothing
        return with_ids(replace(value, closers=[]), ids, ids_column, f"ids of `{argument}`")
    if isinstance(value, str | Path):
        return load_activations(value, trust=trust, ids=ids, ids_column=ids_column)
    if isinstance(value, list | tuple):
        value = hf_hidden_states(value)
    if not (callable(getattr(value, "keys", None)) and hasattr(value, "__getitem__")):
        raise SimkitError(f"`{argument}` must be a mapping {{layer name: array (samples, ...)}}, a file path or "
                          f"simkit.load_activations(path), got {type(value).__name__}")
    values = flatten_mapping(value)
    extra = {key: values.pop(key) for key in RESERVED if key in values}
    source = build_source(label, {key: as_layer(v, key) for key, v in values.items()}, extra)
    return with_ids(source, ids, ids_column, f"ids of `{argument}`")


def hf_hidden_states(output: Any, attention_mask: Any = None) -> dict[str, Any]:
    """Hugging Face ``output_hidden_states`` as layers: ``{"hidden_states.0": embeddings, …,
    "hidden_states.L": last layer}`` from a model output (``.hidden_states``) or the tuple itself, plus
    ``attention_mask`` when given (so the mean over tokens skips padding)."""
    states = getattr(output, "hidden_states", output)
    if not isinstance(states, list | tuple) or not states:
        raise SimkitError(f"expected Hugging Face hidden states (a tuple of (samples, tokens, features) arrays, or "
                          f"an output with .hidden_states), got {type(states).__name__}; run the model with "
                          "output_hidden_states=True")
    layers = {f"hidden_states.{i}": state for i, state in enumerate(states)}
    return layers if attention_mask is None else {**layers, MASK: attention_mask}


def printable(name: Any) -> str:
    """A layer name or ID from a file made printable: control characters written as ``\\xNN`` escapes."""
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}"
                   for ch in str(name))


def build_source(label: str, layers: Mapping[str, LayerArray], extra: Mapping[str, Any], *,
                 path: Path | None = None, format: str = "arrays", closers: list[Any] | None = None) -> ActivationSource:
    """A checked source: printable unique names, numeric layers of shape (n, features...) with one row
    count, IDs and mask matching it."""
    source = ActivationSource(label, {}, path=path, format=format, closers=list(closers or []))
    try:
        for name, layer in layers.items():
            clean = printable(name)
            if clean in source.layers:
                raise SimkitError(f"{label} names layer {clean!r} twice; give each layer its own name")
            source.layers[clean] = check_layer(clean, layer, label)
        if not source.layers:
            raise SimkitError(f"{label} holds no layers; give at least one array of shape (samples, features...)")
        check_rows(source)
        if MASK in extra:
            source.mask = check_mask(as_layer(extra[MASK], MASK), source)
        if IDS in extra:
            source.ids = check_ids(extra[IDS], source, f"the ids of {label}")
    except BaseException:
        source.close()
        raise
    return source


def dtype_kind(dtype: Any) -> str:
    """The NumPy kind letter of a NumPy or torch dtype (``f`` floating, ``i``/``u`` integer, ``b`` bool,
    ``c`` complex, anything else not a number)."""
    if isinstance(dtype, torch.dtype):
        return "c" if dtype.is_complex else "f" if dtype.is_floating_point else "b" if dtype == torch.bool else "i"
    try:
        return np.dtype(dtype).kind
    except TypeError:
        return "?"


def check_layer(name: str, layer: LayerArray, label: str) -> LayerArray:
    """``layer`` when it is numeric, with a sample axis and at least one feature, and not empty."""
    if dtype_kind(layer.dtype) not in "biuf":
        raise SimkitError(f"layer {name!r} of {label} holds {layer.dtype} values, not numbers; give a numeric array "
                          "(float, integer or bool) per layer")
    if len(layer.shape) < 2:
        raise SimkitError(f"layer {name!r} of {label} has shape {tuple(layer.shape)}: a layer needs one row per sample "
                          "and at least one feature (samples, features...); reshape a single feature to (n, 1)")
    if layer.shape[0] == 0 or int(np.prod(layer.shape[1:])) == 0:
        raise SimkitError(f"layer {name!r} of {label} is empty (shape {tuple(layer.shape)}); give at least one "
                          "sample and one feature")
    return layer


def check_rows(source: ActivationSource) -> None:
    """Every layer of ``source`` has the same number of rows (samples)."""
    rows = source.rows
    for name, layer in source.layers.items():
        if layer.shape[0] != rows:
            first = next(iter(source.layers))
            raise SimkitError(f"layers of {source.label} hold different numbers of samples: {first!r} has {rows} "
                              f"rows, {name!r} has {layer.shape[0]}; every layer needs one row per sample")


def check_mask(mask: LayerArray, source: ActivationSource) -> LayerArray:
    """The token mask: (samples, tokens), one row per sample."""
    if len(mask.shape) != 2 or mask.shape[0] != source.rows:
        raise SimkitError(f"the attention_mask of {source.label} has shape {tuple(mask.shape)}; it must be "
                          f"(samples, tokens) with {source.rows} rows")
    return mask


def read_ids(value: Any, column: str | None, what: str) -> list[str]:
    """Sample IDs as text: a sequence (numbers or text), or a file (one ID per line; a CSV read at
    ``column``)."""
    if isinstance(value, str | Path):
        return ids_from_file(Path(value).expanduser(), column)
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.ndim != 1 or array.dtype.kind not in "iuUSO":
        raise SimkitError(f"{what} must be one ID per sample, whole numbers or text, got an array of "
                          f"{array.dtype} with shape {array.shape}")
    return [printable(v.decode("utf-8", "replace") if isinstance(v, bytes) else v) for v in array.tolist()]


def ids_from_file(path: Path, column: str | None) -> list[str]:
    """IDs from a text file, one per line, or from the ``column`` of a CSV file."""
    if column is None:
        return [printable(line) for line in read_id_lines(path)]
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SimkitError(f"cannot read {str(path)!r} as CSV ({type(exc).__name__}); give a UTF-8 CSV file with "
                          "a header row") from None
    if not rows or column not in rows[0]:
        found = ", ".join(repr(c) for c in (rows[0] if rows else {}))
        raise SimkitError(f"{str(path)!r} has no column {column!r} (columns: {found or 'none'}); name the ID column "
                          "with `ids_column`")
    return [printable(row[column]) for row in rows]


def check_ids(value: Any, source: ActivationSource, what: str, column: str | None = None) -> list[str]:
    """Sample IDs, one per row of ``source``, none twice."""
    ids = read_ids(value, column, what)
    if len(ids) != source.rows:
        raise SimkitError(f"{what} list {len(ids)} samples but {source.label} has {source.rows} rows; give one ID "
                          "per row")
    seen: set[str] = set()
    for position, sample in enumerate(ids):
        if sample in seen:
            raise SimkitError(f"{what} name sample {shorten(sample)!r} twice (again at row {position}); give "
                              "each sample its own ID")
        seen.add(sample)
    return ids


def shorten(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters for a message."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def with_ids(source: ActivationSource, ids: Any, column: str | None, what: str) -> ActivationSource:
    """``source`` with the IDs given (None: its own); ``source`` itself is left as it is."""
    if ids is None:
        if column is not None:
            raise SimkitError("`ids_column` names the ID column of an IDs file; give the file as `ids` too")
        return source
    try:
        return replace(source, ids=check_ids(ids, source, what, column))
    except BaseException:
        source.close()
        raise


# ------------------------------------------------------------------------------------------ caches as sources


def is_imported(path: str | Path) -> bool:
    """True for a cache written from activations (``simkit capture --from``), not from a model."""
    return is_cache(path) and read_manifest(path).get("source") == IMPORTED


def cache_source(path: Path) -> ActivationSource:
    """An activation cache read as a source (its shards in row chunks; an imported cache's IDs)."""
    manifest = read_manifest(path)
    shards, start = [], 0
    for shard in manifest["shards"]:
        shards.append((path / shard["file"], start, start + int(shard["rows"])))
        start += int(shard["rows"])
    layers: dict[str, LayerArray] = {
        layer["name"]: Chunked((start, int(layer["dim"])), torch.float32, _shard_reader(shards, layer["name"], path))
        for layer in manifest["layers"]}
    source = ActivationSource(str(manifest["model"]), layers, path=path, format="simkit cache",
                              weights=str(manifest.get("weights", "unknown (an older cache)")), manifest=manifest)
    if manifest.get("ids"):
        source.ids = check_ids(json.loads((path / manifest["ids"]).read_text(encoding="utf-8")), source,
                               f"the ids of cache {path}")
    return source


def _shard_reader(shards: list[tuple[Path, int, int]], name: str, path: Path) -> Any:
    def read(start: int, stop: int) -> torch.Tensor:
        parts = []
        for file, low, high in shards:
            if low < stop and start < high:
                try:
                    with safe_open(str(file), framework="pt") as handle:
                        parts.append(handle.get_slice(name)[max(start, low) - low:min(stop, high) - low])
                except Exception as exc:  # a truncated, foreign or unreadable shard
                    raise SimkitError(f"cache {path}: cannot read shard {file.name} ({str(exc)[:120]}); the cache "
                                      "is damaged: write it again with `simkit capture`") from None
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    return read


# ------------------------------------------------------------------------------------------ alignment


@dataclass(frozen=True)
class Alignment:
    """How the sources' samples were matched: ``by`` ids or position, each source's rows, the samples
    matched, and each source's rows in comparison order (None: rows 0 … matched − 1)."""

    by: str
    rows: list[int]
    matched: int
    index: list[np.ndarray | None]

    def record(self, names: Sequence[str]) -> dict[str, Any]:
        """The summary's ``samples``: how many samples each side had, matched and dropped."""
        out: dict[str, Any] = {"aligned_by": self.by, "matched": self.matched}
        out.update({f"rows_{name}": rows for name, rows in zip(names, self.rows, strict=True)})
        out.update({f"dropped_{name}": rows - self.matched for name, rows in zip(names, self.rows, strict=True)})
        return out


def align(sources: Sequence[ActivationSource], min_overlap: float) -> Alignment:
    """Match the samples of ``sources``: by ID when every source has IDs (the samples present in all, in the
    first source's order), else by position (same number of rows required). Caches captured from models
    must hold the same samples by their digests (``simkit.engine.sources.check_same_samples``)."""
    captured = [s for s in sources if s.manifest is not None and s.manifest.get("source") != IMPORTED]
    if len(captured) > 1:  # caches captured from models: their sample digests must agree, as ever
        check_same_samples([s.manifest or {} for s in captured], [s.path or s.label for s in captured])
    rows = [source.rows for source in sources]
    if any(source.ids is None for source in sources):
        if len(set(rows)) > 1:
            counts = " and ".join(f"{source.label} has {source.rows}" for source in sources)
            raise SimkitError(f"the activations hold different numbers of samples ({counts} rows): without sample IDs "
                              "every side must hold the same samples in the same order; give IDs (an `ids` entry "
                              "in each file, or `ids_a` and `ids_b`)")
        return Alignment("position", rows, rows[0], [None] * len(sources))
    positions = [{sample: row for row, sample in enumerate(source.ids or [])} for source in sources]
    common = [sample for sample in sources[0].ids or [] if all(sample in p for p in positions[1:])]
    needed = min_overlap * min(rows)
    if len(common) < needed:
        found = "no sample ID is" if not common else f"only {len(common)} sample IDs are"
        raise SimkitError(f"{found} shared by all sides ({', '.join(str(r) for r in rows)} rows), fewer than "
                          f"`min_overlap` {min_overlap:g} of the smaller side ({int(np.ceil(needed))}); check that "
                          "the IDs name the same samples, or lower `min_overlap`")
    index = [np.fromiter((p[sample] for sample in common), dtype=np.int64, count=len(common)) for p in positions]
    ordered = [None if np.array_equal(i, np.arange(len(common))) else i for i in index]
    return Alignment("ids", rows, len(common), ordered)


# ------------------------------------------------------------------------------------------ streaming


def resolved_reduction(how: str, ndim: int) -> str:
    """The reduction an array of ``ndim`` dimensions gets (``auto``: the mean over the tokens of a 3-D
    array, flatten otherwise; a 2-D array is kept)."""
    if ndim <= 2:
        return "flatten"
    if how == "auto":
        return "mean" if ndim == 3 else "flatten"
    return how


class Side:
    """One source's chosen layers, read batch by batch in comparison order, checked and reduced to
    ``(b, features)`` tensors (``raw``: kept as they are, ``(b, ...)``, for tokens or positions as samples)."""

    def __init__(self, source: ActivationSource, layers: list[str], index: np.ndarray | None, reduce: str,
                 raw: bool = False):
        self.source, self.layers, self.index, self.reduce, self.raw = source, layers, index, reduce, raw

    def mask(self, start: int, stop: int | None) -> torch.Tensor | None:
        """The token mask of rows ``start`` … ``stop`` − 1 of the comparison (None without one)."""
        if self.source.mask is None:
            return None
        stop = len(self.index) if stop is None and self.index is not None else stop
        rows: Rows = slice(start, stop) if self.index is None else self.index[start:stop]
        return torch.as_tensor(self.source.mask.rows(rows))

    def batch(self, start: int, stop: int, device: torch.device) -> list[torch.Tensor]:
        """Rows ``start`` … ``stop`` − 1 of the comparison (float32, float64 kept), one tensor per layer."""
        rows: Rows = slice(start, stop) if self.index is None else self.index[start:stop]
        mask = None if self.source.mask is None else self.source.mask.rows(rows)
        out = []
        for name in self.layers:
            values = self.read(name, rows)
            values = values if values.dtype == torch.float64 else values.to(torch.float32)
            self.check_finite(name, values, rows, start)
            kept = values if self.raw else reduce_activation(values, self.reduce, layout="tokens", mask=mask)
            out.append(kept.to(device))
        return out

    def read(self, name: str, rows: Rows) -> torch.Tensor:
        """The rows of layer ``name``; a file that fails to give them is a SimkitError naming it."""
        try:
            return self.source.layers[name].rows(rows)
        except SimkitError:
            raise
        except Exception as exc:  # OSError, a zip or HDF5 error: a file truncated or changed while read
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise SimkitError(f"cannot read layer {name!r} of {self.source.label} ({first}); the file is truncated "
                              "or damaged: write it again") from None

    def check_finite(self, name: str, values: torch.Tensor, rows: Rows, start: int) -> None:
        """NaN or inf in a layer is a SimkitError naming the layer and its first bad row."""
        bad = ~torch.isfinite(values.reshape(values.shape[0], -1)).all(1)
        if bool(bad.any()):
            first = int(torch.nonzero(bad)[0, 0])
            row = start + first if isinstance(rows, slice) else int(rows[first])
            raise SimkitError(f"layer {name!r} of {self.source.label} holds NaN or inf, first at row {row}; drop or "
                              "fix those samples (or that layer) before comparing")

    def layer_rows(self, side: str, dims: Sequence[int]) -> list[dict[str, Any]]:
        """Rows of the ``layers`` table: side, name, format, shape per sample, reduction, width."""
        return [{"model": side, "name": name, "type": self.source.format,
                 "shape": "x".join(str(s) for s in self.source.layers[name].shape[1:]),
                 "reduction": resolved_reduction(self.reduce, len(self.source.layers[name].shape)), "dim": dim}
                for name, dim in zip(self.layers, dims, strict=True)]


def stream_sides(sides: Sequence[Side], rows: int, settings: CompareSettings, device: torch.device, progress: bool,
                 label: str) -> Iterator[tuple[int, list[list[torch.Tensor]]]]:
    """This rank's global batches over ``rows`` aligned samples (capped by ``n``): ``(index, per side one
    tensor per layer)``, with a progress bar."""
    total = rows if settings.n is None else min(rows, settings.n)
    rank, world = distributed.rank(), distributed.world_size()
    bar = progress_bar(progress)
    task = bar.add_task(f"{label} ({settings.mode})", total=steps(total, None, settings.batch_size))
    with bar:
        for index, start in enumerate(range(0, total, settings.batch_size)):
            if index % world == rank:
                stop = min(start + settings.batch_size, total)
                yield index, [side.batch(start, stop, device) for side in sides]
                bar.advance(task, world)


def sample_rows(settings: CompareSettings, sides: Sequence[Side], matched: int) -> SampleRows | None:
    """Tokens or positions as samples (``settings.samples``; None for sequences): the rows of the ``matched``
    aligned samples (capped by ``n``), each sequence's tokens counted by A's mask when it has one."""
    if settings.samples == "sequences":
        return None
    sequences = matched if settings.n is None else min(matched, settings.n)
    mask = sides[0].mask(0, sequences) if settings.samples == "tokens" else None
    counts = None if mask is None else mask.bool().sum(1).numpy()
    first = sides[0].source.layers[sides[0].layers[0]].shape
    if mask is not None and tuple(mask.shape[1:]) != tuple(first[1:2]):
        counts = None   # a mask of another length is ignored, as the mean over tokens ignores it
    return SampleRows(settings.samples, sequences, settings.batch_size, counts)


def as_rows(layout: SampleRows | None, stream: Iterator[tuple[int, list[list[torch.Tensor]]]],
            sides: Sequence[Side]) -> Iterator[tuple[int, list[torch.Tensor], list[torch.Tensor]]]:
    """The engine's ``(index, acts_a, acts_b)`` batches of two sides: as read, or as tokens or positions."""
    for index, (acts_a, acts_b) in stream:
        if layout is None:
            yield index, acts_a, acts_b
            continue
        start = index * layout.batch_size
        stop = start + int(acts_a[0].shape[0])
        masks = (sides[0].mask(start, stop), sides[1].mask(start, stop))
        yield (index, *layout.rows(index, acts_a, acts_b, masks, (sides[0].layers, sides[1].layers)))


def check_reduce(reduce: str) -> str:
    """``reduce`` as one of :data:`~simkit.settings.compare.REDUCTIONS`."""
    if reduce not in REDUCTIONS:
        raise SimkitError(f"`reduce` must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
    return reduce


# ------------------------------------------------------------------------------------------ compare


def compare_arrays(acts_a: Any, acts_b: Any, settings: CompareSettings | None = None, *,
                   ids_a: Sequence[Any] | str | Path | None = None, ids_b: Sequence[Any] | str | Path | None = None,
                   layers_a: str | Sequence[str] = "all", layers_b: str | Sequence[str] = "all",
                   reduce: str = "auto", device: str | torch.device = "cpu", progress: bool = True,
                   names: tuple[str, str] | None = None, data_name: str | None = None, trust: bool = False,
                   **changes: Any) -> CompareResult:
    """Compare every chosen layer of one set of activations with every chosen layer of another, as
    ``simkit.compare`` compares two models; returns the same ``CompareResult``.

    acts_a, acts_b: a mapping ``{layer: array (samples, ...)}`` (torch tensors, NumPy arrays, anything with
    ``__array__``, a dict-like such as a TransformerLens ``ActivationCache``), a tuple of arrays (Hugging
    Face ``hidden_states``: see :func:`hf_hidden_states`), a file or directory path, an activation cache,
    or a source from :func:`load_activations`. ids_a, ids_b: sample IDs (a sequence, or a file with one per
    line), replacing the sources' own: with IDs on both sides the samples present in both are compared, in
    A's order (``min_overlap``); without, both sides must have the same rows, aligned by position.
    layers_*: names and globs (``all``: every layer). reduce: for arrays of more than two dimensions, as
    for a model's outputs (a 3-D array is a token sequence). settings and keyword ``changes``: as in
    ``simkit.compare``. names: of A and B in results (default: the file paths, or "arrays A"/"arrays B").
    trust: allow ``.pt`` files that need unpickling code. The summary's ``samples`` says how the samples
    were aligned, how many each side had, matched and dropped."""
    given = settings or CompareSettings()
    chosen = resolve_settings(settings, changes)
    target = resolve_device(device)
    check_reduce(reduce)
    with ExitStack() as stack:
        sources = [stack.enter_context(as_source(acts, argument, label=f"arrays {side}", ids=ids, trust=trust))
                   for acts, argument, side, ids in ((acts_a, "acts_a", "A", ids_a), (acts_b, "acts_b", "B", ids_b))]
        alignment = align(sources, chosen.overlap())
        sides = [Side(source, select_names(list(source.layers), selected, "layer", source.label), index, reduce,
                      raw=chosen.samples != "sequences")
                 for source, selected, index in zip(sources, (layers_a, layers_b), alignment.index, strict=True)]
        labels = names or (sources[0].label, sources[1].label)
        started = time.perf_counter()
        layout = sample_rows(chosen, sides, alignment.matched)
        stream = stream_sides(sides, alignment.matched, chosen, target, progress, "compare arrays")
        measured = measure(as_rows(layout, stream, sides), chosen, target, layout=layout,
                           names_a=[f"{name!r} ({labels[0]})" for name in sides[0].layers],
                           names_b=[f"{name!r} ({labels[1]})" for name in sides[1].layers], progress=progress,
                           expected_rows=alignment.matched if chosen.n is None else min(alignment.matched, chosen.n))
        run = Run(given.updated(**changes), chosen, str(target),
                  {"layers_a": selector(layers_a), "layers_b": selector(layers_b), "reduce": reduce}, {})
        result = compare_result(
            run, measured, model_a=labels[0], model_b=labels[1], data=data_name or "activations",
            layers_a=sides[0].layers, layers_b=sides[1].layers,
            layer_rows=labelled(layout, sides[0].layer_rows("a", measured.dims_a) + sides[1].layer_rows("b", measured.dims_b)),
            seconds=time.perf_counter() - started, weights=(sources[0].provenance(), sources[1].provenance()),
            sources={"a": sources[0].origin(), "b": sources[1].origin()})
    result.summary["samples"] = alignment.record(["a", "b"])
    if layout is not None:
        result.summary["sample_unit"] = layout.record()
    return result


def labelled(layout: SampleRows | None, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The layers table's rows, with tokens or positions as the reduction when they are the samples."""
    return rows if layout is None else [{**row, "reduction": layout.label()} for row in rows]


# ------------------------------------------------------------------------------------------ import into a cache


def capture_arrays(acts: Any, out: str | Path, *, layers: str | Sequence[str] = "all", reduce: str = "auto",
                   batch_size: int = 1024, n: int | None = None, ids: Sequence[Any] | str | Path | None = None,
                   ids_column: str | None = None, trust: bool = False, shard_bytes: int = 256 * 2**20,
                   name: str | None = None, progress: bool = True) -> Path:
    """Import activations (a file, a directory, a mapping: as :func:`compare_arrays` takes them) into the
    activation cache ``out``: the chosen layers reduced to (n, features) float32 in shards, their IDs (an
    ``ids`` entry or ``ids`` given) in ``ids.json``, the manifest last. Such a cache is compared as
    activations (by IDs, or by position), not by a sample digest. Returns the cache directory."""
    check_capture(batch_size, n, shard_bytes)
    check_reduce(reduce)
    path = Path(out)
    check_run_path(path, "out")
    settings = CompareSettings(batch_size=batch_size, n=n).validate()
    started = time.perf_counter()
    with as_source(acts, "acts", label=name or "arrays", ids=ids, ids_column=ids_column, trust=trust) as source:
        side = Side(source, select_names(list(source.layers), layers, "layer", source.label), None, reduce)
        writer = CacheWriter(path, side.layers, shard_bytes)
        for _, (batch,) in stream_sides([side], source.rows, settings, torch.device("cpu"), progress, "import"):
            writer.add(batch)
        writer.flush()
        kept = source.ids[:writer.rows] if source.ids is not None else None
        if kept is not None:
            writer.start()
            write_json(path / IDS_FILE, kept)
        manifest = run_meta(
            format=FORMAT, source=IMPORTED, model=name or source.label, weights=source.provenance(),
            data="activations", n=writer.rows, batch_size=batch_size, reduce=reduce, dtype="float32",
            **({} if kept is None else {"ids": IDS_FILE}), origin=source.origin(),
            layers=[{k: v for k, v in row.items() if k != "model"} for row in side.layer_rows("a", writer.dims)],
            shards=writer.shards, seconds=round(time.perf_counter() - started, 3))
    writer.finish(manifest)
    return path

